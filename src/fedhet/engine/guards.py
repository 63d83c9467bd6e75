"""Server-side guards on the updates of a round (``[guards]``; docs/reliability.md).

The protocol checks of :mod:`fedhet.engine.boundary` judge each reply alone (keys, shapes, finite values).
The guards here judge a reply against the round's others: an update whose norm, or a sample count that is
far above the round's median, is what a scaled, random or lying client sends. Each returns the rejected
clients with the reason, which the round loop logs and records like any rejected update.

The median of a small round is one or two clients' own values: with 3 hospitals, two that have converged
(update norms 0.0002 and 0.014) make the third, still learning from data unlike theirs (0.41), look like a
scaled attack. So the update-norm bound is never below ``update_norm_factor`` × ``update_norm_floor`` × the
global model's norm: an update moving a model by less than that (10 % of its norm, by default) is too
small to be what a random or scaled update is (N(0, 1) noise measured 36× the model's norm; a ×100 scale
2.4×), and it cannot wreck the model in one round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor, nn

from fedhet.config import GuardsConfig
from fedhet.engine.protocol import Instruction, Reply

#: The median of fewer updates than this says nothing about any one of them.
MIN_UPDATES_FOR_MEDIAN = 3


def update_norm(reply: Reply, sent: Instruction | None, updates: bool = False) -> float:
    """‖w_i − w_sent‖₂ over the floating-point tensors the server sent in full (``sent.weights``; a tensor it
    did not send, such as CELM's client-held heads in warm-up, has no reference and is left out); where it
    sent none, or an increment to a model only the client holds (``delta``), or where the replies are updates
    themselves (``updates``: the trainer's ``uploads_updates``), ‖w_i‖₂."""
    return update_norms({0: reply}, {0: sent} if sent is not None else {}, updates)[0]


def _reference(ins: Instruction | None, updates: bool) -> Mapping[str, Tensor]:
    """What an update is measured against: the weights the server sent in full, or nothing where it sent
    none, sent an increment to a model only the client holds (``delta``), or the replies are updates."""
    return {} if updates or ins is None or ins.delta else ins.weights


def _update_parts(reply: Reply, ins: Instruction | None, updates: bool) -> Iterator[tuple[str, Tensor]]:
    """The change w_i − w_sent per floating-point tensor, as :func:`update_norm` defines it, one tensor at a
    time (the norms of the round loop hold one difference at once, not a model's worth)."""
    reference = _reference(ins, updates)
    for key, value in reply.weights.items():
        if not value.is_floating_point():
            continue
        base = reference.get(key)
        if reference and base is None:
            # Not sent: an absolute weight is not a change; beside the changes of the keys that were sent
            # it made an honest returning client's norm 25x the round's median (CELM's warm-up heads).
            continue
        yield key, (value if base is None else value - base.to(value.device, value.dtype)).detach()


def update_norms(
    replies: Mapping[int, Reply], sent: Mapping[int, Instruction], updates: bool = False
) -> dict[int, float]:
    """:func:`update_norm` of every reply, summed where the weights live and read back once per round (one
    host sync on a GPU, not one per tensor)."""
    squares: list[Tensor] = []
    for cid in sorted(replies):
        total = torch.zeros((), dtype=torch.float64)
        for _, diff in _update_parts(replies[cid], sent.get(cid), updates):
            total = total.to(diff.device) + diff.double().pow(2).sum()
        squares.append(total)
    if not squares:
        return {}
    device = squares[0].device
    values = torch.stack([t.to(device) for t in squares]).sqrt().tolist()
    return dict(zip(sorted(replies), values, strict=True))


def update_bases(reply: Reply, ins: Instruction | None, updates: bool) -> dict[str, Tensor]:
    """The reference of each floating-point tensor of ``reply`` that :func:`update_norms` measures against:
    the sent weight, or zero where the server sent no reference (a tensor it did not send is left out)."""
    reference = _reference(ins, updates)
    out = {}
    for key, value in reply.weights.items():
        if not value.is_floating_point() or (reference and key not in reference):
            continue  # integer buffers stay; a tensor the server did not send has no reference
        base = reference.get(key)
        out[key] = base.to(value.device, value.dtype) if base is not None else torch.zeros_like(value)
    return out


def update_delta(reply: Reply, base: Mapping[str, Tensor], key: str) -> Tensor:
    """Δ of one tensor of ``reply`` against its reference (:func:`update_bases`), in float64."""
    return reply.weights[key].double() - base[key].double()


def with_updates(reply: Reply, bases: Mapping[str, Tensor], updates: Mapping[str, Tensor]) -> Reply:
    """``reply`` with each tensor of ``updates`` replaced by base + update (float64, cast to its dtype)."""
    weights = dict(reply.weights)
    for key, update in updates.items():
        weights[key] = (bases[key].double() + update.to(bases[key].device)).to(weights[key].dtype)
    return replace(reply, weights=weights)


def model_norm(model: nn.Module | None) -> float | None:
    """‖w‖₂ over the floating-point parameters and buffers of ``model`` (None for no model: Standalone)."""
    if model is None:
        return None
    tensors = (*model.parameters(), *model.buffers())
    squares = [t.detach().double().pow(2).sum() for t in tensors if t.is_floating_point()]
    return float(torch.stack(squares).sum().sqrt()) if squares else None


def update_norm_floor(guards: GuardsConfig, global_norm: float | None) -> float:
    """``update_norm_floor`` × the global model's norm: the least scale the update-norm guard multiplies by
    ``update_norm_factor`` (0 with the floor off or no global model)."""
    if not guards.update_norm_floor or global_norm is None:
        return 0.0
    return guards.update_norm_floor * global_norm


def update_cosines(
    replies: Mapping[int, Reply], sent: Mapping[int, Instruction], updates: bool = False
) -> dict[int, float]:
    """cos(Δ_i, m) for every reply: its update Δ_i (as :func:`update_norm` measures it) against the
    coordinate-wise median m of the round's updates (the lower median for an even count), over the tensors
    every update holds. Empty with fewer than 3 updates or a zero median (no consensus to judge by)."""
    if len(replies) < MIN_UPDATES_FOR_MEDIAN:
        return {}
    ids = sorted(replies)
    parts = [dict(_update_parts(replies[cid], sent.get(cid), updates)) for cid in ids]
    keys = sorted(set.intersection(*(set(p) for p in parts)))
    if not keys:
        return {}
    rows = torch.stack([torch.cat([p[k].reshape(-1).float() for k in keys]) for p in parts])
    median = rows.median(dim=0).values
    scale = float(median.norm())
    if scale == 0.0:
        return {}
    norms = rows.norm(dim=1).clamp_min(1e-30)
    cosines = (rows @ median) / (norms * scale)
    return dict(zip(ids, cosines.double().tolist(), strict=True))


def guard_updates(
    replies: Mapping[int, Reply],
    sent: Mapping[int, Instruction],
    guards: GuardsConfig,
    norms: Mapping[int, float] | None = None,
    updates: bool = False,
    cosines: Mapping[int, float] | None = None,
    global_norm: float | None = None,
) -> dict[int, str]:
    """The replies the guards reject, with the reason: num_examples above ``max_num_examples`` or above
    ``num_examples_factor`` × the round's median, an update norm above ``update_norm_factor`` × the median
    (``norms``: the replies' :func:`update_norms`, computed here when not given, measured as ``updates``
    says: the trainer's ``uploads_updates``), an update whose cosine with the round's median update is below
    ``min_update_cosine`` (``cosines``: :func:`update_cosines`, computed here when not given).
    ``global_norm``: the norm of the global model the round started from (:func:`model_norm`), for the
    update-norm guard's floor."""
    rejected: dict[int, str] = {}
    if guards.max_num_examples is not None:
        for cid, reply in replies.items():
            if reply.num_examples > guards.max_num_examples:
                rejected[cid] = (
                    f"num_examples={reply.num_examples} exceeds guards.max_num_examples="
                    f"{guards.max_num_examples}"
                )
    if guards.num_examples_factor:  # 0 = off
        counts = {cid: float(r.num_examples) for cid, r in replies.items()}
        rejected.update(
            _above_median(counts, guards.num_examples_factor, "num_examples", rejected, "num_examples_factor")
        )
    if guards.update_norm_factor:
        if norms is None:
            norms = update_norms(replies, sent, updates)
        kept = {cid: norms[cid] for cid in replies if cid not in rejected}
        floor = update_norm_floor(guards, global_norm)
        rejected.update(
            _above_median(
                kept, guards.update_norm_factor, "update norm", rejected, "update_norm_factor", floor
            )
        )
    if guards.min_update_cosine is not None:
        if cosines is None:
            cosines = update_cosines(replies, sent, updates)
        bound = guards.min_update_cosine
        for cid, cos in cosines.items():
            if cid not in rejected and cos < bound:
                rejected[cid] = (
                    f"update points away from the round's median update (cosine {cos:.3f} < "
                    f"guards.min_update_cosine = {bound:g}; if this client is honest and its data unlike the "
                    "others', lower it, or set it to none to turn the guard off)"
                )
    return rejected


def clip_updates(
    replies: Mapping[int, Reply],
    sent: Mapping[int, Instruction],
    guards: GuardsConfig,
    norms: Mapping[int, float],
    updates: bool = False,
    global_norm: float | None = None,
) -> tuple[dict[int, Reply], dict[int, float]]:
    """The replies with every update longer than ``update_norm_clip`` × the round's median norm (over
    ``replies``, 3 or more; never below the update-norm guard's floor) scaled down to that length:
    w_i ← w_sent + (bound / ‖Δ_i‖) Δ_i, norm bounding (Sun et al., "Can You Really Backdoor Federated
    Learning?", 2019, Sec. 4) with a bound relative to the round, as the update-norm guard's, so that it
    carries over between models. Returns the replies (the unclipped ones the same objects: a round that clips
    nothing is the round without the guard, bit for bit) and each clipped client's scale."""
    out = dict(replies)
    factor = guards.update_norm_clip
    kept = [norms[cid] for cid in replies if cid in norms]
    if not factor or len(kept) < MIN_UPDATES_FOR_MEDIAN:
        return out, {}
    median = float(np.median(kept))
    if median <= 0.0:
        return out, {}  # no scale to judge by (as the update-norm guard)
    bound = factor * max(median, update_norm_floor(guards, global_norm))
    scales: dict[int, float] = {}
    for cid, reply in replies.items():
        norm = norms.get(cid, 0.0)
        if norm <= bound:
            continue
        scale = bound / norm
        bases = update_bases(reply, sent.get(cid), updates)
        out[cid] = with_updates(reply, bases, {k: scale * update_delta(reply, bases, k) for k in bases})
        scales[cid] = scale
    return out, scales


def _above_median(
    values: Mapping[int, float],
    factor: float,
    what: str,
    already: Mapping[int, str],
    key: str,
    floor: float = 0.0,
) -> dict[int, str]:
    """The clients whose value exceeds ``factor`` × the median over the round (3 or more values), or
    ``factor`` × ``floor`` where that is larger (the update norm's floor, see the module's note)."""
    if len(values) < MIN_UPDATES_FOR_MEDIAN:
        return {}
    median = float(np.median(list(values.values())))
    if median <= 0.0:
        # Most clients changed nothing (or claim no samples), e.g. labels at one client only: there is no
        # scale to judge the others by, and rejecting the one client that learnt something is no defence.
        return {}
    scale = f"the round's median {median:.4g}"
    if floor > median:
        scale = f"{floor:.4g} (guards.update_norm_floor × the global model's norm, above {scale})"
    out = {}
    for cid, v in values.items():
        if cid in already or v <= factor * max(median, floor):
            continue
        out[cid] = (
            f"{what} {v:.4g} exceeds {factor:g} × {scale} (guards.{key}; if this client is honest, raise "
            f"it, or set it to 0 to turn the guard off)"
        )
    return out


def model_is_finite(model: nn.Module | None) -> bool:
    """Whether every floating-point parameter and buffer of ``model`` is finite (True for no model)."""
    if model is None:
        return True
    tensors: list[Tensor] = [*model.parameters(), *model.buffers()]
    return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


def nothing_trained_message(
    rounds: str, failures: Mapping[int, str], rejected: Mapping[int, str], client: Callable[[int], str]
) -> str:
    """Why a run that trains nothing stops (``guards.max_all_rejected_rounds``), with advice that fits its
    last round's reasons: updates rejected (non-finite, or by a guard) call for a lower learning rate or
    looser guards; clients that failed (raised, sent nothing, or their Flower node is gone) for the fix of
    the failure, which no learning rate or guard brings. ``rounds``: ``"a..b"``; ``client`` names a client."""
    advice = []
    if rejected:
        cid, reason = min(rejected.items())
        advice.append(
            f"{client(cid)}'s update was rejected: {reason}. Lower train.lr or train.weight_decay if the "
            "updates are non-finite, or loosen [guards]"
        )
    if failures:
        cid, reason = min(failures.items())
        advice.append(
            f"{client(cid)} failed: {reason}. Fix the error each failed client reports (logged above, per "
            "client and round) or, on Flower, check that every client's node is running and connected"
            + ("" if rejected else "; train.lr and [guards] play no part in a failure")
        )
    what = "update" if rejected else "client"
    did = "was rejected or failed" if rejected and failures else "was rejected" if rejected else "failed"
    return (
        f"every {what} of rounds {rounds} {did}; nothing is being trained. {'. '.join(advice)}; "
        "guards.max_all_rejected_rounds=0 never stops"
    )
