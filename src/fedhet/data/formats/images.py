"""Image folders (train/<class>/<image>, in a directory, zip or tar), CINIC-10 and Tiny-ImageNet-200."""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from fedhet.data.formats.arrays import Arrays
from fedhet.data.formats.cifar import CIFAR10_CLASSES
from fedhet.data.formats.containers import _Container, _find_prefix
from fedhet.errors import DataError

IMAGE_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png")


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
