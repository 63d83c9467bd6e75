"""fedhet messages as Flower records, and back, exactly (tensors travel as NumPy arrays, dtype and bits kept).

An :class:`~fedhet.engine.protocol.Instruction` becomes a ``RecordDict`` with ``weights``, ``payload`` and
``mask`` ArrayRecords and a ``config`` ConfigRecord (``delta`` rides in the config); a
:class:`~fedhet.engine.protocol.Reply` becomes ``weights`` and ``payload`` ArrayRecords, a ``metrics``
MetricRecord and ``num_examples`` in a ``reply`` ConfigRecord. A client's
:class:`~fedhet.engine.protocol.ClientState` lives in Flower's ``context.state`` under ``fedhet.state.*``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedhet.engine.protocol import ClientState, Instruction, Reply
from fedhet.errors import ProtocolError

DELTA_KEY = "fedhet.delta"
MASK_KEY = "mask"
NUM_EXAMPLES_KEY = "num_examples"
STATE_WEIGHTS = "fedhet.state.weights"
STATE_VALUES = "fedhet.state.values"


def tensors_to_record(tensors: Mapping[str, torch.Tensor]) -> ArrayRecord:
    """An ArrayRecord holding each tensor as a NumPy array (on the CPU; dtype, shape and bits kept)."""
    return ArrayRecord({k: Array(v.detach().cpu().contiguous().numpy()) for k, v in tensors.items()})


def record_to_tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    """Tensors from an ArrayRecord (CPU tensors owning their memory)."""
    return {k: torch.from_numpy(v.numpy()) for k, v in record.items()}


def instruction_to_content(ins: Instruction) -> RecordDict:
    """An Instruction as the content of a Flower Message."""
    content = RecordDict()
    content["weights"] = tensors_to_record(ins.weights)
    content["payload"] = tensors_to_record(ins.payload)
    if ins.mask is not None:
        content["mask"] = tensors_to_record({MASK_KEY: ins.mask})
    content["config"] = ConfigRecord({**ins.config, DELTA_KEY: bool(ins.delta)})
    return content


def content_to_instruction(content: RecordDict) -> Instruction:
    """The Instruction a Message carries (ProtocolError when it is not one)."""
    for key in ("weights", "payload", "config"):
        if key not in content:
            raise ProtocolError(f"the message holds no {key!r} record; it was not sent by a fedhet server")
    config = dict(content["config"])
    delta = bool(config.pop(DELTA_KEY, False))
    mask = record_to_tensors(content["mask"])[MASK_KEY] if "mask" in content else None
    return Instruction(
        weights=record_to_tensors(content["weights"]),
        mask=mask,
        payload=record_to_tensors(content["payload"]),
        config=config,
        delta=delta,
    )


def reply_to_content(reply: Reply) -> RecordDict:
    """A Reply as the content of a Flower reply Message."""
    content = RecordDict()
    content["weights"] = tensors_to_record(reply.weights)
    content["payload"] = tensors_to_record(reply.payload)
    content["metrics"] = MetricRecord({k: float(v) for k, v in reply.metrics.items()})
    content["reply"] = ConfigRecord({NUM_EXAMPLES_KEY: int(reply.num_examples)})
    return content


def content_to_reply(content: RecordDict) -> Reply:
    """The Reply a Message carries (ProtocolError when it is not one)."""
    for key in ("weights", "payload", "metrics", "reply"):
        if key not in content:
            raise ProtocolError(f"the reply holds no {key!r} record; it was not sent by a fedhet client")
    return Reply(
        weights=record_to_tensors(content["weights"]),
        num_examples=int(content["reply"][NUM_EXAMPLES_KEY]),
        metrics={k: float(v) for k, v in content["metrics"].items()},
        payload=record_to_tensors(content["payload"]),
    )


def load_state(state: RecordDict) -> ClientState:
    """The fedhet ClientState kept in a Flower ``context.state``."""
    weights = record_to_tensors(state[STATE_WEIGHTS]) if STATE_WEIGHTS in state else None
    values = json.loads(str(state[STATE_VALUES]["json"])) if STATE_VALUES in state else {}
    return ClientState(weights=weights, values=values)


def store_state(client_state: ClientState, state: RecordDict) -> None:
    """Write a ClientState into a Flower ``context.state`` (replacing what was there)."""
    if client_state.weights is None:
        if STATE_WEIGHTS in state:
            del state[STATE_WEIGHTS]
    else:
        state[STATE_WEIGHTS] = tensors_to_record(client_state.weights)
    state[STATE_VALUES] = ConfigRecord({"json": json.dumps(client_state.values)})
