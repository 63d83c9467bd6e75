"""Several methods on the same splits and seeds (the engine of `fedhet compare` and `fedhet reproduce`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.algorithms import accepted_params, build_strategy, strategy_class
from fedhet.config import ExperimentConfig, apply_override
from fedhet.engine.simulation import Simulation, standalone_accuracies

#: progress(description, total_rounds) -> per-round callback, or None for no progress display
ProgressFactory = Callable[[str, int], Callable[..., None]] | None


def method_config(
    base: ExperimentConfig, method: str, seed: int, params: dict[str, Any] | None = None
) -> ExperimentConfig:
    """``base`` for one method and seed: base method params the method accepts, plus its own ``params``."""
    cfg = base.copy()
    apply_override(cfg, "seed", seed)
    cfg.method.name = method
    accepted = accepted_params(strategy_class(method))
    shared = {k: v for k, v in base.method.params.items() if k in accepted}
    cfg.method.params = {**shared, **(params or {})}
    return cfg


def _needs_standalone(cfg: ExperimentConfig) -> bool:
    if cfg.eval.fairness is False or cfg.method.name == "standalone":
        return False
    return cfg.eval.fairness is True or build_strategy(cfg.method.name, cfg.method.params).has_rewards()


def run_comparison(
    base: ExperimentConfig,
    methods: list[str],
    seeds: list[int],
    out_dir: Path,
    method_params: dict[str, dict[str, Any]] | None = None,
    progress: ProgressFactory = None,
) -> dict[str, list[dict[str, Any]]]:
    """Run every method for every seed into ``out_dir/<method>-seed<k>``; summaries per method.

    The standalone accuracies used for fairness are computed (or read from the cache) once per seed and
    shared by all methods of that seed.
    """
    for m in methods:
        strategy_class(m)  # fail early on unknown names
    method_params = method_params or {}
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for seed in seeds:
        standalone = None
        for m in methods:
            cfg = method_config(base, m, seed, method_params.get(m))
            if standalone is None and _needs_standalone(cfg):
                cb = (
                    progress(f"standalone seed {seed} (for fairness)", cfg.train.rounds) if progress else None
                )
                standalone = standalone_accuracies(cfg, progress=cb)
            cb = progress(f"{m} seed {seed}", cfg.train.rounds) if progress else None
            summary = Simulation(
                cfg, run_dir=out_dir / f"{m}-seed{seed}", progress=cb, standalone=standalone
            ).run()
            results[m].append(summary)
    return results


def aggregate_rows(results: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Mean and std over seeds of every scalar metric, final and best, one row per method."""
    rows = []
    for m, summaries in results.items():
        row: dict[str, Any] = {
            "method": m,
            "seeds": [s["seed"] for s in summaries],
            "mean": {},
            "std": {},
            "best_mean": {},
            "best_std": {},
        }
        for view, mk, sk in (("final", "mean", "std"), ("best", "best_mean", "best_std")):
            keys = sorted({k for s in summaries for k, v in s[view].items() if isinstance(v, int | float)})
            for k in keys:
                vals = [s[view].get(k) for s in summaries]
                vals = [float(v) for v in vals if isinstance(v, int | float) and math.isfinite(v)]
                if vals:
                    row[mk][k] = float(np.mean(vals))
                    row[sk][k] = float(np.std(vals))
        rows.append(row)
    return rows
