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

A table's rows get their own weak and strong views (``tabular``: Gaussian noise; SCARF / VIME feature
corruption); ``Augmenter`` picks them for (B, F) batches.

Layout: ``ops`` (the 14 ops, magnitude -> parameter), ``checks`` (argument checks), ``views`` (the entry
points: weak and strong views, one op, RandAugmentMC, Cutout, Augmenter), ``tabular`` (rows).
"""

from fedhet.data.augment.ops import FIXMATCH_OPS
from fedhet.data.augment.views import Augmenter, apply_op, cutout, randaugment, strong_augment, weak_augment

__all__ = [
    "FIXMATCH_OPS",
    "Augmenter",
    "apply_op",
    "cutout",
    "randaugment",
    "strong_augment",
    "weak_augment",
]
