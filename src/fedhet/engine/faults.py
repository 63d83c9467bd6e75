"""Injected client faults (``[faults]`` in the config): a client that misbehaves on purpose.

Client-side faults act on the client, so they run unchanged in the embedded engine and on Flower:
:func:`fault_for` names a client's fault in a round (from ``faults.from_round``, every ``faults.every``-th
round), :func:`fault_data` is the data a client trains on (``label-flip``), :func:`apply_fault` turns the
honest reply into the faulty one. The client keeps its honest state; only what it sends lies (``replay``
keeps its old update in the state's :data:`FAULT_MEMORY`). The behaviours are
:data:`fedhet.config.FAULT_BEHAVIOURS`, documented in docs/reliability.md, with these sources:

- ``label-flip``: data poisoning by label flipping y → K−1−y, the label-flipping attack of Fang et al.,
  "Local Model Poisoning Attacks to Byzantine-Robust Federated Learning", USENIX Security 2020 (Sec. 5).
- ``free-rider``: the "disguised free-rider" that returns the global model plus Gaussian noise, Lin et al.,
  "Free-riders in Federated Learning: Attacks and Defenses", arXiv:1911.12560 (2019), and Fraboni et al.,
  "Free-rider Attacks on Model Aggregation in Federated Learning", AISTATS 2021 (Sec. 3).
- ``replay``: re-sends its first update every later round; our variant of a free rider (no paper's
  algorithm).

The coordinated behaviours (:data:`fedhet.config.COORDINATED_FAULTS`) need the round's honest updates, so
:func:`coordinated_attack` applies them in the round loop after the replies are gathered and before the
guards and the aggregation see them (both engines share that loop). Threat model: an omniscient,
coordinated adversary that sees every honest update of the round (the strongest case; IPM's assumption, the
full-knowledge setting of later evaluations); colluders share one set of statistics and send the same
update. With no honest reply in the round they use their own honest updates (ALIE's own estimate).

- ``alie``: "A Little Is Enough", Baruch et al., NeurIPS 2019 (Sec. 3): each colluder sends the
  coordinate-wise mean − z·std of the honest updates, z_max = Φ⁻¹((n − s)/n), s = ⌊n/2 + 1⌋ − f.
- ``ipm``: Inner Product Manipulation, Xie et al., "Fall of Empires", UAI 2019 (PMLR 115, 2020; Sec. 4):
  each colluder sends −ε × the mean honest update (ε = 0.5 a small ε; e.g. 100 the "large ε" variant).
- ``adaptive-scale``: explicit boosting (Bhagoji et al., "Analyzing Federated Learning through an
  Adversarial Lens", ICML 2019, Sec. 3) tuned to the defence, as adaptive attacks are (Shejwalkar and
  Houmansadr, NDSS 2021): the update scaled to 0.99 × the update-norm guard's bound.
"""

from __future__ import annotations

import base64
import math
import statistics
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedhet.config import ExperimentConfig
from fedhet.config_sections import COORDINATED_FAULTS
from fedhet.engine.guards import (
    MIN_UPDATES_FOR_MEDIAN,
    update_bases,
    update_delta,
    update_norm_floor,
    update_norms,
    with_updates,
)
from fedhet.engine.protocol import ClientData, Instruction, Reply
from fedhet.engine.seeds import derived_torch_generator
from fedhet.errors import FedhetError

#: The key of a client's ``ClientState.values`` where a fault keeps what it remembers (``replay``'s update).
FAULT_MEMORY = "fault_memory"
#: ``adaptive-scale`` aims at this fraction of the update-norm guard's bound (a margin for rounding).
ADAPTIVE_MARGIN = 0.99


class InjectedFault(FedhetError, RuntimeError):
    """A ``crash`` or ``drop`` fault: the client sends no update this round."""


@dataclass(frozen=True)
class Fault:
    """The fault one client injects in one round; ``generator`` draws its noise (per round and client)."""

    behaviour: str
    factor: float
    noise_std: float
    generator: torch.Generator


def fault_for(cfg: ExperimentConfig, cid: int, rnd: int) -> Fault | None:
    """The fault of client ``cid`` in round ``rnd``, or None: honest clients, rounds before
    ``faults.from_round`` or off the ``faults.every`` beat (from_round, from_round + every, …), and the
    round-0 description unless the fault is ``lie-num-examples``."""
    behaviour = cfg.faults.clients.get(str(cid))
    if behaviour is None or (rnd == 0 and behaviour != "lie-num-examples"):
        return None
    f = cfg.faults
    if 0 < rnd and (rnd < f.from_round or (rnd - f.from_round) % f.every):
        return None
    return Fault(behaviour, f.factor, f.noise_std, derived_torch_generator(cfg.seed, "fault", rnd, cid))


def refuse_to_train(fault: Fault | None) -> None:
    """``crash`` and ``drop`` send nothing: raise before any training is spent on them."""
    behaviour = fault.behaviour if fault is not None else None
    if behaviour == "crash":
        raise InjectedFault("injected fault 'crash': the client raised during training")
    if behaviour == "drop":
        raise InjectedFault("injected fault 'drop': the client sent no reply")


def fault_data(fault: Fault | None, data: ClientData) -> ClientData:
    """The data a client with ``fault`` trains on: ``label-flip`` relabels its own labeled samples
    y → K−1−y (Fang et al. 2020); the shared label tensor and every other client's data are untouched."""
    if fault is None or fault.behaviour != "label-flip":
        return data
    labels = data.labels.clone()
    labels[data.indices] = data.num_classes - 1 - labels[data.indices]
    return replace(data, labels=labels)


def apply_fault(
    fault: Fault | None,
    reply: Reply,
    start: Mapping[str, Tensor],
    memory: MutableMapping[str, Any] | None = None,
) -> Reply:
    """The reply a client with ``fault`` sends instead of its honest ``reply`` (trained from ``start``).

    Only floating-point tensors are altered (integer buffers such as BatchNorm's counters stay). ``memory``
    is the client's fault memory (:data:`FAULT_MEMORY`, JSON), read and written by ``replay``. The
    coordinated behaviours send the honest reply here; :func:`coordinated_attack` replaces it.
    """
    if fault is None or fault.behaviour in COORDINATED_FAULTS or fault.behaviour == "label-flip":
        return reply  # label-flip lied in training (fault_data); its update is sent as trained
    if fault.behaviour == "lie-num-examples":
        claimed = min(reply.num_examples * fault.factor, float(2**62))  # a finite int however large
        return replace(reply, num_examples=int(round(claimed)))
    bases = {
        key: start[key].to(trained.device, trained.dtype) if key in start else torch.zeros_like(trained)
        for key, trained in reply.weights.items()
        if trained.is_floating_point()
    }
    if fault.behaviour == "replay":
        return _replay(reply, bases, memory if memory is not None else {})
    out = dict(reply.weights)
    for key, base in bases.items():
        out[key] = _faulty_tensor(fault, reply.weights[key], base)
    return replace(reply, weights=out)


def _faulty_tensor(fault: Fault, trained: Tensor, base: Tensor) -> Tensor:
    behaviour = fault.behaviour
    if behaviour in ("noise", "free-rider"):  # i.i.d. N(0, noise_std²): a random model, or around w_sent
        noise = torch.randn(trained.shape, generator=fault.generator, dtype=torch.float32)
        noise = (noise * fault.noise_std).to(trained.device, trained.dtype)
        return noise if behaviour == "noise" else base + noise
    if behaviour == "scale":
        return base + fault.factor * (trained - base)
    if behaviour == "sign-flip":
        return base - (trained - base)
    if behaviour == "stale":
        return base.clone()
    if behaviour == "nan":
        return torch.full_like(trained, float("nan"))
    raise ValueError(f"unknown fault {behaviour!r}")


def _replay(reply: Reply, bases: Mapping[str, Tensor], memory: MutableMapping[str, Any]) -> Reply:
    """``replay``: the first time, send the honest update and keep it; later, w_sent + that update."""
    kept = memory.get("replay")
    if kept is None:
        memory["replay"] = {key: _encode(reply.weights[key] - base) for key, base in bases.items()}
        return reply
    out = dict(reply.weights)
    for key, base in bases.items():
        if key in kept:
            out[key] = base + _decode(kept[key]).to(base.device, base.dtype)
    return replace(reply, weights=out)


def _encode(t: Tensor) -> dict[str, Any]:
    """A tensor as JSON (Flower's ``context.state`` holds JSON): its shape and its float64 bytes."""
    data = t.detach().to("cpu", torch.float64).contiguous().numpy()
    return {"shape": list(t.shape), "float64": base64.b64encode(data.tobytes()).decode("ascii")}


def _decode(blob: Mapping[str, Any]) -> Tensor:
    data = np.frombuffer(base64.b64decode(blob["float64"]), dtype=np.float64).copy()
    return torch.from_numpy(data).reshape(blob["shape"])


# --------------------------------------------------------------------------------------------------------
# The coordinated adversary (alie, ipm, adaptive-scale): one step of the round loop
# --------------------------------------------------------------------------------------------------------
def alie_z(n: int, f: int) -> float:
    """ALIE's z_max (Baruch et al. 2019, Sec. 3): Φ⁻¹((n − s)/n) with s = ⌊n/2 + 1⌋ − f, for ``n`` updates
    of which ``f`` are the colluders'. With a majority of colluders (s < 1) s = 1; with n = 1, z = 0."""
    s = max(math.floor(n / 2 + 1) - f, 1)
    p = (n - s) / n
    return statistics.NormalDist().inv_cdf(p) if p > 0 else 0.0


def coordinated_attack(
    cfg: ExperimentConfig,
    rnd: int,
    replies: Mapping[int, Reply],
    sent: Mapping[int, Instruction],
    updates: bool = False,
    global_norm: float | None = None,
) -> dict[int, Reply]:
    """The round's replies after its coordinated colluders (``alie``, ``ipm``, ``adaptive-scale`` in
    round ``rnd``, by :func:`fault_for`) replaced theirs; the others are untouched.

    The colluders see every honest update Δ_i of the round (the replies of clients with no fault this round;
    where there are none, the colluders' own honest updates), measured as the guards measure it: w_i −
    w_sent over the tensors sent in full, or w_i itself where the server sent no reference or the replies
    are updates (``updates``: the trainer's ``uploads_updates``). Statistics are float64 and coordinate-wise;
    each colluder sends its own w_sent + the malicious update, cast back to its dtype.
    """
    faults = {cid: fault_for(cfg, cid, rnd) for cid in sorted(replies)}
    group = {
        cid: f.behaviour for cid, f in faults.items() if f is not None and f.behaviour in COORDINATED_FAULTS
    }
    if not group:
        return dict(replies)
    bases = {cid: update_bases(replies[cid], sent.get(cid), updates) for cid in replies}
    honest = [cid for cid, f in faults.items() if f is None] or sorted(group)
    n = len(replies)
    malicious: dict[int, dict[str, Tensor]] = {cid: {} for cid in group}  # colluder -> key -> its Δ
    for behaviour in ("alie", "ipm"):
        colluders = [cid for cid, b in group.items() if b == behaviour]
        if not colluders:
            continue
        for key in sorted(set.intersection(*(set(bases[c]) for c in honest + colluders))):
            stacked = torch.stack([update_delta(replies[c], bases[c], key) for c in honest])
            mean = stacked.mean(dim=0)
            if behaviour == "alie":  # Baruch et al. 2019, Sec. 3: μ − z·σ, σ the population std
                z = cfg.faults.z if cfg.faults.z is not None else alie_z(n, len(colluders))
                update = mean - z * stacked.std(dim=0, correction=0)
            else:  # Xie et al. 2020, Sec. 4: −ε · (1/|honest|) Σ Δ_i
                update = -cfg.faults.epsilon * mean
            for c in colluders:
                malicious[c][key] = update
    out = {
        cid: with_updates(replies[cid], bases[cid], malicious[cid]) if cid in group else r
        for cid, r in replies.items()
    }
    scalers = [cid for cid, b in group.items() if b == "adaptive-scale"]
    if scalers:
        floor = update_norm_floor(cfg.guards, global_norm)
        factors = _adaptive_factors(cfg, update_norms(out, sent, updates), scalers, floor)
        for c in scalers:
            scaled = {key: factors[c] * update_delta(replies[c], bases[c], key) for key in bases[c]}
            out[c] = with_updates(replies[c], bases[c], scaled)
    return out


def _adaptive_factors(
    cfg: ExperimentConfig, norms: Mapping[int, float], scalers: list[int], floor: float
) -> dict[int, float]:
    """Each ``adaptive-scale`` colluder's factor: ``ADAPTIVE_MARGIN`` × guards.update_norm_factor × M / ‖Δ‖,
    M the scale the update-norm guard will take: the median over the round's norms (the colluders' counted
    above every other, where their scaled norms will be), or the guard's ``floor`` where that is larger.
    ``faults.factor`` where the guard does not judge: off, fewer than 3 updates, a zero median, or
    colluders holding half the round (the median is then theirs)."""
    k = cfg.guards.update_norm_factor
    others = [v for cid, v in norms.items() if cid not in scalers]
    median = float(np.median(others + [math.inf] * len(scalers))) if norms else math.nan
    judged = k and len(norms) >= MIN_UPDATES_FOR_MEDIAN and math.isfinite(median) and median > 0
    out = {}
    for c in scalers:
        if not judged:
            out[c] = cfg.faults.factor
        else:
            scale = max(median, floor)
            out[c] = ADAPTIVE_MARGIN * k * scale / norms[c] if norms[c] > 0 else 1.0
    return out
