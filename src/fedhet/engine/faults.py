"""Injected client faults (``[faults]`` in the config): a client that misbehaves on purpose.

The attacks themselves are registered classes (fedhet.attacks: one file per attack, each declaring its kind
and parameters; docs/writing-an-attack.md, with their sources in docs/reliability.md); this module runs them
and knows none by name. Client-side kinds act on the client, so they run unchanged in the embedded engine
and on Flower: :func:`fault_for` names a client's fault in a round (from ``faults.from_round``, every
``faults.every``-th round), :func:`refuse_to_train` raises for a ``refuse`` attack, :func:`fault_data` is the
data a ``data`` attack trains on, :func:`apply_fault` turns the honest reply into the faulty one (``reply``
and ``count`` attacks). The client keeps its honest state; only what it sends lies (an attack's memory, e.g.
``replay``'s update, lives in the state's :data:`FAULT_MEMORY`).

The ``coordinated`` attacks need the round's honest updates, so :func:`coordinated_attack` applies them in
the round loop after the replies are gathered and before the guards and the aggregation see them (both
engines share that loop). Threat model: an omniscient, coordinated adversary that sees every honest update
of the round (the strongest case; IPM's assumption, the full-knowledge setting of later evaluations);
colluders share one set of statistics. With no honest reply in the round they use their own honest updates
(ALIE's own estimate).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from fedhet.attacks import build_attack
from fedhet.attacks.alie import alie_z
from fedhet.attacks.base import Attack, NormGuard, RoundView
from fedhet.config import ExperimentConfig
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

__all__ = [
    "FAULT_MEMORY",
    "Fault",
    "InjectedFault",
    "alie_z",
    "apply_fault",
    "coordinated_attack",
    "fault_data",
    "fault_for",
    "refuse_to_train",
]

#: The key of a client's ``ClientState.values`` where a fault keeps what it remembers (``replay``'s update).
FAULT_MEMORY = "fault_memory"


class InjectedFault(FedhetError, RuntimeError):
    """A ``refuse`` attack (``crash``, ``drop``): the client sends no update this round."""


@dataclass(frozen=True)
class Fault:
    """The attack one client injects in one round; ``generator`` draws its noise (per round and client)."""

    attack: Attack
    generator: torch.Generator

    @property
    def behaviour(self) -> str:
        """The attack's name (``faults.clients.K``)."""
        return self.attack.name

    @property
    def kind(self) -> str:
        return self.attack.kind


def fault_for(cfg: ExperimentConfig, cid: int, rnd: int) -> Fault | None:
    """The fault of client ``cid`` in round ``rnd``, or None: honest clients, rounds before
    ``faults.from_round`` or off the ``faults.every`` beat (from_round, from_round + every, …), and the
    round-0 description unless the attack lies about the sample count (kind ``count``)."""
    behaviour = cfg.faults.clients.get(str(cid))
    if behaviour is None:
        return None
    f = cfg.faults
    if 0 < rnd and (rnd < f.from_round or (rnd - f.from_round) % f.every):
        return None
    attack = build_attack(behaviour, f)
    if rnd == 0 and attack.kind != "count":
        return None
    return Fault(attack, derived_torch_generator(cfg.seed, "fault", rnd, cid))


def refuse_to_train(fault: Fault | None) -> None:
    """A ``refuse`` attack sends nothing: raise before any training is spent on it."""
    if fault is not None and fault.kind == "refuse":
        raise InjectedFault(f"injected fault {fault.behaviour!r}: {fault.attack.refusal}")


def fault_data(fault: Fault | None, data: ClientData) -> ClientData:
    """The data a client with ``fault`` trains on: a ``data`` attack relabels its own labeled samples (e.g.
    ``label-flip``, y → K−1−y); the shared label tensor and every other client's data are untouched."""
    if fault is None or fault.kind != "data":
        return data
    labels = data.labels.clone()
    labels[data.indices] = fault.attack.relabel(labels[data.indices], data.num_classes)
    return replace(data, labels=labels)


def apply_fault(
    fault: Fault | None,
    reply: Reply,
    start: Mapping[str, Tensor],
    memory: MutableMapping[str, Any] | None = None,
) -> Reply:
    """The reply a client with ``fault`` sends instead of its honest ``reply`` (trained from ``start``).

    Only floating-point tensors are altered (integer buffers such as BatchNorm's counters stay). ``memory``
    is the client's fault memory (:data:`FAULT_MEMORY`, JSON), read and written by the attack. Coordinated,
    data and refusing attacks send the honest reply here (:func:`coordinated_attack` replaces the first).
    """
    if fault is None or fault.kind not in ("reply", "count"):
        return reply  # a data attack lied in training (fault_data); its update is sent as trained
    if fault.kind == "count":
        return replace(reply, num_examples=fault.attack.claim(reply.num_examples))
    bases = {
        key: start[key].to(trained.device, trained.dtype) if key in start else torch.zeros_like(trained)
        for key, trained in reply.weights.items()
        if trained.is_floating_point()
    }
    altered = fault.attack.alter(reply.weights, bases, fault.generator, memory if memory is not None else {})
    if not altered:
        return reply
    return replace(reply, weights={**reply.weights, **altered})


# --------------------------------------------------------------------------------------------------------
# The coordinated adversary: one step of the round loop
# --------------------------------------------------------------------------------------------------------
def coordinated_attack(
    cfg: ExperimentConfig,
    rnd: int,
    replies: Mapping[int, Reply],
    sent: Mapping[int, Instruction],
    updates: bool = False,
    global_norm: float | None = None,
) -> dict[int, Reply]:
    """The round's replies after its coordinated colluders (attacks of kind ``coordinated`` in round
    ``rnd``, by :func:`fault_for`) replaced theirs; the others are untouched.

    The colluders see every honest update Δ_i of the round (the replies of clients with no fault this round;
    where there are none, the colluders' own honest updates), measured as the guards measure it: w_i −
    w_sent over the tensors sent in full, or w_i itself where the server sent no reference or the replies
    are updates (``updates``: the trainer's ``uploads_updates``). Statistics are float64; each colluder
    sends its own w_sent + the malicious update, cast back to its dtype. Each attack sees the honest replies
    as gathered; those declaring ``after_others`` (``adaptive-scale``) then see every reply's norm once the
    others replaced theirs.
    """
    faults = {cid: fault_for(cfg, cid, rnd) for cid in sorted(replies)}
    group = {cid: f for cid, f in faults.items() if f is not None and f.kind == "coordinated"}
    if not group:
        return dict(replies)
    bases = {cid: update_bases(replies[cid], sent.get(cid), updates) for cid in replies}
    honest = [cid for cid, f in faults.items() if f is None] or sorted(group)
    guard = NormGuard(
        cfg.guards.update_norm_factor, update_norm_floor(cfg.guards, global_norm), MIN_UPDATES_FOR_MEDIAN
    )
    by_name: dict[str, list[int]] = {}
    for cid, f in group.items():
        by_name.setdefault(f.behaviour, []).append(cid)
    out = dict(replies)
    for late in (False, True):
        norms = update_norms(out, sent, updates) if late else {}
        for colluders in by_name.values():
            attack = group[colluders[0]].attack
            if attack.after_others != late:
                continue
            keys = sorted(set.intersection(*(set(bases[c]) for c in honest + colluders)))
            view = RoundView(
                honest={
                    k: torch.stack([update_delta(replies[c], bases[c], k) for c in honest]) for k in keys
                },
                honest_ids=list(honest),
                own={c: {k: update_delta(replies[c], bases[c], k) for k in bases[c]} for c in colluders},
                replies=len(replies),
                guard=guard,
                norms=norms,
            )
            for c, malicious in attack.forge(view).items():
                out[c] = with_updates(replies[c], bases[c], malicious)
    return out
