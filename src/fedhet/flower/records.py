"""fedhet messages as Flower records, and back, exactly (tensors travel as NumPy arrays, dtype and bits kept).

This is the public protocol between a fedhet server and a ClientApp (docs/flower.md, "Your own ClientApp").
An :class:`~fedhet.engine.protocol.Instruction` becomes a ``RecordDict`` with ``weights``, ``payload`` and
``mask`` ArrayRecords and a ``config`` ConfigRecord (``delta`` rides in the config); a
:class:`~fedhet.engine.protocol.Reply` becomes ``weights`` and ``payload`` ArrayRecords, a ``metrics``
MetricRecord and ``num_examples`` in a ``reply`` ConfigRecord. A train reply needs ``weights`` and
``reply.num_examples``; ``metrics`` and ``payload`` may be left out. The round-0 description adds a
``fedhet.node`` ConfigRecord (:func:`description_to_content`). A client's
:class:`~fedhet.engine.protocol.ClientState` lives in Flower's ``context.state`` under ``fedhet.state.*``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedhet.engine.protocol import ClientState, Instruction, Reply
from fedhet.errors import ProtocolError

__all__ = [
    "NODE_RECORD",
    "RUN_RECORD",
    "content_to_instruction",
    "content_to_reply",
    "description_to_content",
    "instruction_to_content",
    "reply_to_content",
]

#: RecordDict keys of the run description the server sends (round 0), and of the node's answer.
RUN_RECORD = "fedhet.run"
NODE_RECORD = "fedhet.node"
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


def content_to_reply(content: RecordDict, *, description: bool = False) -> Reply:
    """The Reply a Message carries; ProtocolError naming the record and the key when a required field is
    missing or malformed. A train reply needs ``weights`` (an ArrayRecord) and ``reply.num_examples`` (an
    integer); a ``description`` (the round-0 answer) needs only ``reply.num_examples``. ``metrics`` (numbers)
    and ``payload`` (an ArrayRecord) are optional."""
    if "reply" not in content:
        raise ProtocolError("the reply holds no 'reply' record (a ConfigRecord with num_examples)")
    record = content["reply"]
    if not isinstance(record, ConfigRecord) or NUM_EXAMPLES_KEY not in record:
        raise ProtocolError(f"the reply's 'reply' record holds no {NUM_EXAMPLES_KEY!r}")
    num_examples = record[NUM_EXAMPLES_KEY]
    if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 0:
        raise ProtocolError(
            f"the reply's {NUM_EXAMPLES_KEY}={num_examples!r} must be an integer >= 0 (samples trained on)"
        )
    if "weights" not in content and not description:
        raise ProtocolError("the reply holds no 'weights' record (an ArrayRecord of the model's state dict)")
    metrics: dict[str, float] = {}
    if "metrics" in content:
        for key, value in content["metrics"].items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ProtocolError(f"the reply's metric {key!r} is {value!r}; metrics must be numbers")
            metrics[key] = float(value)
    return Reply(
        weights=_tensors(content, "weights"),
        num_examples=num_examples,
        metrics=metrics,
        payload=_tensors(content, "payload"),
    )


def _tensors(content: RecordDict, name: str) -> dict[str, torch.Tensor]:
    """The tensors of record ``name`` (none when it is absent); ProtocolError when it holds no arrays."""
    if name not in content:
        return {}
    record = content[name]
    if not isinstance(record, ArrayRecord):
        raise ProtocolError(
            f"the reply's {name!r} record is a {type(record).__name__}; it must be an ArrayRecord"
        )
    try:
        return record_to_tensors(record)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"the reply's {name!r} record holds an array NumPy cannot read: {exc}") from exc


def description_to_content(
    client_id: int,
    num_examples: int,
    class_counts: Sequence[int] | torch.Tensor,
    input_shape: Sequence[int],
    classes: Sequence[str] = (),
) -> RecordDict:
    """A node's answer to the round-0 describe query: who it is (its client id), its sample and per-class
    counts (self-reported) and the shape of its inputs; ``classes`` (its class names), when given, are
    checked against the run's."""
    counts = torch.as_tensor(class_counts, dtype=torch.int64)
    content = reply_to_content(
        Reply(weights={}, num_examples=int(num_examples), payload={"class_counts": counts})
    )
    content[NODE_RECORD] = ConfigRecord(
        {
            "client-id": int(client_id),
            "classes": [str(c) for c in classes],
            "input_shape": [int(s) for s in input_shape],
        }
    )
    return content


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
