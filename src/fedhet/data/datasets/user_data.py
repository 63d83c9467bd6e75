"""Your own data: arrays, registered data sets, .npz files and image folders (and a federation node's
own data directory).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from fedhet.data import formats
from fedhet.data.datasets.catalog import DATASET_NAMES, USER_FORMATS
from fedhet.data.datasets.dataset import Dataset, _channel_stats, _to_dataset, input_stats
from fedhet.errors import ConfigError, DataError


def from_arrays(
    x_train,
    y_train,
    x_test,
    y_test,
    class_names: Sequence[str] | None = None,
    *,
    name: str = "arrays",
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> Dataset:
    """A :class:`Dataset` from in-memory arrays (numpy, torch, or pandas data frames).

    Images (N, H, W), (N, C, H, W) or (N, H, W, C) with C in {1, 3}, uint8 or float in [0, 1]; or a
    table's rows (N, F) of numbers, kept as float32 (a pandas DataFrame with text or categorical columns
    goes through :func:`fedhet.data.from_table`, which one-hot encodes them). Labels integers in 0..K-1.
    ``class_names`` default to "0".."K-1"; ``mean``/``std`` (per channel on [0, 1], or per feature) default
    to the train split's — for a table a federation replaces them with its clients' aggregated
    statistics. Register it (:func:`register_dataset`) to use it as ``data.dataset``.
    """
    if not isinstance(name, str) or not name or "/" in name or name in (*DATASET_NAMES, *USER_FORMATS):
        raise DataError(
            f"from_arrays(name={name!r}): give a non-empty name without '/' that is not a built-in data set "
            f"({', '.join((*DATASET_NAMES, *USER_FORMATS))})"
        )
    if hasattr(x_train, "columns") and hasattr(x_train, "dtypes"):  # a pandas DataFrame
        from fedhet.data.datasets.tables import from_table

        return _frame_dataset(from_table, x_train, y_train, x_test, y_test, class_names, name)
    as_numpy = lambda a: a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)  # noqa: E731
    arrays = formats.arrays_from(
        as_numpy(x_train),
        as_numpy(y_train),
        as_numpy(x_test),
        as_numpy(y_test),
        None if class_names is None else np.asarray(list(class_names), dtype=str),
        source=f"from_arrays({name!r})",
    )
    if len(arrays.test_y) == 0:
        raise DataError(f"from_arrays({name!r}): x_test is empty; pass the test images the runs evaluate on")
    stats = input_stats(arrays.train_x)
    assert arrays.classes is not None  # arrays_from always names the classes
    return _to_dataset(
        name, arrays, arrays.classes, stats[0] if mean is None else mean, stats[1] if std is None else std,
        f"from_arrays({name!r})",
    )  # fmt: skip


def _frame_dataset(from_table, x_train, y_train, x_test, y_test, class_names, name: str) -> Dataset:
    """from_arrays with data frames: encode the features as from_table does, keep the labels' indices."""
    label = "__label__"
    frames = []
    for x, part in ((x_train, "train"), (x_test, "test")):
        if not (hasattr(x, "columns") and hasattr(x, "dtypes")):
            raise DataError(f"from_arrays({name!r}): x_train is a DataFrame, so x_{part} must be one too")
        if label in x.columns:
            raise DataError(f"from_arrays({name!r}): a column may not be named {label!r}")
        frames.append({**{str(c): x[c] for c in x.columns}, label: np.zeros(len(x), dtype=np.int64)})
    data = from_table(frames[0], frames[1], label=label, name=name)
    arrays = formats.arrays_from(
        data.train_x.numpy(), np.asarray(y_train), data.test_x.numpy(), np.asarray(y_test),
        None if class_names is None else np.asarray(list(class_names), dtype=str),
        source=f"from_arrays({name!r})",
    )  # fmt: skip
    assert arrays.classes is not None
    return replace(
        data, train_y=torch.from_numpy(arrays.train_y), test_y=torch.from_numpy(arrays.test_y),
        classes=arrays.classes, source=f"from_arrays({name!r})",
    )  # fmt: skip


#: name -> a Dataset, or a function that returns one (called once per process, on first use)
_REGISTERED: dict[str, Dataset | Callable[[], Dataset]] = {}


def register_dataset(
    dataset: Dataset | Callable[[], Dataset], name: str | None = None, *, overwrite: bool = False
) -> str:
    """Make ``data.dataset = name`` load ``dataset`` (a :class:`Dataset` or a function returning one).

    ``name`` defaults to the dataset's own. Registration lives in this process: ``fedhet compare --jobs N``
    workers see it when it happens at import time of the calling script, or through the
    ``fedhet.datasets`` entry-point group. Returns the name.
    """
    name = name or getattr(dataset, "name", None)
    if not isinstance(name, str) or not name or "/" in name or name in (*DATASET_NAMES, *USER_FORMATS):
        raise ConfigError(
            f"register_dataset: the name {name!r} must be non-empty, without '/', and not a built-in data set"
        )
    if not isinstance(dataset, Dataset) and not callable(dataset):
        raise ConfigError(f"register_dataset({name!r}): give a Dataset or a function returning one")
    if name in _REGISTERED and not overwrite and _REGISTERED[name] is not dataset:
        raise ConfigError(
            f"a data set named {name!r} is already registered; pass overwrite=True to replace it"
        )
    _REGISTERED[name] = dataset
    return name


def _registered(name: str) -> Dataset | None:
    """The data set registered (or advertised by an installed package's entry point) under ``name``."""
    if name not in _REGISTERED:
        from importlib.metadata import entry_points

        for point in entry_points(group="fedhet.datasets"):
            if point.name == name:
                _REGISTERED[name] = point.load()
    entry = _REGISTERED.get(name)
    if entry is None:
        return None
    if not isinstance(entry, Dataset):
        entry = entry()
        if not isinstance(entry, Dataset):
            raise DataError(
                f"the function registered as data set {name!r} returned {type(entry).__name__}, not a "
                "fedhet Dataset; build one with fedhet.data.from_arrays"
            )
        _REGISTERED[name] = entry
    return entry


def _load_folder(path: Path) -> Dataset:
    """train/<class>/<image> and test/<class>/<image>; grayscale when every image has R = G = B."""
    arrays = formats.read_image_folder(path, mode="RGB")
    if len(arrays.test_y) == 0:
        raise DataError(f"{path}: test/ holds no images; put test images in test/<class>/<image>")
    rgb = arrays.train_x
    gray = all(
        np.array_equal(x[:, 0], x[:, 1]) and np.array_equal(x[:, 0], x[:, 2])
        for x in (arrays.train_x, arrays.test_x)
    )
    if gray:
        arrays = formats.Arrays(
            np.ascontiguousarray(rgb[:, :1]), arrays.train_y, np.ascontiguousarray(arrays.test_x[:, :1]),
            arrays.test_y, arrays.classes,
        )  # fmt: skip
    mean, std = _channel_stats(arrays.train_x)
    assert arrays.classes is not None  # folder names are the classes
    return _to_dataset(path.name, arrays, arrays.classes, mean, std, str(path.resolve()))


def _user_file(kind: str, path: str | os.PathLike | None, root: str | os.PathLike | None) -> Path:
    example = {
        "npz": 'data.path = "site-a.npz"',
        "csv": 'data.path = "clinic.csv" or a folder with train/<client>.csv and test.csv',
        "parquet": 'data.path = "clinic.parquet"',
    }.get(kind, 'data.path = "/srv/site-a"')
    if path is None:
        raise ConfigError(f"data.dataset = {kind!r} reads your own files: set data.path ({example})")
    p = Path(path).expanduser()
    if not p.is_absolute() and not p.exists() and root is not None and (Path(root) / p).exists():
        p = Path(root) / p
    if kind == "npz" and not p.is_file():
        raise DataError(
            f"data.path {path}: no .npz file there (looked at {p.resolve()}); pass an existing file"
        )
    if kind == "folder" and not (p / "train").is_dir():
        what = "does not exist" if not p.exists() else "has no train/ folder"
        raise DataError(
            f"data.path {path} {what}; an image folder holds train/<class>/<image>.png|jpg and "
            "test/<class>/<image>"
        )
    return p


def _load_npz(path: Path) -> Dataset:
    arrays = formats.read_npz(path)
    mean, std = input_stats(arrays.train_x)
    assert arrays.classes is not None  # read_npz always names the classes
    return _to_dataset(path.stem, arrays, arrays.classes, mean, std, str(path.resolve()))


def load_local_data(data_dir: str | os.PathLike, *, channels: int) -> tuple[formats.Arrays, bool]:
    """A federation node's own data: one ``.npz`` in ``data_dir`` (x_train/y_train, optional x_test/y_test and
    classes) or an image folder ``data_dir/train/<class>/*.png|jpg`` (optional ``test/``).

    ``channels`` is the run's input channels (1: images are read as grayscale). Returns the arrays and
    whether the data name their classes (folder names, or a ``classes`` array in the .npz). Raises DataError
    naming the folder and what it should hold.
    """
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise DataError(
            f"data-dir {folder} is not a directory; give each node a folder holding one .npz "
            "(x_train, y_train) or train/<class>/<image> files"
        )
    archives = sorted(folder.glob("*.npz"))
    if len(archives) > 1:
        raise DataError(
            f"data-dir {folder} holds {len(archives)} .npz files ({[a.name for a in archives]}); keep one"
        )
    if archives:
        arrays = formats.read_npz(archives[0], require_test=False)  # validates the file first
        with np.load(archives[0], allow_pickle=False) as archive:
            named = "classes" in archive.files
        return arrays, named
    if (folder / "train").is_dir():
        mode = "L" if channels == 1 else "RGB"
        return formats.read_image_folder(folder, mode=mode, require_test=False), True
    raise DataError(
        f"data-dir {folder} holds neither a .npz file nor a train/ folder; put x_train/y_train in one "
        ".npz, or images in train/<class>/<image>.png|jpg"
    )
