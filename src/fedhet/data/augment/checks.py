"""Argument checks of the augmentation entry points: images, generator and parameters."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fedhet.data.augment.ops import _PARAMETER_MAX
from fedhet.errors import ConfigError

# ----------------------------------------------------------------------------------------------------------
# validation


def _check_images(x: Any, *, strong: bool) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"images must be a torch.Tensor of shape (B, C, H, W), got {type(x).__name__}")
    if x.ndim != 4:
        raise ValueError(
            f"images must have shape (B, C, H, W), got shape {tuple(x.shape)}; "
            "add a batch dimension with x.unsqueeze(0) for a single image"
        )
    if not x.is_floating_point():
        raise TypeError(
            f"images must be float in [0, 1], got dtype {x.dtype}; convert uint8 images with x.float() / 255"
        )
    if strong and x.shape[1] not in (1, 3):
        raise ValueError(
            f"strong augmentation needs 1 (grayscale) or 3 (RGB) channels, got C = {x.shape[1]} "
            f"in shape {tuple(x.shape)}"
        )
    if x.numel() == 0:
        return
    low, high = torch.aminmax(x)
    low, high = float(low), float(high)
    # `not (a and b)` also rejects NaN, for which every comparison is False.
    if not (low >= 0.0 and high <= 1.0):
        raise ValueError(
            f"images must lie in [0, 1], got values in [{low:.4g}, {high:.4g}]; convert 0..255 images with "
            "x.float() / 255 and augment before normalizing (mean/std)"
        )


def _check_generator(generator: Any) -> None:
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator, got {type(generator).__name__}; "
            "create one with torch.Generator().manual_seed(seed)"
        )
    if generator.device.type != "cpu":
        raise ValueError(
            f"generator must be a CPU torch.Generator (parameters are drawn on the CPU, then moved to the "
            f"images' device), got one on {generator.device}; use torch.Generator().manual_seed(seed)"
        )


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < low or (high is not None and value > high):
        accepted = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ConfigError(f"{name} must be {accepted}, got {value}")


def _check_weak_params(pad: Any, flip: Any) -> None:
    _check_int("pad", pad, 0)
    if not isinstance(flip, bool):
        raise ConfigError(f"flip must be True or False, got {flip!r}")


def _check_pad_fits(pad: int, x: Tensor) -> None:
    height, width = x.shape[2], x.shape[3]
    if pad >= height or pad >= width:
        raise ConfigError(
            f"pad must be smaller than the image height and width for reflect padding, got pad = {pad} for "
            f"{height}x{width} images"
        )


def _check_strong_params(num_ops: Any, max_magnitude: Any, cutout: Any) -> None:
    _check_int("num_ops", num_ops, 0)
    # RandAugmentMC draws magnitudes from {1, ..., m - 1} and asserts m <= 10 (beyond it, e.g. Solarize's
    # threshold 256 - v turns negative).
    _check_int("max_magnitude", max_magnitude, 2, _PARAMETER_MAX)
    _check_int("cutout", cutout, 0)
