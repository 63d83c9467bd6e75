"""load_dataset (a built-in name, a registered one or your own files) and dataset_status."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.data import formats
from fedhet.data.datasets.cache import _read_with_cache, cache_root
from fedhet.data.datasets.catalog import (
    _DIGITS_INFO,
    _SPECS,
    DATASET_NAMES,
    DIGIT_CLASSES,
    DIGITS_SPLIT,
    SKLEARN_TABLES,
    USER_FORMATS,
)
from fedhet.data.datasets.dataset import Dataset, _channel_stats, _to_dataset
from fedhet.data.datasets.locations import _fix_hint, _is_under, _locate, _missing_error
from fedhet.data.datasets.user_data import _REGISTERED, _load_folder, _load_npz, _registered, _user_file
from fedhet.errors import ConfigError, DataError

# The package's logger: a log line names fedhet.data.datasets whichever of its modules writes it.
log = logging.getLogger("fedhet.data.datasets")

_ALIASES = {
    "fashion_mnist": "fashion-mnist",
    "fashionmnist": "fashion-mnist",
    "fmnist": "fashion-mnist",
    "cifar-10": "cifar10",
    "cifar-100": "cifar100",
    "cinic-10": "cinic10",
    "tiny_imagenet": "tiny-imagenet",
    "tinyimagenet": "tiny-imagenet",
}


def _canonical(name: str) -> str:
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in DATASET_NAMES:
        raise ConfigError(
            f"unknown dataset {name!r}; accepted: {', '.join(DATASET_NAMES)}; your own files with "
            "data.dataset = 'npz' or 'folder' and data.path; or a name given to fedhet.data.register_dataset"
            + (f" (registered here: {', '.join(sorted(_REGISTERED))})" if _REGISTERED else "")
        )
    return key


def _canonical_or_none(name: str) -> str | None:
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    return key if key in DATASET_NAMES else None


def _load_digits() -> Dataset:
    """scikit-learn's 8x8 digits, pixel values 0..16 scaled to uint8 by round(v * 255 / 16); the split is
    train_test_split(arange(1797), test_size=0.25, stratify=y, random_state=0) -> 1347 train / 450 test,
    in the order that call returns; mean/std are computed from the train split.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)[:, None]
    labels = digits.target.astype(np.int64)
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=0.25, stratify=labels, random_state=0
    )
    arrays = formats.Arrays(images[train_idx], labels[train_idx], images[test_idx], labels[test_idx])
    mean, std = _channel_stats(arrays.train_x)
    return _to_dataset(
        "digits", arrays, DIGIT_CLASSES, mean, std, f"sklearn.datasets.load_digits, {DIGITS_SPLIT}"
    )


def load_dataset(
    name: str,
    root: str | os.PathLike | None = None,
    *,
    cache: bool = True,
    path: str | os.PathLike | None = None,
    table: Mapping[str, Any] | None = None,
) -> Dataset:
    """Load a data set: a built-in name (DATASET_NAMES), a registered one (:func:`register_dataset`), or your
    own files: ``"npz"`` / ``"folder"`` / ``"csv"`` / ``"parquet"`` at ``path`` (stats from their train
    split). A ``name`` ending in ``.npz`` is that file's path. ``table`` holds the keyword arguments of
    :func:`~fedhet.data.datasets.tables.load_table_files` (label, client, categorical, test_path) for csv
    and parquet.

    Built-in names are looked for in `root`, then $FEDHET_DATA, then known locations; raises DataError
    naming every place looked in. cache=False neither reads nor writes the decoded-image cache.
    """
    if name in ("csv", "parquet"):
        from fedhet.data.datasets.tables import load_table_files

        return load_table_files(_user_file(name, path, root), **dict(table or {}))
    if name in USER_FORMATS:
        file = _user_file(name, path, root)
        return _load_npz(file) if name == "npz" else _load_folder(file)
    if path is not None:
        raise ConfigError(
            f"data.path is read only with data.dataset = 'npz', 'folder', 'csv' or 'parquet', not {name!r}; "
            "drop data.path, or set data.root to where the built-in data set lies"
        )
    if name not in DATASET_NAMES and _canonical_or_none(name) is None:
        registered = _registered(name)
        if registered is not None:
            return registered
    if str(name).lower().endswith(".npz"):
        path = Path(name).expanduser()
        if not path.is_file() and root is not None and (Path(root) / path).is_file():
            path = Path(root) / path
        if not path.is_file():
            raise DataError(
                f"{name}: .npz file not found (looked at {path.resolve()}); pass an existing path"
            )
        return _load_npz(path)
    key = _canonical(name)
    if root is not None and not Path(root).expanduser().is_dir():
        what = "is a file, not a directory" if Path(root).expanduser().exists() else "does not exist"
        raise DataError(
            f"--data-root {root} {what}; pass the directory that holds the {key} files, or omit --data-root "
            "to use $FEDHET_DATA and the known locations"
        )
    if key == "digits":
        return _load_digits()
    if key in SKLEARN_TABLES:
        from fedhet.data.datasets.tables import load_sklearn_table

        return load_sklearn_table(key)
    spec = _SPECS[key]
    location, layout, looked = _locate(spec, root)
    if location is None or layout is None:
        raise _missing_error(spec, looked)
    if root is not None and not _is_under(location, Path(root).expanduser()):
        # An explicit --data-root is what the user wants trained on: never fall back past it silently.
        accepted = "; ".join(layout.description for layout in spec.layouts)
        raise DataError(
            f"dataset {key!r} not found under --data-root {root} (looked in {root} and its subfolders "
            f"{list(spec.subdirs)} for any of: {accepted}). A copy exists at {location}: omit --data-root to "
            "use it, or put the files under the directory you gave"
        )
    arrays = _read_with_cache(key, location, layout, cache)
    classes = arrays.classes if spec.classes is None else spec.classes
    if classes is None or len(classes) != spec.num_classes:
        raise DataError(f"{location}: {key} needs {spec.num_classes} class names, the files give {classes}")
    if arrays.classes is not None and spec.classes is not None and tuple(arrays.classes) != spec.classes:
        raise DataError(
            f"{location}: class names {list(arrays.classes)} differ from the official {list(spec.classes)}"
        )
    for part, labels in (("train", arrays.train_y), ("test", arrays.test_y)):
        if labels.size and (labels.min() < 0 or labels.max() >= spec.num_classes):
            raise DataError(f"{location}: {part} labels exceed 0..{spec.num_classes - 1}")
    if arrays.train_x.shape[1] != spec.input_shape[0]:
        raise DataError(
            f"{location}: {key} images have {arrays.train_x.shape[1]} channels, "
            f"expected {spec.input_shape[0]}"
        )
    for part, images in (("train", arrays.train_x), ("test", arrays.test_x)):
        if len(images) == 0:
            raise DataError(f"{location}: the {key} {part} set holds 0 images; the files are truncated")
        if tuple(images.shape[1:]) != tuple(spec.input_shape):
            raise DataError(
                f"{location}: {key} {part} images have shape {tuple(images.shape[1:])}, expected "
                f"{tuple(spec.input_shape)} (channels, height, width); these are not {key}'s official files"
            )
    log.info("loaded %s from %s", key, location)
    return _to_dataset(key, arrays, classes, spec.mean, spec.std, str(location))


def dataset_status(root: str | os.PathLike | None = None) -> list[dict]:
    """One dict per data set for `fedhet datasets [--json]`: where it was found (files are only detected,
    never decoded; train_size/test_size/num_classes/input_shape are the official values) or looked for.
    """
    rows = []
    for name in DATASET_NAMES:
        if name == "digits":
            rows.append(
                {
                    "name": name,
                    "available": True,
                    "location": "scikit-learn (sklearn.datasets.load_digits)",
                    **{k: (list(v) if isinstance(v, tuple) else v) for k, v in _DIGITS_INFO.items()},
                    "looked_in": [],
                    "note": f"bundled with scikit-learn; fixed split {DIGITS_SPLIT}",
                }
            )
            continue
        if name in SKLEARN_TABLES:
            size, features, classes = SKLEARN_TABLES[name]
            test = size - int(size * 0.75)
            rows.append(
                {
                    "name": name,
                    "available": True,
                    "location": f"scikit-learn (sklearn.datasets.load_{name.replace('-', '_')})",
                    "train_size": size - test,
                    "test_size": test,
                    "num_classes": classes,
                    "input_shape": [features],
                    "looked_in": [],
                    "note": "a table bundled with scikit-learn; fixed split train_test_split(test_size=0.25, "
                    "stratify=y, random_state=0)",
                }
            )
            continue
        spec = _SPECS[name]
        location, layout, looked = _locate(spec, root)
        if location is not None and layout is not None:
            note = f"found as {layout.description}"
            if location.name.startswith("cifar10-jpg"):
                note += "; JPEG copy: pixels differ from the originals by about 6/255 on average"
            if layout.decodes_images:
                note += f"; decoded images are cached under {cache_root() / 'datasets'}"
        else:
            note = f"not found; {_fix_hint(spec)}"
        rows.append(
            {
                "name": name,
                "available": location is not None,
                "location": str(location) if location is not None else None,
                "train_size": spec.train_size,
                "test_size": spec.test_size,
                "num_classes": spec.num_classes,
                "input_shape": list(spec.input_shape),
                "looked_in": [str(p) for p, _why in looked],
                "note": note,
            }
        )
    return rows
