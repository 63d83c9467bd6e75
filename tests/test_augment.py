"""Tests for fedhet.data.augment: FixMatch weak/strong views, batched with per-sample randomness.

The ops are checked against PIL's own ImageOps/ImageEnhance/transform (what FixMatch's RandAugmentMC
calls), on real CIFAR-10 and Fashion-MNIST images where the files are present.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image, ImageEnhance, ImageOps

from fedhet.data.augment import (
    FIXMATCH_OPS,
    Augmenter,
    apply_op,
    cutout,
    randaugment,
    strong_augment,
    weak_augment,
)
from fedhet.data.datasets import shared_data_file
from fedhet.errors import ConfigError

CIFAR_TARBALL = shared_data_file("cifar10-jpg.tar.gz")
FASHION_IMAGES = Path("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")


# ---------------------------------------------------------------------------------------------- fixtures


def _synthetic_rgb(count: int) -> np.ndarray:
    """Deterministic structured images (gradients + a bright square + stripes) when the tarball is absent."""
    rows, cols = np.mgrid[0:32, 0:32]
    images = []
    for index in range(count):
        red = (rows * 7 + cols * 3 + index * 11) % 256
        green = ((rows - 16) ** 2 + (cols - 10) ** 2 + index * 5) % 256
        blue = np.where((rows // 4 + cols // 6) % 2 == 0, 40, 210)
        image = np.stack([red, green, blue], axis=-1).astype(np.uint8)
        image[3 + index % 8 : 9 + index % 8, 20:27] = 250
        images.append(image)
    return np.stack(images)


@pytest.fixture(scope="module")
def cifar_uint8() -> np.ndarray:
    """16 real CIFAR-10 test images (N, 32, 32, 3) uint8, read straight from the JPEG tarball."""
    if CIFAR_TARBALL is None:
        return _synthetic_rgb(16)
    images = []
    with tarfile.open(CIFAR_TARBALL, "r:gz") as tar:
        for member in tar:
            if member.isfile() and member.name.endswith(".jpg"):
                data = tar.extractfile(member).read()
                images.append(np.array(Image.open(io.BytesIO(data)).convert("RGB")))
                if len(images) == 16:
                    break
    return np.stack(images)


@pytest.fixture(scope="module")
def cifar(cifar_uint8: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(cifar_uint8).permute(0, 3, 1, 2).float() / 255


@pytest.fixture(scope="module")
def fashion_uint8() -> np.ndarray:
    """16 real Fashion-MNIST test images (N, 28, 28) uint8 from the idx file."""
    if not FASHION_IMAGES.exists():
        return _synthetic_rgb(16)[:, 2:30, 2:30, 0]
    with gzip.open(FASHION_IMAGES, "rb") as handle:
        header = handle.read(16)
        assert int.from_bytes(header[:4], "big") == 2051
        data = handle.read(16 * 28 * 28)
    return np.frombuffer(data, dtype=np.uint8).reshape(16, 28, 28).copy()


@pytest.fixture(scope="module")
def fashion(fashion_uint8: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(fashion_uint8)[:, None].float() / 255


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _distinct(batch: torch.Tensor) -> int:
    return torch.unique(batch.reshape(batch.shape[0], -1), dim=0).shape[0]


# ---------------------------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("dataset", ["cifar", "fashion"])
@pytest.mark.parametrize("kind", ["weak", "strong"])
def test_shape_dtype_and_range_are_preserved(dataset, kind, request):
    images = request.getfixturevalue(dataset)
    batch = images.repeat(4, 1, 1, 1)
    for dtype in (torch.float32, torch.float64):
        out = Augmenter(kind)(batch.to(dtype), _generator())
        assert out.shape == batch.shape
        assert out.dtype == dtype
        assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
        assert not torch.equal(out, batch.to(dtype))


def test_empty_batch_is_returned_empty(cifar):
    empty = cifar[:0]
    assert weak_augment(empty, _generator()).shape == empty.shape
    assert strong_augment(empty, _generator()).shape == empty.shape


# ---------------------------------------------------------------------------------------------- per-sample


def test_copies_of_one_image_get_different_parameters(cifar):
    copies = cifar[3:4].repeat(256, 1, 1, 1)
    weak = weak_augment(copies, _generator(1))
    strong = strong_augment(copies, _generator(1))
    # 2 flips x 81 crop offsets = 162 possible weak views.
    assert _distinct(weak) > 20
    assert _distinct(strong) > 200


def test_each_randaugment_op_is_applied_with_probability_one_half(cifar):
    copies = cifar[5:6].repeat(1024, 1, 1, 1)
    out = randaugment(copies, _generator(2), num_ops=1)
    unchanged = (out == copies).flatten(1).all(dim=1).float().mean().item()
    # Unchanged = not applied (1/2) + Identity (1/28) + rare no-op draws (e.g. a 0-px translation).
    assert 0.45 < unchanged < 0.65


# ---------------------------------------------------------------------------------------------- weak view


def test_weak_without_flip_and_pad_is_the_identity(cifar, fashion):
    for images in (cifar, fashion):
        assert torch.equal(weak_augment(images, _generator(), pad=0, flip=False), images)


def test_flip_only_equals_torch_flip_on_the_flipped_samples(cifar):
    batch = cifar.repeat(16, 1, 1, 1)
    out = weak_augment(batch, _generator(3), pad=0, flip=True)
    flipped = torch.flip(batch, dims=[-1])
    is_flipped = (out == flipped).flatten(1).all(dim=1)
    is_kept = (out == batch).flatten(1).all(dim=1)
    assert bool((is_flipped | is_kept).all())
    assert 0.35 < is_flipped.float().mean().item() < 0.65


@pytest.mark.parametrize("flip", [False, True])
def test_crop_is_a_translation_of_the_reflect_padded_image(cifar, flip):
    batch = cifar.repeat(16, 1, 1, 1)
    out = weak_augment(batch, _generator(4), pad=4, flip=flip)
    padded = F.pad(batch, (4, 4, 4, 4), mode="reflect")
    offsets = set()
    for index in range(batch.shape[0]):
        sources = [padded[index], torch.flip(padded[index], dims=[-1])] if flip else [padded[index]]
        matches = [
            (source_index, top, left)
            for source_index, source in enumerate(sources)
            for top in range(9)
            for left in range(9)
            if torch.equal(out[index], source[:, top : top + 32, left : left + 32])
        ]
        assert matches, f"sample {index} is no crop of the reflect-padded image"
        offsets.add(matches[0])
    # 256 uniform draws over 81 (or 162) offsets cover most of them.
    assert len(offsets) >= (60 if not flip else 100)


# ---------------------------------------------------------------------------------------------- seeding


@pytest.mark.numerics
@pytest.mark.parametrize("kind", ["weak", "strong"])
def test_same_seed_is_bit_identical_and_different_seed_differs(cifar, kind):
    batch = cifar.repeat(4, 1, 1, 1)
    augment = Augmenter(kind)
    first = augment(batch, _generator(7))
    assert torch.equal(first, augment(batch, _generator(7)))
    assert not torch.equal(first, augment(batch, _generator(8)))


def test_global_rng_is_neither_used_nor_advanced(cifar):
    batch = cifar.repeat(4, 1, 1, 1)
    state = torch.get_rng_state()
    torch.manual_seed(123)
    first = strong_augment(batch, _generator(9))
    torch.manual_seed(456)
    second = strong_augment(batch, _generator(9))
    assert torch.equal(first, second)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    strong_augment(batch, _generator(9))
    assert torch.equal(torch.get_rng_state(), before)
    torch.set_rng_state(state)


def test_augmenter_matches_the_functions(cifar):
    batch = cifar.repeat(2, 1, 1, 1)
    options = {"pad": 2, "num_ops": 3, "max_magnitude": 6, "cutout": 8}
    assert torch.equal(
        Augmenter("strong", **options)(batch, _generator(5)), strong_augment(batch, _generator(5), **options)
    )
    assert torch.equal(
        Augmenter("weak", pad=2)(batch, _generator(5)), weak_augment(batch, _generator(5), pad=2)
    )
    assert "strong" in repr(Augmenter("strong", cutout=8))


# ---------------------------------------------------------------------------------------------- the 14 ops


def _squeeze_range(images: torch.Tensor) -> torch.Tensor:
    # Real images often span [0, 1] already (AutoContrast acts only on a narrower range), while dark ones
    # never reach Solarize's threshold: stretch each image to [0.1, 0.9].
    low = images.amin(dim=(1, 2, 3), keepdim=True)
    high = images.amax(dim=(1, 2, 3), keepdim=True)
    return 0.1 + 0.8 * (images - low) / (high - low)


@pytest.mark.parametrize("op", FIXMATCH_OPS)
@pytest.mark.parametrize("dataset", ["cifar", "fashion"])
def test_each_op_runs_keeps_range_and_changes_the_image(op, dataset, request):
    images = _squeeze_range(request.getfixturevalue(dataset))
    for magnitude in range(2, 10):
        for negate in (False, True):
            out = apply_op(images, op, magnitude, negate=negate)
            assert out.shape == images.shape and out.dtype == images.dtype
            assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
            changed = ~(out == images).flatten(1).all(dim=1)
            if op == "Identity" or (op == "Color" and images.shape[1] == 1):
                # Colour saturation is undefined for one channel: Color is the identity there.
                assert torch.equal(out, images)
            elif op == "Color":
                # A gray RGB image (R = G = B, a few CIFAR photos) has no saturation to change either.
                colourful = (images.amax(dim=1) - images.amin(dim=1)).flatten(1).amax(dim=1) > 0
                assert bool(changed[colourful].all()) and bool(colourful.any())
                assert torch.allclose(out[~colourful], images[~colourful], atol=1e-6)
            else:
                assert bool(changed.all()), f"{op} at magnitude {magnitude} left an image unchanged"


@pytest.mark.numerics
def test_per_sample_magnitudes_are_honoured(cifar):
    magnitudes = torch.arange(1, 10)
    images = cifar[:9]
    together = apply_op(images, "Rotate", magnitudes)
    # One function on a batch of 9 and of 1: nearest-neighbour sampling from float64 coordinates, so a pixel
    # could differ only if its source coordinate lay within ~1e-15 of a pixel edge; equality is exact.
    for index, magnitude in enumerate(magnitudes.tolist()):
        assert torch.equal(together[index], apply_op(images[index : index + 1], "Rotate", magnitude)[0])


def _pil_reference(op: str, image: Image.Image, magnitude: int, negate: bool) -> Image.Image:
    """FixMatch's fixmatch_augment_pool op with its parameter mapping, via PIL, fill (128, 128, 128)."""
    factor = magnitude * 0.9 / 10 + 0.05
    sign = -1 if negate else 1
    fill = 128 if image.mode == "L" else (128, 128, 128)
    affine = {
        "ShearX": (1, sign * magnitude * 0.3 / 10, 0, 0, 1, 0),
        "ShearY": (1, 0, 0, sign * magnitude * 0.3 / 10, 1, 0),
        "TranslateX": (1, 0, int(sign * magnitude * 0.3 / 10 * image.size[0]), 0, 1, 0),
        "TranslateY": (1, 0, 0, 0, 1, int(sign * magnitude * 0.3 / 10 * image.size[1])),
    }
    if op in affine:
        return image.transform(image.size, Image.AFFINE, affine[op], fillcolor=fill)
    operations = {
        "AutoContrast": lambda: ImageOps.autocontrast(image),
        "Brightness": lambda: ImageEnhance.Brightness(image).enhance(factor),
        "Color": lambda: ImageEnhance.Color(image).enhance(factor),
        "Contrast": lambda: ImageEnhance.Contrast(image).enhance(factor),
        "Equalize": lambda: ImageOps.equalize(image),
        "Identity": lambda: image,
        "Posterize": lambda: ImageOps.posterize(image, int(magnitude * 4 / 10) + 4),
        "Rotate": lambda: image.rotate(sign * int(magnitude * 30 / 10), fillcolor=fill),
        "Sharpness": lambda: ImageEnhance.Sharpness(image).enhance(factor),
        "Solarize": lambda: ImageOps.solarize(image, 256 - int(magnitude * 256 / 10)),
    }
    return operations[op]()


# Largest |ours - PIL| in 8-bit levels: PIL rounds its intermediate images (luminance, mean, smoothing) to
# uint8 and truncates blends; the exact ops must agree to the level.
_LEVEL_TOLERANCE = {
    "AutoContrast": 1.0,
    "Brightness": 1.0,
    "Color": 2.0,
    "Contrast": 2.0,
    "Sharpness": 2.0,
    "Equalize": 0.0,
    "Identity": 0.0,
    "Posterize": 0.0,
    "Solarize": 0.0,
    "TranslateX": 0.0,
    "TranslateY": 0.0,
}
# Nearest-neighbour warps: the share of pixels that may differ, from coordinates that land exactly on a pixel
# edge, where PIL's incrementally summed coordinates and ours round differently.
_PIXEL_MISMATCH = {"Rotate": 0.01, "ShearX": 0.05, "ShearY": 0.05}


@pytest.mark.numerics
@pytest.mark.parametrize("op", FIXMATCH_OPS)
@pytest.mark.parametrize("dataset", ["cifar", "fashion"])
def test_each_op_matches_pil_as_fixmatch_calls_it(op, dataset, request):
    images_uint8 = request.getfixturevalue(f"{dataset}_uint8")[:8]
    images = torch.from_numpy(images_uint8).float() / 255
    images = images.permute(0, 3, 1, 2) if images.ndim == 4 else images[:, None]
    for magnitude in (2, 5, 9):
        for negate in (False, True):
            ours = apply_op(images, op, magnitude, negate=negate)
            # Our gray fill is 0.5; PIL's (128, 128, 128) is 128/255 (no 8-bit input level is exactly 0.5).
            ours = torch.where(ours == 0.5, torch.tensor(128 / 255), ours)
            reference = np.stack(
                [
                    np.array(_pil_reference(op, Image.fromarray(image), magnitude, negate))
                    for image in images_uint8
                ]
            )
            reference = torch.from_numpy(reference).float() / 255
            reference = reference.permute(0, 3, 1, 2) if reference.ndim == 4 else reference[:, None]
            difference = (ours - reference).abs() * 255
            if op in _PIXEL_MISMATCH:
                mismatch = (difference.amax(dim=1) > 0.5).float().mean().item()
                assert mismatch <= _PIXEL_MISMATCH[op], (op, magnitude, negate, mismatch)
            else:
                assert float(difference.max()) <= _LEVEL_TOLERANCE[op] + 1e-3, (op, magnitude, negate)


def test_translate_is_an_exact_whole_pixel_shift_with_gray_fill(cifar):
    images = cifar[:4]
    # v = 5: int(5 * 0.3 / 10 * 32) = 4 px; positive TranslateX reads 4 px to the right (content moves left).
    out = apply_op(images, "TranslateX", 5)
    assert torch.equal(out[..., :, :28], images[..., :, 4:])
    assert bool((out[..., :, 28:] == 0.5).all())
    out = apply_op(images, "TranslateY", 5, negate=True)
    assert torch.equal(out[..., 4:, :], images[..., :28, :])
    assert bool((out[..., :4, :] == 0.5).all())


# ---------------------------------------------------------------------------------------------- Cutout


def _check_cutout_boxes(original: torch.Tensor, out: torch.Tensor, side: int) -> int:
    """Assert every sample has one gray axis-aligned box of `side` (clipped at the border); count clipped."""
    height, width = original.shape[-2:]
    clipped = 0
    for index in range(original.shape[0]):
        gray = (out[index] == 0.5).all(dim=0)
        rows = torch.nonzero(gray.any(dim=1)).squeeze(1)
        cols = torch.nonzero(gray.any(dim=0)).squeeze(1)
        top, bottom, left, right = int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1
        assert bool(gray[top:bottom, left:right].all()), "the gray region is not a filled rectangle"
        box = torch.zeros_like(gray)
        box[top:bottom, left:right] = True
        assert torch.equal(out[index][:, ~box], original[index][:, ~box]), "pixels outside the box changed"
        for start, stop, size in ((top, bottom, height), (left, right, width)):
            extent = stop - start
            touches_border = start == 0 or stop == size
            assert extent == side or (touches_border and 0 < extent < side), (start, stop, side)
        if bottom - top < side or right - left < side:
            clipped += 1
    return clipped


def test_cutout_fills_a_square_of_the_requested_size_clipped_at_the_border(cifar, fashion):
    batch = cifar.repeat(16, 1, 1, 1)
    out = strong_augment(batch, _generator(11), pad=0, flip=False, num_ops=0)
    clipped = _check_cutout_boxes(batch, out, side=16)
    # A centre within 8 px of a border (probability 1 - (16/32)^2 = 3/4) crosses it.
    assert 128 < clipped < 256
    # 28x28 images: the 16 px at 32x32 scale to int(16 * 28 / 32) = 14 px.
    gray_batch = fashion.repeat(8, 1, 1, 1)
    out = strong_augment(gray_batch, _generator(12), pad=0, flip=False, num_ops=0)
    _check_cutout_boxes(gray_batch, out, side=14)
    out = cutout(batch, _generator(13), size=5)
    _check_cutout_boxes(batch, out, side=5)
    assert torch.equal(strong_augment(batch, _generator(), pad=0, flip=False, num_ops=0, cutout=0), batch)


# ---------------------------------------------------------------------------------------------- errors


def test_uint8_images_are_refused_with_the_fix(cifar_uint8):
    images = torch.from_numpy(cifar_uint8).permute(0, 3, 1, 2)
    with pytest.raises(TypeError, match=r"x\.float\(\) / 255"):
        weak_augment(images, _generator())
    with pytest.raises(TypeError, match=r"x\.float\(\) / 255"):
        strong_augment(images, _generator())


def test_out_of_range_and_malformed_inputs_are_refused(cifar):
    with pytest.raises(ValueError, match=r"\[0, 1\].*x\.float\(\) / 255"):
        weak_augment(cifar * 255, _generator())
    normalized = (cifar - 0.5) / 0.25
    with pytest.raises(ValueError, match="before normalizing"):
        strong_augment(normalized, _generator())
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        weak_augment(torch.full_like(cifar, float("nan")), _generator())
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        weak_augment(cifar[0], _generator())
    with pytest.raises(ValueError, match="1 \\(grayscale\\) or 3"):
        strong_augment(cifar.repeat(1, 2, 1, 1)[:, :4], _generator())
    with pytest.raises(TypeError, match="torch.Generator"):
        weak_augment(cifar, 0)


def test_bad_parameters_raise_config_errors(cifar):
    with pytest.raises(ConfigError, match="kind"):
        Augmenter("medium")
    with pytest.raises(ConfigError, match="num_ops"):
        Augmenter("weak", num_ops=2)
    with pytest.raises(ConfigError, match="max_magnitude"):
        Augmenter("strong", max_magnitude=11)
    with pytest.raises(ConfigError, match="pad"):
        weak_augment(cifar, _generator(), pad=32)
    with pytest.raises(ConfigError, match="pad"):
        weak_augment(cifar, _generator(), pad=-1)
    with pytest.raises(ConfigError, match="unknown op"):
        apply_op(cifar, "Invert", 3)
    with pytest.raises(ConfigError, match="magnitude"):
        apply_op(cifar, "Rotate", 11)
    with pytest.raises(ConfigError, match="one per sample"):
        apply_op(cifar, "Rotate", torch.tensor([1, 2]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu(cifar):
    batch = cifar.repeat(16, 1, 1, 1)
    for kind in ("weak", "strong"):
        on_cpu = Augmenter(kind)(batch, _generator(21))
        on_gpu = Augmenter(kind)(batch.cuda(), _generator(21))
        assert on_gpu.device.type == "cuda"
        # Same parameters; float rounding on the GPU may move a few blend outputs by an ulp or a tie pixel.
        assert (on_gpu.cpu() - on_cpu).abs().gt(1e-4).float().mean().item() < 0.01
