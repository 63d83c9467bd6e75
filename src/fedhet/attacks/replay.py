"""``replay``: re-sends its first update every later round; our variant of a free rider that re-sends an
honest contribution it once made (no paper's algorithm). The update lives in the client's JSON fault memory
(Flower's ``context.state`` and the checkpoints hold it; as large as a model)."""

from __future__ import annotations

import base64
from collections.abc import Mapping, MutableMapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedhet.attacks.base import Attack


class Replay(Attack):
    """The first time it acts, the honest update Δ₁ (kept); later, w_sent + Δ₁."""

    name = "replay"
    kind = "reply"

    def alter(
        self,
        trained: Mapping[str, Tensor],
        bases: Mapping[str, Tensor],
        generator: torch.Generator,
        memory: MutableMapping[str, Any],
    ) -> dict[str, Tensor]:
        kept = memory.get("replay")
        if kept is None:
            memory["replay"] = {key: _encode(trained[key] - base) for key, base in bases.items()}
            return {}
        return {
            key: base + _decode(kept[key]).to(base.device, base.dtype)
            for key, base in bases.items()
            if key in kept
        }


def _encode(t: Tensor) -> dict[str, Any]:
    """A tensor as JSON (Flower's ``context.state`` holds JSON): its shape and its float64 bytes."""
    data = t.detach().to("cpu", torch.float64).contiguous().numpy()
    return {"shape": list(t.shape), "float64": base64.b64encode(data.tobytes()).decode("ascii")}


def _decode(blob: Mapping[str, Any]) -> Tensor:
    data = np.frombuffer(base64.b64decode(blob["float64"]), dtype=np.float64).copy()
    return torch.from_numpy(data).reshape(blob["shape"])
