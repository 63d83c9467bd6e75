"""How much each kept update of a round points where the others' do: cos(Δ_i, Σ_{j≠i} Δ_j).

Recorded per round in ``metrics.jsonl`` (``update_alignment``) for the audit's free-rider finding
(fedhet.report.audit, docs/audit.md): an update that carries no information about any data — the model it
was sent plus noise (Lin et al., arXiv:1911.12560, 2019; Fraboni et al., AISTATS 2021), whatever the
noise's size — is orthogonal to every honest update (|cos| of the order of 1/√P for P weights), while an
honest client's update shares some of the round's common direction. It is a record only: no guard reads it
and no number of the run changes.

The updates are measured as the guards measure them (:func:`fedhet.engine.guards.update_norm`: w_i − w_sent
over the tensors the server sent in full), over the tensors every update of the round holds, in float64,
in two passes (the sum Σ Δ_j, then each Δ_i · Σ) so that one model's worth of memory is added, not N.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from fedhet.engine.guards import MIN_UPDATES_FOR_MEDIAN, _reference, _update_parts
from fedhet.engine.protocol import Instruction, Reply


def update_alignment(
    replies: Mapping[int, Reply], sent: Mapping[int, Instruction], updates: bool = False
) -> tuple[dict[int, float], int]:
    """cos(Δ_i, Σ_{j≠i} Δ_j) of every reply in ``replies`` (the round's kept updates), and the number of
    weights compared (the size of the tensors every update holds: a random direction's cosine with any
    fixed one has spread 1/√size). 0.0 for an update of norm 0 (it points nowhere). Empty, size 0, with
    fewer than 3 replies (two updates' cosine is one number for both) or no tensor that every update holds;
    a client whose others sum to 0 is left out."""
    if len(replies) < MIN_UPDATES_FOR_MEDIAN:
        return {}, 0
    ids = sorted(replies)
    keys = set.intersection(*(_delta_keys(replies[c], sent.get(c), updates) for c in ids))
    if not keys:
        return {}, 0
    size = sum(replies[ids[0]].weights[k].numel() for k in keys)
    total: dict[str, Tensor] = {}
    squares = {}
    for cid in ids:
        sq = torch.zeros((), dtype=torch.float64)
        for key, diff in _update_parts(replies[cid], sent.get(cid), updates):
            if key not in keys:
                continue
            d = diff.double()
            total[key] = d.clone() if key not in total else total[key] + d.to(total[key].device)
            sq = sq.to(d.device) + d.pow(2).sum()
        squares[cid] = sq
    total_sq = sum(t.pow(2).sum().cpu() for t in total.values())
    dots = {}
    for cid in ids:
        dot = torch.zeros((), dtype=torch.float64)
        for key, diff in _update_parts(replies[cid], sent.get(cid), updates):
            if key in keys:
                dot = dot.to(diff.device) + (diff.double() * total[key].to(diff.device)).sum()
        dots[cid] = dot
    out = {}
    s2 = float(total_sq)
    for cid in ids:
        own, dot = float(squares[cid]), float(dots[cid])
        others = s2 - 2.0 * dot + own  # ‖Σ − Δ_i‖²
        if own == 0.0:
            out[cid] = 0.0
        elif others > 0.0:
            out[cid] = (dot - own) / (math.sqrt(own) * math.sqrt(others))
    return out, size


def _delta_keys(reply: Reply, ins: Instruction | None, updates: bool) -> set[str]:
    """The keys :func:`fedhet.engine.guards._update_parts` yields for ``reply``, without computing a Δ."""
    reference = _reference(ins, updates)
    return {
        k for k, v in reply.weights.items() if v.is_floating_point() and (not reference or k in reference)
    }
