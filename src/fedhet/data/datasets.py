"""Named data sets -> uint8 tensors + class names + normalization stats (DESIGN.md layout, paper-results.md
"Data available offline"; normalization stats from methods.md §1.2, §2.2, §3.2).

Lookup, for each data set, in this order (the first match wins):
  1. `root` (the CLI's --data-root DIR): first DIR/<name> (and aliases such as cifar-10 or torchvision's
     MNIST/raw, see `_specs`), then DIR itself, accepting the official file names;
  2. each directory of $FEDHET_DATA (os.pathsep-separated), the same way;
  3. known locations: /usr/share/datasets/fashion-mnist (Debian package dataset-fashion-mnist) and the
     repository's sibling ../shared/data (and /work/shared/data).
Inside one directory the exact official formats are preferred over the JPEG copy of CIFAR-10.

Images decoded from image folders/tars (CIFAR-10 JPEG, CINIC-10, Tiny-ImageNet) are cached as .npy under
$FEDHET_CACHE (default ~/.cache/fedhet)/datasets/, keyed by the source's absolute path, size and mtime;
the cache is safe to delete. digits is scikit-learn's 8x8 set with a fixed split (see `_load_digits`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedhet.data import formats
from fedhet.errors import ConfigError, DataError

__all__ = [
    "DATASET_NAMES",
    "USER_FORMATS",
    "Dataset",
    "cache_root",
    "dataset_status",
    "from_arrays",
    "load_dataset",
    "register_dataset",
]

log = logging.getLogger(__name__)

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
)

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
USER_FORMATS: tuple[str, ...] = ("npz", "folder")

DIGIT_CLASSES: tuple[str, ...] = tuple(str(d) for d in range(10))
EMNIST_BYCLASS_CLASSES: tuple[str, ...] = (
    DIGIT_CLASSES
    + tuple(chr(c) for c in range(ord("A"), ord("Z") + 1))
    + tuple(chr(c) for c in range(ord("a"), ord("z") + 1))
)
CIFAR10_CLASSES = formats.CIFAR10_CLASSES

# Known locations; module-level so that tests (and packagers) can point them elsewhere.
SYSTEM_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
REPOSITORY_ROOT = Path(__file__).resolve().parents[3]
SHARED_DATA_DIRS: tuple[Path, ...] = (REPOSITORY_ROOT.parent / "shared" / "data", Path("/work/shared/data"))


def shared_data_file(name: str) -> Path | None:
    """The first ``SHARED_DATA_DIRS / name`` that exists (e.g. ``cifar10-jpg.tar.gz``), or None."""
    return next((d / name for d in SHARED_DATA_DIRS if (d / name).is_file()), None)


DIGITS_SPLIT = "sklearn.model_selection.train_test_split(test_size=0.25, stratify=y, random_state=0)"
CACHE_FORMAT_VERSION = 1
_CACHE_KEYS = ("train_x", "train_y", "test_x", "test_y")

_IDX_STEMS = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


# --------------------------------------------------------------------------------------------------------
# The Dataset
# --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Dataset:
    """A named data set: uint8 images (N, C, H, W), int64 labels, class names, per-channel mean/std on [0, 1].

    Equality is identity (tensors have no single truth value); compare the tensors themselves.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str

    def __post_init__(self) -> None:
        # Per-(device, dtype) mean/std tensors for normalize(); not a dataclass field.
        object.__setattr__(self, "_stats", {})
        for part in ("train", "test"):
            x, y = getattr(self, f"{part}_x"), getattr(self, f"{part}_y")
            if x.dtype != torch.uint8 or x.dim() != 4:
                raise DataError(
                    f"{self.name}: {part}_x must be uint8 (N, C, H, W), got {x.dtype} {tuple(x.shape)}"
                )
            if y.dtype != torch.int64 or y.dim() != 1 or len(y) != len(x):
                raise DataError(
                    f"{self.name}: {part}_y must be int64 (N,) with N = {len(x)}, "
                    f"got {y.dtype} {tuple(y.shape)}"
                )
            if len(y) and (int(y.min()) < 0 or int(y.max()) >= len(self.classes)):
                raise DataError(
                    f"{self.name}: {part} labels span {int(y.min())}..{int(y.max())}, "
                    f"accepted 0..{len(self.classes) - 1}"
                )
        if self.train_x.shape[1:] != self.test_x.shape[1:]:
            raise DataError(
                f"{self.name}: train images {tuple(self.train_x.shape[1:])} differ from test images "
                f"{tuple(self.test_x.shape[1:])}"
            )
        channels = self.train_x.shape[1]
        if len(self.mean) != channels or len(self.std) != channels or min(self.std) <= 0:
            raise DataError(
                f"{self.name}: need {channels} mean and {channels} positive std values, "
                f"got {self.mean} / {self.std}"
            )

    @property
    def num_classes(self) -> int:
        """Number of classes K."""
        return len(self.classes)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image."""
        channels, height, width = self.train_x.shape[1:]
        return int(channels), int(height), int(width)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(x/255 - mean) / std per channel (channel axis -3); uint8 is scaled, float is taken as [0, 1].

        Works on any device; returns float32 for uint8 input, the input's dtype for float input.
        """
        if x.dtype == torch.uint8:
            x = x.to(torch.float32).div_(255.0)
        elif not x.is_floating_point():
            raise TypeError(f"normalize expects uint8 or floating images, got {x.dtype}")
        channels = self.input_shape[0]
        if x.dim() < 3 or x.shape[-3] != channels:
            raise ValueError(
                f"normalize expects images (..., {channels}, H, W) for {self.name}, "
                f"got shape {tuple(x.shape)}"
            )
        key = (x.device, x.dtype)
        if key not in self._stats:
            mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(channels, 1, 1)
            std = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(channels, 1, 1)
            self._stats[key] = (mean, std)
        mean, std = self._stats[key]
        return (x - mean).div_(std)

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, train={tuple(self.train_x.shape)}, "
            f"test={tuple(self.test_x.shape)}, "
            f"num_classes={self.num_classes}, source={self.source!r})"
        )


# --------------------------------------------------------------------------------------------------------
# Where each data set may lie
# --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Layout:
    """One official way a data set is stored inside a search directory."""

    description: str
    locate: Callable[[Path], Path | None]
    read: Callable[[Path], formats.Arrays]
    decodes_images: bool = False  # slow to decode: cache the arrays


@dataclass(frozen=True)
class _Spec:
    name: str
    classes: tuple[str, ...] | None  # None: from the files (CIFAR-100 meta, Tiny-ImageNet wnids)
    num_classes: int
    input_shape: tuple[int, int, int]
    train_size: int
    test_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    url: str
    layouts: tuple[_Layout, ...]
    subdirs: tuple[str, ...]
    apt_package: str | None = None


def _raw_or_gz(folder: Path, stem: str) -> Path | None:
    for candidate in (folder / stem, folder / (stem + ".gz")):
        if candidate.is_file():
            return candidate
    return None


def _idx_layout(relpath: str, stems: tuple[str, ...], num_classes: int, transposed: bool = False) -> _Layout:
    def locate(base: Path) -> Path | None:
        folder = base / relpath if relpath else base
        return folder if all(_raw_or_gz(folder, s) for s in stems) else None

    def read(folder: Path) -> formats.Arrays:
        paths = [_raw_or_gz(folder, s) for s in stems]
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


def _emnist_layouts() -> tuple[_Layout, ...]:
    stems = tuple(
        f"emnist-byclass-{part}-{kind}-ubyte"
        for part, kind in (
            ("train", "images-idx3"),
            ("train", "labels-idx1"),
            ("test", "images-idx3"),
            ("test", "labels-idx1"),
        )
    )

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


def _specs() -> dict[str, _Spec]:
    cifar10_python = lambda p: formats.read_cifar_python(p, "cifar10")  # noqa: E731
    cifar100_python = lambda p: formats.read_cifar_python(p, "cifar100")  # noqa: E731
    mnist_like = (0.1307,), (0.3081,)
    specs = [
        _Spec(
            "fashion-mnist",
            FASHION_MNIST_CLASSES,
            10,
            (1, 28, 28),
            60_000,
            10_000,
            (0.286,),
            (0.353,),
            "https://github.com/zalandoresearch/fashion-mnist (the four *-ubyte.gz files)",
            (_idx_layout("", _IDX_STEMS, 10),),
            ("fashion-mnist", "fashion_mnist", "FashionMNIST/raw"),
            apt_package="dataset-fashion-mnist",
        ),
        _Spec(
            "mnist",
            DIGIT_CLASSES,
            10,
            (1, 28, 28),
            60_000,
            10_000,
            *mnist_like,
            "http://yann.lecun.com/exdb/mnist/ (the four *-ubyte.gz files)",
            (_idx_layout("", _IDX_STEMS, 10),),
            ("mnist", "MNIST/raw"),
        ),
        _Spec(
            "emnist",
            EMNIST_BYCLASS_CLASSES,
            62,
            (1, 28, 28),
            697_932,
            116_323,
            *mnist_like,
            "https://www.nist.gov/itl/products-and-services/emnist-dataset (gzip.zip, split 'byclass')",
            _emnist_layouts(),
            ("emnist", "EMNIST/raw"),
        ),
        _Spec(
            "cifar10",
            CIFAR10_CLASSES,
            10,
            (3, 32, 32),
            50_000,
            10_000,
            (0.4914, 0.4822, 0.4465),
            (0.2023, 0.1994, 0.2010),
            "https://www.cs.toronto.edu/~kriz/cifar.html (cifar-10-python.tar.gz)",
            (
                _file_layout("cifar-10-python.tar.gz", cifar10_python),
                _dir_layout("cifar-10-batches-py", ("data_batch_1", "test_batch"), cifar10_python),
                _dir_layout("", ("data_batch_1", "test_batch"), cifar10_python),
                _file_layout("cifar10-jpg.tar.gz", _cifar10_jpg, decodes_images=True),
                _dir_layout(
                    "cifar10-jpg", ("train/airplane/", "test/airplane/"), _cifar10_jpg, decodes_images=True
                ),
                _dir_layout("", ("train/airplane/", "test/airplane/"), _cifar10_jpg, decodes_images=True),
            ),
            ("cifar10", "cifar-10"),
        ),
        _Spec(
            "cifar100",
            None,
            100,
            (3, 32, 32),
            50_000,
            10_000,
            (0.5071, 0.4865, 0.4409),
            (0.2673, 0.2564, 0.2762),
            "https://www.cs.toronto.edu/~kriz/cifar.html (cifar-100-python.tar.gz)",
            (
                _file_layout("cifar-100-python.tar.gz", cifar100_python),
                _dir_layout("cifar-100-python", ("train", "test", "meta"), cifar100_python),
                _dir_layout("", ("train", "test", "meta"), cifar100_python),
            ),
            ("cifar100", "cifar-100"),
        ),
        _Spec(
            "svhn",
            DIGIT_CLASSES,
            10,
            (3, 32, 32),
            73_257,
            26_032,
            (0.4377, 0.4438, 0.4728),
            (0.1980, 0.2010, 0.1970),
            "http://ufldl.stanford.edu/housenumbers/ (train_32x32.mat, test_32x32.mat)",
            (_svhn_layout(),),
            ("svhn", "SVHN"),
        ),
        _Spec(
            "cinic10",
            CIFAR10_CLASSES,
            10,
            (3, 32, 32),
            90_000,
            90_000,
            (0.4789, 0.4723, 0.4305),
            (0.2421, 0.2383, 0.2587),
            "https://datashare.ed.ac.uk/handle/10283/3192 (CINIC-10.tar.gz)",
            (
                _file_layout("CINIC-10.tar.gz", formats.read_cinic10, decodes_images=True),
                _dir_layout(
                    "CINIC-10", ("train/", "valid/", "test/"), formats.read_cinic10, decodes_images=True
                ),
                _dir_layout("", ("train/", "valid/", "test/"), formats.read_cinic10, decodes_images=True),
            ),
            ("cinic10", "cinic-10", "CINIC-10"),
        ),
        _Spec(
            "tiny-imagenet",
            None,
            200,
            (3, 64, 64),
            100_000,
            10_000,
            (0.4802, 0.4481, 0.3975),
            (0.2770, 0.2691, 0.2821),
            "http://cs231n.stanford.edu/tiny-imagenet-200.zip",
            (
                _file_layout("tiny-imagenet-200.zip", formats.read_tiny_imagenet, decodes_images=True),
                _dir_layout(
                    "tiny-imagenet-200", ("wnids.txt", "train/", "val/"), formats.read_tiny_imagenet, True
                ),
                _dir_layout(
                    "", ("wnids.txt", "train/", "val/"), formats.read_tiny_imagenet, decodes_images=True
                ),
            ),
            ("tiny-imagenet", "tiny_imagenet"),
        ),
    ]
    return {spec.name: spec for spec in specs}


_SPECS = _specs()
_DIGITS_INFO = {"num_classes": 10, "input_shape": (1, 8, 8), "train_size": 1347, "test_size": 450}
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


def _known_dirs(name: str) -> list[Path]:
    dirs = [SYSTEM_FASHION_MNIST_DIR] if name == "fashion-mnist" else []
    return dirs + list(SHARED_DATA_DIRS)


def _search_dirs(spec: _Spec, root: str | os.PathLike | None) -> list[tuple[Path, str]]:
    """(directory, why it is searched) in lookup order (see the module docstring), without duplicates."""
    tops: list[tuple[Path, str]] = []
    if root is not None:
        tops.append((Path(root).expanduser(), "--data-root"))
    env = os.environ.get("FEDHET_DATA", "")
    tops.extend((Path(p).expanduser(), "$FEDHET_DATA") for p in env.split(os.pathsep) if p)
    bases: list[tuple[Path, str]] = []
    for top, why in tops:
        bases.extend((top / sub, why) for sub in spec.subdirs)
        bases.append((top, why))
    bases.extend((known, "known location") for known in _known_dirs(spec.name))
    seen: set[str] = set()
    unique = []
    for base, why in bases:
        key = os.path.abspath(base)
        if key not in seen:
            seen.add(key)
            unique.append((Path(key), why))
    return unique


def _locate(
    spec: _Spec, root: str | os.PathLike | None
) -> tuple[Path | None, _Layout | None, list[tuple[Path, str]]]:
    looked = _search_dirs(spec, root)
    for base, _why in looked:
        if not base.is_dir():
            continue
        for layout in spec.layouts:
            found = layout.locate(base)
            if found is not None:
                return found, layout, looked
    return None, None, looked


def _is_under(path: Path, top: Path) -> bool:
    try:
        Path(os.path.abspath(path)).relative_to(os.path.abspath(top))
    except ValueError:
        return False
    return True


def _fix_hint(spec: _Spec) -> str:
    hint = []
    if spec.apt_package:
        hint.append(
            f"apt-get install {spec.apt_package} (Debian/Ubuntu; installs {SYSTEM_FASHION_MNIST_DIR})"
        )
    hint.append(
        f"download from {spec.url} into a directory DIR and pass --data-root DIR (or set FEDHET_DATA=DIR)"
    )
    return "; or ".join(hint)


def _missing_error(spec: _Spec, looked: list[tuple[Path, str]]) -> DataError:
    lines = [f"  - {base} ({why}{'' if base.is_dir() else '; does not exist'})" for base, why in looked]
    if not os.environ.get("FEDHET_DATA"):
        at = next((i for i, (_b, why) in enumerate(looked) if why == "known location"), len(looked))
        lines.insert(at, "  - $FEDHET_DATA (not set)")
    if not any(why == "--data-root" for _b, why in looked):
        lines.insert(0, "  - --data-root (not given)")
    accepted = "; ".join(layout.description for layout in spec.layouts)
    return DataError(
        f"dataset {spec.name!r} not found. Looked in:\n" + "\n".join(lines) + f"\nfor any of: {accepted}.\n"
        f"Fix: {_fix_hint(spec)}."
    )


# --------------------------------------------------------------------------------------------------------
# Cache of decoded image folders
# --------------------------------------------------------------------------------------------------------
def cache_root() -> Path:
    """$FEDHET_CACHE, or ~/.cache/fedhet; decoded data sets live in its datasets/ folder (safe to delete)."""
    return Path(os.environ.get("FEDHET_CACHE") or Path.home() / ".cache" / "fedhet").expanduser()


def _fingerprint(path: Path) -> dict:
    if path.is_file():
        stat = path.stat()
        return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    # A directory's own mtime misses edits deeper down: summarise every file below it.
    count = size = newest = 0
    for folder, _subdirs, files in os.walk(path):
        newest = max(newest, os.stat(folder).st_mtime_ns)
        for name in files:
            stat = os.stat(os.path.join(folder, name))
            count, size, newest = count + 1, size + stat.st_size, max(newest, stat.st_mtime_ns)
    return {"files": count, "size": size, "mtime_ns": newest}


def _cache_entry(name: str, source: Path) -> tuple[Path, dict]:
    key = {
        "dataset": name,
        "source": os.path.abspath(source),
        "fingerprint": _fingerprint(source),
        "version": CACHE_FORMAT_VERSION,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return cache_root() / "datasets" / f"{name}-{digest}", key


def _read_cache(entry: Path) -> formats.Arrays | None:
    if not entry.is_dir():
        return None
    try:
        meta = json.loads((entry / "meta.json").read_text())
        parts = {k: np.load(entry / f"{k}.npy", allow_pickle=False) for k in _CACHE_KEYS}
        ok = (
            parts["train_x"].dtype == np.uint8
            and parts["test_x"].dtype == np.uint8
            and parts["train_y"].dtype == np.int64
            and parts["test_y"].dtype == np.int64
            and len(parts["train_x"]) == len(parts["train_y"])
            and len(parts["test_x"]) == len(parts["test_y"])
        )
        if not ok:
            raise ValueError("arrays have unexpected dtypes or lengths")
        classes = tuple(meta["classes"]) if meta.get("classes") is not None else None
    except (OSError, ValueError, EOFError, KeyError, TypeError) as err:
        log.warning("ignoring unreadable cache entry %s (%s); decoding the source again", entry, err)
        shutil.rmtree(entry, ignore_errors=True)
        return None
    return formats.Arrays(**parts, classes=classes)


def _write_cache(entry: Path, arrays: formats.Arrays, key: dict) -> None:
    """Write all arrays into a temporary folder, then rename it into place (atomic on one file system)."""
    tmp: Path | None = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".tmp", dir=entry.parent))
        for k in _CACHE_KEYS:
            np.save(tmp / f"{k}.npy", getattr(arrays, k), allow_pickle=False)
        meta = {**key, "classes": list(arrays.classes) if arrays.classes is not None else None}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        os.rename(tmp, entry)
    except OSError as err:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if not entry.is_dir():  # else a concurrent load wrote the same entry first
            log.warning("could not write the dataset cache %s (%s); the next load decodes again", entry, err)


def _read_with_cache(name: str, location: Path, layout: _Layout, cache: bool) -> formats.Arrays:
    if not (cache and layout.decodes_images):
        return layout.read(location)
    entry, key = _cache_entry(name, location)
    arrays = _read_cache(entry)
    if arrays is not None:
        log.info("loaded %s from the cache %s", name, entry)
        return arrays
    log.info("decoding %s from %s (cached afterwards under %s)", name, location, entry)
    arrays = layout.read(location)
    _write_cache(entry, arrays, key)
    return arrays


# --------------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------------
def _channel_stats(images: np.ndarray, chunk: int = 4096) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and population std of uint8 images on the [0, 1] scale, in float64 chunks."""
    channels = images.shape[1]
    total = np.zeros(channels)
    squares = np.zeros(channels)
    for start in range(0, len(images), chunk):
        block = images[start : start + chunk].astype(np.float64) / 255.0
        total += block.sum(axis=(0, 2, 3))
        squares += np.square(block).sum(axis=(0, 2, 3))
    count = len(images) * images.shape[2] * images.shape[3]
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean**2, 0.0))
    return tuple(float(m) for m in mean), tuple(float(max(s, 1e-6)) for s in std)


def to_tensor(array: np.ndarray) -> torch.Tensor:
    """A torch tensor sharing a C-ordered, writable copy of ``array`` with the canonical strides."""
    array = np.ascontiguousarray(array)
    # numpy calls an array C-contiguous whatever the stride of a size-1 axis: images[idx] of an (N, 1, H, W)
    # array has channel stride 1, which torch reads as channels_last, so every conv would run NHWC (oneDNN's
    # 1x1 strided backward-weights kernel corrupts the heap there for < 8 input channels). copy() restrides.
    canonical = tuple(int(np.prod(array.shape[i + 1 :])) * array.itemsize for i in range(array.ndim))
    if not array.flags.writeable or array.strides != canonical:
        array = array.copy()
    return torch.from_numpy(array)


def _to_dataset(
    name: str, arrays: formats.Arrays, classes: tuple[str, ...], mean, std, source: str
) -> Dataset:
    return Dataset(
        name=name,
        train_x=to_tensor(arrays.train_x),
        train_y=to_tensor(arrays.train_y.astype(np.int64, copy=False)),
        test_x=to_tensor(arrays.test_x),
        test_y=to_tensor(arrays.test_y.astype(np.int64, copy=False)),
        classes=tuple(classes),
        mean=tuple(float(m) for m in mean),
        std=tuple(float(s) for s in std),
        source=source,
    )


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


def _load_npz(path: Path) -> Dataset:
    arrays = formats.read_npz(path)
    mean, std = _channel_stats(arrays.train_x)
    assert arrays.classes is not None  # read_npz always names the classes
    return _to_dataset(path.stem, arrays, arrays.classes, mean, std, str(path.resolve()))


# --------------------------------------------------------------------------------------------------------
# Your own data: arrays, registered data sets, .npz files and image folders
# --------------------------------------------------------------------------------------------------------
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
    """A :class:`Dataset` from in-memory arrays (numpy or torch).

    Images (N, H, W), (N, C, H, W) or (N, H, W, C) with C in {1, 3}, uint8 or float in [0, 1]; labels
    integers in 0..K-1. ``class_names`` default to "0".."K-1"; ``mean``/``std`` (per channel, on [0, 1])
    default to the train split's. Register it (:func:`register_dataset`) to use it as ``data.dataset``.
    """
    if not isinstance(name, str) or not name or "/" in name or name in (*DATASET_NAMES, *USER_FORMATS):
        raise DataError(
            f"from_arrays(name={name!r}): give a non-empty name without '/' that is not a built-in data set "
            f"({', '.join((*DATASET_NAMES, *USER_FORMATS))})"
        )
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
    stats = _channel_stats(arrays.train_x)
    assert arrays.classes is not None  # arrays_from always names the classes
    return _to_dataset(
        name, arrays, arrays.classes, stats[0] if mean is None else mean, stats[1] if std is None else std,
        f"from_arrays({name!r})",
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
    example = 'data.path = "site-a.npz"' if kind == "npz" else 'data.path = "/srv/site-a"'
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


def load_dataset(
    name: str,
    root: str | os.PathLike | None = None,
    *,
    cache: bool = True,
    path: str | os.PathLike | None = None,
) -> Dataset:
    """Load a data set: a built-in name (DATASET_NAMES), a registered one (:func:`register_dataset`), or your
    own files: ``"npz"`` / ``"folder"`` at ``path`` (stats from their train split). A ``name`` ending in
    ``.npz`` is that file's path.

    Built-in names are looked for in `root`, then $FEDHET_DATA, then known locations; raises DataError
    naming every place looked in. cache=False neither reads nor writes the decoded-image cache.
    """
    if name in USER_FORMATS:
        file = _user_file(name, path, root)
        return _load_npz(file) if name == "npz" else _load_folder(file)
    if path is not None:
        raise ConfigError(
            f"data.path is read only with data.dataset = 'npz' or 'folder', not {name!r}; drop data.path, "
            "or set data.root to where the built-in data set lies"
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
