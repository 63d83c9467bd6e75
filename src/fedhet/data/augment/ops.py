"""The 14 ops of FixMatch's ``fixmatch_augment_pool`` on whole batches, written in torch to follow PIL's
definitions, and FixMatch's map from a magnitude to each op's parameter (see the package docstring).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fedhet.devices import to_device

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
