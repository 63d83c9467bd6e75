"""idx files (MNIST, Fashion-MNIST, EMNIST): raw or gzip, in a directory or EMNIST's official gzip.zip."""

from __future__ import annotations

import gzip
import os
import struct
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO

import numpy as np

from fedhet.data.formats.arrays import Arrays, _check_counts, _check_labels
from fedhet.data.formats.containers import _is_junk
from fedhet.errors import DataError

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


def emnist_stems(split: str) -> list[str]:
    """The official names, without .gz, of EMNIST ``split``'s train images, train labels, test images and test
    labels idx files, in this order."""
    kinds = (
        ("train", "images-idx3"),
        ("train", "labels-idx1"),
        ("test", "images-idx3"),
        ("test", "labels-idx1"),
    )
    return [f"emnist-{split}-{part}-{kind}-ubyte" for part, kind in kinds]


def read_emnist(
    source: str | os.PathLike, *, split: str = "byclass", num_classes: int | None = None
) -> Arrays:
    """Read EMNIST from its official idx files (a directory, its gzip/ subfolder, or the official gzip.zip).

    EMNIST stores each image transposed (column-major); the result is in the usual row-major orientation.
    """
    source = Path(source)
    stems = emnist_stems(split)
    if source.is_dir():
        folder = source / "gzip" if not find_raw_or_gz(source, stems[0]) else source
        paths = []
        for stem in stems:
            found = find_raw_or_gz(folder, stem)
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


def find_raw_or_gz(folder: Path, stem: str) -> Path | None:
    """``folder/stem`` or else ``folder/stem.gz``, whichever is a file first; None if neither is."""
    for candidate in (folder / stem, folder / (stem + ".gz")):
        if candidate.is_file():
            return candidate
    return None


def _basename(name: str) -> str:
    """The last component of a posix member name (archives always use '/')."""
    return name.rstrip("/").rsplit("/", 1)[-1]
