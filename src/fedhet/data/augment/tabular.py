"""Weak and strong views of a table's rows, for the semi-supervised methods (FixMatch, SAGE, ProxyFL).

Rows arrive standardised (mean 0, std 1 per numeric feature), so one noise scale fits every feature:

* weak view: Gaussian noise, x + N(0, ``noise``²) per feature (``noise`` = 0.1 by default) — the tabular
  counterpart of a flip and a small crop: the class does not change;
* strong view: random feature corruption after SCARF (Bahri et al., ICLR 2022) and VIME's mask-and-replace
  (Yoon et al., NeurIPS 2020): each feature of each row is, with probability ``corruption`` (0.3), replaced
  by the same feature of another row of the batch drawn uniformly (a draw from the batch's empirical
  marginal), then the weak noise is added.

One-hot columns are corrupted like any other (a replaced block stays a valid category only when the whole
block is replaced; SCARF makes the same simplification). All randomness comes from the generator passed in.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedhet.errors import ConfigError

#: Default weak noise std and strong corruption rate (SCARF's experiments use 0.6 for pre-training; a
#: FixMatch strong view must keep the class recognisable, so fedhet uses half of it).
WEAK_NOISE = 0.1
STRONG_CORRUPTION = 0.3


def _check_rows(x: Tensor) -> None:
    if not isinstance(x, Tensor) or x.dim() != 2 or not x.is_floating_point():
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ConfigError(f"table rows must be a float tensor (B, F), got {shape}")


def weak_rows(x: Tensor, generator: torch.Generator, noise: float = WEAK_NOISE) -> Tensor:
    """x + N(0, noise²) per feature (rows (B, F), standardised)."""
    _check_rows(x)
    if noise < 0:
        raise ConfigError(f"noise must be >= 0, got {noise}")
    draw = torch.randn(x.shape, generator=generator, dtype=x.dtype).to(x.device)
    return x + noise * draw


def strong_rows(
    x: Tensor, generator: torch.Generator, corruption: float = STRONG_CORRUPTION, noise: float = WEAK_NOISE
) -> Tensor:
    """Each entry replaced with probability ``corruption`` by the same feature of a uniformly drawn row of
    the batch, then the weak view's noise."""
    _check_rows(x)
    if not 0.0 <= corruption <= 1.0:
        raise ConfigError(f"corruption must lie in [0, 1], got {corruption}")
    rows, width = x.shape
    replace = (torch.rand((rows, width), generator=generator) < corruption).to(x.device)
    donors = torch.randint(0, max(rows, 1), (rows, width), generator=generator).to(x.device)
    marginal = x.gather(0, donors)
    return weak_rows(torch.where(replace, marginal, x), generator, noise)
