"""Host-to-device copies that do not make the host wait: what the CPU generators draw (batch
permutations, augmentation parameters) goes to a CUDA device through pinned memory with ``non_blocking=True``.

A plain ``cpu_tensor.to("cuda")`` is a blocking copy: the host waits for the device to finish everything
queued before it (a host sync, every step). From pinned memory the copy is queued like a kernel; PyTorch's
pinned-memory cache keeps the source alive until the copy has run. Randomness stays on the CPU generators,
so a seed gives the same batches and views on every device.

A ground-floor module (it imports only torch): data/ (augmentation), engine/ and algorithms/ all use it.
"""

from __future__ import annotations

import torch
from torch import Tensor


def to_device(t: Tensor, device: torch.device | str, dtype: torch.dtype | None = None) -> Tensor:
    """``t`` on ``device`` (and in ``dtype``); from the CPU to CUDA without a host sync."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        if dtype is not None:
            t = t.to(dtype)
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device=device, dtype=dtype)
