"""What a run directory records besides its checkpoints: the metrics and timings lines, the summary (final,
best and last-rounds metrics, contributions, provenance), the partition and the method's records (their file
names: ``fedhet.engine.rundir``). The round loop writes them; report/ reads them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from fedhet import metrics as M
from fedhet.config import ExperimentConfig
from fedhet.engine.names import RunNames
from fedhet.engine.rundir import PARTITION_FILE, read_json_lines, write_atomic

SCALAR_KEYS = (
    "accuracy",
    "balanced_accuracy",
    "loss",
    "rare_class_recall",
    "fairness_pearson",
    "fairness_spearman",
    "bcf_rate",
    "bcf_rate_code",
    "ipr",
    "contribution_fairness_pearson",
    "best_reward_accuracy",
)

#: ``summary["last"]``: the mean over the evaluations of the last LAST_ROUNDS rounds (baselines.md §3.1 asks
#: for final, best and the mean of the last 10 rounds; it also steadies curves that swing between rounds).
LAST_ROUNDS = 10
#: ``summary["last_100"]``: the mean over the last LAST_EVALUATIONS evaluations. A metric that swings between
#: evaluations (FedRAC's fairness over 2,000 rounds) has a best value that is the maximum of a noisy series;
#: the mean of the last 100 is the level a run stays at, and carries the FedRAC pages' verdicts.
LAST_EVALUATIONS = 100


def jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON values: numpy and torch values become numbers and lists, dict keys strings,
    and non-finite floats ``None`` (so that every line of ``metrics.jsonl`` is strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Tensor):
        return jsonable(obj.tolist())
    return obj


def read_rounds(path: Path, last_round: int) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` up to ``last_round``, rewritten to the file; lines that do not parse (a
    write torn by a kill) are dropped with a warning."""
    if not path.is_file():
        return []
    kept = [
        record
        for record in read_json_lines(path, drop_torn=True)
        if isinstance(record, dict) and int(record.get("round", last_round + 1)) <= last_round
    ]
    write_atomic(path, "".join(json.dumps(h) + "\n" for h in kept))
    return kept


def lost_clients(line: Mapping[str, Any]) -> list[int]:
    """The clients a round's metrics line names as rejected or failed: their updates were not aggregated."""
    return [int(c) for key in ("rejected", "failed") for c in line.get(key, {})]


def zero_rejected(contributions: Sequence[float], rejected: Iterable[int]) -> list[float]:
    """The contributions a round reports: 0 for a client whose update was rejected in that round, or that
    failed (not the weight it held before, e.g. CELM's 1/N); on the simplex the others sum to 1 again."""
    c = np.asarray(contributions, dtype=np.float64).copy()
    total = float(c.sum())
    c[list(rejected)] = 0.0
    kept = float(c.sum())
    if abs(total - 1.0) < 1e-6 and kept > 0:
        c /= kept
    return [float(v) for v in c]


def last_aggregated_line(history: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The metrics line of the run's last aggregated round (a reply used, not rolled back); with none, the
    last trained round's line; ``{}`` for a run with no trained round."""
    rounds = [h for h in history if "clients" in h]  # the lines of trained rounds (not a diverged stop's)
    used = [h for h in rounds if h["clients"] and "rolled_back" not in h]
    return (used or rounds or [{}])[-1]


def run_contributions(
    estimate: np.ndarray | None, history: Sequence[Mapping[str, Any]]
) -> list[float] | None:
    """The run's one contribution vector (``summary["contributions"]``, read by the API, ``--json``, the
    CSVs, figures, reports and the audit): the weights of the run's last aggregated round (a reply used,
    not rolled back) as its metrics line reports them: 0 for a client rejected or failed in that round
    (:func:`zero_rejected`), the method's weight for the others, clients not sampled or dropped in it
    included. ``estimate`` (``strategy.contributions()`` at the end) stands in where the lines carry no
    contributions (FedRAC's ρ), with that round's rejected and failed clients zeroed; with no aggregated
    round at all, the last round's line is used. None when the method estimates none."""
    line = last_aggregated_line(history)
    if line.get("contributions") is not None:
        # a resumed run reads its lines back from JSON, where a non-finite value is null
        return [math.nan if c is None else float(c) for c in line["contributions"]]
    if estimate is None:
        return None
    return zero_rejected(estimate, lost_clients(line))


def zero_lost_clients(line: dict[str, Any]) -> None:
    """Give the clients a round's metrics ``line`` names as rejected or failed 0 in its ``contributions``
    (:func:`zero_rejected`): they were not aggregated in that round."""
    lost = lost_clients(line)
    if "contributions" in line and lost:
        line["contributions"] = zero_rejected(line["contributions"], lost)


def free_rider_view(contributions: np.ndarray | None, free_rider: int | None) -> dict[str, float]:
    """For a split with a known free rider and a method with non-negative contribution weights: whether the
    free rider has the strictly lowest weight (1.0 / 0.0; its mean over seeds is the identification rate)
    and its weight × N (1 = a uniform share); empty otherwise (CELM's free-rider claim, methods.md §1.2)."""
    if contributions is None or free_rider is None:
        return {}
    w = np.asarray(contributions, dtype=np.float64)
    if w.size < 2 or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        return {}
    report = M.free_rider_report(w, int(free_rider))
    return {
        "free_rider_lowest": float(report["lowest"]),
        "free_rider_weight_ratio": report["ratio_to_uniform"],
    }


def mean_scalars(views: list[dict[str, Any]]) -> dict[str, float]:
    """Per key, the mean of the finite float values among ``views`` (keys with none are left out)."""
    out: dict[str, float] = {}
    for k in {k for v in views for k in v}:
        vals = [v[k] for v in views if isinstance(v.get(k), float) and math.isfinite(v[k])]
        if vals:
            out[k] = float(np.mean(vals))
    return dict(sorted(out.items()))


def _metric_view(line: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: line[k] for k in SCALAR_KEYS if k in line}
    if "per_class_recall" in line:
        out["per_class_recall"] = line["per_class_recall"]
    return out


def run_summary(
    cfg: ExperimentConfig,
    history: Sequence[Mapping[str, Any]],
    *,
    run_dir: Path | None,
    federation: Any,
    contributions: np.ndarray | None,
    standalone: np.ndarray | None,
    wall: float,
    commit: str,
    code_commits: list[dict[str, Any]],
    descriptions: Mapping[int, Any] | None = None,
) -> dict[str, Any]:
    """The summary of a run whose metrics lines are ``history``: the final and best evaluation, the
    mean of the last rounds', the contributions (:func:`run_contributions` of ``contributions``, the
    method's estimate at the end) and the final rewards, the partition (``federation``: sizes and info),
    the standalone accuracies fairness was measured against, the class counts each client described in
    round 0 (``descriptions``, the accepted replies: what the server knew, which the audit reads), and the
    code it ran (``commit``: that of its last rounds; ``code_commits``: every stretch of rounds with its
    own), and what the outputs call its clients and classes (``federation.names``, last)."""
    contributions = run_contributions(contributions, history)
    evals = [h for h in history if "accuracy" in h or "rewards" in h]
    final = _metric_view(evals[-1]) if evals else {}
    best: dict[str, Any] = {}
    for h in evals:
        for k, v in _metric_view(h).items():
            if isinstance(v, float) and math.isfinite(v):
                if k not in best or (v < best[k] if k == "loss" else v > best[k]):
                    best[k] = v
    recent = [h for h in evals if h["round"] > cfg.train.rounds - LAST_ROUNDS]
    last = evals[-1] if evals else {}
    final.update(free_rider_view(contributions, federation.info.get("free_rider")))
    return {
        "method": cfg.method.name,
        "run_dir": str(run_dir) if run_dir else None,
        "rounds": cfg.train.rounds,
        "seed": cfg.seed,
        "final": final,
        "best": best,
        "last": mean_scalars([_metric_view(h) for h in recent]),
        "last_100": mean_scalars([_metric_view(h) for h in evals[-LAST_EVALUATIONS:]]),
        "contributions": contributions,
        "rewards": last.get("rewards"),
        "standalone": [float(s) for s in standalone] if standalone is not None else None,
        "client_sizes": federation.sizes,
        "described_class_counts": {
            str(cid): [int(v) for v in reply.payload["class_counts"].tolist()]
            for cid, reply in sorted((descriptions or {}).items())
            if "class_counts" in reply.payload
        },
        "partition_info": jsonable(federation.info),
        "wall_time_s": wall,
        # where the numbers came from (result pages cite it): the commit the last rounds ran at, and every
        # stretch of rounds with its own
        "fedhet_commit": commit,
        "fedhet_commits": code_commits,
        # what the outputs call the clients and classes (fedhet.engine.names)
        **getattr(federation, "names", RunNames()).to_summary(),
    }


def write_partition(run_dir: Path, federation: Any) -> None:
    """The partition file: each client's sample and class counts, the class names and the split's info."""
    info = {
        "sizes": federation.sizes,
        "counts": federation.class_counts.tolist(),
        "classes": list(federation.dataset.classes),
        "info": jsonable(federation.info),
    }
    (run_dir / PARTITION_FILE).write_text(json.dumps(info))
