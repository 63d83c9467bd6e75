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
- ``geometric-median``: argmin_v Σ p_i ‖v − x_i‖ by the smoothed Weiszfeld algorithm of RFA (Pillutla,
  Kakade and Harchaoui, IEEE TSP 2022, Algorithm 3), weighted by p, from the weighted mean.

Before the rule, ``aggregation.pre`` may list pre-aggregation steps, run in the order listed on the rows
and weights p, which the rule then reads (f is ``num_malicious_nodes``):

- ``nnm``, nearest-neighbour mixing (Allouah et al., "Fixing by Mixing", AISTATS 2023, Algorithm 1): each
  x_i becomes the plain mean of its n − f nearest rows in Euclidean distance, itself included (ties broken by
  the lower row index); each mixed row keeps its p_i.
- ``bucketing`` (Karimireddy, He and Jaggi, ICLR 2022, Algorithm 1): the rows in a random order, cut into
  buckets of s consecutive rows (the last one smaller when s does not divide n), each bucket replaced by its
  mean weighted by p, with weight Σ p of its rows; with equal weights, each bucket's plain mean. The order is
  drawn from the run's seed and round, so a run is reproducible. ``bucketing`` then ``mean`` is the mean.
- ``arc``, adaptive robust clipping (Allouah et al., NeurIPS 2024, Algorithm 1): the k = ⌊2 (f/n)(n − f)⌋
  updates x_i − c of largest norm are scaled down to the norm of the largest of the others, c the center
  (the model the clients started from, as in centered clipping: clipping is about updates, and a model's
  own norm says nothing); weights are unchanged.

Every step also says which original rows each new row draws on, so that the rows a rule keeps map back to
the clients whose models entered them.

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

from fedhet.config_sections import PRE_AGGREGATION_STEPS as PRE_STEPS
from fedhet.config_sections import PRE_STEPS_READING_F as STEPS_NEEDING_F

log = logging.getLogger(__name__)

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1

RULES = ("mean", "median", "trimmed-mean", "krum", "multi-krum", "centered-clipping", "geometric-median")
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
WEIGHTED_RULES = ("mean", "krum", "multi-krum", "centered-clipping", "geometric-median")


# -- pre-aggregation steps (aggregation.pre) ---------------------------------------------------------------
#: Stream id of the bucketing order, apart from the engine's seed purposes (fedhet.engine.seeds.PURPOSE).
BUCKETING_STREAM = 0xB0C


def bucketing_generator(seed: int, rnd: int) -> np.random.Generator:
    """The generator of round ``rnd``'s bucketing order: a function of (seed, stream, round) only."""
    return np.random.default_rng([seed, BUCKETING_STREAM, rnd])


def nearest_neighbour_mixing(x: Tensor, f: int) -> tuple[Tensor, list[list[int]]]:
    """Each row replaced by the mean of its n − f nearest rows (itself included), and those rows' indices."""
    n = x.shape[0]
    k = n - f
    if k < 1:
        raise ValueError(f"nnm: f={f} leaves no neighbour of {n} rows (need f < n)")
    distances = torch.cdist(x.double(), x.double())
    distances.fill_diagonal_(0.0)  # a row is its own nearest neighbour, even where rounding says otherwise
    nearest = torch.sort(distances, dim=1, stable=True).indices[:, :k]
    return x[nearest].mean(dim=1), [sorted(row) for row in nearest.tolist()]


def bucket_means(
    x: Tensor, p: Tensor, bucket_size: int, order: Sequence[int]
) -> tuple[Tensor, Tensor, list[list[int]]]:
    """The rows taken in ``order``, cut into buckets of ``bucket_size`` (the last may be smaller): each
    bucket's p-weighted mean (the plain mean where its weights sum to 0), its weight Σ p, and its rows."""
    if bucket_size < 1:
        raise ValueError(f"bucketing: bucket_size={bucket_size} must be >= 1")
    order = [int(i) for i in order]
    if sorted(order) != list(range(x.shape[0])):
        raise ValueError(f"bucketing: order {order} is not a permutation of the {x.shape[0]} rows")
    rows, weights, members = [], [], []
    for start in range(0, len(order), bucket_size):
        bucket = order[start : start + bucket_size]
        w = p[bucket]
        total = w.sum()
        rows.append((w[:, None] * x[bucket]).sum(0) / total if total > 0 else x[bucket].mean(0))
        weights.append(total)
        members.append(sorted(bucket))
    return torch.stack(rows), torch.stack(weights), members


def arc_clipped_count(n: int, f: int) -> int:
    """k = ⌊2 (f/n)(n − f)⌋, the number of rows ARC clips, in exact integer arithmetic."""
    return max(0, (2 * f * (n - f)) // n)


def adaptive_robust_clipping(x: Tensor, f: int) -> Tensor:
    """The k = ⌊2 (f/n)(n − f)⌋ largest-norm rows scaled to the norm of the largest remaining row."""
    n = x.shape[0]
    k = arc_clipped_count(n, f)
    if k == 0:
        return x.clone()
    norms = x.double().norm(dim=1)
    order = torch.sort(norms, stable=True).indices  # ascending; ties: the later row counts as larger
    threshold = norms[order[n - k - 1]]
    scale = torch.ones(n, dtype=torch.float64)
    largest = order[n - k :]
    scale[largest] = torch.where(
        norms[largest] > threshold, threshold / norms[largest].clamp_min(1e-300), torch.ones(k).double()
    )
    return x * scale.to(x.dtype)[:, None]


def apply_pre_steps(
    x: Tensor,
    p: Tensor,
    steps: Sequence[str],
    *,
    num_malicious_nodes: int = 0,
    bucket_size: int = 2,
    rng: np.random.Generator | None = None,
    center: Tensor | None = None,
) -> tuple[Tensor, Tensor, list[list[int]]]:
    """``steps`` in order on the rows ``x`` with weights ``p``: the new rows, their weights and, per new
    row, the original rows it draws on. ``rng`` draws the bucketing order; ARC clips the rows' differences
    from ``center`` (the model the clients started from; None: the rows are updates already)."""
    members = [[i] for i in range(x.shape[0])]
    for step in steps:
        n = x.shape[0]
        f = num_malicious_nodes
        if step in STEPS_NEEDING_F:
            if f < 1:
                raise ValueError(
                    f"aggregation.pre step {step!r} needs f = num_malicious_nodes >= 1 (it is {f}): set "
                    "aggregation.num_malicious_nodes to the number of hostile clients assumed"
                )
            if 2 * f >= n:  # fewer rows than planned this round (dropped or rejected replies)
                f = (n - 1) // 2
                log.warning(
                    "aggregation.pre step %r: f=%d is not below half of the %d rows of this round; using "
                    "f=%d%s", step, num_malicious_nodes, n, f, " (the step is skipped)" if f < 1 else "",
                )  # fmt: skip
                if f < 1:
                    continue
        if step == "nnm":
            x, sources = nearest_neighbour_mixing(x, f)
        elif step == "bucketing":
            if rng is None:
                raise ValueError("bucketing needs a generator for its order (rng)")
            x, p, sources = bucket_means(x, p, bucket_size, rng.permutation(n).tolist())
        elif step == "arc":
            if center is None:
                x = adaptive_robust_clipping(x, f)
            else:
                x = center + adaptive_robust_clipping(x - center, f)
            sources = [[i] for i in range(n)]
        else:
            raise ValueError(f"unknown pre-aggregation step {step!r}; accepted: {', '.join(PRE_STEPS)}")
        members = [sorted({m for j in row for m in members[j]}) for row in sources]
    return x, p, members


# -- rules -------------------------------------------------------------------------------------------------
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


def geometric_median(
    x: Tensor,
    p: Tensor,
    nu: float = 1e-6,
    iterations: int = 100,
    tolerance: float = 1e-6,
    start: Tensor | None = None,
) -> Tensor:
    """Smoothed Weiszfeld (RFA, Pillutla et al. 2022, Algorithm 3): v ← Σ β_i x_i / Σ β_i with
    β_i = p_i / max(ν, ‖v − x_i‖), from ``start`` (default: the p-weighted mean), at most ``iterations``
    times; it stops once a step moves v by no more than ``tolerance`` × the p-weighted mean distance
    Σ p_i ‖v − x_i‖ / Σ p_i of the rows from v (their spread: a scale-free bound; 0: never stops early)."""
    xd, pd = x.double(), p.double()
    v = weighted_mean(xd, pd) if start is None else start.double().clone()
    for _ in range(iterations):
        distances = (xd - v).norm(dim=1)
        moved = weighted_mean(xd, pd / distances.clamp_min(nu))
        step, spread = float((moved - v).norm()), float((pd * distances).sum() / pd.sum())
        v = moved
        if step <= tolerance * spread:
            break
    return v.to(x.dtype)


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
    pre: Sequence[str] = (),
    bucket_size: int = 2,
    gm_nu: float = 1e-6,
    gm_iterations: int = 100,
    gm_tolerance: float = 1e-6,
    rng: np.random.Generator | None = None,
) -> tuple[Tensor, list[int]]:
    """The pre-aggregation steps ``pre`` (in order), then one rule, on the rows of ``x`` with the method's
    weights ``p``: the result and the rows of ``x`` it used. ``rng`` draws bucketing's order."""
    weights = torch.as_tensor(p, dtype=x.dtype, device=x.device)
    if pre:
        x, weights, members = apply_pre_steps(
            x, weights, pre, num_malicious_nodes=num_malicious_nodes, bucket_size=bucket_size, rng=rng,
            center=center,
        )  # fmt: skip
        out, kept = aggregate_vectors(
            x, weights, rule, center=center, beta=beta, num_malicious_nodes=num_malicious_nodes,
            num_nodes_to_select=num_nodes_to_select, clipping_tau=clipping_tau,
            clipping_iterations=clipping_iterations, gm_nu=gm_nu, gm_iterations=gm_iterations,
            gm_tolerance=gm_tolerance,
        )  # fmt: skip
        return out, sorted({m for row in kept for m in members[row]})
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
    if rule == "geometric-median":
        return geometric_median(x, weights, gm_nu, gm_iterations, gm_tolerance), everyone
    raise ValueError(f"unknown aggregation rule {rule!r}; accepted: {', '.join(RULES)}")


def robust_average(
    states: Sequence[Mapping[str, Tensor]],
    p: Sequence[float] | np.ndarray,
    settings: Mapping[str, Any],
    center: Mapping[str, Tensor] | None = None,
    rng: np.random.Generator | None = None,
) -> tuple[dict[str, Tensor], list[int]]:
    """The rule ``settings["rule"]`` (with its parameters and pre-aggregation steps, ``[aggregation]``) over
    client models ``states`` with the method's weights ``p``: the aggregated state dict and the positions of
    the models it used. ``center`` (the previous global model) is the start of centered clipping and what
    ARC clips the models' differences from; ``rng`` draws bucketing's order. Integer buffers (BatchNorm's
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
        rng=rng,
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
    if settings.get("pre"):
        raise ValueError(
            f"Flower's strategies have no pre-aggregation step (aggregation.pre = {list(settings['pre'])}); "
            "use implementation = 'fedhet' for them"
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
