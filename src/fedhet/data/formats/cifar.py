"""CIFAR-10 / CIFAR-100 python batches (the official .tar.gz or its extracted directory)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.data.formats.arrays import Arrays, _check_counts, _check_labels, _writable
from fedhet.data.formats.containers import _Container
from fedhet.data.formats.unpickle import restricted_loads
from fedhet.errors import DataError

CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)

_CIFAR_LAYOUTS: dict[str, dict[str, Any]] = {
    "cifar10": {
        "train": tuple(f"data_batch_{i}" for i in range(1, 6)),
        "test": ("test_batch",),
        "meta": "batches.meta",
        "labels": "labels",
        "names": "label_names",
        "num_classes": 10,
    },
    "cifar100": {
        "train": ("train",),
        "test": ("test",),
        "meta": "meta",
        "labels": "fine_labels",
        "names": "fine_label_names",
        "num_classes": 100,
    },
}


def _as_str_keys(obj: Any, source: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise DataError(
            f"{source}: expected a pickled dict (an official CIFAR batch), got {type(obj).__name__}"
        )
    return {k.decode("latin1") if isinstance(k, bytes) else str(k): v for k, v in obj.items()}


def _cifar_batch(
    data: bytes, source: str, labels_key: str, num_classes: int
) -> tuple[np.ndarray, np.ndarray]:
    batch = _as_str_keys(restricted_loads(data, source), source)
    if "data" not in batch or labels_key not in batch:
        raise DataError(
            f"{source}: a CIFAR batch needs keys 'data' and {labels_key!r}, found {sorted(batch)}"
        )
    pixels = batch["data"]
    if (
        not isinstance(pixels, np.ndarray)
        or pixels.dtype != np.uint8
        or pixels.ndim != 2
        or pixels.shape[1] != 3072
    ):
        desc = f"{pixels.dtype} {pixels.shape}" if isinstance(pixels, np.ndarray) else type(pixels).__name__
        raise DataError(f"{source}: 'data' must be a uint8 array of shape (N, 3072), got {desc}")
    try:
        labels = np.asarray(batch[labels_key])
    except (TypeError, ValueError) as err:
        raise DataError(f"{source}: {labels_key!r} is not a list of integers ({err})") from err
    labels = _check_labels(labels, num_classes, source)
    _check_counts(pixels, labels, f"{source} ('data')", f"{source} ({labels_key!r})")
    # The official row layout is 1024 red, 1024 green, 1024 blue values, each a row-major 32x32 plane: NCHW.
    return pixels.reshape(-1, 3, 32, 32), labels


def read_cifar_python(source: str | os.PathLike, variant: str = "cifar10") -> Arrays:
    """Read the official CIFAR-10/100 python version (the .tar.gz, or its extracted directory).

    Batches are unpickled with `restricted_loads`; CIFAR-100 uses the fine labels and names from `meta`.
    """
    if variant not in _CIFAR_LAYOUTS:
        raise ValueError(f"variant must be one of {sorted(_CIFAR_LAYOUTS)}, got {variant!r}")
    layout = _CIFAR_LAYOUTS[variant]
    source = Path(source)
    wanted = {*layout["train"], *layout["test"], layout["meta"]}
    with _Container(source, lambda n: n.rsplit("/", 1)[-1] in wanted, max_depth=1) as container:
        by_base: dict[str, list[str]] = {}
        for name in container.names:
            by_base.setdefault(name.rsplit("/", 1)[-1], []).append(name)
        for base, names in by_base.items():
            if len(names) > 1:
                raise DataError(f"{source}: {base} appears {len(names)} times ({names}); expected one copy")

        def part(base: str) -> tuple[np.ndarray, np.ndarray]:
            if base not in by_base:
                raise DataError(f"{source}: the {variant} batch file {base!r} is missing")
            name = by_base[base][0]
            return _cifar_batch(
                container.read(name), container.describe(name), layout["labels"], layout["num_classes"]
            )

        train = [part(b) for b in layout["train"]]
        test = [part(b) for b in layout["test"]]
        classes: tuple[str, ...] | None = CIFAR10_CLASSES if variant == "cifar10" else None
        if layout["meta"] in by_base:
            meta_name = by_base[layout["meta"]][0]
            where = container.describe(meta_name)
            meta = _as_str_keys(restricted_loads(container.read(meta_name), where), where)
            names = meta.get(layout["names"])
            if not isinstance(names, list) or len(names) != layout["num_classes"]:
                raise DataError(f"{where}: {layout['names']!r} must list {layout['num_classes']} class names")
            classes = tuple(n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in names)
        elif classes is None:
            raise DataError(f"{source}: the meta file {layout['meta']!r} (class names) is missing")

    def join(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        if len(parts) == 1:
            return _writable(parts[0][0]), parts[0][1]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    train_x, train_y = join(train)
    test_x, test_y = join(test)
    return Arrays(train_x, train_y, test_x, test_y, classes)
