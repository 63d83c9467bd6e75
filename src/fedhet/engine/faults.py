"""Injected client faults (``[faults]`` in the config): a client that misbehaves on purpose.

A fault acts on the client side, after the honest local update, so it runs unchanged in the embedded
engine and on Flower: :func:`fault_for` names a client's fault in a round, :func:`apply_fault` turns the
honest reply into the faulty one. The client keeps its honest state; only what it sends lies. The
behaviours are :data:`fedhet.config.FAULT_BEHAVIOURS`, documented in docs/robustness.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from fedhet.config import ExperimentConfig
from fedhet.engine.protocol import Reply
from fedhet.engine.seeds import derived_torch_generator
from fedhet.errors import FedhetError


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
    ``faults.from_round``, and the round-0 description unless the fault is ``lie-num-examples``."""
    behaviour = cfg.faults.clients.get(str(cid))
    if behaviour is None or (rnd == 0 and behaviour != "lie-num-examples"):
        return None
    if 0 < rnd < cfg.faults.from_round:
        return None
    f = cfg.faults
    return Fault(behaviour, f.factor, f.noise_std, derived_torch_generator(cfg.seed, "fault", rnd, cid))


def refuse_to_train(fault: Fault | None) -> None:
    """``crash`` and ``drop`` send nothing: raise before any training is spent on them."""
    behaviour = fault.behaviour if fault is not None else None
    if behaviour == "crash":
        raise InjectedFault("injected fault 'crash': the client raised during training")
    if behaviour == "drop":
        raise InjectedFault("injected fault 'drop': the client sent no reply")


def apply_fault(fault: Fault | None, reply: Reply, start: Mapping[str, Tensor]) -> Reply:
    """The reply a client with ``fault`` sends instead of its honest ``reply`` (trained from ``start``).

    Only floating-point tensors are altered (integer buffers such as BatchNorm's counters stay).
    """
    if fault is None:
        return reply
    if fault.behaviour == "lie-num-examples":
        claimed = min(reply.num_examples * fault.factor, float(2**62))  # a finite int however large
        return replace(reply, num_examples=int(round(claimed)))
    out: dict[str, Tensor] = {}
    for key, trained in reply.weights.items():
        if not trained.is_floating_point():
            out[key] = trained
            continue
        base = start[key].to(trained.device, trained.dtype) if key in start else torch.zeros_like(trained)
        out[key] = _faulty_tensor(fault, trained, base)
    return replace(reply, weights=out)


def _faulty_tensor(fault: Fault, trained: Tensor, base: Tensor) -> Tensor:
    behaviour = fault.behaviour
    if behaviour == "noise":  # a random model: i.i.d. N(0, noise_std²) weights
        noise = torch.randn(trained.shape, generator=fault.generator, dtype=torch.float32)
        return (noise * fault.noise_std).to(trained.device, trained.dtype)
    if behaviour == "scale":
        return base + fault.factor * (trained - base)
    if behaviour == "sign-flip":
        return base - (trained - base)
    if behaviour == "stale":
        return base.clone()
    if behaviour == "nan":
        return torch.full_like(trained, float("nan"))
    raise ValueError(f"unknown fault {behaviour!r}")
