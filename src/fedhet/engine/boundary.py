"""Validation of what crosses the message boundary: client replies, client descriptions, and whether a
transport can carry a method's configuration at all.

The server trusts nothing a client sends. A reply or description that breaks the protocol raises
:class:`~fedhet.errors.ClientUpdateError` naming the client, the field and what was wrong; the round loop
logs it, records it in ``metrics.jsonl`` and goes on without that client.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from fedhet.engine.protocol import Reply, Strategy
from fedhet.errors import ClientUpdateError, ConfigError


def check_reply(cid: int, reply: Reply, reference: Mapping[str, Tensor]) -> None:
    """A training reply: every key of the model, matching shapes, finite values, num_examples >= 0."""
    if not isinstance(reply, Reply):
        raise ClientUpdateError(f"client {cid} returned {type(reply).__name__}, expected a Reply")
    _check_count(cid, reply.num_examples)
    unknown = set(reply.weights) - set(reference)
    if unknown:
        raise ClientUpdateError(
            f"client {cid} sent unknown parameters {sorted(unknown)[:5]}; the model has {len(reference)} keys"
        )
    missing = set(reference) - set(reply.weights)
    if missing:
        raise ClientUpdateError(f"client {cid} omitted parameters {sorted(missing)[:5]}")
    for key, value in reply.weights.items():
        ref = reference[key]
        if not isinstance(value, Tensor):
            raise ClientUpdateError(f"client {cid} sent {key} as {type(value).__name__}, expected a tensor")
        if value.shape != ref.shape:
            raise ClientUpdateError(
                f"client {cid} sent {key} with shape {tuple(value.shape)}, expected {tuple(ref.shape)}"
            )
        if value.is_floating_point() and not _all_finite(value):
            raise ClientUpdateError(f"client {cid} sent non-finite values (NaN/inf) in {key}")


def check_description(cid: int, reply: Reply, num_classes: int) -> None:
    """A round-0 description: num_examples >= 0 and ``class_counts`` a non-negative (K,) count vector."""
    if not isinstance(reply, Reply):
        raise ClientUpdateError(f"client {cid} described itself with a {type(reply).__name__}, not a Reply")
    _check_count(cid, reply.num_examples)
    counts = reply.payload.get("class_counts")
    if not isinstance(counts, Tensor) or tuple(counts.shape) != (num_classes,):
        shape = tuple(counts.shape) if isinstance(counts, Tensor) else type(counts).__name__
        raise ClientUpdateError(
            f"client {cid} described its class counts as {shape}; expected a tensor of shape ({num_classes},)"
        )
    if counts.is_floating_point() and not bool(torch.isfinite(counts).all()):
        raise ClientUpdateError(f"client {cid} described non-finite class counts")
    if bool((counts < 0).any()):
        raise ClientUpdateError(f"client {cid} described negative class counts {counts.tolist()}")


def _all_finite(value: Tensor) -> bool:
    """Whether every entry is finite. A finite sum proves it (an inf or NaN entry makes the sum inf or NaN),
    at the cost of one reduction; only a sum that overflowed (or a non-finite entry) takes the elementwise
    test, which costs five passes (isfinite is x == x and |x| != inf) and was most of the reply check."""
    return bool(torch.isfinite(value.sum())) or bool(torch.isfinite(value).all())


def _check_count(cid: int, num_examples: object) -> None:
    if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 0:
        raise ClientUpdateError(
            f"client {cid} reported num_examples={num_examples!r}; it must be an integer >= 0"
        )


def check_transport(strategy: Strategy, transport: str) -> None:
    """Refuse, with a ConfigError naming each feature, a configuration that needs memory shared between
    clients (``Strategy.simulation_only``) on any transport but the embedded simulation."""
    features = strategy.simulation_only()
    if transport != "simulation" and features:
        raise ConfigError(
            f"method {strategy.name!r} on {transport} cannot honour {', '.join(features)}: only the embedded "
            "simulation shares memory between clients. Turn the option off or run the simulation"
        )
