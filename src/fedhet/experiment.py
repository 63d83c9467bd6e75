"""One experiment from a config: the method from the registry, its declared inputs, the embedded engine.

``run_experiment(cfg, run_dir)`` is what ``fedhet run`` and ``fedhet compare`` call. It builds the strategy
named in the config, computes the inputs the run needs beyond messages — the clients' standalone accuracies,
from a cached pre-pass in which every client trains alone with the run's budget — and runs the simulation.
The engine itself knows no method by name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.algorithms import build_strategy
from fedhet.config import ExperimentConfig, FaultsConfig, GuardsConfig, apply_override
from fedhet.engine.protocol import Strategy
from fedhet.engine.rounds import RoundListener
from fedhet.engine.simulation import Simulation
from fedhet.report.listeners import run_listeners


def cache_dir() -> Path:
    """fedhet's cache directory (``$FEDHET_CACHE``, default ``~/.cache/fedhet``); safe to delete."""
    return Path(os.environ.get("FEDHET_CACHE", Path.home() / ".cache" / "fedhet"))


# --------------------------------------------------------------------------------------------------------
# The standalone pre-pass (cached): the reference contributions
# --------------------------------------------------------------------------------------------------------
def standalone_key(cfg: ExperimentConfig) -> str:
    """Cache key: dataset, split and params, clients, seed, model and the local-training budget."""
    # client_dropout stays in the key: the standalone sub-run inherits it, so it changes the result.
    return cfg.fingerprint("data", "model", "train", "seed", exclude=("train.device", "train.threads"))


def _standalone_cache_file(cfg: ExperimentConfig) -> Path:
    return cache_dir() / "standalone" / f"{standalone_key(cfg)}.json"


def store_standalone_accuracies(cfg: ExperimentConfig, accuracies: Sequence[float]) -> None:
    """Put per-client standalone accuracies for ``cfg``'s (data, model, budget, seed) into the cache."""
    path = _standalone_cache_file(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    payload = {"accuracies": [float(a) for a in accuracies], "config": cfg.to_dict()}
    tmp.write_text(json.dumps(payload, default=str))
    tmp.replace(path)


def standalone_accuracies(
    cfg: ExperimentConfig, *, use_cache: bool = True, progress: Callable[..., None] | None = None
) -> np.ndarray:
    """Per-client test accuracy of models trained on each client alone with the run's budget (cached)."""
    path = _standalone_cache_file(cfg)
    if use_cache and path.is_file():
        try:
            cached = np.array(json.loads(path.read_text())["accuracies"], dtype=np.float64)
        except (ValueError, KeyError, TypeError):  # torn or foreign file: recompute and overwrite
            cached = None
        if cached is not None and cached.shape == (cfg.data.clients,) and np.all(np.isfinite(cached)):
            return cached
    sub = cfg.copy()
    sub.method.name, sub.method.params = "standalone", {}
    # The reference is what each client's own data is worth: honest clients, no server guards (the key
    # leaves [faults] and [guards] out for this reason). A client that never trains gets NaN here rather
    # than stopping the pre-pass: the method that needs the reference names the client and the fix.
    sub.faults, sub.guards = FaultsConfig(), GuardsConfig(max_all_rejected_rounds=0)
    sub.eval.fairness = False
    sub.eval.every = sub.train.rounds
    strategy = build_strategy(sub.method.name, sub.method.params)
    summary = Simulation(sub, strategy, run_dir=None, progress=progress).run()
    rewards = summary["rewards"]
    acc = np.full(cfg.data.clients, np.nan) if rewards is None else np.array(rewards, dtype=np.float64)
    if use_cache and np.all(np.isfinite(acc)):  # a client that never trained must not poison later runs
        store_standalone_accuracies(cfg, acc)
    return acc


def apply_method_defaults(cfg: ExperimentConfig, strategies: Sequence[Strategy]) -> list[str]:
    """Apply each strategy's ``config_defaults`` where ``cfg`` holds fedhet's general default, in place
    (``model.name`` only when the whole [model] section is the default); return one notice per change."""
    general = ExperimentConfig()
    notices = []
    for strategy in strategies:
        for dotted, value in strategy.config_defaults().items():
            sec, key = dotted.split(".")
            current = getattr(getattr(cfg, sec), key)
            untouched = (
                cfg.model == general.model
                if dotted == "model.name"
                else current == getattr(getattr(general, sec), key)
            )
            if untouched and current != value:
                apply_override(cfg, dotted, json.dumps(value))
                notices.append(
                    f"method {strategy.name!r} needs {dotted} = {value!r}; using it (set {dotted} to choose "
                    "another value)"
                )
    return notices


def needs_reference(cfg: ExperimentConfig, strategy: Strategy) -> bool:
    """Whether a run needs the standalone accuracies: the method requires them, or fairness is measured."""
    if "reference_contributions" in strategy.requirements():
        return True
    if cfg.eval.fairness is False or strategy.rewards_are_reference:
        return False
    return cfg.eval.fairness is True or strategy.has_rewards()


# --------------------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------------------
def make_simulation(
    cfg: ExperimentConfig,
    *,
    run_dir: str | os.PathLike | None = None,
    progress: Callable[..., None] | None = None,
    resume: bool = False,
    strategy: Strategy | None = None,
    reference_contributions: Sequence[float] | np.ndarray | None = None,
    listeners: Sequence[RoundListener] | None = None,
    **kwargs: Any,
) -> Simulation:
    """The simulation of ``cfg``: its method from the registry (unless ``strategy`` is given) and, when the
    run needs them and none are given, the standalone accuracies from the cached pre-pass. ``listeners``
    default to report's (``fedhet.report.listeners.run_listeners``: TensorBoard scalars when
    ``eval.tensorboard``, the run's CSVs and figures)."""
    strategy = strategy if strategy is not None else build_strategy(cfg.method.name, cfg.method.params)
    if reference_contributions is None and needs_reference(cfg, strategy):
        reference_contributions = standalone_accuracies(cfg)
    if listeners is None:
        listeners = run_listeners(cfg)
    return Simulation(
        cfg,
        strategy,
        run_dir=run_dir,
        progress=progress,
        resume=resume,
        reference_contributions=reference_contributions,
        listeners=listeners,
        **kwargs,
    )


def run_experiment(
    cfg: ExperimentConfig, run_dir: str | os.PathLike | None = None, **kwargs: Any
) -> dict[str, Any]:
    """Run ``cfg`` (see :func:`make_simulation`) and return its summary."""
    return make_simulation(cfg, run_dir=run_dir, **kwargs).run()
