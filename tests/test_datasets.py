"""Named data sets: real Fashion-MNIST, CIFAR-10 (JPEG tarball, cached), digits; every other loader on small
files in the official formats; lookup order, error messages, the decoded-image cache and dataset_status."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.data import formats
from fedhet.data.datasets import DATASET_NAMES, Dataset, dataset_status, load_dataset, locations
from fedhet.errors import ConfigError, DataError

# The official-format writers live in test_formats.py; its import name depends on whether tests/ is a package.
try:
    from tests.test_formats import (
        _random_tree,
        expected_from_tree,
        write_cifar10_python,
        write_cifar100_python,
        write_idx,
        write_image_tree,
        write_mnist_dir,
        write_tiny_imagenet,
    )
except ImportError:
    from test_formats import (  # type: ignore[no-redef]
        _random_tree,
        expected_from_tree,
        write_cifar10_python,
        write_cifar100_python,
        write_idx,
        write_image_tree,
        write_mnist_dir,
        write_tiny_imagenet,
    )


FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
CIFAR_JPG = next(
    (d / "cifar10-jpg.tar.gz" for d in locations.SHARED_DATA_DIRS if (d / "cifar10-jpg.tar.gz").is_file()),
    None,
)


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch, tmp_path):
    """No user FEDHET_DATA; a private cache for every test (the CIFAR fixture sets its own)."""
    monkeypatch.delenv("FEDHET_DATA", raising=False)
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def _pixel_stats(pixels: np.ndarray) -> tuple[float, float]:
    """Exact mean and std of uint8 pixels on the [0, 1] scale, from their histogram (no float copy)."""
    counts = np.bincount(pixels, minlength=256).astype(np.float64)
    values = np.arange(256) / 255
    mean = (counts * values).sum() / counts.sum()
    return float(mean), float(np.sqrt((counts * (values - mean) ** 2).sum() / counts.sum()))


@pytest.fixture
def rng():
    return np.random.default_rng(99)


# --------------------------------------------------------------------------------------------------------
# Real data
# --------------------------------------------------------------------------------------------------------
@pytest.mark.skipif(
    not FASHION_DIR.is_dir(), reason="Fashion-MNIST missing: apt-get install dataset-fashion-mnist"
)
def test_fashion_mnist_real():
    data = load_dataset("fashion-mnist")
    assert data.train_x.shape == (60_000, 1, 28, 28) and data.test_x.shape == (10_000, 1, 28, 28)
    assert data.train_x.dtype == torch.uint8 and data.train_y.dtype == torch.int64
    assert torch.bincount(data.train_y).tolist() == [6000] * 10
    assert torch.bincount(data.test_y).tolist() == [1000] * 10
    assert data.input_shape == (1, 28, 28) and data.num_classes == 10
    assert data.classes[0] == "T-shirt/top" and data.classes[9] == "Ankle boot"
    assert data.source == str(FASHION_DIR)
    # The documented stats (methods.md §1.2) are those of the decoded train pixels: a check of the decoding.
    mean, std = _pixel_stats(data.train_x.numpy().ravel())
    assert abs(mean - 0.286) < 5e-4 and abs(std - 0.353) < 5e-4
    # Fashion-MNIST's first training labels are Ankle boot, T-shirt, T-shirt, Dress, T-shirt (official order).
    assert data.train_y[:5].tolist() == [9, 0, 0, 3, 0]


@pytest.fixture(scope="module")
def cifar10(cifar10_cache):
    """CIFAR-10 as this suite decoded it from the JPEG tarball (once, into the shared cache of conftest.py
    ``cifar10_cache``); yields (dataset, cache dir)."""
    cache = cifar10_cache
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEDHET_CACHE", str(cache))
        patch.delenv("FEDHET_DATA", raising=False)
        yield load_dataset("cifar10"), cache


def test_cifar10_jpeg_tarball(cifar10):
    data, _cache = cifar10
    assert data.train_x.shape == (50_000, 3, 32, 32) and data.test_x.shape == (10_000, 3, 32, 32)
    assert data.train_x.dtype == torch.uint8
    assert torch.bincount(data.train_y).tolist() == [5000] * 10
    assert torch.bincount(data.test_y).tolist() == [1000] * 10
    assert data.classes == formats.CIFAR10_CLASSES and data.source == str(CIFAR_JPG)
    assert data.mean == (0.4914, 0.4822, 0.4465) and data.std == (0.2023, 0.1994, 0.2010)
    # The published CIFAR-10 channel means; the JPEG copy shifts them by well under 0.005.
    means = [_pixel_stats(data.train_x[:, c].numpy().ravel())[0] for c in range(3)]
    assert np.allclose(means, [0.4914, 0.4822, 0.4465], atol=5e-3)
    # Files keep the official order within a class: train/airplane/0000.jpg first, then by class folder.
    assert data.train_y[:5000].eq(0).all() and data.train_y[-5000:].eq(9).all()


def test_cifar10_second_load_comes_from_the_cache(cifar10, monkeypatch):
    first, cache = cifar10
    entries = list((cache / "datasets").glob("cifar10-*"))
    assert len(entries) == 1
    for part in ("train_x", "train_y", "test_x", "test_y"):
        assert (entries[0] / f"{part}.npy").is_file()
    meta = json.loads((entries[0] / "meta.json").read_text())
    assert meta["source"] == str(CIFAR_JPG) and meta["fingerprint"]["size"] == CIFAR_JPG.stat().st_size
    assert not list((cache / "datasets").glob(".*tmp"))  # the temporary folder was renamed into place

    def no_decoding(*args, **kwargs):
        raise AssertionError("the second load decoded images instead of reading the cache")

    monkeypatch.setenv("FEDHET_CACHE", str(cache))
    monkeypatch.setattr("PIL.Image.open", no_decoding)
    second = load_dataset("cifar10")
    for part in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(first, part), getattr(second, part))
    assert second.classes == first.classes and second.source == first.source


def test_digits_documented_split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_dataset("digits")
    assert len(data.train_y) == 1347 and len(data.test_y) == 450
    assert data.input_shape == (1, 8, 8) and data.classes == tuple("0123456789")
    raw = load_digits()
    train_idx, test_idx = train_test_split(
        np.arange(len(raw.target)), test_size=0.25, stratify=raw.target, random_state=0
    )
    np.testing.assert_array_equal(data.train_y.numpy(), raw.target[train_idx])
    np.testing.assert_array_equal(data.test_y.numpy(), raw.target[test_idx])
    # 0..16 maps onto 0..255: 16 -> 255, 8 -> 128 (127.5 rounded to even), 0 -> 0.
    assert int(data.train_x.max()) == 255
    pairs = {
        (float(v), int(p))
        for v, p in zip(raw.images[train_idx].ravel(), data.train_x.numpy().ravel(), strict=True)
    }
    assert (16.0, 255) in pairs and (0.0, 0) in pairs and (8.0, 128) in pairs
    assert len({v for v, _ in pairs}) == len(pairs)  # one pixel value per raw value
    pixels = data.train_x.double() / 255
    assert data.mean[0] == pytest.approx(pixels.mean().item(), abs=1e-9)
    assert data.std[0] == pytest.approx(pixels.std(unbiased=False).item(), abs=1e-9)
    assert torch.bincount(data.test_y).tolist() == np.bincount(raw.target[test_idx]).tolist()
    share = torch.bincount(data.test_y).numpy() / np.bincount(raw.target)
    assert np.all(np.abs(share - 0.25) < 0.01)  # stratified: a quarter of each class is test


# --------------------------------------------------------------------------------------------------------
# Loaders on generated official files, through load_dataset
# --------------------------------------------------------------------------------------------------------
def test_mnist_from_data_root_subdirectory(tmp_path, rng):
    written = write_mnist_dir(tmp_path / "root" / "mnist", rng)
    data = load_dataset("mnist", tmp_path / "root")
    np.testing.assert_array_equal(data.train_x[:, 0].numpy(), written["train_x"])
    np.testing.assert_array_equal(data.test_y.numpy(), written["test_y"])
    assert data.mean == (0.1307,) and data.std == (0.3081,) and data.classes == tuple("0123456789")
    assert data.source == str((tmp_path / "root" / "mnist").resolve())


def test_emnist_byclass(tmp_path, rng):
    images = rng.integers(0, 256, (8, 28, 28), dtype=np.uint8)
    labels = np.array([0, 9, 10, 35, 36, 61, 5, 5], np.uint8)
    folder = tmp_path / "emnist" / "gzip"
    folder.mkdir(parents=True)
    for part in ("train", "test"):
        write_idx(
            folder / f"emnist-byclass-{part}-images-idx3-ubyte.gz",
            np.ascontiguousarray(images.transpose(0, 2, 1)),
        )
        write_idx(folder / f"emnist-byclass-{part}-labels-idx1-ubyte.gz", labels)
    data = load_dataset("emnist", tmp_path)
    np.testing.assert_array_equal(data.train_x[:, 0].numpy(), images)
    assert data.num_classes == 62
    assert [data.classes[k] for k in labels[:6]] == ["0", "9", "A", "Z", "a", "z"]
    assert data.mean == (0.1307,)


@pytest.mark.parametrize("as_tar", [True, False], ids=["tar.gz", "extracted-dir"])
def test_cifar10_python_preferred_over_jpeg(tmp_path, rng, as_tar):
    _path, batches = write_cifar10_python(tmp_path, rng, as_tar=as_tar)
    (tmp_path / "cifar10-jpg.tar.gz").write_bytes(b"not read")  # present too, but the exact format wins
    data = load_dataset("cifar10", tmp_path)
    expected = np.concatenate([batches[f"data_batch_{i}"][b"data"] for i in range(1, 6)])
    np.testing.assert_array_equal(data.train_x.reshape(len(expected), -1).numpy(), expected)
    np.testing.assert_array_equal(data.test_y.numpy(), batches["test_batch"][b"labels"])
    assert data.source.endswith("cifar-10-python.tar.gz" if as_tar else "cifar-10-batches-py")


def test_cifar100_python(tmp_path, rng):
    _path, parts = write_cifar100_python(tmp_path / "cifar100", rng, as_tar=True)
    data = load_dataset("cifar100", tmp_path)
    np.testing.assert_array_equal(data.train_y.numpy(), parts["train"][b"fine_labels"])
    assert data.num_classes == 100 and data.classes[3] == "fine03"
    assert data.mean == (0.5071, 0.4865, 0.4409)


def test_svhn(tmp_path, rng):
    import scipy.io

    images = rng.integers(0, 256, (32, 32, 3, 3), dtype=np.uint8)
    for part in ("train", "test"):
        scipy.io.savemat(
            tmp_path / f"{part}_32x32.mat", {"X": images, "y": np.array([[10], [3], [1]], np.uint8)}
        )
    data = load_dataset("svhn", tmp_path)
    assert data.train_y.tolist() == [0, 3, 1]
    np.testing.assert_array_equal(data.train_x.numpy(), images.transpose(3, 2, 0, 1))
    assert data.std == (0.1980, 0.2010, 0.1970)


def test_cinic10_folder_is_cached(tmp_path, rng, monkeypatch):
    classes = list(formats.CIFAR10_CLASSES)
    tree = _random_tree(rng, classes, {"train": 1, "valid": 1, "test": 1}, size=32)
    write_image_tree(tmp_path / "CINIC-10", tree, ext=".png", as_tar=None)
    first = load_dataset("cinic10", tmp_path)
    x, y = expected_from_tree(tree, "train", classes)
    np.testing.assert_array_equal(first.train_x.numpy(), x)
    np.testing.assert_array_equal(first.train_y.numpy(), y)
    assert list((tmp_path / "cache" / "datasets").glob("cinic10-*/train_x.npy"))
    monkeypatch.setattr("PIL.Image.open", lambda *a, **k: pytest.fail("decoded despite the cache"))
    second = load_dataset("cinic10", tmp_path)
    assert torch.equal(first.test_x, second.test_x)


def test_tiny_imagenet_zip(tmp_path, rng):
    wnids = tuple(f"n{k:08d}" for k in range(199, -1, -1))  # 200 classes, listed in reverse order
    _path, train, val, classes = write_tiny_imagenet(
        tmp_path, rng, as_zip=True, wnids=wnids, per_class=1, n_val=6
    )
    data = load_dataset("tiny-imagenet", tmp_path)
    assert data.classes == tuple(sorted(wnids)) and data.num_classes == 200
    assert data.input_shape == (3, 64, 64) and len(data.train_y) == 200 and len(data.test_y) == 6
    np.testing.assert_array_equal(data.train_y.numpy(), [t[2] for t in train])
    np.testing.assert_array_equal(data.test_y.numpy(), [t[2] for t in val])
    assert data.test_y.tolist()[:2] == [199, 198]  # val_0 is labelled wnids[0] = n00000199
    expected = np.stack([t[1].transpose(2, 0, 1) for t in val])
    assert np.abs(data.test_x.numpy().astype(int) - expected).mean() < 3
    assert data.mean == (0.4802, 0.4481, 0.3975)
    assert list((tmp_path / "cache" / "datasets").glob("tiny-imagenet-*/test_x.npy"))


def test_npz_user_data(tmp_path, rng):
    x = rng.integers(0, 256, (10, 2, 5, 5), dtype=np.uint8)
    y = np.arange(10) % 3
    np.savez(tmp_path / "clinic.npz", x_train=x, y_train=y, x_test=x[:4], y_test=y[:4])
    data = load_dataset(str(tmp_path / "clinic.npz"))
    assert data.name == "clinic" and data.input_shape == (2, 5, 5) and data.num_classes == 3
    np.testing.assert_array_equal(data.train_x.numpy(), x)
    channel = x[:, 1].astype(np.float64) / 255
    assert data.mean[1] == pytest.approx(channel.mean()) and data.std[1] == pytest.approx(channel.std())
    assert load_dataset("clinic.npz", tmp_path).num_classes == 3  # relative to --data-root


# --------------------------------------------------------------------------------------------------------
# Lookup order and errors
# --------------------------------------------------------------------------------------------------------
def test_lookup_order_root_then_env_then_subdirectory_first(tmp_path, monkeypatch):
    in_root = write_mnist_dir(tmp_path / "root", np.random.default_rng(1))
    in_sub = write_mnist_dir(tmp_path / "root" / "mnist", np.random.default_rng(2))
    in_env = write_mnist_dir(tmp_path / "env", np.random.default_rng(3), compress=False)
    monkeypatch.setenv("FEDHET_DATA", str(tmp_path / "env"))
    np.testing.assert_array_equal(load_dataset("mnist").train_x[:, 0].numpy(), in_env["train_x"])
    np.testing.assert_array_equal(
        load_dataset("mnist", tmp_path / "root").train_x[:, 0].numpy(), in_sub["train_x"]
    )
    (
        tmp_path / "root" / "mnist" / "t10k-labels-idx1-ubyte.gz"
    ).unlink()  # incomplete: the root's own files win
    np.testing.assert_array_equal(
        load_dataset("mnist", tmp_path / "root").train_x[:, 0].numpy(), in_root["train_x"]
    )
    assert not np.array_equal(in_root["train_x"], in_env["train_x"])


def test_missing_dataset_names_every_place_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_DATA", str(tmp_path / "env"))
    (tmp_path / "mine").mkdir()
    with pytest.raises(DataError) as info:
        load_dataset("svhn", tmp_path / "mine")
    message = str(info.value)
    for place in (
        tmp_path / "mine",
        tmp_path / "mine" / "svhn",
        tmp_path / "env",
        *locations.SHARED_DATA_DIRS[:1],
    ):
        assert str(place) in message
    assert "--data-root" in message and "http://ufldl.stanford.edu/housenumbers/" in message
    assert "train_32x32.mat" in message
    assert message.index(str(tmp_path / "mine")) < message.index(str(tmp_path / "env"))


def test_missing_fashion_mnist_suggests_apt(tmp_path, monkeypatch):
    monkeypatch.setattr(locations, "SYSTEM_FASHION_MNIST_DIR", tmp_path / "nowhere")
    with pytest.raises(DataError) as info:
        load_dataset("fashion-mnist")
    message = str(info.value)
    assert "apt-get install dataset-fashion-mnist" in message and "--data-root" in message
    assert str(tmp_path / "nowhere") in message and "$FEDHET_DATA (not set)" in message
    assert "github.com/zalandoresearch/fashion-mnist" in message


def test_unknown_name_is_a_config_error():
    with pytest.raises(ConfigError, match="cifar10"):
        load_dataset("imagenet-1k")
    assert load_dataset("DIGITS").name == "digits"


# --------------------------------------------------------------------------------------------------------
# Cache behaviour
# --------------------------------------------------------------------------------------------------------
def _small_jpg_source(tmp_path, rng):
    tree = _random_tree(rng, list(formats.CIFAR10_CLASSES), {"train": 1, "test": 1}, size=32)
    return write_image_tree(tmp_path / "data", tree, ext=".png", as_tar="cifar10-jpg.tar.gz")


def test_cache_is_keyed_by_mtime_and_can_be_disabled(tmp_path, rng):
    source = _small_jpg_source(tmp_path, rng)
    entries = tmp_path / "cache" / "datasets"
    load_dataset("cifar10", tmp_path / "data", cache=False)
    assert not entries.exists()
    load_dataset("cifar10", tmp_path / "data")
    assert len(list(entries.glob("cifar10-*"))) == 1
    load_dataset("cifar10", tmp_path / "data")
    assert len(list(entries.glob("cifar10-*"))) == 1
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    load_dataset("cifar10", tmp_path / "data")
    assert len(list(entries.glob("cifar10-*"))) == 2


def test_corrupt_cache_is_rebuilt(tmp_path, rng, caplog):
    _small_jpg_source(tmp_path, rng)
    first = load_dataset("cifar10", tmp_path / "data")
    (entry,) = (tmp_path / "cache" / "datasets").glob("cifar10-*")
    (entry / "train_x.npy").write_bytes(b"\x93NUMPY garbage")
    with caplog.at_level("WARNING"):
        second = load_dataset("cifar10", tmp_path / "data")
    assert "unreadable cache entry" in caplog.text
    assert torch.equal(first.train_x, second.train_x)
    np.load(entry / "train_x.npy", allow_pickle=False)  # rewritten, readable again


def test_unwritable_cache_still_loads(tmp_path, rng, monkeypatch, caplog):
    _small_jpg_source(tmp_path, rng)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("FEDHET_CACHE", str(blocker))
    with caplog.at_level("WARNING"):
        data = load_dataset("cifar10", tmp_path / "data")
    assert len(data.train_y) == 10 and "could not write the dataset cache" in caplog.text


# --------------------------------------------------------------------------------------------------------
# Dataset and dataset_status
# --------------------------------------------------------------------------------------------------------
def _tiny_dataset(channels=3) -> Dataset:
    x = torch.tensor([[[[0, 255]]] * channels], dtype=torch.uint8)  # (1, C, 1, 2)
    return Dataset(
        name="tiny",
        train_x=x,
        train_y=torch.tensor([0]),
        test_x=x.clone(),
        test_y=torch.tensor([1]),
        classes=("a", "b"),
        mean=(0.5, 0.25, 0.0)[:channels],
        std=(0.5, 0.25, 1.0)[:channels],
        source="test",
    )


def test_normalize_known_values():
    data = _tiny_dataset()
    out = data.normalize(data.train_x)
    assert out.dtype == torch.float32 and out.shape == (1, 3, 1, 2)
    # (0 - m)/s and (1 - m)/s per channel, with (m, s) = (0.5, 0.5), (0.25, 0.25), (0, 1).
    expected = torch.tensor([[[[-1.0, 1.0]], [[-1.0, 3.0]], [[0.0, 1.0]]]])
    assert torch.allclose(out, expected)
    floats = data.train_x.double() / 255
    assert torch.allclose(data.normalize(floats), expected.double()) and floats.max() == 1  # input untouched
    assert torch.allclose(data.normalize(data.train_x[0]), expected[0])  # a single (C, H, W) image
    with pytest.raises(ValueError, match="3, H, W"):
        data.normalize(torch.zeros(1, 1, 2, 2, dtype=torch.uint8))
    with pytest.raises(TypeError):
        data.normalize(torch.zeros(1, 3, 2, 2, dtype=torch.int32))


def test_dataset_validates_its_fields():
    good = _tiny_dataset()
    with pytest.raises(DataError, match="labels span"):
        Dataset(**{**_fields(good), "test_y": torch.tensor([2])})
    with pytest.raises(DataError, match="uint8"):
        Dataset(**{**_fields(good), "train_x": good.train_x.float()})
    with pytest.raises(DataError, match="mean"):
        Dataset(**{**_fields(good), "mean": (0.5,)})
    assert "tiny" in repr(good) and "(1, 3, 1, 2)" in repr(good)


def _fields(data: Dataset) -> dict:
    names = ("name", "train_x", "train_y", "test_x", "test_y", "classes", "mean", "std", "source")
    return {n: getattr(data, n) for n in names}


def test_dataset_status_on_this_machine_detects_without_decoding(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("dataset_status must not decode data")

    for name in ("read_idx", "read_idx_dataset", "read_image_folder", "read_cifar_python", "read_svhn"):
        monkeypatch.setattr(formats, name, forbidden)
    monkeypatch.setattr("PIL.Image.open", forbidden)
    rows = {row["name"]: row for row in dataset_status()}
    assert tuple(rows) == DATASET_NAMES
    json.dumps(list(rows.values()))  # what `fedhet datasets --json` prints
    for row in rows.values():
        assert set(row) == {
            "name",
            "available",
            "location",
            "train_size",
            "test_size",
            "num_classes",
            "input_shape",
            "looked_in",
            "note",
        }
    assert rows["digits"]["available"] and rows["digits"]["train_size"] == 1347
    if FASHION_DIR.is_dir():
        assert rows["fashion-mnist"]["available"] and rows["fashion-mnist"]["location"] == str(FASHION_DIR)
        assert rows["fashion-mnist"]["input_shape"] == [1, 28, 28]
    if CIFAR_JPG is not None:
        assert rows["cifar10"]["available"] and rows["cifar10"]["location"] == str(CIFAR_JPG)
        assert rows["cifar10"]["train_size"] == 50_000 and "JPEG" in rows["cifar10"]["note"]
    assert not rows["svhn"]["available"] and rows["svhn"]["location"] is None
    assert "--data-root" in rows["svhn"]["note"] and rows["svhn"]["looked_in"]
    assert rows["tiny-imagenet"]["input_shape"] == [3, 64, 64] and rows["emnist"]["num_classes"] == 62


def test_dataset_status_with_a_data_root(tmp_path, rng):
    write_mnist_dir(tmp_path / "mnist", rng)
    rows = {row["name"]: row for row in dataset_status(tmp_path)}
    assert rows["mnist"]["available"] and rows["mnist"]["location"] == str(tmp_path / "mnist")
    assert rows["svhn"]["looked_in"][:3] == [str(tmp_path / "svhn"), str(tmp_path / "SVHN"), str(tmp_path)]


def test_an_explicit_data_root_is_never_passed_over_silently(tmp_path, monkeypatch):
    """--data-root that does not exist, is a file, or lacks the data set is an error, even when another copy
    exists ($FEDHET_DATA here): the user asked for that directory."""
    write_mnist_dir(tmp_path / "env", np.random.default_rng(0))
    monkeypatch.setenv("FEDHET_DATA", str(tmp_path / "env"))
    assert len(load_dataset("mnist").train_y) == 20  # found through $FEDHET_DATA without a root
    with pytest.raises(DataError, match=r"--data-root .*nowhere does not exist"):
        load_dataset("mnist", tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataError, match="is a file, not a directory"):
        load_dataset("mnist", tmp_path / "file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError) as info:
        load_dataset("mnist", tmp_path / "empty")
    message = str(info.value)
    assert "not found under --data-root" in message and f"A copy exists at {tmp_path / 'env'}" in message
    with pytest.raises(DataError, match="does not exist"):
        load_dataset("digits", tmp_path / "nowhere")  # even for the built-in set: the flag is a mistake


@pytest.mark.parametrize(
    ("n_test", "shape", "needle"), [(0, 28, "test set holds 0 images"), (5, 20, "(1, 20, 20)")]
)
def test_an_empty_test_set_or_wrong_image_shape_is_refused(tmp_path, n_test, shape, needle):
    rng = np.random.default_rng(0)
    folder = tmp_path / "mnist"
    folder.mkdir()
    for name, array in (
        ("train-images-idx3-ubyte.gz", rng.integers(0, 256, (10, shape, shape), dtype=np.uint8)),
        ("train-labels-idx1-ubyte.gz", rng.integers(0, 10, 10, dtype=np.uint8)),
        ("t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (n_test, shape, shape), dtype=np.uint8)),
        ("t10k-labels-idx1-ubyte.gz", rng.integers(0, 10, n_test, dtype=np.uint8)),
    ):
        write_idx(folder / name, array, compress=True)
    with pytest.raises(DataError) as info:
        load_dataset("mnist", tmp_path, cache=False)
    assert needle in str(info.value)


def test_image_tensors_have_canonical_strides_so_no_conv_runs_channels_last():
    """numpy calls images[idx] of an (N, 1, H, W) array C-contiguous with a channel stride of 1; torch reads
    that as channels_last and oneDNN's 1x1 strided backward-weights kernel then corrupts the heap for < 8
    input channels (the native crash of issue 17). Every data set's tensors must have the standard strides."""
    from fedhet.data.datasets import from_arrays, load_dataset, to_tensor

    images = np.arange(5 * 64, dtype=np.uint8).reshape(5, 8, 8)[:, None][[3, 1, 4]]
    assert images.flags.c_contiguous and images.strides[1] == 1  # the trap: numpy does not restride it

    def standard(t):
        _, c, h, w = t.shape
        return list(t.stride()) == [c * h * w, h * w, w, 1]

    assert standard(to_tensor(images))
    digits = load_dataset("digits")
    assert standard(digits.train_x) and standard(digits.test_x)
    made = from_arrays(images, np.array([0, 1, 0]), images, np.array([1, 0, 1]), name="strides")
    assert standard(made.train_x)
