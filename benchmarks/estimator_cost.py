"""What each contribution estimator costs, as a multiple of one FedAvg run of the same federation.

The federations of docs/results/contribution-estimators.md: the shipped experiment ``contributions/digits-n6``
(digits, 6 clients, Dirichlet(1.0) per class, mlp200, 30 rounds, a tenth held out for the server) and the
diabetes table held by six sites by age band (``tabular-mlp``). On each, every estimator the page lists is
timed as the work a user runs to get it, all in this one process, interleaved (FedAvg, CELM, CGSV, ...,
FedAvg, CELM, ... : each repetition runs every entry once, so a change of load hits them all alike), after one
untimed warm-up pass; the cost is the median over the repetitions, divided by FedAvg's median:

- a method's run (CELM, CGSV, ShapFed, IAFL, CFFL: their weights; FedRAC, FedSAC: their reputation), with
  the standalone pre-pass those that need it take from the cache (the pre-pass is the next row);
- standalone accuracy: the standalone pre-pass (every client trained alone, the run's budget, no cache);
- GTG-Shapley and the reconstruction Shapley: a FedAvg run with ``eval.contribution_estimators`` naming one;
- exact Shapley (``fedhet shapley``'s coalitions: ``train_together`` for FedAvg), which also gives Banzhaf
  and leave-one-out at no extra cost;
- sample share costs nothing beyond the sample counts a server has (not timed).

Each run is ``fedhet.api.run`` without a run directory, one thread (the experiment's ``train.threads``). The
standalone cache is a temporary ``$FEDHET_CACHE``. The load average is printed at the start and the end.

    nice python benchmarks/estimator_cost.py [--repeats 5] [--federations digits diabetes] [--json]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from common import emit

#: estimator -> (what is timed, in words)
ENTRIES: dict[str, str] = {
    "fedavg": "FedAvg run (the unit)",
    "celm": "CELM run",
    "cgsv": "CGSV run",
    "shapfed": "ShapFed run",
    "iafl": "IAFL run",
    "cffl": "CFFL run",
    "fedrac": "FedRAC run (reputation)",
    "fedsac": "FedSAC run (reputation)",
    "gtg_shapley": "FedAvg run with gtg-shapley",
    "or_shapley": "FedAvg run with or-shapley (reconstruction Shapley)",
    "standalone": "standalone pre-pass (one run per client)",
    "exact_shapley": "every coalition (fedhet shapley; Banzhaf, leave-one-out too)",
}
METHODS = ("fedavg", "celm", "cgsv", "shapfed", "iafl", "cffl", "fedrac", "fedsac")
RECONSTRUCTED = {"gtg_shapley": "gtg-shapley", "or_shapley": "or-shapley"}
#: the page's federations timed here (overrides of contributions/digits-n6, from the study)
FEDERATIONS = {"digits": "dir-1.0", "diabetes": "diabetes-by-age"}


def cost_table(times: dict[str, list[float]], unit: str = "fedavg") -> list[dict[str, Any]]:
    """One row per entry: its median, minimum and maximum seconds over the repetitions and the ratio of its
    median to ``unit``'s median (``cost_x_fedavg``)."""
    if unit not in times or not times[unit]:
        raise ValueError(f"no timings of the unit {unit!r}: every ratio is a multiple of its median")
    base = statistics.median(times[unit])
    if base <= 0:
        raise ValueError(f"the unit {unit!r} took {base} s: no ratio can be taken to it")
    rows = []
    for name, seconds in times.items():
        if not seconds:
            raise ValueError(f"no timings of {name!r}")
        median = statistics.median(seconds)
        rows.append(
            {
                "estimator": name,
                "median_s": median,
                "min_s": min(seconds),
                "max_s": max(seconds),
                "cost_x_fedavg": median / base,
            }
        )
    return rows


def federation_config(name: str):
    """The study's config of one of its federations (the diabetes tables written first where missing)."""
    from fedhet.api import as_config
    from fedhet.studies import contribution_estimators as study

    if name in study.TABLES and not all(
        (study.TABLE_DIR / f).is_file() for f in (f"{name}.csv", "diabetes-test.csv")
    ):
        study.write_tables()
    return as_config(study.CONFIG, study.FEDERATIONS[name])


def jobs(cfg) -> dict[str, Callable[[], Any]]:
    """Entry -> the work that gives that estimator on ``cfg``'s federation."""
    from fedhet import api
    from fedhet.experiment import standalone_accuracies
    from fedhet.ground_truth.coalitions import together_refusal, train_one_at_a_time, train_together

    def method(name: str, **more: Any) -> Callable[[], Any]:
        overrides = {"method.name": name, **more}
        return lambda: api.run(cfg, overrides=overrides, notify=lambda _: None)

    exact = train_one_at_a_time if together_refusal(cfg) else train_together
    out: dict[str, Callable[[], Any]] = {m: method(m) for m in METHODS}
    for key, estimator in RECONSTRUCTED.items():
        out[key] = method("fedavg", **{"eval.contribution_estimators": [estimator]})
    out["standalone"] = lambda: standalone_accuracies(cfg, use_cache=False)
    out["exact_shapley"] = lambda: exact(cfg)
    return out


def measure(work: dict[str, Callable[[], Any]], repeats: int, echo: Callable[[str], None]):
    """One untimed pass over every entry (imports, caches, the standalone pre-pass into the cache), then
    ``repeats`` interleaved timed passes; entry -> its seconds per pass."""
    for name, job in work.items():
        echo(f"  warm-up {name}")
        job()
    times: dict[str, list[float]] = {name: [] for name in work}
    for rep in range(repeats):
        for name, job in work.items():
            t0 = time.perf_counter()
            job()
            times[name].append(time.perf_counter() - t0)
        echo(f"  pass {rep + 1}/{repeats}: " + ", ".join(f"{k} {v[-1]:.1f}s" for k, v in times.items()))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="timed interleaved passes (median; default 5)")
    ap.add_argument("--federations", nargs="+", choices=list(FEDERATIONS), default=list(FEDERATIONS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.repeats < 1:
        sys.exit("--repeats must be at least 1")
    os.environ["FEDHET_CACHE"] = tempfile.mkdtemp(prefix="fedhet-estimator-cost-")
    logging.getLogger("fedhet").setLevel(logging.ERROR)  # the runs' notes (under-trained, ...) are not timed
    load_start = os.getloadavg()[0]
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    ratios: dict[str, float] = {}
    for short, name in ((f, FEDERATIONS[f]) for f in args.federations):
        print(f"{short} ({name}):", flush=True)
        cfg = federation_config(name)
        times = measure(jobs(cfg), args.repeats, lambda s: print(s, flush=True))
        for row in cost_table(times):
            rows.append({"federation": short, **row, "timed": ENTRIES[row["estimator"]]})
            if row["estimator"] != "fedavg":
                ratios[f"{short}_{row['estimator']}_x_fedavg"] = row["cost_x_fedavg"]
    load_end = os.getloadavg()[0]
    print()
    head = ("federation", "estimator", "median s", "min s", "max s", "x FedAvg")
    print(f"{head[0]:<10} {head[1]:<14} {head[2]:>9} {head[3]:>7} {head[4]:>7} {head[5]:>9}  timed")
    for r in rows:
        print(
            f"{r['federation']:<10} {r['estimator']:<14} {r['median_s']:>9.2f} {r['min_s']:>7.2f} "
            f"{r['max_s']:>7.2f} {r['cost_x_fedavg']:>9.2f}  {r['timed']}"
        )
    print("sample share: free (the sample counts every server has)")
    cpus = os.cpu_count()
    print(
        f"load average {load_start:.1f} at the start, {load_end:.1f} at the end, {cpus} CPUs; "
        f"{args.repeats} timed passes"
    )
    if args.json:
        emit(
            "estimator_cost",
            ratios,
            {},
            settings=f"the contribution-estimators page's federations ({', '.join(args.federations)}), every "
            f"estimator timed in one process, interleaved, one untimed warm-up pass then {args.repeats} "
            f"timed passes (median), each divided by FedAvg's median on the same federation; one thread per "
            f"run; load average {load_start:.1f} at the start, {load_end:.1f} at the end, {cpus} CPUs",
            rows=rows,
            elapsed_s=time.perf_counter() - started,
        )


if __name__ == "__main__":
    main()
