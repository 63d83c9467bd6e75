"""The named data sets: their names, classes, official sizes and statistics, and the official layouts
(file names, folders) each may be stored in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from fedhet.data import formats
from fedhet.data.formats.idx import emnist_stems, find_raw_or_gz
from fedhet.errors import DataError

DATASET_NAMES: tuple[str, ...] = (
    "fashion-mnist",
    "mnist",
    "emnist",
    "cifar10",
    "cifar100",
    "svhn",
    "cinic10",
    "tiny-imagenet",
    "digits",
    "breast-cancer",
    "wine",
)
#: Built-in tables, shipped with scikit-learn: name -> (rows, features, classes) for ``fedhet datasets``.
SKLEARN_TABLES: dict[str, tuple[int, int, int]] = {"breast-cancer": (569, 30, 2), "wine": (178, 13, 3)}

FASHION_MNIST_CLASSES: tuple[str, ...] = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
#: ``data.dataset`` values that read the user's own files at ``data.path``.
USER_FORMATS: tuple[str, ...] = ("npz", "folder", "csv", "parquet")

DIGIT_CLASSES: tuple[str, ...] = tuple(str(d) for d in range(10))
EMNIST_BYCLASS_CLASSES: tuple[str, ...] = (
    DIGIT_CLASSES
    + tuple(chr(c) for c in range(ord("A"), ord("Z") + 1))
    + tuple(chr(c) for c in range(ord("a"), ord("z") + 1))
)
CIFAR10_CLASSES = formats.CIFAR10_CLASSES

DIGITS_SPLIT = "sklearn.model_selection.train_test_split(test_size=0.25, stratify=y, random_state=0)"

_IDX_STEMS = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@dataclass(frozen=True)
class _Layout:
    """One official way a data set is stored inside a search directory."""

    description: str
    locate: Callable[[Path], Path | None]
    read: Callable[[Path], formats.Arrays]
    decodes_images: bool = False  # slow to decode: cache the arrays


class _Facts(NamedTuple):
    """The official facts of an image data set, known before reading its files."""

    num_classes: int
    input_shape: tuple[int, int, int]
    train_size: int
    test_size: int
    mean: tuple[float, ...]  # per channel, to normalise with
    std: tuple[float, ...]


@dataclass(frozen=True)
class _Spec:
    name: str
    classes: tuple[str, ...] | None  # None: from the files (CIFAR-100 meta, Tiny-ImageNet wnids)
    url: str
    layouts: tuple[_Layout, ...]
    subdirs: tuple[str, ...]
    num_classes: int
    input_shape: tuple[int, int, int]
    train_size: int
    test_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    apt_package: str | None = None


def _idx_layout(relpath: str, stems: tuple[str, ...], num_classes: int, transposed: bool = False) -> _Layout:
    def locate(base: Path) -> Path | None:
        folder = base / relpath if relpath else base
        return folder if all(find_raw_or_gz(folder, s) for s in stems) else None

    def read(folder: Path) -> formats.Arrays:
        paths = [find_raw_or_gz(folder, s) for s in stems]
        if any(p is None for p in paths):
            raise DataError(f"{folder}: idx files {stems} (raw or .gz) are incomplete")
        return formats.read_idx_dataset(*paths, num_classes=num_classes, transposed=transposed)

    where = f"{relpath}/" if relpath else ""
    return _Layout(f"{where}{{{', '.join(stems)}}}[.gz]", locate, read)


def _file_layout(name: str, read: Callable[[Path], formats.Arrays], decodes_images: bool = False) -> _Layout:
    def locate(base: Path) -> Path | None:
        path = base / name
        return path if path.is_file() else None

    return _Layout(name, locate, read, decodes_images)


def _marker_present(folder: Path, marker: str) -> bool:
    return (folder / marker).is_dir() if marker.endswith("/") else (folder / marker).is_file()


def _dir_layout(
    relpath: str,
    markers: tuple[str, ...],
    read: Callable[[Path], formats.Arrays],
    decodes_images: bool = False,
) -> _Layout:
    def locate(base: Path) -> Path | None:
        folder = base / relpath if relpath else base
        # A marker ending in "/" must be a directory, any other a file.
        return folder if folder.is_dir() and all(_marker_present(folder, m) for m in markers) else None

    where = f"{relpath}/" if relpath else "./"
    return _Layout(f"{where} with {', '.join(markers)}", locate, read, decodes_images)


def _archive_layouts(
    archive: str,
    folder: str,
    markers: tuple[str, ...],
    read: Callable[[Path], formats.Arrays],
    decodes_images: bool = False,
) -> tuple[_Layout, _Layout, _Layout]:
    """A data set shipped as one archive: the archive itself, the folder it unpacks to, or a search directory
    that is that folder (each folder recognised by its ``markers``), in this order."""
    return (
        _file_layout(archive, read, decodes_images),
        _dir_layout(folder, markers, read, decodes_images),
        _dir_layout("", markers, read, decodes_images),
    )


def _emnist_layouts() -> tuple[_Layout, ...]:
    stems = tuple(emnist_stems("byclass"))

    def read(path: Path) -> formats.Arrays:
        return formats.read_emnist(path, split="byclass", num_classes=62)

    dirs = tuple(_idx_layout(rel, stems, 62, transposed=True) for rel in ("", "gzip"))
    return (*dirs, _file_layout("gzip.zip", read))


def _svhn_layout() -> _Layout:
    def locate(base: Path) -> Path | None:
        return base if (base / "train_32x32.mat").is_file() and (base / "test_32x32.mat").is_file() else None

    def read(folder: Path) -> formats.Arrays:
        return formats.read_svhn(folder / "train_32x32.mat", folder / "test_32x32.mat")

    return _Layout("train_32x32.mat + test_32x32.mat", locate, read)


def _cifar10_jpg(path: Path) -> formats.Arrays:
    return formats.read_image_folder(path, classes=CIFAR10_CLASSES, mode="RGB")


_FACTS: dict[str, _Facts] = {
    "fashion-mnist": _Facts(10, (1, 28, 28), 60_000, 10_000, (0.286,), (0.353,)),
    "mnist": _Facts(10, (1, 28, 28), 60_000, 10_000, (0.1307,), (0.3081,)),
    "emnist": _Facts(62, (1, 28, 28), 697_932, 116_323, (0.1307,), (0.3081,)),
    "cifar10": _Facts(10, (3, 32, 32), 50_000, 10_000, (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "cifar100": _Facts(100, (3, 32, 32), 50_000, 10_000, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "svhn": _Facts(10, (3, 32, 32), 73_257, 26_032, (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
    "cinic10": _Facts(10, (3, 32, 32), 90_000, 90_000, (0.4789, 0.4723, 0.4305), (0.2421, 0.2383, 0.2587)),
    "tiny-imagenet": _Facts(
        200, (3, 64, 64), 100_000, 10_000, (0.4802, 0.4481, 0.3975), (0.2770, 0.2691, 0.2821)
    ),
}


def _spec(
    name: str,
    classes: tuple[str, ...] | None,
    url: str,
    layouts: tuple[_Layout, ...],
    subdirs: tuple[str, ...],
    apt_package: str | None = None,
) -> _Spec:
    """The spec of data set ``name``, its official facts taken from ``_FACTS``."""
    return _Spec(name, classes, url, layouts, subdirs, **_FACTS[name]._asdict(), apt_package=apt_package)


def _specs() -> dict[str, _Spec]:
    cifar10_python = lambda p: formats.read_cifar_python(p, "cifar10")  # noqa: E731
    cifar100_python = lambda p: formats.read_cifar_python(p, "cifar100")  # noqa: E731
    specs = [
        _spec(
            "fashion-mnist",
            FASHION_MNIST_CLASSES,
            "https://github.com/zalandoresearch/fashion-mnist (the four *-ubyte.gz files)",
            (_idx_layout("", _IDX_STEMS, 10),),
            ("fashion-mnist", "fashion_mnist", "FashionMNIST/raw"),
            apt_package="dataset-fashion-mnist",
        ),
        _spec(
            "mnist",
            DIGIT_CLASSES,
            "http://yann.lecun.com/exdb/mnist/ (the four *-ubyte.gz files)",
            (_idx_layout("", _IDX_STEMS, 10),),
            ("mnist", "MNIST/raw"),
        ),
        _spec(
            "emnist",
            EMNIST_BYCLASS_CLASSES,
            "https://www.nist.gov/itl/products-and-services/emnist-dataset (gzip.zip, split 'byclass')",
            _emnist_layouts(),
            ("emnist", "EMNIST/raw"),
        ),
        _spec(
            "cifar10",
            CIFAR10_CLASSES,
            "https://www.cs.toronto.edu/~kriz/cifar.html (cifar-10-python.tar.gz)",
            (
                *_archive_layouts(
                    "cifar-10-python.tar.gz",
                    "cifar-10-batches-py",
                    ("data_batch_1", "test_batch"),
                    cifar10_python,
                ),
                *_archive_layouts(
                    "cifar10-jpg.tar.gz",
                    "cifar10-jpg",
                    ("train/airplane/", "test/airplane/"),
                    _cifar10_jpg,
                    decodes_images=True,
                ),
            ),
            ("cifar10", "cifar-10"),
        ),
        _spec(
            "cifar100",
            None,
            "https://www.cs.toronto.edu/~kriz/cifar.html (cifar-100-python.tar.gz)",
            _archive_layouts(
                "cifar-100-python.tar.gz", "cifar-100-python", ("train", "test", "meta"), cifar100_python
            ),
            ("cifar100", "cifar-100"),
        ),
        _spec(
            "svhn",
            DIGIT_CLASSES,
            "http://ufldl.stanford.edu/housenumbers/ (train_32x32.mat, test_32x32.mat)",
            (_svhn_layout(),),
            ("svhn", "SVHN"),
        ),
        _spec(
            "cinic10",
            CIFAR10_CLASSES,
            "https://datashare.ed.ac.uk/handle/10283/3192 (CINIC-10.tar.gz)",
            _archive_layouts(
                "CINIC-10.tar.gz",
                "CINIC-10",
                ("train/", "valid/", "test/"),
                formats.read_cinic10,
                decodes_images=True,
            ),
            ("cinic10", "cinic-10", "CINIC-10"),
        ),
        _spec(
            "tiny-imagenet",
            None,
            "http://cs231n.stanford.edu/tiny-imagenet-200.zip",
            _archive_layouts(
                "tiny-imagenet-200.zip",
                "tiny-imagenet-200",
                ("wnids.txt", "train/", "val/"),
                formats.read_tiny_imagenet,
                decodes_images=True,
            ),
            ("tiny-imagenet", "tiny_imagenet"),
        ),
    ]
    return {spec.name: spec for spec in specs}


_SPECS = _specs()
_DIGITS_INFO = {"num_classes": 10, "input_shape": (1, 8, 8), "train_size": 1347, "test_size": 450}
