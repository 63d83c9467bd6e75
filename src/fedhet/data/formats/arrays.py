"""The decoded train/test pair every reader returns (:class:`Arrays`) and the checks the readers share."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhet.errors import DataError


@dataclass(frozen=True, eq=False)
class Arrays:
    """A decoded train/test pair: images uint8 (N, C, H, W) or table rows float32 (N, F), labels int64 (N,),
    class names if known."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    classes: tuple[str, ...] | None = None


# --------------------------------------------------------------------------------------------------------
# Shared checks
# --------------------------------------------------------------------------------------------------------
def _check_labels(labels: np.ndarray, num_classes: int | None, source: str) -> np.ndarray:
    """Return labels as int64 (N,), refusing non-integers and values outside [0, num_classes)."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise DataError(f"{source}: labels must be one-dimensional, got shape {labels.shape}")
    if labels.dtype.kind not in "iu":
        raise DataError(f"{source}: labels must be integers, got dtype {labels.dtype}")
    labels = labels.astype(np.int64, copy=False)
    if labels.size and num_classes is not None:
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= num_classes:
            bad = labels[(labels < 0) | (labels >= num_classes)]
            raise DataError(
                f"{source}: labels out of range: found {int(bad[0])} ({bad.size} such labels; min {low}, "
                f"max {high}), accepted 0..{num_classes - 1} for {num_classes} classes; the file is "
                "corrupted or belongs to another data set"
            )
    return labels


def _check_counts(images: np.ndarray, labels: np.ndarray, images_source: str, labels_source: str) -> None:
    if len(images) != len(labels):
        raise DataError(
            f"image/label count mismatch: {images_source} holds {len(images)} images but {labels_source} "
            f"holds {len(labels)} labels; the two files must come from the same release"
        )


def _writable(array: np.ndarray) -> np.ndarray:
    """A C-contiguous writable array (torch.from_numpy refuses to share read-only buffers silently)."""
    array = np.ascontiguousarray(array)
    return array if array.flags.writeable else array.copy()
