"""The :class:`Dataset` (uint8 images, labels, class names, normalization stats) and how arrays become one."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedhet.data import formats
from fedhet.errors import DataError


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
