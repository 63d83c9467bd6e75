"""Batched weak/strong image augmentation for federated semi-supervised learning (FixMatch, SAGE, ProxyFL).

Implements spec methods.md §2.2 and baselines.md §3.1/§3.3 on whole batches of float images in [0, 1]:

* weak view: horizontal flip (p = 0.5) then a random HxW crop of the 4-px reflect-padded image, as
  torchvision's ``RandomHorizontalFlip`` + ``RandomCrop(32, padding=4, padding_mode="reflect")``;
* strong view: weak, then FixMatch's ``RandAugmentMC(n=2, m=10)`` with the 14-op ``fixmatch_augment_pool``
  (kekmodel/FixMatch-pytorch ``dataset/randaugment.py``), then Cutout.

Every sample draws its own flip, crop offset, ops, magnitudes, signs and Cutout centre (kornia's
``RandAugment`` draws its ops once per batch, which would make all strong views of one image identical).
All randomness comes from the ``torch.Generator`` passed in (a CPU generator; parameters are drawn on the CPU
and moved to the images' device), so the same seed gives bit-identical output on the CPU. The ops are written
directly in torch (no kornia) to follow PIL's definitions, which FixMatch applies to uint8 images:

* AutoContrast, Equalize, Posterize and Solarize work per channel on the 8-bit grid (Equalize, Posterize
  quantise to k/255 first, as PIL sees the image); Brightness, Color, Contrast and Sharpness blend with
  PIL's degenerate images (black, luminance ITU-R 601-2, mean luminance, the 3x3 SMOOTH filter, border kept).
* Rotate (about the centre, counter-clockwise for positive angles), ShearX/ShearY (about the top-left corner,
  as PIL's affine ``(1, v, 0, 0, 1, 0)``) and TranslateX/TranslateY (whole pixels, ``int(v * size)``) sample
  with nearest neighbour like PIL's default and fill uncovered pixels with gray 0.5 (google-research/fixmatch
  fills (128, 128, 128); kekmodel leaves PIL's default black, we follow the brief's gray).

Choices beyond the spec (documented here, listed in the hand-off report):

* Grayscale (C = 1): Color is the identity (a one-channel image has no saturation); Contrast uses the channel
  itself as luminance. Strong augmentation accepts C in {1, 3}; weak accepts any C.
* Posterize keeps 4..7 bits for magnitudes 1..9 (``int(v * 4 / 10) + 4``); 8 bits would need v = 10, which
  ``RandAugmentMC`` never draws (magnitudes are uniform in {1, ..., m - 1}).
* Cutout: the square's centre is a uniform pixel of the image and the square (side ``int(cutout * min(H, W) /
  32)``, 16 px at 32x32, 14 px at 28x28) is clipped at the border, i.e. DeVries & Taylor's Cutout. kekmodel's
  ``CutoutAbs`` differs slightly: it shifts a box that would cross the left/top border inside the image and
  PIL's inclusive rectangle makes it 17 px wide. It fills 0.5 (kekmodel fills 127/255). kornia's
  ``RandomErasing`` is not used because its boxes never cross the border.
* Ops are drawn with replacement (``random.choices``), each applied with probability 0.5, magnitudes uniform
  in {1, ..., max_magnitude - 1}; rotation, shear and translation signs are drawn per sample (p = 0.5).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fedhet.devices import to_device
from fedhet.errors import ConfigError

__all__ = [
    "FIXMATCH_OPS",
    "Augmenter",
    "apply_op",
    "cutout",
    "randaugment",
    "strong_augment",
    "weak_augment",
]

#: The 14 ops of FixMatch's ``fixmatch_augment_pool``, in its order (op id = index in this tuple).
FIXMATCH_OPS: tuple[str, ...] = (
    "AutoContrast",
    "Brightness",
    "Color",
    "Contrast",
    "Equalize",
    "Identity",
    "Posterize",
    "Rotate",
    "Sharpness",
    "ShearX",
    "ShearY",
    "Solarize",
    "TranslateX",
    "TranslateY",
)
_OP_ID = {name: index for index, name in enumerate(FIXMATCH_OPS)}
_GEOMETRIC_OPS = ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY")
_GEOMETRIC_IDS = torch.tensor([_OP_ID[name] for name in _GEOMETRIC_OPS])

# FixMatch maps a magnitude v to a parameter as v * max_value / PARAMETER_MAX + bias, with PARAMETER_MAX = 10.
_PARAMETER_MAX = 10
# FixMatch's geometric fill colour (128, 128, 128) and Cutout colour, as the brief fixes them: gray 0.5.
GRAY = 0.5
# ITU-R 601-2 luma weights, as PIL's convert("L").
_LUMA_WEIGHTS = (0.299, 0.587, 0.114)


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


# ----------------------------------------------------------------------------------------------------------
# the 14 FixMatch ops; each takes images (n, C, H, W) and per-sample parameters on the images' device


def _per_sample(values: Tensor, x: Tensor) -> Tensor:
    return to_device(values, x.device, x.dtype).reshape(-1, 1, 1, 1)


def _blend(degenerate: Tensor, x: Tensor, factor: Tensor) -> Tensor:
    # PIL's ImageEnhance: blend(degenerate, image, factor) = degenerate + factor * (image - degenerate).
    return (degenerate + factor * (x - degenerate)).clamp_(0.0, 1.0)


def _luminance(x: Tensor) -> Tensor:
    if x.shape[1] == 1:
        return x
    red, green, blue = x.unbind(1)
    return (_LUMA_WEIGHTS[0] * red + _LUMA_WEIGHTS[1] * green + _LUMA_WEIGHTS[2] * blue).unsqueeze(1)


def _to_8bit(x: Tensor) -> Tensor:
    return (x * 255).round_().clamp_(0, 255)


def _auto_contrast(x: Tensor) -> Tensor:
    low = x.amin(dim=(2, 3), keepdim=True)
    high = x.amax(dim=(2, 3), keepdim=True)
    spread = high > low
    # A flat channel stays as it is (PIL's lut is the identity when hi <= lo).
    scale = torch.where(spread, high - low, torch.ones_like(high))
    return torch.where(spread, (x - low) / scale, x).clamp_(0.0, 1.0)


def _brightness(x: Tensor, factor: Tensor) -> Tensor:
    return (x * factor).clamp_(0.0, 1.0)


def _color(x: Tensor, factor: Tensor) -> Tensor:
    if x.shape[1] == 1:
        return x.clone()
    return _blend(_luminance(x), x, factor)


def _contrast(x: Tensor, factor: Tensor) -> Tensor:
    return _blend(_luminance(x).mean(dim=(1, 2, 3), keepdim=True), x, factor)


def _sharpness(x: Tensor, factor: Tensor) -> Tensor:
    batch, channels, height, width = x.shape
    degenerate = x.clone()
    if height >= 3 and width >= 3:
        # PIL's ImageFilter.SMOOTH: 3x3 kernel (1 1 1 / 1 5 1 / 1 1 1) / 13 on the interior, border copied.
        kernel = torch.ones(1, 1, 3, 3, dtype=x.dtype, device=x.device)
        kernel[0, 0, 1, 1] = 5.0
        kernel /= 13.0
        smooth = F.conv2d(x.reshape(batch * channels, 1, height, width), kernel)
        degenerate[:, :, 1:-1, 1:-1] = smooth.reshape(batch, channels, height - 2, width - 2)
    return _blend(degenerate, x, factor)


def _equalize(x: Tensor) -> Tensor:
    batch, channels, height, width = x.shape
    levels = _to_8bit(x).long().reshape(batch * channels, height * width)
    histogram = torch.zeros(batch * channels, 256, dtype=torch.long, device=x.device)
    histogram.scatter_add_(1, levels, torch.ones_like(levels))
    # PIL's ImageOps.equalize: step = (pixels - count of the highest occupied level) // 255 and
    # lut[i] = (step // 2 + pixels below level i) // step; step == 0 leaves the channel unchanged.
    bins = torch.arange(256, device=x.device)
    highest = ((histogram > 0) * bins).argmax(dim=1, keepdim=True)
    step = (height * width - histogram.gather(1, highest)) // 255
    unchanged = step == 0
    step = step.clamp_min(1)
    below = histogram.cumsum(dim=1) - histogram
    lut = ((step // 2 + below) // step).clamp_max_(255)
    equalized = lut.gather(1, levels).to(x.dtype) / 255
    out = torch.where(unchanged, x.reshape(batch * channels, height * width), equalized)
    return out.reshape(batch, channels, height, width)


def _posterize(x: Tensor, bits: Tensor) -> Tensor:
    # Keep the top `bits` bits of each 8-bit level (PIL: level & ~(2 ** (8 - bits) - 1)).
    step = torch.pow(2.0, 8 - to_device(bits, x.device, x.dtype)).reshape(-1, 1, 1, 1)
    return torch.floor(_to_8bit(x) / step) * step / 255


def _solarize(x: Tensor, threshold: Tensor) -> Tensor:
    # PIL inverts 8-bit levels >= threshold; the 0.5 margin makes k/255 inputs compare as their level k.
    threshold = _per_sample(threshold, x)
    return torch.where(x * 255 >= threshold - 0.5, 1.0 - x, x)


def _affine_nearest(x: Tensor, matrices: Tensor) -> Tensor:
    """Warp by per-sample 2x3 `matrices` that map output pixel-centre coordinates (x + 0.5, y + 0.5) to input
    coordinates, nearest neighbour (PIL's ``Image.transform(AFFINE)``: input pixel = floor of the coordinate);
    pixels that fall outside take gray 0.5."""
    batch, channels, height, width = x.shape
    dtype = torch.float32 if x.device.type == "mps" else torch.float64
    matrices = to_device(matrices, x.device, dtype)
    ys = torch.arange(height, device=x.device, dtype=dtype) + 0.5
    xs = torch.arange(width, device=x.device, dtype=dtype) + 0.5
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    points = torch.stack([grid_x, grid_y, torch.ones_like(grid_x)], dim=-1).reshape(1, height * width, 3)
    source = points @ matrices.transpose(1, 2)
    source_x = torch.floor(source[..., 0]).long()
    source_y = torch.floor(source[..., 1]).long()
    inside = (source_x >= 0) & (source_x < width) & (source_y >= 0) & (source_y < height)
    flat_index = source_y.clamp(0, height - 1) * width + source_x.clamp(0, width - 1)
    gathered = x.reshape(batch, channels, -1).gather(
        2, flat_index[:, None, :].expand(batch, channels, height * width)
    )
    out = torch.where(inside[:, None, :], gathered, torch.full_like(gathered, GRAY))
    return out.reshape(batch, channels, height, width)


# ----------------------------------------------------------------------------------------------------------
# magnitude -> parameter (FixMatch's _float_parameter / _int_parameter with the fixmatch_augment_pool ranges)


def _float_parameter(magnitude: Tensor, max_value: float, bias: float = 0.0) -> Tensor:
    return magnitude.double() * max_value / _PARAMETER_MAX + bias


def _int_parameter(magnitude: Tensor, max_value: int) -> Tensor:
    return (magnitude.long() * max_value) // _PARAMETER_MAX


def _enhance_factor(magnitude: Tensor) -> Tensor:
    # Brightness, Color, Contrast, Sharpness: (v * 0.9 / 10 + 0.05), in [0.14, 0.86] for v in 1..9.
    return _float_parameter(magnitude, 0.9, 0.05)


def _geometric_matrices(op_ids: Tensor, magnitude: Tensor, negate: Tensor, height: int, width: int) -> Tensor:
    """Per-sample 2x3 output->input maps (float64, CPU) for the geometric ops; identity for any other op."""
    count = op_ids.shape[0]
    sign = torch.where(negate, -1.0, 1.0).double()
    matrices = torch.zeros(count, 2, 3, dtype=torch.float64)
    matrices[:, 0, 0] = 1.0
    matrices[:, 1, 1] = 1.0

    # Rotate: int(v * 30 / 10) degrees counter-clockwise about the image centre (PIL's Image.rotate).
    is_rotate = op_ids == _OP_ID["Rotate"]
    angle = torch.deg2rad(sign * _int_parameter(magnitude, 30).double())
    cos, sin = torch.cos(angle), torch.sin(angle)
    centre_x, centre_y = width / 2.0, height / 2.0
    rotation = torch.stack(
        [
            torch.stack([cos, -sin, centre_x - cos * centre_x + sin * centre_y], dim=-1),
            torch.stack([sin, cos, centre_y - sin * centre_x - cos * centre_y], dim=-1),
        ],
        dim=1,
    )
    matrices = torch.where(is_rotate[:, None, None], rotation, matrices)

    # ShearX / ShearY: v * 0.3 / 10, PIL's affine (1, s, 0, 0, 1, 0) / (1, 0, 0, s, 1, 0).
    shear = sign * _float_parameter(magnitude, 0.3)
    is_shear_x = op_ids == _OP_ID["ShearX"]
    is_shear_y = op_ids == _OP_ID["ShearY"]
    matrices[:, 0, 1] = torch.where(is_shear_x, shear, matrices[:, 0, 1])
    matrices[:, 1, 0] = torch.where(is_shear_y, shear, matrices[:, 1, 0])

    # TranslateX / TranslateY: int(+-(v * 0.3 / 10) * size) whole pixels (truncation toward zero).
    fraction = _float_parameter(magnitude, 0.3)
    shift_x = sign * torch.floor(fraction * width)
    shift_y = sign * torch.floor(fraction * height)
    matrices[:, 0, 2] = torch.where(op_ids == _OP_ID["TranslateX"], shift_x, matrices[:, 0, 2])
    matrices[:, 1, 2] = torch.where(op_ids == _OP_ID["TranslateY"], shift_y, matrices[:, 1, 2])
    return matrices


def _apply_photometric(x: Tensor, op_id: int, magnitude: Tensor) -> Tensor:
    name = FIXMATCH_OPS[op_id]
    if name == "Identity":
        return x.clone()
    if name == "AutoContrast":
        return _auto_contrast(x)
    if name == "Equalize":
        return _equalize(x)
    if name == "Posterize":
        return _posterize(x, _int_parameter(magnitude, 4) + 4)
    if name == "Solarize":
        return _solarize(x, 256 - _int_parameter(magnitude, 256))
    factor = _per_sample(_enhance_factor(magnitude), x)
    if name == "Brightness":
        return _brightness(x, factor)
    if name == "Color":
        return _color(x, factor)
    if name == "Contrast":
        return _contrast(x, factor)
    if name == "Sharpness":
        return _sharpness(x, factor)
    raise AssertionError(f"unhandled photometric op {name}")


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
        """Augment the batch `x` (float (B, C, H, W) in [0, 1]) with randomness from `generator`."""
        if self.kind == "weak":
            return weak_augment(x, generator, **self.options)
        return strong_augment(x, generator, **self.options)

    def __repr__(self) -> str:
        options = ", ".join(f"{key}={value!r}" for key, value in self.options.items())
        return f"Augmenter({self.kind!r}{', ' if options else ''}{options})"
