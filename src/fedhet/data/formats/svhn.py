"""SVHN cropped digits: the official train_32x32.mat and test_32x32.mat."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np

from fedhet.data.formats.arrays import Arrays, _check_counts
from fedhet.errors import DataError


def read_svhn_mat(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read one official SVHN cropped-digits file (X: 32x32x3xN uint8, y: Nx1 with 10 meaning digit 0)."""
    import scipy.io
    from scipy.io.matlab import MatReadError

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        content = scipy.io.loadmat(path, variable_names=["X", "y"])
    except (MatReadError, ValueError, TypeError, OSError, EOFError, zlib.error) as err:
        raise DataError(f"{path}: not a readable MATLAB file ({type(err).__name__}: {err})") from err
    if "X" not in content or "y" not in content:
        raise DataError(
            f"{path}: an SVHN .mat file holds variables X and y, "
            f"found {sorted(k for k in content if not k.startswith('__'))}"
        )
    images, labels = content["X"], content["y"]
    if images.ndim != 4 or images.shape[:3] != (32, 32, 3) or images.dtype != np.uint8:
        raise DataError(f"{path}: X must be uint8 of shape (32, 32, 3, N), got {images.dtype} {images.shape}")
    if labels.ndim != 2 or labels.shape[1] != 1:
        raise DataError(f"{path}: y must have shape (N, 1), got {labels.shape}")
    labels = labels[:, 0]
    if labels.dtype.kind not in "iu" and not (
        labels.dtype.kind == "f" and np.all(labels == np.round(labels))
    ):
        raise DataError(f"{path}: y must hold integer labels, got dtype {labels.dtype}")
    labels = labels.astype(np.int64)
    if labels.size and (labels.min() < 1 or labels.max() > 10):
        bad = labels[(labels < 1) | (labels > 10)]
        raise DataError(
            f"{path}: labels out of range: found {int(bad[0])}, accepted 1..10 (10 means digit 0)"
        )
    _check_counts(images.T, labels, f"{path} (X)", f"{path} (y)")
    labels[labels == 10] = 0
    # (H, W, C, N) -> (N, C, H, W); one copy is unavoidable, MATLAB stores the sample index last.
    return np.ascontiguousarray(images.transpose(3, 2, 0, 1)), labels


def read_svhn(train_path: str | os.PathLike, test_path: str | os.PathLike) -> Arrays:
    """Read SVHN from train_32x32.mat and test_32x32.mat; labels are digits 0..9."""
    train_x, train_y = read_svhn_mat(train_path)
    test_x, test_y = read_svhn_mat(test_path)
    return Arrays(train_x, train_y, test_x, test_y, tuple(str(d) for d in range(10)))
