"""The user's own arrays: an .npz file (x_train, y_train, x_test, y_test, classes) or in-memory arrays."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.data.formats.arrays import Arrays, _check_counts, _check_labels, _writable
from fedhet.errors import DataError


def _npz_images(array: np.ndarray, source: str) -> np.ndarray:
    if array.ndim == 3:
        array = array[:, None]
    elif array.ndim == 4:
        channels_last = array.shape[-1] in (1, 3) and array.shape[1] not in (1, 3)
        if channels_last:
            array = array.transpose(0, 3, 1, 2)
    else:
        raise DataError(
            f"{source}: images must be (N, H, W), (N, C, H, W) or (N, H, W, C), and table rows (N, F); got "
            f"shape {array.shape}"
        )
    if array.dtype == np.uint8:
        return _writable(array)
    if array.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(array.reshape(len(array), -1)).all(axis=1)) if array.size else []
        if len(bad):
            raise DataError(
                f"{source}: {len(bad)} sample(s) hold NaN or inf values (first: sample {int(bad[0])}); "
                "fedhet does not impute: clean or drop those samples"
            )
        if array.size and (array.min() < 0 or array.max() > 1):
            raise DataError(
                f"{source}: float images must lie in [0, 1], got {array.min():.4g}..{array.max():.4g} "
                "(or store uint8 0..255); for a table's rows give (N, F) features"
            )
        return np.rint(array * 255).astype(np.uint8)
    if array.dtype.kind in "iu":
        if array.size and (array.min() < 0 or array.max() > 255):
            raise DataError(f"{source}: integer images must lie in 0..255, got {array.min()}..{array.max()}")
        return array.astype(np.uint8)
    raise DataError(f"{source}: images must be uint8 (or float in [0, 1]), got dtype {array.dtype}")


def read_npz(path: str | os.PathLike, *, require_test: bool = True) -> Arrays:
    """Read user data from an .npz with keys x_train, y_train, x_test, y_test (and optional `classes`).

    Images may be (N,H,W), (N,C,H,W) or (N,H,W,C) with C in {1,3}; uint8, or float in [0,1] (scaled
    and rounded to uint8). x_train (N, F) is a table's rows, kept as float32. Loaded with
    allow_pickle=False. With ``require_test=False`` x_test/y_test may be absent (a federation node's data)
    and give an empty test split.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    required = ("x_train", "y_train", "x_test", "y_test") if require_test else ("x_train", "y_train")
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = [k for k in required if k not in archive.files]
            if missing:
                raise DataError(f"{path}: missing key(s) {missing}; an fedhet .npz holds {list(required)}")
            content = {
                k: archive[k]
                for k in ("x_train", "y_train", "x_test", "y_test", "classes")
                if k in archive.files
            }
            if "x_test" not in content:
                content["x_test"] = np.zeros((0, *content["x_train"].shape[1:]), dtype=np.uint8)
                content["y_test"] = np.zeros(0, dtype=np.int64)
    except DataError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise DataError(
            f"{path}: cannot read the .npz ({type(err).__name__}: {err}); object arrays are refused, store "
            "numeric arrays only"
        ) from err
    return arrays_from(
        content["x_train"],
        content["y_train"],
        content["x_test"],
        content["y_test"],
        content.get("classes"),
        source=str(path),
    )


def _table_rows(array: np.ndarray, source: str) -> np.ndarray:
    """A table's rows (N, F) as float32, unquantised; NaN/inf refused naming the sample and the column."""
    if array.ndim != 2:
        raise DataError(f"{source}: table rows must be (N, F), got shape {array.shape}")
    if array.dtype.kind not in "biuf":
        raise DataError(
            f"{source}: table rows must be numbers, got dtype {array.dtype}; encode text columns first, or "
            "pass a pandas DataFrame to fedhet.data.from_table, which one-hot encodes them"
        )
    rows = array.astype(np.float32)
    bad = np.argwhere(~np.isfinite(rows))
    if len(bad):
        raise DataError(
            f"{source}: {len(bad)} NaN or inf value(s) (first: sample {int(bad[0][0])}, feature "
            f"{int(bad[0][1])}); fedhet does not impute: fill them (e.g. the feature's median) or drop "
            "those samples"
        )
    return _writable(rows)


def _refuse_label_gaps(labels: np.ndarray, count: int, source: str) -> None:
    """Labels are class indices 0..K-1: a gap (labels {0, 5, 9}) would train as K classes, some empty."""
    empty = np.setdiff1d(np.arange(count), labels)
    if empty.size:
        used = np.unique(labels)
        shown = ", ".join(str(int(c)) for c in used[:10]) + (" …" if used.size > 10 else "")
        raise DataError(
            f"{source}: the labels use {used.size} values ({shown}) but as class indices they make {count} "
            f"classes, {empty.size} of them empty (e.g. {int(empty[0])}); renumber them 0..K-1 "
            "(np.unique(y, return_inverse=True)), or pass class names (all K) to keep the empty classes"
        )


def arrays_from(
    x_train: Any,
    y_train: Any,
    x_test: Any,
    y_test: Any,
    classes: Any = None,
    *,
    source: str = "from_arrays",
) -> Arrays:
    """Validate user arrays (an .npz's, or :func:`fedhet.data.from_arrays`'s) into :class:`Arrays`.

    Images as :func:`read_npz` accepts them; labels integers (N,); ``classes`` 1-D strings, or None for
    "0".."K-1" with K = 1 + the largest label. Errors name ``source`` and the array at fault.
    """
    x_train, x_test = np.asarray(x_train), np.asarray(x_test)
    if len(x_train) == 0:
        raise DataError(f"{source}: x_train is empty; a data set needs training images")
    table = x_train.ndim == 2
    read = _table_rows if table else _npz_images
    train_x = read(x_train, f"{source} (x_train)")
    test_x = read(x_test, f"{source} (x_test)")
    if train_x.shape[1:] != test_x.shape[1:]:
        what = "rows have" if table else "images are"
        raise DataError(f"{source}: x_train {what} {train_x.shape[1:]} but x_test {what} {test_x.shape[1:]}")
    names: tuple[str, ...] | None = None
    if classes is not None:
        classes = np.asarray(classes)
        if classes.ndim != 1 or classes.dtype.kind not in "UO" or len(set(classes.tolist())) != len(classes):
            raise DataError(f"{source}: 'classes' must be a 1-D array of distinct strings")
        names = tuple(str(c) for c in classes)
    num_classes = len(names) if names is not None else None
    train_y = _check_labels(np.asarray(y_train).reshape(-1), num_classes, f"{source} (y_train)")
    test_y = _check_labels(np.asarray(y_test).reshape(-1), num_classes, f"{source} (y_test)")
    _check_counts(train_x, train_y, f"{source} (x_train)", f"{source} (y_train)")
    _check_counts(test_x, test_y, f"{source} (x_test)", f"{source} (y_test)")
    if names is None:
        if min(train_y.min(initial=0), test_y.min(initial=0)) < 0:
            raise DataError(f"{source}: labels must be >= 0")
        count = int(max(train_y.max(initial=-1), test_y.max(initial=-1))) + 1
        _refuse_label_gaps(np.concatenate([train_y, test_y]), count, source)
        names = tuple(str(i) for i in range(count))
    return Arrays(train_x, _writable(train_y), test_x, _writable(test_y), names)
