"""Robust aggregation rules: what replaces the weighted mean of the replies when some clients are hostile.

Each rule maps the replies' weights, flattened to rows of one matrix X (n × d), to one vector. Parameter
names follow Flower's strategies of the same rule (FedMedian, FedTrimmedAvg ``beta``, Krum / MultiKrum
``num_malicious_nodes`` and ``num_nodes_to_select``) so a federation moving to Flower keeps its settings.

- ``mean``: Σ p_i x_i / Σ p_i, the method's own weights (FedAvg's sample counts, CELM's contributions).
- ``median``: the coordinate-wise median (Yin et al., 2018); unweighted, as Flower's FedMedian.
- ``trimmed-mean``: per coordinate, the mean after dropping the ⌊β n⌋ smallest and largest values (Yin et
  al., 2018); unweighted, as Flower's FedTrimmedAvg.
- ``krum`` / ``multi-krum``: score_i = Σ of the squared distances from x_i to its n − f − 2 nearest others
  (at least 1); Krum keeps the lowest-scoring update, Multi-Krum the m lowest and averages them with the
  method's weights (Blanchard et al., 2017; El Mhamdi et al., 2018).
- ``centered-clipping``: v ← v + Σ p_i clip_τ(x_i − v) / Σ p_i, L times from v = the previous global model,
  clip_τ(z) = z · min(1, τ/‖z‖) (Karimireddy, He and Jaggi, 2021).

With ``implementation = "flower"`` the rule is computed by Flower's own strategy of the same name
(:data:`FLOWER_STRATEGIES`, :func:`flower_average`): the anchor that fedhet's rules are Flower's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1

RULES = ("mean", "median", "trimmed-mean", "krum", "multi-krum", "centered-clipping")
#: rule -> the Flower strategy (flwr.serverapp.strategy) that implements it (``implementation = "flower"``)
FLOWER_STRATEGIES = {
    "mean": "FedAvg",
    "median": "FedMedian",
    "trimmed-mean": "FedTrimmedAvg",
    "krum": "Krum",
    "multi-krum": "MultiKrum",
}
#: The [aggregation] keys that are not parameters of a rule.
_NOT_PARAMETERS = ("rule", "implementation")
#: Rules that use the method's aggregation weights (the others weigh every kept update alike).
WEIGHTED_RULES = ("mean", "krum", "multi-krum", "centered-clipping")


def weighted_mean(x: Tensor, p: Tensor) -> Tensor:
    """Σ p_i x_i / Σ p_i over the rows of ``x``."""
    return (p[:, None] * x).sum(0) / p.sum()


def coordinate_median(x: Tensor) -> Tensor:
    """Per coordinate, the middle value (the mean of the two middle ones for an even count, as numpy)."""
    ordered = x.sort(dim=0).values
    n = x.shape[0]
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def trimmed_mean(x: Tensor, beta: float) -> Tensor:
    """Per coordinate, the mean of the values left after cutting ⌊beta · n⌋ from each end."""
    n = x.shape[0]
    cut = int(beta * n)
    if not 0.0 <= beta < 0.5 or n - 2 * cut < 1:
        raise ValueError(f"trimmed-mean: beta={beta} leaves no value of {n} (need 0 <= beta < 0.5)")
    return x.sort(dim=0).values[cut : n - cut].mean(0)


def krum_scores(x: Tensor, num_malicious_nodes: int) -> Tensor:
    """score_i = Σ of the squared distances from row i to its max(1, n − f − 2) nearest other rows."""
    n = x.shape[0]
    distances = torch.cdist(x.double(), x.double()).pow(2)
    distances.fill_diagonal_(float("inf"))
    closest = max(1, n - num_malicious_nodes - 2)
    return distances.sort(dim=1).values[:, : min(closest, n - 1)].sum(1)


def multi_krum(
    x: Tensor, p: Tensor, num_malicious_nodes: int, num_nodes_to_select: int
) -> tuple[Tensor, Tensor]:
    """The mean (weights ``p``) of the ``num_nodes_to_select`` lowest Krum scores, and which rows it kept."""
    scores = krum_scores(x, num_malicious_nodes)
    kept = torch.argsort(scores, stable=True)[: max(1, min(num_nodes_to_select, x.shape[0]))]
    kept = kept.sort().values
    return weighted_mean(x[kept], p[kept]), kept


def centered_clipping(x: Tensor, p: Tensor, center: Tensor, tau: float, iterations: int = 1) -> Tensor:
    """v ← v + Σ p_i clip_τ(x_i − v) / Σ p_i, ``iterations`` times from ``center``."""
    v = center.clone()
    for _ in range(iterations):
        z = x - v
        norms = z.norm(dim=1).clamp_min(1e-12)
        v = v + weighted_mean(z * torch.clamp(tau / norms, max=1.0)[:, None], p)
    return v


def aggregate_vectors(
    x: Tensor,
    p: Sequence[float] | Tensor,
    rule: str,
    *,
    center: Tensor | None = None,
    beta: float = 0.2,
    num_malicious_nodes: int = 0,
    num_nodes_to_select: int = 1,
    clipping_tau: float = 1.0,
    clipping_iterations: int = 1,
) -> tuple[Tensor, list[int]]:
    """One rule on the rows of ``x`` with the method's weights ``p``; the result and the rows it used."""
    weights = torch.as_tensor(p, dtype=x.dtype, device=x.device)
    everyone = list(range(x.shape[0]))
    if rule == "mean":
        return weighted_mean(x, weights), everyone
    if rule == "median":
        return coordinate_median(x), everyone
    if rule == "trimmed-mean":
        return trimmed_mean(x, beta), everyone
    if rule in ("krum", "multi-krum"):
        m = 1 if rule == "krum" else num_nodes_to_select
        out, kept = multi_krum(x, weights, num_malicious_nodes, m)
        return out, kept.tolist()
    if rule == "centered-clipping":
        if center is None:
            raise ValueError("centered-clipping needs the center (the previous global model)")
        return centered_clipping(x, weights, center, clipping_tau, clipping_iterations), everyone
    raise ValueError(f"unknown aggregation rule {rule!r}; accepted: {', '.join(RULES)}")


def robust_average(
    states: Sequence[Mapping[str, Tensor]],
    p: Sequence[float] | np.ndarray,
    settings: Mapping[str, Any],
    center: Mapping[str, Tensor] | None = None,
) -> tuple[dict[str, Tensor], list[int]]:
    """The rule ``settings["rule"]`` (with its parameters, ``[aggregation]``) over client models ``states``
    with the method's weights ``p``: the aggregated state dict and the positions of the models it used.
    ``center`` (the previous global model) is the start of centered clipping. Integer buffers (BatchNorm's
    counters) are the first model's, as in the weighted mean."""
    if settings.get("implementation", "fedhet") == "flower":
        return flower_average(states, p, settings)
    keys = [k for k, v in states[0].items() if v.is_floating_point()]
    shapes = [states[0][k].shape for k in keys]
    flat = lambda sd: torch.cat([sd[k].reshape(-1) for k in keys])  # noqa: E731
    x = torch.stack([flat(sd) for sd in states])
    rule = settings.get("rule", "mean")
    vector, kept = aggregate_vectors(
        x,
        torch.as_tensor(np.asarray(p, dtype=np.float64), dtype=x.dtype),
        rule,
        center=None if center is None else flat(center).to(x.device, x.dtype),
        **{k: v for k, v in settings.items() if k not in _NOT_PARAMETERS},
    )
    out: dict[str, Tensor] = {}
    offset = 0
    for key, shape in zip(keys, shapes, strict=True):
        size = int(np.prod(shape)) if len(shape) else 1
        out[key] = vector[offset : offset + size].reshape(shape).clone()
        offset += size
    for key, value in states[0].items():
        if key not in out:
            out[key] = value.clone()
    return {k: out[k] for k in states[0]}, kept


class _FlowerReply:
    """A reply as Flower's strategies read it (``has_error()``, ``content``). Flower's ``Message`` can only be
    made inside a Flower run (it takes the run's identity); its strategies read nothing else of it."""

    def __init__(self, content: Any) -> None:
        self.content = content

    def has_error(self) -> bool:
        return False


def flower_strategy(settings: Mapping[str, Any]) -> Any:
    """Flower's strategy object for ``settings["rule"]``, with fedhet's parameters under Flower's names."""
    import flwr.serverapp.strategy as strategies

    rule = settings.get("rule", "mean")
    if rule not in FLOWER_STRATEGIES:
        raise ValueError(
            f"Flower has no strategy for the rule {rule!r}; it has {', '.join(FLOWER_STRATEGIES)}"
        )
    cls = getattr(strategies, FLOWER_STRATEGIES[rule])
    if rule == "trimmed-mean":
        return cls(beta=settings.get("beta", 0.2))
    if rule == "krum":
        return cls(num_malicious_nodes=settings.get("num_malicious_nodes", 0))
    if rule == "multi-krum":
        return cls(
            num_malicious_nodes=settings.get("num_malicious_nodes", 0),
            num_nodes_to_select=settings.get("num_nodes_to_select", 1),
        )
    return cls()


def flower_average(
    states: Sequence[Mapping[str, Tensor]], p: Sequence[float] | np.ndarray, settings: Mapping[str, Any]
) -> tuple[dict[str, Tensor], list[int]]:
    """:func:`robust_average` computed by Flower's own strategy (:func:`flower_strategy`): its
    ``aggregate_train`` on the client models as Flower records, each weighted by p_i as its ``num-examples``
    (Flower's weighting key). Which models Flower used is read back from Flower's own metric aggregation:
    each reply carries a one-hot metric ``fedhet-used-<i>``, whose weighted average is nonzero exactly for
    the replies it averaged (Krum's choice; a chosen model of weight 0 reads as unused). Integer buffers are
    the first model's, as in the weighted mean."""
    from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

    keys = [k for k, v in states[0].items() if v.is_floating_point()]
    n = len(states)
    replies = []
    for i, (sd, weight) in enumerate(zip(states, np.asarray(p, dtype=np.float64), strict=True)):
        arrays = ArrayRecord({k: Array(sd[k].detach().cpu().numpy()) for k in keys})
        metrics = MetricRecord(
            {"num-examples": float(weight), **{f"fedhet-used-{j}": float(j == i) for j in range(n)}}
        )
        replies.append(_FlowerReply(RecordDict({"arrays": arrays, "metrics": metrics})))
    quiet = logging.getLogger("flwr")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # Flower logs every aggregation at INFO ("Received n results")
    try:
        arrays, metrics = flower_strategy(settings).aggregate_train(1, replies)
    finally:
        quiet.setLevel(level)
    out = {
        k: torch.from_numpy(np.array(arrays[k].numpy())).to(states[0][k].device, states[0][k].dtype)
        for k in keys
    }
    for key, value in states[0].items():
        if key not in out:
            out[key] = value.clone()
    if settings.get("rule", "mean") in WEIGHTED_RULES:
        used = [j for j in range(n) if float(metrics[f"fedhet-used-{j}"]) != 0.0]
    else:  # FedMedian and FedTrimmedAvg take every reply, whatever its weight
        used = list(range(n))
    return {k: out[k] for k in states[0]}, used
