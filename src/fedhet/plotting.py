"""Figures fedhet writes into run directories (PNG, matplotlib's Agg canvas; no display needed)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

#: Annotate each cell with its count when the matrix has at most this many cells.
MAX_ANNOTATED_CELLS = 400


def plot_class_counts(
    counts: np.ndarray,
    path: str | os.PathLike,
    title: str | None = None,
    class_names: Sequence[str] | None = None,
) -> None:
    """Client × class heatmap of a partition's (N, K) class-count matrix, saved as a PNG at ``path``.

    Counts are written into the cells when the matrix is small (<= 400 cells); row totals label the y axis.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    matrix = np.asarray(counts)
    if matrix.ndim != 2:
        raise ValueError(f"counts must be a 2-D (clients × classes) matrix, got shape {matrix.shape}")
    n_clients, n_classes = matrix.shape
    if class_names is not None and len(class_names) != n_classes:
        raise ValueError(
            f"class_names has {len(class_names)} names for {n_classes} classes; give one per class"
        )
    names = list(class_names) if class_names is not None else [str(k) for k in range(n_classes)]

    width = min(4.0 + 0.6 * n_classes, 30.0)
    height = min(2.0 + 0.4 * n_clients, 30.0)
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(matrix, aspect="auto", cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="samples")
    ax.set_xlabel("class")
    ax.set_ylabel("client (total)")
    if n_classes <= 60:
        ax.set_xticks(range(n_classes))
        ax.set_xticklabels(names, rotation=45 if max(len(s) for s in names) > 3 else 0, ha="right")
    if n_clients <= 60:
        totals = matrix.sum(axis=1)
        ax.set_yticks(range(n_clients))
        ax.set_yticklabels([f"{i} ({int(t)})" for i, t in enumerate(totals)])
    if matrix.size <= MAX_ANNOTATED_CELLS:
        # Dark text on the bright end of viridis, light text elsewhere, so every number stays readable.
        top = float(matrix.max()) if matrix.size else 0.0
        for i in range(n_clients):
            for k in range(n_classes):
                value = matrix[i, k]
                color = "black" if top > 0 and value > 0.6 * top else "white"
                ax.text(k, i, f"{int(value)}", ha="center", va="center", fontsize=7, color=color)
    ax.set_title(title if title is not None else f"class counts ({n_clients} clients × {n_classes} classes)")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
