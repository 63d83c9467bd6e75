"""Pure readers for the official file formats of the data sets fedhet knows.

Spec: paper-results.md, "Data available offline".

Each reader takes paths and returns numpy arrays: images uint8 in (N, C, H, W) order, built in that layout
directly; labels int64 (N,). Malformed files raise `DataError` naming the file and what is wrong with it.
Containers: a directory, a zip archive, or a tar archive (plain, .gz, .bz2 or .xz); members are read in
sorted name order. Official pickles (CIFAR python batches) go through a restricted unpickler.
"""

from __future__ import annotations

import builtins
import codecs
import functools
import gzip
import importlib
import io
import os
import pickle
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from fedhet.errors import DataError

__all__ = [
    "CIFAR10_CLASSES",
    "IMAGE_EXTENSIONS",
    "Arrays",
    "read_cifar_python",
    "read_cinic10",
    "read_emnist",
    "read_idx",
    "read_idx_dataset",
    "read_image_folder",
    "read_npz",
    "read_svhn",
    "read_svhn_mat",
    "read_tiny_imagenet",
    "restricted_loads",
]

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
IMAGE_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png")

# idx type byte -> element dtype (big-endian as stored); see "THE IDX FILE FORMAT" at
# http://yann.lecun.com/exdb/mnist/.
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
# A header that claims more than this is garbage, not a data set; refusing it avoids a huge allocation.
_IDX_MAX_BYTES = 1 << 36


@dataclass(frozen=True, eq=False)
class Arrays:
    """A decoded train/test pair: images uint8 (N, C, H, W), labels int64 (N,), class names if known."""

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


# --------------------------------------------------------------------------------------------------------
# idx (MNIST, Fashion-MNIST, EMNIST)
# --------------------------------------------------------------------------------------------------------
def _read_idx_stream(stream: IO[bytes], source: str) -> np.ndarray:
    header = stream.read(4)
    if len(header) < 4:
        raise DataError(
            f"{source}: truncated idx file: {len(header)} bytes, the 4-byte magic number is missing"
        )
    if header[0] != 0 or header[1] != 0 or header[2] not in _IDX_DTYPES or header[3] == 0:
        raise DataError(
            f"{source}: wrong magic number 0x{header.hex()}: an idx file starts with 0x0000TTDD, "
            "type TT one of "
            f"{', '.join(f'{code:02x}' for code in _IDX_DTYPES)} and DD >= 1 dimensions (0x00000803 for "
            "images, 0x00000801 for labels); this is not an idx file"
        )
    ndim = header[3]
    dims = stream.read(4 * ndim)
    if len(dims) < 4 * ndim:
        raise DataError(
            f"{source}: truncated idx file: the header announces {ndim} dimensions but ends early"
        )
    shape = struct.unpack(f">{ndim}I", dims)
    dtype = _IDX_DTYPES[header[2]]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if expected > _IDX_MAX_BYTES:
        raise DataError(
            f"{source}: idx header claims shape {shape} ({expected} bytes); the header is corrupted"
        )
    out = np.empty(shape, dtype=dtype)
    buffer = memoryview(out.reshape(-1).view(np.uint8))
    filled = 0
    while filled < expected:
        got = stream.readinto(buffer[filled:])
        if not got:
            break
        filled += got
    if filled < expected:
        raise DataError(
            f"{source}: truncated idx file: the header announces shape {shape} ({expected} bytes of data) "
            f"but only {filled} bytes follow; download the file again"
        )
    if stream.read(1):
        raise DataError(
            f"{source}: {expected} bytes of data for shape {shape} are followed by extra bytes; the header "
            "does not match the data (corrupted or concatenated file)"
        )
    if dtype.byteorder == ">":
        out = out.astype(dtype.newbyteorder("="))
    return out


def _read_idx_from(opener: Callable[[], IO[bytes]], gzipped: bool, source: str) -> np.ndarray:
    try:
        with opener() as raw:
            if gzipped:
                with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
                    return _read_idx_stream(stream, source)
            return _read_idx_stream(raw, source)
    except DataError:
        raise
    except FileNotFoundError as err:
        raise DataError(f"{source}: file not found") from err
    except (EOFError, zlib.error, gzip.BadGzipFile, zipfile.BadZipFile) as err:
        raise DataError(
            f"{source}: truncated or corrupted gzip stream ({err}); download the file again"
        ) from err


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one idx file (gzip or raw, detected from its first bytes) into a native-endian array."""
    path = Path(path)
    try:
        with open(path, "rb") as probe:
            gzipped = probe.read(2) == b"\x1f\x8b"
    except FileNotFoundError as err:
        raise DataError(f"{path}: file not found") from err
    return _read_idx_from(lambda: open(path, "rb"), gzipped, str(path))


def _idx_images(array: np.ndarray, source: str) -> np.ndarray:
    if array.ndim != 3 or array.dtype != np.uint8:
        raise DataError(
            f"{source}: expected an idx3 ubyte image file (magic 0x00000803), got {array.ndim} dimensions of "
            f"{array.dtype}"
        )
    return array[:, None, :, :]


def _idx_labels(array: np.ndarray, source: str, num_classes: int | None) -> np.ndarray:
    if array.ndim != 1 or array.dtype != np.uint8:
        raise DataError(
            f"{source}: expected an idx1 ubyte label file (magic 0x00000801), got {array.ndim} dimensions "
            f"of {array.dtype}"
        )
    return _check_labels(array, num_classes, source)


def _transpose_in_place(images: np.ndarray, chunk: int = 8192) -> None:
    """Swap H and W of square images chunk by chunk: the peak extra memory is one chunk, not a copy."""
    for start in range(0, len(images), chunk):
        block = images[start : start + chunk]
        block[...] = block.transpose(0, 1, 3, 2).copy()


def _idx_pair(images: np.ndarray, labels: np.ndarray, sources: tuple[str, str], num_classes: int | None):
    x = _idx_images(images, sources[0])
    y = _idx_labels(labels, sources[1], num_classes)
    _check_counts(x, y, *sources)
    return x, y


def read_idx_dataset(
    train_images: str | os.PathLike,
    train_labels: str | os.PathLike,
    test_images: str | os.PathLike,
    test_labels: str | os.PathLike,
    *,
    num_classes: int | None = None,
    transposed: bool = False,
) -> Arrays:
    """Read the four idx files of an MNIST-style release; images (N, 1, H, W), labels < num_classes.

    transposed=True undoes EMNIST's column-major storage (its images are saved transposed).
    """
    paths = [Path(p) for p in (train_images, train_labels, test_images, test_labels)]
    arrays = [read_idx(p) for p in paths]
    train_x, train_y = _idx_pair(arrays[0], arrays[1], (str(paths[0]), str(paths[1])), num_classes)
    test_x, test_y = _idx_pair(arrays[2], arrays[3], (str(paths[2]), str(paths[3])), num_classes)
    if transposed:
        _untranspose(train_x, str(paths[0]))
        _untranspose(test_x, str(paths[2]))
    return Arrays(train_x, train_y, test_x, test_y)


def _untranspose(images: np.ndarray, source: str) -> None:
    if images.shape[2] != images.shape[3]:
        raise DataError(
            f"{source}: EMNIST images must be square to undo the transposition, got {images.shape[2:]}"
        )
    _transpose_in_place(images)


def _emnist_stem(split: str, part: str, kind: str) -> str:
    return f"emnist-{split}-{part}-{kind}-ubyte"


def read_emnist(
    source: str | os.PathLike, *, split: str = "byclass", num_classes: int | None = None
) -> Arrays:
    """Read EMNIST from its official idx files (a directory, its gzip/ subfolder, or the official gzip.zip).

    EMNIST stores each image transposed (column-major); the result is in the usual row-major orientation.
    """
    source = Path(source)
    kinds = (
        ("train", "images-idx3"),
        ("train", "labels-idx1"),
        ("test", "images-idx3"),
        ("test", "labels-idx1"),
    )
    stems = [_emnist_stem(split, part, kind) for part, kind in kinds]
    if source.is_dir():
        folder = source / "gzip" if not _find_raw_or_gz(source, stems[0]) else source
        paths = []
        for stem in stems:
            found = _find_raw_or_gz(folder, stem)
            if found is None:
                raise DataError(f"{folder}: EMNIST file {stem}[.gz] is missing (split {split!r})")
            paths.append(found)
        return read_idx_dataset(*paths, num_classes=num_classes, transposed=True)
    if not zipfile.is_zipfile(source):
        raise DataError(f"{source}: not a directory or a zip archive holding the EMNIST idx files")
    arrays, sources = [], []
    try:
        with zipfile.ZipFile(source) as archive:
            members = {_basename(name): name for name in archive.namelist() if not _is_junk(name)}
            for stem in stems:
                member = members.get(stem + ".gz") or members.get(stem)
                if member is None:
                    raise DataError(f"{source}: the archive holds no {stem}[.gz] (split {split!r})")
                sources.append(f"{source}!{member}")
                opener = lambda m=member: archive.open(m)  # noqa: E731
                arrays.append(_read_idx_from(opener, member.endswith(".gz"), sources[-1]))
    except zipfile.BadZipFile as err:
        raise DataError(f"{source}: corrupted zip archive ({err}); download it again") from err
    train_x, train_y = _idx_pair(arrays[0], arrays[1], (sources[0], sources[1]), num_classes)
    test_x, test_y = _idx_pair(arrays[2], arrays[3], (sources[2], sources[3]), num_classes)
    _untranspose(train_x, sources[0])
    _untranspose(test_x, sources[2])
    return Arrays(train_x, train_y, test_x, test_y)


def _find_raw_or_gz(folder: Path, stem: str) -> Path | None:
    for candidate in (folder / stem, folder / (stem + ".gz")):
        if candidate.is_file():
            return candidate
    return None


def _basename(name: str) -> str:
    """The last component of a posix member name (archives always use '/')."""
    return name.rstrip("/").rsplit("/", 1)[-1]


# --------------------------------------------------------------------------------------------------------
# Restricted unpickler (CIFAR python batches)
# --------------------------------------------------------------------------------------------------------
_BUILTIN_NAMES = (
    "dict",
    "list",
    "tuple",
    "set",
    "frozenset",
    "bytes",
    "bytearray",
    "str",
    "int",
    "float",
    "complex",
    "bool",
)


def _numpy_core(module: str, name: str) -> Any:
    """numpy >= 2 keeps its internals in numpy._core; numpy 1.x in numpy.core."""
    try:
        return getattr(importlib.import_module(f"numpy._core.{module}"), name)
    except ImportError:
        return getattr(importlib.import_module(f"numpy.core.{module}"), name)


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    # Python 3 pickles bytes at protocol <= 2 as _codecs.encode(str, 'latin1'); other codecs are refused.
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise DataError(
            f"refused _codecs.encode with encoding {encoding!r}: only latin1 appears in array pickles"
        )
    return codecs.encode(text, "latin1")


@functools.cache
def _allowed_globals() -> dict[tuple[str, str], Any]:
    """(module, name) -> object for every global a pickle may reference; py2 pickles say __builtin__."""
    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _latin1_encode,
    }
    for prefix in ("numpy.core", "numpy._core"):
        allowed[(f"{prefix}.multiarray", "_reconstruct")] = _numpy_core("multiarray", "_reconstruct")
        allowed[(f"{prefix}.multiarray", "scalar")] = _numpy_core("multiarray", "scalar")
        allowed[(f"{prefix}.numeric", "_frombuffer")] = _numpy_core("numeric", "_frombuffer")
    for module in ("builtins", "__builtin__"):
        for name in _BUILTIN_NAMES:
            allowed[(module, name)] = getattr(builtins, name)
    return allowed


class _RestrictedUnpickler(pickle.Unpickler):
    """Admits only numpy arrays, dtypes, numpy scalars and builtin containers; any other global is refused."""

    def __init__(self, file: IO[bytes], source: str) -> None:
        super().__init__(file, encoding="bytes")
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        found = _allowed_globals().get((module, name))
        if found is None:
            raise DataError(
                f"{self._source}: refused to unpickle: the pickle references {module}.{name}, but only numpy "
                "arrays/dtypes and builtin containers (dict, list, bytes, str, int, ...) are admitted; an "
                "official CIFAR batch holds nothing else, so this file is not one; nothing was executed"
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise DataError(f"{self._source}: refused to unpickle: the pickle uses persistent ids")


def restricted_loads(data: bytes, source: str = "<pickle>") -> Any:
    """Unpickle bytes admitting only numpy arrays/dtypes and builtins (DESIGN.md: no arbitrary pickles).

    Anything else (a class instance, os.system, builtins.eval, ...) raises DataError before it is called.
    """
    try:
        return _RestrictedUnpickler(io.BytesIO(data), source).load()
    except DataError:
        raise
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        AttributeError,
        IndexError,
        KeyError,
        struct.error,
        MemoryError,
        RecursionError,
    ) as err:
        raise DataError(
            f"{source}: not a readable pickle ({type(err).__name__}: {err}); the file is truncated or "
            "corrupted: download it again"
        ) from err


# --------------------------------------------------------------------------------------------------------
# Containers: directory, zip, tar(.gz)
# --------------------------------------------------------------------------------------------------------
def _is_junk(name: str) -> bool:
    # macOS archive leftovers (__MACOSX/, ._name) and hidden files are never data.
    return any(part.startswith(".") or part == "__MACOSX" for part in name.split("/") if part)


class _Container:
    """The files of a directory, a zip or a tar archive, by posix relative name (only those `want` accepts).

    A tar archive is streamed once and the accepted members are kept in memory (gzip cannot seek cheaply).
    """

    def __init__(self, source: Path, want: Callable[[str], bool], max_depth: int | None = None) -> None:
        self.source = source
        self._zip: zipfile.ZipFile | None = None
        self._data: dict[str, bytes] | None = None

        def accept(name: str) -> bool:
            if _is_junk(name):
                return False
            if max_depth is not None and name.count("/") > max_depth:
                return False
            return want(name)

        if source.is_dir():
            names = []
            for folder, subdirs, files in os.walk(source):
                rel = Path(folder).relative_to(source).as_posix()
                rel = "" if rel == "." else rel + "/"
                if max_depth is not None and rel.count("/") >= max_depth:
                    subdirs[:] = []
                subdirs[:] = [d for d in subdirs if not d.startswith(".")]
                names.extend(rel + f for f in files if accept(rel + f))
            self.names = sorted(names)
        elif not source.exists():
            raise DataError(f"{source}: no such file or directory")
        elif zipfile.is_zipfile(source):
            try:
                self._zip = zipfile.ZipFile(source)
                self.names = sorted(
                    i.filename for i in self._zip.infolist() if not i.is_dir() and accept(i.filename)
                )
            except (zipfile.BadZipFile, OSError) as err:
                raise DataError(f"{source}: corrupted zip archive ({err})") from err
        elif tarfile.is_tarfile(source):
            self._data = {}
            try:
                with tarfile.open(source, mode="r|*") as archive:
                    for member in archive:
                        name = member.name.removeprefix("./")
                        if member.isfile() and accept(name):
                            handle = archive.extractfile(member)
                            assert handle is not None  # a regular file member always has data
                            self._data[name] = handle.read()
            except (tarfile.TarError, EOFError, zlib.error, OSError) as err:
                raise DataError(
                    f"{source}: truncated or corrupted tar archive ({err}); download it again"
                ) from err
            self.names = sorted(self._data)
        else:
            raise DataError(f"{source}: neither a directory, a zip archive nor a tar(.gz) archive")

    def read(self, name: str) -> bytes:
        """The bytes of one member."""
        if self._data is not None:
            return self._data[name]
        if self._zip is not None:
            try:
                return self._zip.read(name)
            except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as err:
                raise DataError(f"{self.source}: cannot read member {name} ({err})") from err
        try:
            return (self.source / name).read_bytes()
        except OSError as err:
            raise DataError(f"{self.source / name}: cannot read ({err})") from err

    def describe(self, name: str) -> str:
        """How to name a member in an error message."""
        return (
            str(self.source / name) if self._data is None and self._zip is None else f"{self.source}!{name}"
        )

    def close(self) -> None:
        """Release the archive and the members kept in memory."""
        if self._zip is not None:
            self._zip.close()
        self._data = None

    def __enter__(self) -> _Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _find_prefix(names: Iterable[str], marker: str, source: Path) -> str:
    """The folder ('' or 'top/') holding `marker`: archives often wrap everything in one top folder."""
    prefixes = set()
    for name in names:
        parts = name.split("/")
        if parts[0] == marker and len(parts) > 1:
            prefixes.add("")
        elif len(parts) > 2 and parts[1] == marker:
            prefixes.add(parts[0] + "/")
    if not prefixes:
        raise DataError(
            f"{source}: no {marker}/ folder with images found (expected {marker}/<class>/<image>)"
        )
    if len(prefixes) > 1:
        raise DataError(
            f"{source}: {marker}/ appears under several folders ({sorted(prefixes)}); point at one of them"
        )
    return prefixes.pop()


# --------------------------------------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------------------------------------
def _decode_images(container: _Container, names: list[str], mode: str) -> np.ndarray:
    """Decode JPEG/PNG members into one preallocated uint8 (N, C, H, W) array; all must share one size."""
    from PIL import Image

    channels = {"RGB": 3, "L": 1}[mode]
    out: np.ndarray | None = None
    size: tuple[int, int] = (0, 0)
    for index, name in enumerate(names):
        data = container.read(name)
        try:
            with Image.open(io.BytesIO(data), formats=("JPEG", "PNG")) as image:
                pixels = np.asarray(image if image.mode == mode else image.convert(mode))
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
            raise DataError(f"{container.describe(name)}: cannot decode image ({err})") from err
        if out is None:
            size = pixels.shape[:2]
            out = np.empty((len(names), channels, *size), dtype=np.uint8)
        elif pixels.shape[:2] != size:
            raise DataError(
                f"{container.describe(name)}: image is {pixels.shape[1]}x{pixels.shape[0]} but the first "
                f"image ({container.describe(names[0])}) is {size[1]}x{size[0]}; all images of a data set "
                "must share one size"
            )
        if channels == 1:
            out[index, 0] = pixels
        else:
            out[index] = pixels.transpose(2, 0, 1)
    if out is None:
        raise DataError(f"{container.source}: no images to decode")
    return out


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def _split_members(container: _Container, prefix: str, split: str) -> tuple[list[str], list[str]]:
    """Members prefix/split/<class>/<image>, sorted; returns (names, class folder of each)."""
    start = f"{prefix}{split}/"
    names, folders = [], []
    for name in container.names:
        if not name.startswith(start) or not _is_image(name):
            continue
        parts = name[len(start) :].split("/")
        if len(parts) != 2:
            raise DataError(
                f"{container.describe(name)}: expected {split}/<class>/<image>, but this image sits "
                f"{'directly in' if len(parts) == 1 else 'deeper under'} {split}/"
            )
        names.append(name)
        folders.append(parts[0])
    if not names:
        raise DataError(
            f"{container.source}: no images under {start} (expected {start}<class>/<image>.png|jpg)"
        )
    return names, folders


def _labels_for(
    folders: list[str], classes: tuple[str, ...], container: _Container, split: str
) -> np.ndarray:
    index = {name: i for i, name in enumerate(classes)}
    unknown = sorted(set(folders) - index.keys())
    if unknown:
        raise DataError(
            f"{container.source}: {split}/ has class folders {unknown} that are not among the accepted "
            f"classes {list(classes)}"
        )
    return np.fromiter((index[f] for f in folders), dtype=np.int64, count=len(folders))


def read_image_folder(
    source: str | os.PathLike,
    *,
    classes: Iterable[str] | None = None,
    train_dir: str = "train",
    test_dir: str = "test",
    mode: str = "RGB",
    require_test: bool = True,
) -> Arrays:
    """Read train/<class>/<image> and test/<class>/<image> (.jpg/.jpeg/.png) from a dir, zip or tar(.gz).

    Members are decoded in sorted path order; label = index of the folder name in `classes`, or in the
    sorted train folder names when classes is None. One optional top folder wrapping everything is allowed.
    With ``require_test=False`` a missing test/ folder gives an empty test split (a federation node's data).
    """
    if mode not in ("RGB", "L"):
        raise ValueError(f"mode must be 'RGB' or 'L', got {mode!r}")
    source = Path(source)
    splits = {train_dir, test_dir}

    def want(name: str) -> bool:
        parts = name.split("/")
        return _is_image(name) and any(p in splits for p in parts[:2])

    with _Container(source, want) as container:
        prefix = _find_prefix(container.names, train_dir, source)
        train_names, train_folders = _split_members(container, prefix, train_dir)
        has_test = require_test or any(n.startswith(f"{prefix}{test_dir}/") for n in container.names)
        test_names, test_folders = _split_members(container, prefix, test_dir) if has_test else ([], [])
        class_list = tuple(classes) if classes is not None else tuple(sorted(set(train_folders)))
        train_y = _labels_for(train_folders, class_list, container, train_dir)
        test_y = _labels_for(test_folders, class_list, container, test_dir)
        train_x = _decode_images(container, train_names, mode)
        test_x = (
            _decode_images(container, test_names, mode)
            if test_names
            else np.zeros((0, *train_x.shape[1:]), dtype=np.uint8)
        )
    if train_x.shape[1:] != test_x.shape[1:]:
        raise DataError(
            f"{source}: train images are {train_x.shape[1:]} but test images are {test_x.shape[1:]}"
        )
    return Arrays(train_x, train_y, test_x, test_y, class_list)


def read_cinic10(source: str | os.PathLike) -> Arrays:
    """Read CINIC-10 (train|valid|test/<class>/*.png, a directory or CINIC-10.tar.gz): train, test.

    The valid/ split is not read. Classes are CIFAR-10's, in CIFAR-10's order (Darlow et al., 2018).
    """
    return read_image_folder(source, classes=CIFAR10_CLASSES, train_dir="train", test_dir="test", mode="RGB")


def read_tiny_imagenet(source: str | os.PathLike) -> Arrays:
    """Read Tiny-ImageNet-200 (directory or tiny-imagenet-200.zip): train/<wnid>/images/*.JPEG as train,
    val/images/*.JPEG labelled by val/val_annotations.txt as test; classes = sorted wnids of wnids.txt.
    """
    source = Path(source)

    def want(name: str) -> bool:
        base = name.rsplit("/", 1)[-1]
        return base in ("wnids.txt", "val_annotations.txt") or (
            _is_image(name) and any(p in ("train", "val") for p in name.split("/")[:2])
        )

    with _Container(source, want) as container:
        wnid_files = [n for n in container.names if n.rsplit("/", 1)[-1] == "wnids.txt" and n.count("/") <= 1]
        if len(wnid_files) != 1:
            raise DataError(
                f"{source}: expected exactly one wnids.txt at the top (or under one top folder), found "
                f"{wnid_files or 'none'}"
            )
        prefix = wnid_files[0][: -len("wnids.txt")]
        wnids = container.read(wnid_files[0]).decode("utf-8").split()
        if not wnids or len(set(wnids)) != len(wnids):
            raise DataError(f"{container.describe(wnid_files[0])}: expected distinct class ids, one per line")
        classes = tuple(sorted(wnids))
        index = {w: i for i, w in enumerate(classes)}

        train_names, train_labels = [], []
        for name in container.names:
            if not name.startswith(prefix + "train/") or not _is_image(name):
                continue
            parts = name[len(prefix + "train/") :].split("/")
            if len(parts) != 3 or parts[1] != "images":
                raise DataError(f"{container.describe(name)}: expected train/<wnid>/images/<image>.JPEG")
            if parts[0] not in index:
                raise DataError(
                    f"{container.describe(name)}: class folder {parts[0]!r} is not listed in wnids.txt"
                )
            train_names.append(name)
            train_labels.append(index[parts[0]])
        if not train_names:
            raise DataError(f"{source}: no images under {prefix}train/<wnid>/images/")

        annotations_name = prefix + "val/val_annotations.txt"
        if annotations_name not in container.names:
            raise DataError(
                f"{source}: {annotations_name} is missing (it labels the val/ images used as test)"
            )
        val_label: dict[str, int] = {}
        for line_no, line in enumerate(container.read(annotations_name).decode("utf-8").splitlines(), 1):
            fields = line.split("\t")
            if not line.strip():
                continue
            if len(fields) < 2 or fields[1] not in index:
                raise DataError(
                    f"{container.describe(annotations_name)}:{line_no}: expected '<file>\\t<wnid>\\t...' "
                    f"with a wnid from wnids.txt, got {line!r}"
                )
            val_label[fields[0]] = index[fields[1]]
        test_names = [
            n
            for n in container.names
            if n.startswith(prefix + "val/images/") and _is_image(n) and n.count("/") == prefix.count("/") + 2
        ]
        files = [n.rsplit("/", 1)[-1] for n in test_names]
        missing = [f for f in files if f not in val_label]
        if missing:
            raise DataError(
                f"{container.describe(annotations_name)}: no label for val image(s) {missing[:5]}"
            )
        absent = sorted(set(val_label) - set(files))
        if absent:
            raise DataError(
                f"{source}: val_annotations.txt labels {len(absent)} image(s) not in val/images/, "
                f"e.g. {absent[:5]}"
            )
        train_x = _decode_images(container, train_names, "RGB")
        test_x = _decode_images(container, test_names, "RGB")
    train_y = np.asarray(train_labels, dtype=np.int64)
    test_y = np.fromiter((val_label[f] for f in files), dtype=np.int64, count=len(files))
    return Arrays(train_x, train_y, test_x, test_y, classes)


# --------------------------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100 python batches
# --------------------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------------------
# SVHN .mat
# --------------------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------------------
# npz (user data)
# --------------------------------------------------------------------------------------------------------
def _npz_images(array: np.ndarray, source: str) -> np.ndarray:
    if array.ndim == 3:
        array = array[:, None]
    elif array.ndim == 4:
        channels_last = array.shape[-1] in (1, 3) and array.shape[1] not in (1, 3)
        if channels_last:
            array = array.transpose(0, 3, 1, 2)
    else:
        raise DataError(
            f"{source}: images must be (N, H, W), (N, C, H, W) or (N, H, W, C), got shape {array.shape}"
        )
    if array.dtype == np.uint8:
        return _writable(array)
    if array.dtype.kind == "f":
        if array.size and (np.nanmin(array) < 0 or np.nanmax(array) > 1 or np.isnan(array).any()):
            raise DataError(f"{source}: float images must lie in [0, 1] (or store uint8 0..255)")
        return np.rint(array * 255).astype(np.uint8)
    if array.dtype.kind in "iu":
        if array.size and (array.min() < 0 or array.max() > 255):
            raise DataError(f"{source}: integer images must lie in 0..255, got {array.min()}..{array.max()}")
        return array.astype(np.uint8)
    raise DataError(f"{source}: images must be uint8 (or float in [0, 1]), got dtype {array.dtype}")


def read_npz(path: str | os.PathLike, *, require_test: bool = True) -> Arrays:
    """Read user data from an .npz with keys x_train, y_train, x_test, y_test (and optional `classes`).

    Images may be (N,H,W), (N,C,H,W) or (N,H,W,C) with C in {1,3}; uint8, or float in [0,1] (scaled
    and rounded to uint8). Loaded with allow_pickle=False. With ``require_test=False`` x_test/y_test may be
    absent (a federation node's data) and give an empty test split.
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
    train_x = _npz_images(x_train, f"{source} (x_train)")
    test_x = _npz_images(x_test, f"{source} (x_test)")
    if train_x.shape[1:] != test_x.shape[1:]:
        raise DataError(
            f"{source}: x_train images are {train_x.shape[1:]} but x_test images are {test_x.shape[1:]}"
        )
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
        names = tuple(str(i) for i in range(count))
    return Arrays(train_x, _writable(train_y), test_x, _writable(test_y), names)
