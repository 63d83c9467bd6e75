"""``noise`` and ``free-rider``: weights drawn from N(0, noise_std²), a random model, or around w_sent.

- ``noise``: a random model, every float tensor drawn from N(0, ``faults.noise_std``²).
- ``free-rider``: the "disguised free-rider" that returns the model it was sent plus Gaussian noise, Lin et
  al., "Free-riders in Federated Learning: Attacks and Defenses", arXiv:1911.12560 (2019), and Fraboni et
  al., "Free-rider Attacks on Model Aggregation in Federated Learning", AISTATS 2021 (Sec. 3).

The noise is drawn in float32 from the generator of (seed, round, client), tensor after tensor.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedhet.attacks.base import Attack


def _gaussian(trained: Tensor, std: float, generator: torch.Generator) -> Tensor:
    noise = torch.randn(trained.shape, generator=generator, dtype=torch.float32)
    return (noise * std).to(trained.device, trained.dtype)


class Noise(Attack):
    """A random model: i.i.d. N(0, noise_std²) weights."""

    name = "noise"
    kind = "reply"
    flat_parameters = ("noise_std",)
    noise_std: float

    def tensor(self, trained: Tensor, base: Tensor, generator: torch.Generator) -> Tensor:
        return _gaussian(trained, self.noise_std, generator)


class FreeRider(Attack):
    """A disguised free rider: the model it was sent plus N(0, noise_std²) noise (Lin et al. 2019)."""

    name = "free-rider"
    kind = "reply"
    flat_parameters = ("noise_std",)
    noise_std: float

    def tensor(self, trained: Tensor, base: Tensor, generator: torch.Generator) -> Tensor:
        return base + _gaussian(trained, self.noise_std, generator)
