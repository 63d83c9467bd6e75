"""Speed of fedhet's batched FixMatch augmentation against a per-image PIL loop (as FixMatch's DataLoader).

Prints milliseconds per batch of 256 RGB 32x32 CIFAR-10 images (the JPEG tarball if present, else random
images) for the weak view (flip + 4-px reflect crop) and the strong view (weak + RandAugmentMC(2, 10) + Cutout
16), with torch.set_num_threads(2), and the speed-up over PIL. Targets: weak about 3 ms, strong under 30 ms.

    python benchmarks/augment_speed.py [--repeats 30] [--device cpu]
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import tarfile
import time

import numpy as np
import torch
from common import emit
from PIL import Image, ImageEnhance, ImageOps

from fedhet.data.augment import strong_augment, weak_augment
from fedhet.data.datasets import shared_data_file

CIFAR_TARBALL = shared_data_file("cifar10-jpg.tar.gz")
BATCH = 256
THREADS = 2


def load_images(count: int) -> tuple[np.ndarray, str]:
    """`count` CIFAR-10 images as (N, 32, 32, 3) uint8, or random ones when the tarball is absent."""
    if CIFAR_TARBALL is None:
        return np.random.default_rng(0).integers(0, 256, (count, 32, 32, 3), dtype=np.uint8), "random"
    images = []
    with tarfile.open(CIFAR_TARBALL, "r:gz") as tar:
        for member in tar:
            if member.isfile() and member.name.endswith(".jpg"):
                images.append(np.array(Image.open(io.BytesIO(tar.extractfile(member).read())).convert("RGB")))
                if len(images) == count:
                    break
    return np.stack(images), "CIFAR-10"


def pil_weak(image: Image.Image, rng: random.Random) -> Image.Image:
    """Per-image reference: flip with p = 0.5, then a 32x32 crop of the 4-px reflect-padded image."""
    if rng.random() < 0.5:
        image = ImageOps.mirror(image)
    padded = Image.fromarray(np.pad(np.asarray(image), ((4, 4), (4, 4), (0, 0)), mode="reflect"))
    top, left = rng.randint(0, 8), rng.randint(0, 8)
    return padded.crop((left, top, left + 32, top + 32))


def pil_strong(image: Image.Image, rng: random.Random) -> Image.Image:
    """Per-image reference: weak, two FixMatch-pool ops (p = 0.5 each, v in 1..9), Cutout 16 px."""
    image = pil_weak(image, rng)
    fill = (128, 128, 128)
    for op in rng.choices(range(14), k=2):
        if rng.random() >= 0.5:
            continue
        v = rng.randint(1, 9)
        factor, sign = v * 0.9 / 10 + 0.05, rng.choice((-1, 1))
        shear, shift = sign * v * 0.3 / 10, int(sign * v * 0.3 / 10 * 32)
        affine = {9: (1, shear, 0, 0, 1, 0), 10: (1, 0, 0, shear, 1, 0), 12: (1, 0, shift, 0, 1, 0)}
        affine[13] = (1, 0, 0, 0, 1, shift)
        if op in affine:
            image = image.transform(image.size, Image.AFFINE, affine[op], fillcolor=fill)
        elif op == 0:
            image = ImageOps.autocontrast(image)
        elif op in (1, 2, 3, 8):
            enhancer = {1: ImageEnhance.Brightness, 2: ImageEnhance.Color, 3: ImageEnhance.Contrast}
            image = enhancer.get(op, ImageEnhance.Sharpness)(image).enhance(factor)
        elif op == 4:
            image = ImageOps.equalize(image)
        elif op == 6:
            image = ImageOps.posterize(image, int(v * 4 / 10) + 4)
        elif op == 7:
            image = image.rotate(sign * int(v * 30 / 10), fillcolor=fill)
        elif op == 11:
            image = ImageOps.solarize(image, 256 - int(v * 256 / 10))
    array = np.array(image)
    centre_y, centre_x = rng.randrange(32), rng.randrange(32)
    array[max(0, centre_y - 8) : centre_y + 8, max(0, centre_x - 8) : centre_x + 8] = 127
    return Image.fromarray(array)


def time_ms(function, repeats: int) -> float:
    """Median wall time of `function()` in milliseconds, after ten warm-up calls (the first large allocations
    page-fault until glibc's malloc raises its mmap threshold)."""
    for _ in range(10):
        function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30, help="timed batches per measurement (median)")
    parser.add_argument("--device", default="cpu", help="device of the image batch (cpu, cuda)")
    parser.add_argument("--json", action="store_true", help="end with the JSON result line")
    args = parser.parse_args()

    torch.set_num_threads(THREADS)
    images, source = load_images(BATCH)
    batch = (torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255).to(args.device)
    generator = torch.Generator().manual_seed(0)
    pil_images = [Image.fromarray(image) for image in images]
    rng = random.Random(0)

    def to_tensor(views: list[Image.Image]) -> torch.Tensor:
        return (
            torch.from_numpy(np.stack([np.asarray(view) for view in views])).permute(0, 3, 1, 2).float() / 255
        )

    print(
        f"batch of {BATCH} {source} RGB 32x32 images on {args.device}, torch.set_num_threads({THREADS}), "
        f"median of {args.repeats} batches"
    )
    rows = [
        (
            "weak",
            lambda: weak_augment(batch, generator),
            lambda: to_tensor([pil_weak(im, rng) for im in pil_images]),
        ),
        (
            "strong",
            lambda: strong_augment(batch, generator),
            lambda: to_tensor([pil_strong(im, rng) for im in pil_images]),
        ),
    ]
    for _, batched, _ in rows:
        time_ms(batched, 1)
    measured = []
    for name, batched, per_image in rows:
        ours = time_ms(batched, args.repeats)
        pil = time_ms(per_image, max(3, args.repeats // 5))
        measured.append({"view": name, "fedhet_ms": ours, "pil_loop_ms": pil, "speedup": pil / ours})
        print(
            f"{name:6s}  fedhet batched {ours:7.2f} ms/batch   PIL per-image loop {pil:7.2f} ms/batch   "
            f"speed-up x{pil / ours:5.1f}"
        )
    if args.json:
        weak, strong = measured
        emit(
            "augment_speed",
            {"weak_ms": weak["fedhet_ms"], "strong_ms": strong["fedhet_ms"]},
            {"weak_ms": "about 3", "strong_ms": "<= 30"},
            settings=f"a batch of {BATCH} {source} RGB 32x32 images on {args.device}, {THREADS} threads, "
            f"median of {args.repeats} batches; the PIL loop is FixMatch's per-image augmentation",
            rows=measured,
        )


if __name__ == "__main__":
    main()
