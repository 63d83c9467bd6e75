"""The one client-side entry: ``run_client``, used by the embedded simulation and by Flower's ClientApp.

A client holds its trainer, its state and its data; it follows the instruction it receives and returns a
reply and its new state. Nothing else passes between client and server.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import SimpleNamespace

from torch import Tensor

from fedhet.engine.faults import FAULT_MEMORY, Fault, apply_fault, fault_data, refuse_to_train
from fedhet.engine.protocol import (
    ACTION_KEY,
    DESCRIBE,
    ClientData,
    ClientState,
    Instruction,
    LocalUpdate,
    Reply,
    TrainContext,
    Trainer,
    Weights,
)
from fedhet.errors import ProtocolError


def describe_instruction() -> Instruction:
    """The round-0 request: each client describes itself (sample and class counts) and trains nothing."""
    return Instruction(weights={}, config={ACTION_KEY: DESCRIBE})


def start_weights(ins: Instruction, kept: Mapping[str, Tensor] | None, keys: Collection[str]) -> Weights:
    """The weights a local update starts from: what the client kept, overlaid with the instruction's
    weights (or, with ``delta``, incremented by them). Raises ProtocolError when keys of the model are
    covered by neither, or a delta arrives at a client without a model of its own."""
    if ins.delta:
        if kept is None or set(keys) - set(kept):
            raise ProtocolError(
                "the instruction sends an increment (delta=True) but this client keeps no model of its own "
                "to add it to; the server must send the full model first"
            )
        out = dict(kept)
        for k, v in ins.weights.items():
            out[k] = kept[k] + v.to(kept[k].device)
        return out
    if kept is None:
        merged = ins.weights
    elif len(ins.weights) == len(keys):
        merged = ins.weights  # the instruction replaces everything the client kept
    else:
        merged = {**kept, **ins.weights}
    missing = set(keys) - set(merged)
    if missing:
        raise ProtocolError(
            f"the instruction lacks {len(missing)} of the model's {len(keys)} parameters "
            f"(e.g. {sorted(missing)[:3]}) and the client keeps none of them; send the full model"
        )
    return merged


def run_client(
    trainer: Trainer,
    instruction: Instruction,
    state: ClientState,
    data: ClientData,
    context: TrainContext,
    fault: Fault | None = None,
) -> tuple[Reply, ClientState]:
    """Follow one instruction: describe the client, or train from the start weights. Returns the reply and
    the client's new state (``state`` itself is left unchanged). An injected ``fault`` (fedhet.engine.faults)
    alters what is sent, or (``label-flip``) the labels it trains on; the state the client keeps is its
    honest one, plus what a fault remembers (``values[FAULT_MEMORY]``: ``replay``'s update)."""
    if instruction.config.get(ACTION_KEY) == DESCRIBE:
        return apply_fault(fault, trainer.describe(data), {}), state
    refuse_to_train(fault)
    model = context.model
    start = start_weights(instruction, state.weights, model.state_dict().keys())
    update = LocalUpdate(
        model=model,
        data=fault_data(fault, data),
        instruction=instruction,
        state=ClientState(weights=state.weights, values=dict(state.values)),
        context=context,
        start=start,
        scratch=SimpleNamespace(),
    )
    reply = trainer.fit(update)
    # A fault alters what was learnt: the change from ``start``, or the update itself where that is the reply
    # (an empty start: a stale update is zero, a scaled one k·Δ, a flipped one −Δ).
    memory = dict(state.values.get(FAULT_MEMORY, {}))
    sent = apply_fault(fault, reply, {} if trainer.uploads_updates else start, memory)
    if not memory:
        return sent, update.state
    # Kept whatever the trainer made of its values, so that it survives rounds in which the fault is idle.
    return sent, ClientState(
        weights=update.state.weights, values={**update.state.values, FAULT_MEMORY: memory}
    )
