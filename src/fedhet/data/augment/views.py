"""The entry points: the weak view, one pool op, RandAugmentMC, Cutout, the strong view, and
:class:`Augmenter`, which binds their options.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fedhet.data.augment.checks import (
    _check_generator,
    _check_images,
    _check_int,
    _check_pad_fits,
    _check_strong_params,
    _check_weak_params,
)
from fedhet.data.augment.ops import (
    _GEOMETRIC_IDS,
    _GEOMETRIC_OPS,
    _OP_ID,
    _PARAMETER_MAX,
    FIXMATCH_OPS,
    GRAY,
    _affine_nearest,
    _apply_photometric,
    _geometric_matrices,
)
from fedhet.data.augment.tabular import strong_rows, weak_rows
from fedhet.devices import to_device
from fedhet.errors import ConfigError

# ----------------------------------------------------------------------------------------------------------
# weak view


def _flip_crop(x: Tensor, flipped: Tensor, offset_y: Tensor, offset_x: Tensor, pad: int) -> Tensor:
    """Flip (where `flipped`), then crop HxW at (offset_y, offset_x) of the reflect-padded image."""
    batch, channels, height, width = x.shape
    padded = F.pad(x, (pad, pad, pad, pad), mode="reflect") if pad > 0 else x
    padded_width = width + 2 * pad
    device = x.device
    rows = to_device(offset_y, device)[:, None] + torch.arange(height, device=device)
    cols = to_device(offset_x, device)[:, None] + torch.arange(width, device=device)
    # Reflect padding is symmetric, so pad(flip(x)) == flip(pad(x)): a flipped crop reads mirrored columns.
    cols = torch.where(to_device(flipped, device)[:, None], padded_width - 1 - cols, cols)
    flat_index = (rows[:, :, None] * padded_width + cols[:, None, :]).reshape(batch, 1, height * width)
    out = padded.reshape(batch, channels, -1).gather(2, flat_index.expand(batch, channels, height * width))
    return out.reshape(batch, channels, height, width)


@torch.no_grad()
def weak_augment(x: Tensor, generator: torch.Generator, *, pad: int = 4, flip: bool = True) -> Tensor:
    """FixMatch's weak view (methods.md §2.2): per-sample horizontal flip (p = 0.5), then a random HxW crop
    of the `pad`-px reflect-padded image; `x` float (B, C, H, W) in [0, 1] -> a new tensor of that shape."""
    _check_weak_params(pad, flip)
    _check_images(x, strong=False)
    _check_generator(generator)
    _check_pad_fits(pad, x)
    return _weak(x, generator, pad, flip)


def _weak(x: Tensor, generator: torch.Generator, pad: int, flip: bool) -> Tensor:
    batch = x.shape[0]
    if batch == 0:
        return x.clone()
    if flip:
        flipped = torch.rand(batch, generator=generator) < 0.5
    else:
        flipped = torch.zeros(batch, dtype=torch.bool)
    offset_y = torch.randint(0, 2 * pad + 1, (batch,), generator=generator)
    offset_x = torch.randint(0, 2 * pad + 1, (batch,), generator=generator)
    return _flip_crop(x, flipped, offset_y, offset_x, pad)


def _one_per_sample(name: str, value: int | bool | Tensor, batch: int) -> Tensor:
    values = torch.as_tensor(value).reshape(-1).cpu()
    if values.numel() not in (1, batch):
        raise ConfigError(
            f"{name} must be one value or one per sample ({batch}), got {values.numel()} values"
        )
    return values.expand(batch)


@torch.no_grad()
def apply_op(x: Tensor, op: str, magnitude: int | Tensor, *, negate: bool | Tensor = False) -> Tensor:
    """Apply one FixMatch pool op (``FIXMATCH_OPS``) to every image of `x` at integer magnitude(s) v in
    [0, 10] (one int or one per sample), parameter v * max / 10 + bias as in ``fixmatch_augment_pool``;
    `negate` flips the sign of Rotate/Shear/Translate (FixMatch draws it with p = 0.5)."""
    if op not in _OP_ID:
        raise ConfigError(f"unknown op {op!r}; accepted ops: {', '.join(FIXMATCH_OPS)}")
    _check_images(x, strong=True)
    batch, _, height, width = x.shape
    magnitude = _one_per_sample("magnitude", magnitude, batch).long()
    if magnitude.numel() and (int(magnitude.min()) < 0 or int(magnitude.max()) > _PARAMETER_MAX):
        raise ConfigError(f"magnitude must be in [0, {_PARAMETER_MAX}], got {magnitude.tolist()}")
    negate = _one_per_sample("negate", negate, batch).bool()
    if batch == 0:
        return x.clone()
    op_id = _OP_ID[op]
    if op in _GEOMETRIC_OPS:
        op_ids = torch.full((batch,), op_id)
        return _affine_nearest(x, _geometric_matrices(op_ids, magnitude, negate, height, width))
    return _apply_photometric(x, op_id, magnitude)


# ----------------------------------------------------------------------------------------------------------
# RandAugmentMC, Cutout, strong view


@torch.no_grad()
def randaugment(
    x: Tensor, generator: torch.Generator, *, num_ops: int = 2, max_magnitude: int = 10
) -> Tensor:
    """FixMatch's RandAugmentMC(n, m) per sample (baselines.md §3.1): `num_ops` ops drawn with replacement
    from the 14-op pool, each applied with p = 0.5 at a magnitude uniform in {1, ..., m - 1}; no Cutout."""
    _check_strong_params(num_ops, max_magnitude, 0)
    _check_images(x, strong=True)
    _check_generator(generator)
    return _randaugment(x, generator, num_ops, max_magnitude)


def _randaugment(x: Tensor, generator: torch.Generator, num_ops: int, max_magnitude: int) -> Tensor:
    batch, _, height, width = x.shape
    out = x.clone()
    if batch == 0 or num_ops == 0:
        return out
    op_ids = torch.randint(0, len(FIXMATCH_OPS), (batch, num_ops), generator=generator)
    applied = torch.rand(batch, num_ops, generator=generator) < 0.5
    magnitudes = torch.randint(1, max_magnitude, (batch, num_ops), generator=generator)
    negate = torch.rand(batch, num_ops, generator=generator) < 0.5
    geometric = torch.isin(op_ids, _GEOMETRIC_IDS) & applied
    for step in range(num_ops):
        # All geometric ops of this step share one warp with per-sample matrices.
        selected = geometric[:, step].nonzero().squeeze(1)
        if selected.numel():
            matrices = _geometric_matrices(
                op_ids[selected, step], magnitudes[selected, step], negate[selected, step], height, width
            )
            index = to_device(selected, x.device)
            out[index] = _affine_nearest(out[index], matrices)
        for op_id, name in enumerate(FIXMATCH_OPS):
            if name == "Identity" or name in _GEOMETRIC_OPS:
                continue
            selected = ((op_ids[:, step] == op_id) & applied[:, step]).nonzero().squeeze(1)
            if selected.numel():
                index = to_device(selected, x.device)
                out[index] = _apply_photometric(out[index], op_id, magnitudes[selected, step])
    return out


@torch.no_grad()
def cutout(x: Tensor, generator: torch.Generator, *, size: int) -> Tensor:
    """Cutout (DeVries & Taylor 2017) as FixMatch's strong view ends: per sample, a `size` x `size` square
    centred on a uniform pixel, clipped at the border, filled with gray 0.5; `size` in pixels (not scaled)."""
    _check_int("size", size, 0)
    _check_images(x, strong=False)
    _check_generator(generator)
    return _cutout(x, generator, size)


def _cutout(x: Tensor, generator: torch.Generator, size: int) -> Tensor:
    batch, _, height, width = x.shape
    if batch == 0 or size == 0:
        return x.clone()
    centre_y = torch.randint(0, height, (batch,), generator=generator)
    centre_x = torch.randint(0, width, (batch,), generator=generator)
    top = to_device(centre_y - size // 2, x.device)
    left = to_device(centre_x - size // 2, x.device)
    rows = torch.arange(height, device=x.device)
    cols = torch.arange(width, device=x.device)
    in_rows = (rows >= top[:, None]) & (rows < top[:, None] + size)
    in_cols = (cols >= left[:, None]) & (cols < left[:, None] + size)
    box = (in_rows[:, :, None] & in_cols[:, None, :])[:, None]
    return torch.where(box, torch.full_like(x, GRAY), x)


def _cutout_side(cutout_at_32: int, height: int, width: int) -> int:
    # FixMatch's 16 px is for 32x32; other sizes scale it (14 px at 28x28).
    return int(cutout_at_32 * min(height, width) / 32)


@torch.no_grad()
def strong_augment(
    x: Tensor,
    generator: torch.Generator,
    *,
    pad: int = 4,
    flip: bool = True,
    num_ops: int = 2,
    max_magnitude: int = 10,
    cutout: int = 16,
) -> Tensor:
    """FixMatch's strong view (methods.md §2.2): weak (flip + reflect crop), RandAugmentMC(num_ops,
    max_magnitude) per sample, then Cutout of side int(cutout * min(H, W) / 32) px filled with 0.5."""
    _check_weak_params(pad, flip)
    _check_strong_params(num_ops, max_magnitude, cutout)
    _check_images(x, strong=True)
    _check_generator(generator)
    _check_pad_fits(pad, x)
    out = _weak(x, generator, pad, flip)
    out = _randaugment(out, generator, num_ops, max_magnitude)
    side = _cutout_side(cutout, x.shape[2], x.shape[3])
    return _cutout(out, generator, side)


class Augmenter:
    """A weak or strong augmentation with its parameters bound: ``Augmenter("strong", num_ops=2)(x, gen)``
    calls ``strong_augment(x, gen, num_ops=2)`` (methods.md §2.2)."""

    _WEAK_OPTIONS = ("pad", "flip")
    _STRONG_OPTIONS = ("pad", "flip", "num_ops", "max_magnitude", "cutout")

    def __init__(self, kind: str = "weak", **options: Any) -> None:
        if kind not in ("weak", "strong"):
            raise ConfigError(f"kind must be 'weak' or 'strong', got {kind!r}")
        accepted = self._WEAK_OPTIONS if kind == "weak" else self._STRONG_OPTIONS
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise ConfigError(
                f"unknown option(s) {unknown} for a {kind} Augmenter; accepted options: {', '.join(accepted)}"
            )
        _check_weak_params(options.get("pad", 4), options.get("flip", True))
        if kind == "strong":
            _check_strong_params(
                options.get("num_ops", 2), options.get("max_magnitude", 10), options.get("cutout", 16)
            )
        self.kind = kind
        self.options = dict(options)

    def __call__(self, x: Tensor, generator: torch.Generator) -> Tensor:
        """Augment the batch `x` (float (B, C, H, W) in [0, 1]) with randomness from `generator`.

        A table's rows (B, F), standardised, get the tabular views instead (``fedhet.data.augment.tabular``:
        Gaussian noise; SCARF-style feature corruption); the image options do not apply to them."""
        if isinstance(x, Tensor) and x.dim() == 2:
            return weak_rows(x, generator) if self.kind == "weak" else strong_rows(x, generator)
        if self.kind == "weak":
            return weak_augment(x, generator, **self.options)
        return strong_augment(x, generator, **self.options)

    def __repr__(self) -> str:
        options = ", ".join(f"{key}={value!r}" for key, value in self.options.items())
        return f"Augmenter({self.kind!r}{', ' if options else ''}{options})"
