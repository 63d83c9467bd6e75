"""Validation of what crosses the message boundary: client replies, client descriptions, whether a
transport can carry a method's configuration at all, and whether the run holds the inputs a method declares.

The server trusts nothing a client sends. A reply or description that breaks the protocol raises
:class:`~fedhet.errors.ClientUpdateError` naming the client, the field and what was wrong; the round loop
logs it, records it in ``metrics.jsonl`` and goes on without that client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from fedhet.engine.protocol import Reply, Strategy
from fedhet.errors import ClientUpdateError, ConfigError

if TYPE_CHECKING:
    from fedhet.config import ExperimentConfig


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


def accept_replies(
    received: Mapping[int, Reply], reference: Mapping[str, Tensor]
) -> tuple[dict[int, Reply], dict[int, str]]:
    """The replies of a round that pass :func:`check_reply`, and client → reason for the others, both in
    client-id order (the results do not depend on the order in which replies arrived)."""
    replies: dict[int, Reply] = {}
    rejected: dict[int, str] = {}
    for cid in sorted(received):
        try:
            check_reply(cid, received[cid], reference)
        except ClientUpdateError as exc:
            rejected[cid] = str(exc)
            continue
        replies[cid] = received[cid]
    return replies, rejected


def accept_descriptions(
    received: Mapping[int, Reply], num_classes: int, max_num_examples: int | None
) -> tuple[dict[int, Reply], dict[int, str]]:
    """The round-0 descriptions that pass :func:`check_description` and claim at most ``max_num_examples``
    (``guards.max_num_examples``; None: no bound), and client → reason for the others, in client-id order."""
    accepted: dict[int, Reply] = {}
    rejected: dict[int, str] = {}
    for cid in sorted(received):
        try:
            check_description(cid, received[cid], num_classes)
            if max_num_examples is not None and received[cid].num_examples > max_num_examples:
                raise ClientUpdateError(
                    f"client {cid} described num_examples={received[cid].num_examples}, above "
                    f"guards.max_num_examples={max_num_examples}"
                )
        except ClientUpdateError as exc:
            rejected[cid] = str(exc)
            continue
        accepted[cid] = received[cid]
    return accepted, rejected


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


def check_inputs(
    strategy: Strategy,
    cfg: ExperimentConfig,
    validation: Any,
    reference: np.ndarray | None,
) -> None:
    """The inputs a method declares (:meth:`Strategy.requirements`) are present: a server validation split
    (``validation``), reference contributions (the clients' standalone accuracies, one finite value per
    client); and the standalone accuracies when ``eval.fairness = true`` asks for them."""
    name = strategy.name
    needs = strategy.requirements()
    rule = cfg.aggregation.rule
    if rule != "mean" and not strategy.supports_aggregation_rules:
        raise ConfigError(
            f"aggregation.rule = {rule!r} replaces an average of client models, which method {name!r} does "
            "not compute (it averages masked submodels unit by unit, or nothing); use aggregation.rule = "
            "'mean' with it"
        )
    if "validation" in needs and validation is None:
        raise ConfigError(
            f"method {name!r} needs a server validation set and the run holds none; set "
            "data.validation_fraction (e.g. --set data.validation_fraction=0.1)"
        )
    if "reference_contributions" in needs and reference is None:
        raise ConfigError(
            f"method {name!r} needs reference contributions (the clients' standalone accuracies); run it "
            "through fedhet.experiment.run_experiment (fedhet run/compare), which computes them"
        )
    if reference is not None and (
        reference.shape != (cfg.data.clients,) or not np.all(np.isfinite(reference))
    ):
        raise ConfigError(
            f"reference contributions {reference.tolist()} must hold one finite value per client "
            f"({cfg.data.clients}); a standalone pre-pass in which some client never trained (never "
            "sampled, or every update rejected, e.g. non-finite with a too large train.lr) gives none: "
            "raise train.rounds or train.clients_per_round, or lower train.lr"
        )
    if cfg.eval.fairness is True and reference is None and not strategy.rewards_are_reference:
        raise ConfigError(
            "eval.fairness=true needs the standalone accuracies; run through fedhet.experiment."
            "run_experiment (fedhet run/compare), which computes them, or pass reference_contributions"
        )
