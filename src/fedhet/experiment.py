"""One experiment from a config: the method from the registry, its declared inputs, the embedded engine.

``run_experiment(cfg, run_dir)`` is what ``fedhet run`` and ``fedhet compare`` call. It builds the strategy
named in the config, computes the inputs the run needs beyond messages — the clients' standalone accuracies,
from a cached pre-pass in which every client trains alone with the run's budget — and runs the simulation.
The engine itself knows no method by name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.algorithms import build_strategy
from fedhet.config import (
    AggregationConfig,
    EvalConfig,
    ExperimentConfig,
    FaultsConfig,
    GuardsConfig,
    apply_override,
)
from fedhet.config_sections import GENERAL_LR, MODEL_LR
from fedhet.engine.protocol import Strategy
from fedhet.engine.rounds import RoundListener
from fedhet.engine.simulation import Simulation
from fedhet.report.listeners import run_listeners

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """fedhet's cache directory (``$FEDHET_CACHE``, default ``~/.cache/fedhet``); safe to delete."""
    return Path(os.environ.get("FEDHET_CACHE") or Path.home() / ".cache" / "fedhet").expanduser()


# --------------------------------------------------------------------------------------------------------
# The standalone pre-pass (cached): the reference contributions
# --------------------------------------------------------------------------------------------------------
def standalone_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The config the standalone pre-pass runs: ``cfg``'s data, model, budget and seed, method
    ``standalone``, honest clients, no server guards, every reward evaluated once at the end."""
    sub = cfg.copy()
    sub.method.name, sub.method.params = "standalone", {}
    # The reference is what each client's own data is worth: honest clients, no server guards (the key
    # leaves [faults] and [guards] out for this reason). A client that never trains gets NaN here rather
    # than stopping the pre-pass: the method that needs the reference names the client and the fix.
    sub.faults, sub.guards = FaultsConfig(), GuardsConfig(max_all_rejected_rounds=0)
    sub.aggregation = AggregationConfig()  # nothing is averaged
    # The reference *is* the rewards' accuracy: the run's own [eval] switches say what the run reports,
    # never what the pre-pass computes (eval.rewards=false would leave it nothing but NaN).
    sub.eval = EvalConfig(
        batch_size=cfg.eval.batch_size, every=cfg.train.rounds, rewards=True, fairness=False
    )
    return sub


#: Inputs of the pre-pass added to its cache key after keys were in use, keyed only when they differ from
#: these values (so caches written before keep their keys).
_LATER_KEY_INPUTS: dict[str, Any] = {"eval.batch_size": EvalConfig().batch_size, "engine.mode": "sequential"}


def standalone_key(cfg: ExperimentConfig) -> str:
    """Cache key of the pre-pass: every input that changes its result — dataset, split and params, clients,
    seed, model and the local-training budget ([data], [model], [train], seed), the evaluation batch size
    and the engine mode, the weights of ``model.init_from`` and the size and time of a ``data.path`` file."""
    # client_dropout stays in the key: the standalone sub-run inherits it, so it changes the result.
    key = cfg.fingerprint("data", "model", "train", "seed", exclude=("train.device",))
    extra: dict[str, Any] = {}
    for dotted, default in _LATER_KEY_INPUTS.items():
        sec, _, name = dotted.partition(".")
        value = getattr(getattr(cfg, sec), name)
        if value != default:
            extra[dotted] = value
    if cfg.model.init_from:
        from fedhet.engine.warm_start import warm_start_digest

        extra["init_from_digest"] = warm_start_digest(cfg.model.init_from.format(seed=cfg.seed))
    if cfg.data.path and Path(cfg.data.path).exists():
        st = Path(cfg.data.path).stat()
        extra["data_path_file"] = [st.st_size, st.st_mtime_ns]
        if Path(cfg.data.path).is_dir():  # a folder of files (images, or one table per client)
            extra["data_path_file"] = _folder_signature(Path(cfg.data.path))
    if cfg.data.test_path and Path(cfg.data.test_path).is_file():
        st = Path(cfg.data.test_path).stat()
        extra["data_test_path_file"] = [st.st_size, st.st_mtime_ns]
    if not extra:
        return key
    blob = json.dumps({"key": key, **extra}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _folder_signature(folder: Path) -> str:
    """A digest of every file's relative path, size and modification time under ``folder``."""
    entries = sorted(
        (str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    )
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()[:16]


def standalone_cache_file(cfg: ExperimentConfig) -> Path:
    """Where the pre-pass of ``cfg`` is cached (``$FEDHET_CACHE/standalone/<key>.json``)."""
    return cache_dir() / "standalone" / f"{standalone_key(cfg)}.json"


def store_standalone_accuracies(cfg: ExperimentConfig, accuracies: Sequence[float]) -> None:
    """Put per-client standalone accuracies for ``cfg``'s (data, model, budget, seed) into the cache."""
    path = standalone_cache_file(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    payload = {"accuracies": [float(a) for a in accuracies], "config": cfg.to_dict()}
    tmp.write_text(json.dumps(payload, default=str))
    tmp.replace(path)


def cached_standalone_accuracies(cfg: ExperimentConfig) -> np.ndarray | None:
    """The cached pre-pass of ``cfg`` (one finite accuracy per client), or None."""
    path = standalone_cache_file(cfg)
    if not path.is_file():
        return None
    try:
        cached = np.array(json.loads(path.read_text())["accuracies"], dtype=np.float64)
    except (ValueError, KeyError, TypeError):  # torn or foreign file: recompute and overwrite
        return None
    if cached.shape == (cfg.data.clients,) and np.all(np.isfinite(cached)):
        return cached
    return None


def prepass_notice(cfg: ExperimentConfig, reason: str) -> str:
    """The line a user sees when the standalone pre-pass is about to run: what it is, why, what it costs
    and where it is cached."""
    return (
        f"fairness reference: {reason}, so first every one of the {cfg.data.clients} clients trains alone "
        f"for {cfg.train.rounds} rounds (the standalone pre-pass, seed {cfg.seed}: one standalone run per "
        f"client); cached in {standalone_cache_file(cfg)} and reused by runs with the same data, model, "
        "budget and seed"
    )


def standalone_accuracies(
    cfg: ExperimentConfig,
    *,
    use_cache: bool = True,
    progress: Callable[..., None] | None = None,
    notify: Callable[[str], None] | None = None,
    reason: str = "the run needs every client's standalone accuracy",
) -> np.ndarray:
    """Per-client test accuracy of models trained on each client alone with the run's budget (cached).

    ``notify`` receives one line saying the pre-pass runs (and why: ``reason``), or that its cached result is
    used."""
    if use_cache:
        cached = cached_standalone_accuracies(cfg)
        if cached is not None:
            if notify:
                notify(
                    f"fairness reference: {reason}; using the cached standalone pre-pass "
                    f"{standalone_cache_file(cfg)}"
                )
            return cached
    if notify:
        notify(prepass_notice(cfg, reason))
    sub = standalone_config(cfg)
    strategy = build_strategy(sub.method.name, sub.method.params)
    summary = Simulation(sub, strategy, run_dir=None, progress=progress).run()
    rewards = summary["rewards"]
    acc = np.full(cfg.data.clients, np.nan) if rewards is None else np.array(rewards, dtype=np.float64)
    if use_cache and np.all(np.isfinite(acc)):  # a client that never trained must not poison later runs
        store_standalone_accuracies(cfg, acc)
    return acc


def apply_method_defaults(cfg: ExperimentConfig, strategies: Sequence[Strategy]) -> list[str]:
    """Apply each strategy's ``config_defaults`` where ``cfg`` holds fedhet's general default, in place
    (``model.name`` only when the whole [model] section is the default); return one notice per change, and
    one for a learning rate the model sets where ``train.lr`` is unset (config_sections.MODEL_LR)."""
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
    if cfg.train.lr is None and cfg.model.name in MODEL_LR:
        notices.append(
            f"model {cfg.model.name!r} trains with train.lr = {cfg.learning_rate():g} by default (fedhet's "
            f"general default is {GENERAL_LR:g}; set train.lr to choose another value)"
        )
    return notices


def measures_fairness(cfg: ExperimentConfig, strategy: Strategy, *, auto: bool | None = None) -> bool:
    """Whether the run reports fairness against the standalone accuracies: ``eval.fairness = true``, or
    ``"auto"`` and the method's rewards are its result (``Strategy.fairness_by_default``: CGSV, CFFL, IAFL,
    ShapFed, FedRAC, FedSAC) — or, in a comparison, ``auto`` (another of its methods measures it). Never
    for ``eval.fairness = false``, a method whose rewards are the reference, or without rewards."""
    if cfg.eval.fairness is False or strategy.rewards_are_reference:
        return False
    if cfg.eval.fairness is True:
        return True
    wanted = strategy.fairness_by_default if auto is None else auto
    return bool(wanted and cfg.eval.rewards and strategy.has_rewards())


def needs_reference(cfg: ExperimentConfig, strategy: Strategy, *, auto: bool | None = None) -> bool:
    """Whether a run needs the standalone pre-pass: the method requires its accuracies as an input, or the
    run measures fairness (:func:`measures_fairness`; ``auto`` as there)."""
    if "reference_contributions" in strategy.requirements():
        return True
    return measures_fairness(cfg, strategy, auto=auto)


def reference_reason(cfg: ExperimentConfig, strategy: Strategy) -> str:
    """Why the run needs the pre-pass, in the words of its config (for the line announcing it)."""
    if "reference_contributions" in strategy.requirements():
        return f"method {strategy.name!r} takes every client's standalone accuracy as an input"
    if cfg.eval.fairness is True:
        return "eval.fairness = true measures fairness against every client's standalone accuracy"
    return (
        f'fairness is measured for {strategy.name!r} (eval.fairness = "auto"; set eval.fairness = false '
        "to skip it)"
    )


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
    notify: Callable[[str], None] | None = None,
    **kwargs: Any,
) -> Simulation:
    """The simulation of ``cfg``: its method from the registry (unless ``strategy`` is given) and, when the
    run needs them and none are given, the standalone accuracies from the cached pre-pass. ``listeners``
    default to report's (``fedhet.report.listeners.run_listeners``: TensorBoard scalars when
    ``eval.tensorboard``, the run's CSVs and figures). ``notify`` receives the line announcing the pre-pass
    (default: logged as a warning)."""
    strategy = strategy if strategy is not None else build_strategy(cfg.method.name, cfg.method.params)
    if reference_contributions is None and needs_reference(cfg, strategy):
        reference_contributions = standalone_accuracies(
            cfg, notify=notify or log.warning, reason=reference_reason(cfg, strategy)
        )
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
