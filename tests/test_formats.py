"""Readers of the official file formats, on small files this test writes in each official byte layout."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import struct
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy.io
from PIL import Image

from fedhet.data import formats
from fedhet.errors import DataError

RNG_SEED = 1234


# --------------------------------------------------------------------------------------------------------
# Writers of the official layouts (shared with test_datasets.py by import)
# --------------------------------------------------------------------------------------------------------
def write_idx(path: Path, array: np.ndarray, *, compress: bool = True) -> Path:
    """The idx layout: 0x00 0x00, type byte 0x08 (ubyte), ndim byte, big-endian uint32 dims, raw data."""
    assert array.dtype == np.uint8
    payload = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()
    if compress:
        path.write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)
    return path


def write_mnist_dir(
    folder: Path, rng: np.random.Generator, n_train=20, n_test=7, num_classes=10, compress=True
):
    """The four official MNIST/Fashion-MNIST files; returns the arrays written (images (N, 28, 28))."""
    folder.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if compress else ""
    arrays = {
        "train_x": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_y": rng.integers(0, num_classes, n_train, dtype=np.uint8),
        "test_x": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_y": rng.integers(0, num_classes, n_test, dtype=np.uint8),
    }
    write_idx(folder / f"train-images-idx3-ubyte{suffix}", arrays["train_x"], compress=compress)
    write_idx(folder / f"train-labels-idx1-ubyte{suffix}", arrays["train_y"], compress=compress)
    write_idx(folder / f"t10k-images-idx3-ubyte{suffix}", arrays["test_x"], compress=compress)
    write_idx(folder / f"t10k-labels-idx1-ubyte{suffix}", arrays["test_y"], compress=compress)
    return arrays


def official_pickle(obj: object) -> bytes:
    """A protocol-2 pickle naming numpy.core.multiarray._reconstruct, as the official batches do."""
    data = pickle.dumps(obj, protocol=2)
    # Protocol 2 names globals as text lines ('c<module>\n<name>\n'), so the module can be renamed in place.
    return data.replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


def cifar10_batches(rng: np.random.Generator, sizes=(3, 2, 4, 1, 2), n_test=5):
    """Official CIFAR-10 batch dicts: b'data' uint8 (n, 3072), b'labels' a list of ints, plus batches.meta."""
    batches = {}
    for i, n in enumerate(sizes, 1):
        batches[f"data_batch_{i}"] = {
            b"batch_label": f"training batch {i} of 5".encode(),
            b"labels": [int(v) for v in rng.integers(0, 10, n)],
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"filenames": [f"img_{i}_{j}.png".encode() for j in range(n)],
        }
    batches["test_batch"] = {
        b"batch_label": b"testing batch 1 of 1",
        b"labels": [int(v) for v in rng.integers(0, 10, n_test)],
        b"data": rng.integers(0, 256, (n_test, 3072), dtype=np.uint8),
        b"filenames": [f"test_{j}.png".encode() for j in range(n_test)],
    }
    meta = {
        b"num_cases_per_batch": 10000,
        b"label_names": [c.encode() for c in formats.CIFAR10_CLASSES],
        b"num_vis": 3072,
    }
    return batches, meta


def write_cifar10_python(folder: Path, rng: np.random.Generator, *, as_tar: bool) -> tuple[Path, dict]:
    """cifar-10-batches-py/ (or cifar-10-python.tar.gz holding it); returns the path and the batch dicts."""
    batches, meta = cifar10_batches(rng)
    files = {name: official_pickle(batch) for name, batch in batches.items()}
    files["batches.meta"] = official_pickle(meta)
    files["readme.html"] = b"<html></html>"
    return write_tree(folder, "cifar-10-batches-py", files, as_tar, "cifar-10-python.tar.gz"), batches


def write_tree(folder: Path, top: str, files: dict[str, bytes], as_tar: bool, tar_name: str) -> Path:
    """Write files under folder/top/, or into folder/tar_name with top/ as the archive's top folder."""
    folder.mkdir(parents=True, exist_ok=True)
    if not as_tar:
        for name, data in files.items():
            path = folder / top / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return folder / top
    with tarfile.open(folder / tar_name, "w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}" if top else name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return folder / tar_name


def write_cifar100_python(folder: Path, rng: np.random.Generator, *, as_tar: bool) -> tuple[Path, dict]:
    parts = {}
    for part, n in (("train", 6), ("test", 4)):
        parts[part] = {
            b"filenames": [f"{part}_{j}.png".encode() for j in range(n)],
            b"batch_label": f"{part} batch".encode(),
            b"fine_labels": [int(v) for v in rng.integers(0, 100, n)],
            b"coarse_labels": [int(v) for v in rng.integers(0, 20, n)],
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        }
    meta = {
        b"fine_label_names": [f"fine{k:02d}".encode() for k in range(100)],
        b"coarse_label_names": [f"coarse{k:02d}".encode() for k in range(20)],
    }
    files = {name: official_pickle(obj) for name, obj in parts.items()}
    files["meta"] = official_pickle(meta)
    return write_tree(folder, "cifar-100-python", files, as_tar, "cifar-100-python.tar.gz"), parts


def png_bytes(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def jpeg_bytes(pixels: np.ndarray, quality: int = 95) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def smooth_images(rng: np.random.Generator, n: int, size: int, channels: int = 3) -> np.ndarray:
    """(n, H, W, C) uint8 images that are smooth ramps plus a random offset, so JPEG changes them little."""
    ramp = np.linspace(0, 150, size)
    base = (ramp[:, None] + ramp[None, :]) / 2
    offsets = rng.integers(0, 100, (n, 1, 1, channels))
    return np.clip(base[None, :, :, None] + offsets, 0, 255).astype(np.uint8)


def write_image_tree(
    folder: Path, tree: dict[str, dict[str, list[np.ndarray]]], *, ext: str, as_tar: str | None, top: str = ""
) -> Path:
    """tree[split][class] = list of (H, W, 3) images -> split/class/NNNN.ext as files or in a tar archive.

    Tar members are added in reverse sorted order, so a reader that does not sort gets them backwards.
    """
    encode = png_bytes if ext == ".png" else jpeg_bytes
    files = {}
    for split, classes in tree.items():
        for cls, images in classes.items():
            for j, image in enumerate(images):
                files[f"{split}/{cls}/{j:04d}{ext}"] = encode(image)
    if as_tar is None:
        for name, data in files.items():
            path = folder / top / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return folder / top if top else folder
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(folder / as_tar, "w:gz") as archive:
        for name in sorted(files, reverse=True):
            info = tarfile.TarInfo(f"{top}/{name}" if top else name)
            info.size = len(files[name])
            archive.addfile(info, io.BytesIO(files[name]))
    return folder / as_tar


def expected_from_tree(tree, split: str, classes: list[str]):
    """Images (N, C, H, W) and labels in sorted path order (class folder, then file name)."""
    xs, ys = [], []
    for cls in sorted(tree[split]):
        for image in tree[split][cls]:
            xs.append(image.transpose(2, 0, 1))
            ys.append(classes.index(cls))
    return np.stack(xs), np.array(ys, dtype=np.int64)


@pytest.fixture
def rng():
    return np.random.default_rng(RNG_SEED)


# --------------------------------------------------------------------------------------------------------
# idx
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compress", [True, False])
def test_read_idx_returns_the_written_array(tmp_path, rng, compress):
    images = rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)
    path = write_idx(tmp_path / "images", images, compress=compress)
    out = formats.read_idx(path)
    assert out.dtype == np.uint8 and out.shape == (5, 28, 28)
    np.testing.assert_array_equal(out, images)


def test_read_idx_big_endian_int32(tmp_path):
    values = np.array([1, -2, 70000], dtype=">i4")
    path = tmp_path / "ints"
    path.write_bytes(bytes([0, 0, 0x0C, 1]) + struct.pack(">I", 3) + values.tobytes())
    out = formats.read_idx(path)
    np.testing.assert_array_equal(out, [1, -2, 70000])
    assert out.dtype.isnative


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda b: b"\x00\x01" + b[2:], "wrong magic number"),
        (lambda b: b[:2] + b"\x07" + b[3:], "wrong magic number"),
        (lambda b: b[:-10], "truncated"),
        (lambda b: b[:6], "truncated"),
        (lambda b: b + b"\x00\x00", "extra bytes"),
    ],
    ids=["magic", "type-byte", "truncated-data", "truncated-header", "trailing"],
)
@pytest.mark.parametrize("compress", [True, False])
def test_read_idx_refuses_malformed_files(tmp_path, rng, corrupt, message, compress):
    images = rng.integers(0, 256, (3, 4, 4), dtype=np.uint8)
    raw = bytes([0, 0, 8, 3]) + struct.pack(">3I", 3, 4, 4) + images.tobytes()
    path = tmp_path / "bad-idx3-ubyte"
    data = corrupt(raw)
    path.write_bytes(gzip.compress(data) if compress else data)
    with pytest.raises(DataError, match=message) as info:
        formats.read_idx(path)
    assert str(path) in str(info.value)


def test_read_idx_truncated_gzip_stream(tmp_path, rng):
    images = rng.integers(0, 256, (50, 28, 28), dtype=np.uint8)
    path = write_idx(tmp_path / "t.gz", images)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match="truncated") as info:
        formats.read_idx(path)
    assert str(path) in str(info.value)


def test_read_idx_dataset_mnist_layout(tmp_path, rng):
    written = write_mnist_dir(tmp_path, rng)
    f = tmp_path
    out = formats.read_idx_dataset(
        f / "train-images-idx3-ubyte.gz",
        f / "train-labels-idx1-ubyte.gz",
        f / "t10k-images-idx3-ubyte.gz",
        f / "t10k-labels-idx1-ubyte.gz",
        num_classes=10,
    )
    assert out.train_x.shape == (20, 1, 28, 28) and out.train_x.dtype == np.uint8
    np.testing.assert_array_equal(out.train_x[:, 0], written["train_x"])
    np.testing.assert_array_equal(out.test_x[:, 0], written["test_x"])
    np.testing.assert_array_equal(out.train_y, written["train_y"])
    np.testing.assert_array_equal(out.test_y, written["test_y"])
    assert out.train_y.dtype == np.int64


def test_read_idx_dataset_count_mismatch_and_label_range(tmp_path, rng):
    write_mnist_dir(tmp_path, rng)
    f = tmp_path
    write_idx(f / "short-labels", np.zeros(19, np.uint8))
    with pytest.raises(DataError, match="count mismatch") as info:
        formats.read_idx_dataset(
            f / "train-images-idx3-ubyte.gz",
            f / "short-labels",
            f / "t10k-images-idx3-ubyte.gz",
            f / "t10k-labels-idx1-ubyte.gz",
        )
    assert "20 images" in str(info.value) and "19 labels" in str(info.value)
    bad = np.zeros(20, np.uint8)
    bad[7] = 10
    write_idx(f / "bad-labels", bad)
    with pytest.raises(DataError, match="out of range") as info:
        formats.read_idx_dataset(
            f / "train-images-idx3-ubyte.gz",
            f / "bad-labels",
            f / "t10k-images-idx3-ubyte.gz",
            f / "t10k-labels-idx1-ubyte.gz",
            num_classes=10,
        )
    assert "bad-labels" in str(info.value) and "found 10" in str(info.value)
    with pytest.raises(DataError, match="idx3"):  # labels file given where images are expected
        formats.read_idx_dataset(
            f / "train-labels-idx1-ubyte.gz",
            f / "train-labels-idx1-ubyte.gz",
            f / "t10k-images-idx3-ubyte.gz",
            f / "t10k-labels-idx1-ubyte.gz",
        )


def _emnist_files(rng: np.random.Generator, n_train=9, n_test=4):
    """EMNIST arrays (as seen, row-major) and the official file contents (stored transposed)."""
    seen = {
        "train_x": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_y": rng.integers(0, 62, n_train, dtype=np.uint8),
        "test_x": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_y": rng.integers(0, 62, n_test, dtype=np.uint8),
    }
    stored = {
        "emnist-byclass-train-images-idx3-ubyte": np.ascontiguousarray(seen["train_x"].transpose(0, 2, 1)),
        "emnist-byclass-train-labels-idx1-ubyte": seen["train_y"],
        "emnist-byclass-test-images-idx3-ubyte": np.ascontiguousarray(seen["test_x"].transpose(0, 2, 1)),
        "emnist-byclass-test-labels-idx1-ubyte": seen["test_y"],
    }
    return seen, stored


def _check_emnist(out: formats.Arrays, seen: dict) -> None:
    np.testing.assert_array_equal(out.train_x[:, 0], seen["train_x"])
    np.testing.assert_array_equal(out.test_x[:, 0], seen["test_x"])
    np.testing.assert_array_equal(out.train_y, seen["train_y"])
    np.testing.assert_array_equal(out.test_y, seen["test_y"])


def test_read_emnist_directory_undoes_the_transposition(tmp_path, rng):
    seen, stored = _emnist_files(rng)
    (tmp_path / "gzip").mkdir()
    for stem, array in stored.items():
        write_idx(tmp_path / "gzip" / f"{stem}.gz", array)
    out = formats.read_emnist(tmp_path, num_classes=62)  # finds the gzip/ subfolder
    _check_emnist(out, seen)
    assert not np.array_equal(out.train_x[:, 0], stored["emnist-byclass-train-images-idx3-ubyte"])


def test_read_emnist_official_zip(tmp_path, rng):
    seen, stored = _emnist_files(rng)
    zip_path = tmp_path / "gzip.zip"
    with zipfile.ZipFile(zip_path, "w") as archive:
        for stem, array in stored.items():
            payload = (
                bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()
            )
            archive.writestr(f"gzip/{stem}.gz", gzip.compress(payload))
        archive.writestr("gzip/emnist-letters-train-labels-idx1-ubyte.gz", gzip.compress(b"junk"))
    _check_emnist(formats.read_emnist(zip_path, num_classes=62), seen)
    with pytest.raises(DataError, match="emnist-digits-train-images"):
        formats.read_emnist(zip_path, split="digits")


# --------------------------------------------------------------------------------------------------------
# CIFAR python batches and the restricted unpickler
# --------------------------------------------------------------------------------------------------------
def _pixel(data_row: np.ndarray, channel: int, row: int, col: int) -> int:
    """The official layout: 1024 red, then 1024 green, then 1024 blue values, each plane row-major."""
    return int(data_row[channel * 1024 + row * 32 + col])


@pytest.mark.parametrize("as_tar", [True, False], ids=["tar.gz", "extracted-dir"])
def test_read_cifar10_python(tmp_path, rng, as_tar):
    path, batches = write_cifar10_python(tmp_path, rng, as_tar=as_tar)
    # The generated batches name the same globals as the official (numpy 1.x, protocol 2) files.
    assert b"cnumpy.core.multiarray\n_reconstruct\n" in official_pickle(batches["test_batch"])
    out = formats.read_cifar_python(path, "cifar10")
    train = [batches[f"data_batch_{i}"] for i in range(1, 6)]
    data = np.concatenate([b[b"data"] for b in train])
    labels = [v for b in train for v in b[b"labels"]]
    assert out.train_x.shape == (12, 3, 32, 32) and out.train_x.dtype == np.uint8
    assert out.test_x.shape == (5, 3, 32, 32)
    for i, c, r, k in [(0, 0, 0, 0), (3, 1, 5, 7), (11, 2, 31, 31), (6, 2, 0, 31)]:
        assert out.train_x[i, c, r, k] == _pixel(data[i], c, r, k)
    np.testing.assert_array_equal(out.train_x.reshape(12, -1), data)
    np.testing.assert_array_equal(out.train_y, labels)
    np.testing.assert_array_equal(out.test_x.reshape(5, -1), batches["test_batch"][b"data"])
    np.testing.assert_array_equal(out.test_y, batches["test_batch"][b"labels"])
    assert out.classes == formats.CIFAR10_CLASSES
    assert out.train_x.flags.writeable and out.test_x.flags.writeable


@pytest.mark.parametrize("as_tar", [True, False], ids=["tar.gz", "extracted-dir"])
def test_read_cifar100_python_fine_labels(tmp_path, rng, as_tar):
    path, parts = write_cifar100_python(tmp_path, rng, as_tar=as_tar)
    out = formats.read_cifar_python(path, "cifar100")
    np.testing.assert_array_equal(out.train_x.reshape(6, -1), parts["train"][b"data"])
    np.testing.assert_array_equal(out.train_y, parts["train"][b"fine_labels"])
    np.testing.assert_array_equal(out.test_x.reshape(4, -1), parts["test"][b"data"])
    np.testing.assert_array_equal(out.test_y, parts["test"][b"fine_labels"])
    assert out.classes == tuple(f"fine{k:02d}" for k in range(100))
    assert out.train_x.flags.writeable


def test_cifar_batch_validation(tmp_path, rng):
    batches, meta = cifar10_batches(rng)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name, batch in batches.items():
        (folder / name).write_bytes(official_pickle(batch))
    batches["data_batch_2"][b"labels"].append(3)  # one label too many
    (folder / "data_batch_2").write_bytes(official_pickle(batches["data_batch_2"]))
    with pytest.raises(DataError, match="count mismatch") as info:
        formats.read_cifar_python(folder)
    assert "data_batch_2" in str(info.value)
    batches["data_batch_2"][b"labels"] = [10] * len(batches["data_batch_2"][b"data"])
    (folder / "data_batch_2").write_bytes(official_pickle(batches["data_batch_2"]))
    with pytest.raises(DataError, match="out of range"):
        formats.read_cifar_python(folder)
    (folder / "data_batch_2").write_bytes(official_pickle(batches["data_batch_1"])[:-20])
    with pytest.raises(DataError, match="data_batch_2"):
        formats.read_cifar_python(folder)
    (folder / "data_batch_2").unlink()
    with pytest.raises(DataError, match="'data_batch_2' is missing"):
        formats.read_cifar_python(folder)


def test_restricted_loads_admits_arrays_and_builtins():
    value = {
        b"data": np.arange(12, dtype=np.uint8).reshape(3, 4),
        "floats": np.linspace(0, 1, 5),
        "nested": [
            1,
            2.5,
            "three",
            b"four",
            (5, 6),
            {7, 8},
            frozenset({9}),
            True,
            None,
            3 + 4j,
            bytearray(b"x"),
        ],
        "scalar": np.float32(1.5),
    }
    for protocol in (2, 3, 4, 5):
        out = formats.restricted_loads(pickle.dumps(value, protocol=protocol))
        np.testing.assert_array_equal(out[b"data"], value[b"data"])
        np.testing.assert_array_equal(out["floats"], value["floats"])
        assert out["nested"] == value["nested"]
        assert out["scalar"] == np.float32(1.5)


class _Shell:
    """Unpickling this would run a shell command that creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Evaluator:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w')",))


class _Plain:
    def __init__(self) -> None:
        self.value = 1


@pytest.mark.parametrize("kind", ["os.system", "builtins.eval", "instance", "ordered-dict", "getattr"])
@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_restricted_loads_refuses_everything_else_and_executes_nothing(tmp_path, kind, protocol):
    import collections

    marker = tmp_path / "executed"
    payload = {
        "os.system": {b"data": _Shell(marker)},
        "builtins.eval": [_Evaluator(marker)],
        "instance": {b"labels": _Plain()},
        "ordered-dict": collections.OrderedDict(a=1),
        "getattr": None,
    }[kind]
    if kind == "getattr":
        data = b"cbuiltins\ngetattr\n(cos\nsystem\nS'x'\ntR."
    else:
        data = pickle.dumps(payload, protocol=protocol)
    with pytest.raises(DataError, match="refused to unpickle") as info:
        formats.restricted_loads(data, "evil_batch")
    assert "evil_batch" in str(info.value)
    assert not marker.exists()


def test_malicious_cifar_batch_in_a_tarball_is_refused(tmp_path, rng):
    marker = tmp_path / "executed"
    batches, meta = cifar10_batches(rng)
    files = {name: official_pickle(batch) for name, batch in batches.items()}
    files["data_batch_3"] = pickle.dumps({b"data": _Shell(marker), b"labels": []}, protocol=2)
    files["batches.meta"] = official_pickle(meta)
    path = write_tree(tmp_path, "cifar-10-batches-py", files, True, "cifar-10-python.tar.gz")
    with pytest.raises(DataError, match="refused to unpickle") as info:
        formats.read_cifar_python(path)
    assert "data_batch_3" in str(info.value) and "system" in str(info.value)
    assert not marker.exists()


# --------------------------------------------------------------------------------------------------------
# SVHN .mat
# --------------------------------------------------------------------------------------------------------
def _svhn_mat(path: Path, rng: np.random.Generator, n: int, labels=None) -> tuple[np.ndarray, np.ndarray]:
    images = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
    labels = rng.integers(1, 11, (n, 1)).astype(np.uint8) if labels is None else labels
    scipy.io.savemat(path, {"X": images, "y": labels})
    return images, labels


def test_read_svhn_mat(tmp_path, rng):
    images, labels = _svhn_mat(
        tmp_path / "train_32x32.mat",
        rng,
        11,
        np.array([[10], [1], [2], [3], [4], [5], [6], [7], [8], [9], [10]], np.uint8),
    )
    test_images, test_labels = _svhn_mat(tmp_path / "test_32x32.mat", rng, 4)
    out = formats.read_svhn(tmp_path / "train_32x32.mat", tmp_path / "test_32x32.mat")
    assert out.train_x.shape == (11, 3, 32, 32) and out.train_x.dtype == np.uint8
    for n, c, h, w in [(0, 0, 0, 0), (3, 2, 5, 30), (10, 1, 31, 2)]:
        assert out.train_x[n, c, h, w] == images[h, w, c, n]
    np.testing.assert_array_equal(out.train_x, images.transpose(3, 2, 0, 1))
    np.testing.assert_array_equal(out.train_y, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0])
    np.testing.assert_array_equal(out.test_x, test_images.transpose(3, 2, 0, 1))
    np.testing.assert_array_equal(out.test_y, np.where(test_labels[:, 0] == 10, 0, test_labels[:, 0]))
    assert out.train_x.flags.c_contiguous


@pytest.mark.parametrize(
    "content, message",
    [
        ({"X": np.zeros((32, 32, 3, 2), np.uint8), "y": np.array([[0], [1]], np.uint8)}, "out of range"),
        ({"X": np.zeros((32, 32, 3, 2), np.uint8), "y": np.array([[11], [1]], np.uint8)}, "out of range"),
        (
            {"X": np.zeros((32, 32, 3, 2), np.uint8), "y": np.array([[1], [1], [2]], np.uint8)},
            "count mismatch",
        ),
        ({"X": np.zeros((28, 28, 3, 2), np.uint8), "y": np.array([[1], [1]], np.uint8)}, "shape"),
        ({"images": np.zeros((32, 32, 3, 2), np.uint8)}, "variables X and y"),
    ],
)
def test_read_svhn_mat_validation(tmp_path, content, message):
    path = tmp_path / "train_32x32.mat"
    scipy.io.savemat(path, content)
    with pytest.raises(DataError, match=message) as info:
        formats.read_svhn_mat(path)
    assert str(path) in str(info.value)


def test_read_svhn_mat_not_a_mat_file(tmp_path):
    path = tmp_path / "train_32x32.mat"
    path.write_bytes(b"definitely not MATLAB" * 10)
    with pytest.raises(DataError, match="MATLAB"):
        formats.read_svhn_mat(path)


# --------------------------------------------------------------------------------------------------------
# Image folders, CINIC-10, Tiny-ImageNet
# --------------------------------------------------------------------------------------------------------
def _random_tree(rng, classes, counts, size=8):
    return {
        split: {c: [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(n)] for c in classes}
        for split, n in counts.items()
    }


@pytest.mark.parametrize("as_tar", [None, "images.tar.gz"], ids=["dir", "tar.gz"])
def test_read_image_folder_png_is_exact(tmp_path, rng, as_tar):
    classes = ["zebra", "apple", "mango"]  # given order != sorted order
    tree = _random_tree(rng, classes, {"train": 3, "test": 2})
    path = write_image_tree(tmp_path, tree, ext=".png", as_tar=as_tar, top="wrapped" if as_tar else "")
    out = formats.read_image_folder(path, classes=classes)
    x, y = expected_from_tree(tree, "train", classes)
    np.testing.assert_array_equal(out.train_x, x)
    np.testing.assert_array_equal(out.train_y, y)
    x, y = expected_from_tree(tree, "test", classes)
    np.testing.assert_array_equal(out.test_x, x)
    np.testing.assert_array_equal(out.test_y, y)
    assert out.classes == tuple(classes)
    # Without a class list the labels index the sorted folder names.
    out = formats.read_image_folder(path)
    assert out.classes == ("apple", "mango", "zebra")
    np.testing.assert_array_equal(out.train_y, expected_from_tree(tree, "train", sorted(classes))[1])


def test_read_image_folder_jpeg_within_tolerance(tmp_path, rng):
    tree = {
        split: {c: list(smooth_images(rng, n, 16)) for c in ("cat", "dog")}
        for split, n in (("train", 3), ("test", 2))
    }
    path = write_image_tree(tmp_path, tree, ext=".jpg", as_tar="jpg.tar.gz")
    out = formats.read_image_folder(path, classes=["cat", "dog"])
    x, y = expected_from_tree(tree, "train", ["cat", "dog"])
    assert out.train_x.shape == (6, 3, 16, 16)
    assert np.abs(out.train_x.astype(int) - x).mean() < 3
    np.testing.assert_array_equal(out.train_y, y)


def test_read_image_folder_grayscale_and_conversion(tmp_path, rng):
    gray = rng.integers(0, 256, (5, 6), dtype=np.uint8)
    for split in ("train", "test"):
        (tmp_path / split / "a").mkdir(parents=True)
        (tmp_path / split / "a" / "0.png").write_bytes(png_bytes(gray))
    out = formats.read_image_folder(tmp_path, mode="L")
    assert out.train_x.shape == (1, 1, 5, 6)
    np.testing.assert_array_equal(out.train_x[0, 0], gray)
    out = formats.read_image_folder(tmp_path, mode="RGB")  # grayscale files in an RGB data set
    assert out.train_x.shape == (1, 3, 5, 6)
    for c in range(3):
        np.testing.assert_array_equal(out.train_x[0, c], gray)


def test_read_image_folder_errors(tmp_path, rng):
    tree = _random_tree(rng, ["a", "b"], {"train": 2, "test": 1})
    path = write_image_tree(tmp_path / "ok", tree, ext=".png", as_tar=None)
    with pytest.raises(DataError, match="not among the accepted classes"):
        formats.read_image_folder(path, classes=["a"])
    (path / "train" / "b" / "0001.png").write_bytes(png_bytes(np.zeros((9, 8, 3), np.uint8)))
    with pytest.raises(DataError, match="share one size") as info:
        formats.read_image_folder(path)
    assert "0001.png" in str(info.value)
    (path / "train" / "b" / "0001.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    with pytest.raises(DataError, match="cannot decode") as info:
        formats.read_image_folder(path)
    assert "0001.png" in str(info.value)
    empty = tmp_path / "empty"
    (empty / "train").mkdir(parents=True)
    with pytest.raises(DataError, match="no train/ folder"):
        formats.read_image_folder(empty)
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    with pytest.raises(DataError, match="neither a directory"):
        formats.read_image_folder(notes)


def test_read_cinic10_uses_train_and_test_ignores_valid(tmp_path, rng):
    classes = list(formats.CIFAR10_CLASSES)
    tree = _random_tree(rng, classes, {"train": 2, "valid": 1, "test": 1}, size=32)
    tree["valid"]["cat"].append(
        rng.integers(0, 256, (7, 7, 3), dtype=np.uint8)
    )  # would break decoding if read
    path = write_image_tree(tmp_path, tree, ext=".png", as_tar="CINIC-10.tar.gz")
    out = formats.read_cinic10(path)
    x, y = expected_from_tree(tree, "train", classes)
    np.testing.assert_array_equal(out.train_x, x)
    np.testing.assert_array_equal(out.train_y, y)
    x, y = expected_from_tree(tree, "test", classes)
    np.testing.assert_array_equal(out.test_x, x)
    np.testing.assert_array_equal(out.test_y, y)
    assert out.train_x.shape == (20, 3, 32, 32) and out.classes == formats.CIFAR10_CLASSES


def write_tiny_imagenet(
    folder: Path, rng, *, as_zip: bool, wnids=("n02", "n01", "n03"), per_class=2, n_val=5
):
    """The official tiny-imagenet-200 layout (JPEG files); returns path, train and val expectations."""
    files: dict[str, bytes] = {"wnids.txt": "\n".join(wnids).encode() + b"\n", "words.txt": b"n01\tthing\n"}
    classes = sorted(wnids)
    train = []
    for wnid in wnids:
        files[f"train/{wnid}/{wnid}_boxes.txt"] = b"box"
        for i, image in enumerate(smooth_images(rng, per_class, 64)):
            name = f"train/{wnid}/images/{wnid}_{i}.JPEG"
            files[name] = jpeg_bytes(image)
            train.append((name, image, classes.index(wnid)))
    annotations, val = [], []
    for i, image in enumerate(smooth_images(rng, n_val, 64)):
        wnid = wnids[i % len(wnids)]
        files[f"val/images/val_{i}.JPEG"] = jpeg_bytes(image)
        annotations.append(f"val_{i}.JPEG\t{wnid}\t0\t0\t63\t63")
        val.append((f"val_{i}.JPEG", image, classes.index(wnid)))
    files["val/val_annotations.txt"] = ("\n".join(annotations) + "\n").encode()
    files["test/images/test_0.JPEG"] = jpeg_bytes(smooth_images(rng, 1, 64)[0])
    if as_zip:
        path = folder / "tiny-imagenet-200.zip"
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in files.items():
                archive.writestr(f"tiny-imagenet-200/{name}", data)
    else:
        path = folder / "tiny-imagenet-200"
        for name, data in files.items():
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).write_bytes(data)
    train.sort(key=lambda t: t[0])
    val.sort(key=lambda t: t[0])
    return path, train, val, tuple(classes)


@pytest.mark.parametrize("as_zip", [True, False], ids=["zip", "dir"])
def test_read_tiny_imagenet(tmp_path, rng, as_zip):
    path, train, val, classes = write_tiny_imagenet(tmp_path, rng, as_zip=as_zip)
    out = formats.read_tiny_imagenet(path)
    assert out.classes == classes == ("n01", "n02", "n03")
    assert out.train_x.shape == (6, 3, 64, 64) and out.test_x.shape == (5, 3, 64, 64)
    np.testing.assert_array_equal(out.train_y, [t[2] for t in train])
    np.testing.assert_array_equal(out.test_y, [t[2] for t in val])
    expected = np.stack([t[1].transpose(2, 0, 1) for t in val])
    assert np.abs(out.test_x.astype(int) - expected).mean() < 3
    expected = np.stack([t[1].transpose(2, 0, 1) for t in train])
    assert np.abs(out.train_x.astype(int) - expected).mean() < 3


def test_read_tiny_imagenet_missing_annotation(tmp_path, rng):
    path, *_ = write_tiny_imagenet(tmp_path, rng, as_zip=False)
    annotations = path / "val" / "val_annotations.txt"
    annotations.write_text("\n".join(annotations.read_text().splitlines()[1:]) + "\n")
    with pytest.raises(DataError, match="no label for val image"):
        formats.read_tiny_imagenet(path)
    annotations.write_text("val_0.JPEG\tn99\t0\t0\t1\t1\n")
    with pytest.raises(DataError, match="wnid from wnids.txt"):
        formats.read_tiny_imagenet(path)


# --------------------------------------------------------------------------------------------------------
# npz
# --------------------------------------------------------------------------------------------------------
def test_read_npz_exact_and_channels_last(tmp_path, rng):
    x_train = rng.integers(0, 256, (6, 10, 12, 3), dtype=np.uint8)  # (N, H, W, C)
    x_test = rng.integers(0, 256, (2, 10, 12, 3), dtype=np.uint8)
    y_train, y_test = np.array([3, 0, 1, 2, 1, 0]), np.array([2, 3])  # every class 0..3 present
    np.savez(tmp_path / "mine.npz", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    out = formats.read_npz(tmp_path / "mine.npz")
    np.testing.assert_array_equal(out.train_x, x_train.transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(out.test_x, x_test.transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(out.train_y, y_train)
    assert out.train_y.dtype == np.int64
    assert out.classes == tuple(str(k) for k in range(int(max(y_train.max(), y_test.max())) + 1))
    # Grayscale (N, H, W), float in [0, 1], and named classes.
    gray = rng.integers(0, 256, (3, 5, 5), dtype=np.uint8)
    np.savez(
        tmp_path / "gray.npz",
        x_train=gray / 255.0,
        y_train=np.array([0, 1, 1]),
        x_test=gray[:1],
        y_test=np.array([1]),
        classes=np.array(["no", "yes"]),
    )
    out = formats.read_npz(tmp_path / "gray.npz")
    np.testing.assert_array_equal(out.train_x[:, 0], gray)
    assert out.classes == ("no", "yes")


def test_read_npz_validation(tmp_path):
    x = np.zeros((2, 4, 4), np.uint8)
    np.savez(tmp_path / "missing.npz", x_train=x, y_train=np.zeros(2, int), x_test=x)
    with pytest.raises(DataError, match="y_test"):
        formats.read_npz(tmp_path / "missing.npz")
    np.savez(
        tmp_path / "objects.npz",
        x_train=x,
        y_train=np.array([{}, {}], dtype=object),
        x_test=x,
        y_test=np.zeros(2, int),
    )
    with pytest.raises(DataError, match="object arrays are refused"):
        formats.read_npz(tmp_path / "objects.npz")
    np.savez(tmp_path / "count.npz", x_train=x, y_train=np.zeros(3, int), x_test=x, y_test=np.zeros(2, int))
    with pytest.raises(DataError, match="count mismatch"):
        formats.read_npz(tmp_path / "count.npz")
    np.savez(
        tmp_path / "range.npz",
        x_train=x,
        y_train=np.array([0, 2]),
        x_test=x,
        y_test=np.zeros(2, int),
        classes=np.array(["a", "b"]),
    )
    with pytest.raises(DataError, match="out of range"):
        formats.read_npz(tmp_path / "range.npz")
