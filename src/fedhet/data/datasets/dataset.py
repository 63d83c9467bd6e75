"""The :class:`Dataset` (uint8 images or a table's float features, labels, class names, normalization
stats) and how arrays become one."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from fedhet.data import formats
from fedhet.errors import DataError


# --------------------------------------------------------------------------------------------------------
# The Dataset
# --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Dataset:
    """A named data set: inputs, int64 labels, class names, per-input mean/std.

    Two kinds of inputs: **images**, uint8 (N, C, H, W) with per-channel mean/std on [0, 1]; or a **table**,
    float32 features (N, F) with per-feature mean/std (one-hot columns of categorical features keep mean 0
    and std 1: ``numeric`` says which columns are standardised). A table may name each training row's client
    (``train_sites``, indices into ``sites``: the natural cross-silo layout, used by the ``sites`` split).

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
    #: A table's column names after encoding ("age", "sex=F", ...); empty for images.
    feature_names: tuple[str, ...] = ()
    #: A table's standardised columns (numeric features) — False for one-hot columns; empty for images.
    numeric: tuple[bool, ...] = ()
    #: The client each training row belongs to (int64 (N,), indices into ``sites``), or None.
    train_sites: torch.Tensor | None = None
    sites: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Per-(device, dtype) mean/std tensors for normalize(); not a dataclass field.
        object.__setattr__(self, "_stats", {})
        tabular = self.train_x.dim() == 2
        for part in ("train", "test"):
            x, y = getattr(self, f"{part}_x"), getattr(self, f"{part}_y")
            if tabular and (x.dtype != torch.float32 or x.dim() != 2):
                raise DataError(
                    f"{self.name}: {part}_x of a table must be float32 (N, F), got {x.dtype} {tuple(x.shape)}"
                )
            if not tabular and (x.dtype != torch.uint8 or x.dim() != 4):
                raise DataError(
                    f"{self.name}: {part}_x must be uint8 images (N, C, H, W) or float32 table rows (N, F), "
                    f"got {x.dtype} {tuple(x.shape)}"
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
            what = "features" if tabular else "images"
            raise DataError(
                f"{self.name}: train {what} {tuple(self.train_x.shape[1:])} differ from test {what} "
                f"{tuple(self.test_x.shape[1:])}"
            )
        width = self.train_x.shape[1]
        unit = "feature" if tabular else "channel"
        if len(self.mean) != width or len(self.std) != width or min(self.std) <= 0:
            raise DataError(
                f"{self.name}: need one mean and one positive std per {unit} ({width}), "
                f"got {len(self.mean)} / {len(self.std)} values (min std {min(self.std, default=0):.3g})"
            )
        if tabular:
            if self.feature_names and len(self.feature_names) != width:
                raise DataError(f"{self.name}: {len(self.feature_names)} feature names for {width} features")
            if self.numeric and len(self.numeric) != width:
                raise DataError(f"{self.name}: {len(self.numeric)} numeric flags for {width} features")
        if self.train_sites is not None:
            sites = self.train_sites
            if sites.dtype != torch.int64 or sites.shape != self.train_y.shape:
                raise DataError(f"{self.name}: train_sites must be int64 (N,) like train_y")
            if len(sites) and (int(sites.min()) < 0 or int(sites.max()) >= len(self.sites)):
                raise DataError(f"{self.name}: train_sites index beyond the {len(self.sites)} site names")

    @property
    def num_classes(self) -> int:
        """Number of classes K."""
        return len(self.classes)

    @property
    def is_table(self) -> bool:
        """Whether the inputs are a table's rows (N, F) rather than images."""
        return self.train_x.dim() == 2

    @property
    def input_shape(self) -> tuple[int, ...]:
        """(C, H, W) of one image, or (F,) of one table row."""
        return tuple(int(s) for s in self.train_x.shape[1:])

    def unit_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """Inputs before normalisation as float32: images scaled to [0, 1], table rows as they are."""
        if x.dtype == torch.uint8:
            return x.to(torch.float32).div_(255.0)
        return x.to(torch.float32)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(x/255 - mean) / std per channel (channel axis -3) for images — uint8 is scaled, float is taken
        as [0, 1] — and (x - mean) / std per feature (last axis) for a table.

        Works on any device; returns float32 for uint8 input, the input's dtype for float input.
        """
        if x.dtype == torch.uint8:
            x = x.to(torch.float32).div_(255.0)
        elif not x.is_floating_point():
            raise TypeError(f"normalize expects uint8 or floating inputs, got {x.dtype}")
        width = self.train_x.shape[1]
        axis = -1 if self.is_table else -3
        if x.dim() < -axis or x.shape[axis] != width:
            expected = f"(..., {width})" if self.is_table else f"(..., {width}, H, W)"
            raise ValueError(
                f"normalize expects inputs {expected} for {self.name}, got shape {tuple(x.shape)}"
            )
        key = (x.device, x.dtype)
        if key not in self._stats:
            view = (width,) if self.is_table else (width, 1, 1)
            mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(view)
            std = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(view)
            self._stats[key] = (mean, std)
        mean, std = self._stats[key]
        return (x - mean).div_(std)

    def with_statistics(self, mean: tuple[float, ...], std: tuple[float, ...]) -> Dataset:
        """The same data normalised with other statistics (a federation's aggregated ones)."""
        return replace(self, mean=tuple(float(m) for m in mean), std=tuple(float(s) for s in std))

    def __repr__(self) -> str:
        kind = f", features={self.input_shape[0]}" if self.is_table else ""
        return (
            f"Dataset(name={self.name!r}, train={tuple(self.train_x.shape)}, "
            f"test={tuple(self.test_x.shape)}, "
            f"num_classes={self.num_classes}{kind}, source={self.source!r})"
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
        feature_names=tuple(f"x{j}" for j in range(arrays.train_x.shape[1]))
        if arrays.train_x.ndim == 2
        else (),
        numeric=(True,) * arrays.train_x.shape[1] if arrays.train_x.ndim == 2 else (),
    )


def input_stats(inputs: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Normalisation statistics of a train split: per channel for images, per feature for table rows (the
    clients' aggregated reports replace the latter in a federation: ``fedhet.data.datasets.tables``)."""
    if inputs.ndim == 2:
        from fedhet.data.datasets.standardization import client_feature_statistics, combine_feature_statistics

        return combine_feature_statistics([client_feature_statistics(inputs)], [True] * inputs.shape[1])
    return _channel_stats(inputs)
