"""Neuron/channel masks for submodels (FedRAC, FedSAC; methods.md §3.3, baselines.md §2.6-2.7).

A submodel is an activation mask, not sliced weights: a 0/1 vector of length K (the model's
``maskable_units``) multiplied into the hidden activations at the model's mask points, in K order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fedhet.errors import ConfigError


class UnitMask(nn.Module):
    """One mask point: multiplies dimension 1 of its input (units or channels) by a 0/1 vector.

    The identity while no mask is set. The mask is a plain attribute, not a buffer, so it is never part
    of ``state_dict`` and never travels with the weights.
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self.mask: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self.mask is None:
            return x
        mask = self.mask.to(device=x.device, dtype=x.dtype)
        # Broadcast over spatial dimensions for conv activations (B, C, H, W); a no-op for (B, C).
        return x * mask.reshape((self.size,) + (1,) * (x.dim() - 2))

    def extra_repr(self) -> str:
        return f"size={self.size}"


def _check_order(order: Tensor, total: int) -> Tensor:
    if total < 0:
        raise ConfigError(f"total must be >= 0, got {total}")
    if order.dim() != 1 or order.numel() != total:
        raise ConfigError(
            f"order must be a 1-D permutation of range({total}), got shape {tuple(order.shape)}; "
            "pass e.g. torch.argsort(frequency) over all units"
        )
    if order.dtype.is_floating_point or order.dtype == torch.bool:
        raise ConfigError(f"order must hold integer unit indices, got dtype {order.dtype}")
    if total and not torch.equal(torch.sort(order).values, torch.arange(total, device=order.device)):
        raise ConfigError(f"order is not a permutation of range({total}): it repeats or misses indices")
    return order


def _check_size(size: int, total: int) -> int:
    if isinstance(size, bool) or int(size) != size or not 0 <= size <= total:
        raise ConfigError(f"submodel size must be an integer in [0, {total}], got {size!r}")
    return int(size)


def nested_prefix_masks(order: Tensor, sizes: Sequence[int], total: int) -> Tensor:
    """Masks of the first ``sizes[m]`` units of permutation ``order`` (FedRAC candidates, §3.4 step 3).

    Returns a float (M, total) 0/1 tensor; every row is a prefix of the same π, so any two rows nest.
    """
    _check_order(order, total)
    checked = [_check_size(size, total) for size in sizes]
    # rank[u] = position of unit u in the order; unit u is in the prefix of length s iff rank[u] < s.
    rank = torch.empty(total, dtype=torch.long, device=order.device)
    rank[order.long()] = torch.arange(total, device=order.device)
    limits = torch.tensor(checked, dtype=torch.long, device=order.device).reshape(-1, 1)
    return (rank.unsqueeze(0) < limits).to(torch.float32)


def prefix_mask(order: Tensor, size: int, total: int) -> Tensor:
    """Mask of the first ``size`` units of permutation ``order``: m[π_1..π_size] = 1 (FedRAC §3.4 step 5)."""
    return nested_prefix_masks(order, [size], total)[0]


def random_mask(total: int, size: int, generator: torch.Generator) -> Tensor:
    """A mask with exactly ``size`` of ``total`` units on, chosen uniformly with ``generator``."""
    if total < 0:
        raise ConfigError(f"total must be >= 0, got {total}")
    size = _check_size(size, total)
    order = torch.randperm(total, generator=generator, device=generator.device)
    return prefix_mask(order, size, total)


def unit_groups(model: nn.Module) -> list[tuple[str, int]]:
    """Names and sizes of the mask points of ``model`` (a ``FedModel``: models/base.py imports this module,
    so it is not named here), in K order (sizes sum to ``maskable_units``)."""
    return [(name, point.size) for name, point in model.mask_points()]
