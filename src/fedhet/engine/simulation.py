"""The embedded round loop: one process, clients trained one after another, bit-reproducible.

Every random choice flows from the run's seed through explicit generators derived per purpose
(partition, sampling per round, each client's batches per round), so results do not depend on the order
in which clients run, and the same config and seed give identical ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedhet import metrics as M
from fedhet.algorithms import build_strategy
from fedhet.config import ExperimentConfig, to_toml
from fedhet.engine import checkpoint as ckpt
from fedhet.engine.evaluation import accuracy_of, evaluate_model, predict  # noqa: F401
from fedhet.engine.protocol import (
    ClientData,
    ClientState,
    Reply,
    ServerContext,
    Strategy,
    TrainContext,
    Trainer,
    check_reply,
    clone_weights,
)
from fedhet.errors import ClientUpdateError, ConfigError

log = logging.getLogger("fedhet")


# --------------------------------------------------------------------------------------------------------
# Seeds
# --------------------------------------------------------------------------------------------------------
PURPOSE = {
    "partition": 1,
    "subset": 2,
    "validation": 3,
    "sampling": 4,
    "dropout": 5,
    "client": 6,
    "strategy": 7,
    "model": 8,
    "test_subset": 9,
}


def derived_rng(seed: int, purpose: str, *keys: int) -> np.random.Generator:
    """A numpy generator for one purpose (and round/client), independent of every other stream."""
    return np.random.default_rng([seed, PURPOSE[purpose], *keys])


def derived_torch_generator(seed: int, purpose: str, *keys: int) -> torch.Generator:
    state = np.random.SeedSequence([seed, PURPOSE[purpose], *keys]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device='cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    return torch.device(name)


def cache_dir() -> Path:
    return Path(os.environ.get("FEDHET_CACHE", Path.home() / ".cache" / "fedhet"))


# --------------------------------------------------------------------------------------------------------
# Data preparation
# --------------------------------------------------------------------------------------------------------
_DATASET_CACHE: dict[tuple[str, str | None], Any] = {}


def get_dataset(name: str, root: str | None):
    """Load a dataset once per process (compare runs share it)."""
    from fedhet.data.datasets import load_dataset

    key = (name, root)
    if key not in _DATASET_CACHE:
        _DATASET_CACHE.clear()  # keep at most one dataset in memory
        _DATASET_CACHE[key] = load_dataset(name, root)
    return _DATASET_CACHE[key]


@dataclass
class Federation:
    """The data side of a run: tensors on the device, the partition and each client's view."""

    dataset: Any
    partition: Any
    clients: list[ClientData]
    test_x: Tensor
    test_y: Tensor
    validation: tuple[Tensor, Tensor] | None
    class_counts: np.ndarray
    pool_indices: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return self.dataset.num_classes

    @property
    def sizes(self) -> list[int]:
        return [c.num_examples for c in self.clients]


def build_federation(cfg: ExperimentConfig, device: torch.device, raw_inputs: bool = False) -> Federation:
    """Load the dataset, hold out validation data, split the pool over clients, move tensors to ``device``."""
    from fedhet.data.splits import holdout_validation, make_partition

    ds = get_dataset(cfg.data.dataset, cfg.data.root)
    n_train = int(ds.train_y.numel())
    all_idx = np.arange(n_train)
    if cfg.data.max_train_samples is not None and cfg.data.max_train_samples < n_train:
        all_idx = np.sort(
            derived_rng(cfg.seed, "subset").choice(n_train, cfg.data.max_train_samples, replace=False)
        )
    val_idx = None
    if cfg.data.validation_fraction > 0:
        pool_pos, val_pos = holdout_validation(
            len(all_idx), cfg.data.validation_fraction, derived_rng(cfg.seed, "validation")
        )
        val_idx, pool = all_idx[val_pos], all_idx[pool_pos]
    else:
        pool = all_idx
    labels_np = ds.train_y.numpy()
    pool_labels = labels_np[pool]
    if cfg.data.clients > len(pool):
        raise ConfigError(
            f"data.clients={cfg.data.clients} exceeds the {len(pool)} training samples available"
        )
    partition = make_partition(
        cfg.data.split,
        pool_labels,
        cfg.data.clients,
        derived_rng(cfg.seed, "partition"),
        cfg.data.split_params,
        num_classes=ds.num_classes,
    )

    if raw_inputs:
        train_inputs = (ds.train_x.float() / 255.0).to(device)

        def normalize(x: Tensor) -> Tensor:
            return ds.normalize(x)
    else:
        train_inputs = ds.normalize(ds.train_x).to(device)
        normalize = None
    train_labels = ds.train_y.to(device)
    to_dev = lambda a: torch.as_tensor(pool[a], dtype=torch.long, device=device)  # noqa: E731
    clients = []
    for cid, idx in enumerate(partition.clients):
        unl = None
        if partition.unlabeled is not None:
            unl = to_dev(partition.unlabeled[cid])
        clients.append(
            ClientData(
                cid=cid,
                inputs=train_inputs,
                labels=train_labels,
                indices=to_dev(idx),
                num_classes=ds.num_classes,
                unlabeled_indices=unl,
                normalize=normalize,
            )
        )
    test_x, test_y = ds.test_x, ds.test_y
    if cfg.data.max_test_samples is not None and cfg.data.max_test_samples < len(test_y):
        sel = np.sort(
            derived_rng(cfg.seed, "test_subset").choice(len(test_y), cfg.data.max_test_samples, replace=False)
        )
        test_x, test_y = test_x[torch.as_tensor(sel)], test_y[torch.as_tensor(sel)]
    validation = None
    if val_idx is not None:
        vi = torch.as_tensor(val_idx)
        validation = (ds.normalize(ds.train_x[vi]).to(device), ds.train_y[vi].to(device))
    return Federation(
        dataset=ds,
        partition=partition,
        clients=clients,
        test_x=ds.normalize(test_x).to(device),
        test_y=test_y.to(device),
        validation=validation,
        class_counts=partition.class_counts(pool_labels, ds.num_classes),
        pool_indices=pool,
        info=dict(partition.info),
    )


# --------------------------------------------------------------------------------------------------------
# Standalone accuracies (cached)
# --------------------------------------------------------------------------------------------------------
def standalone_key(cfg: ExperimentConfig) -> str:
    """Cache key: dataset, split and params, clients, seed, model and the local-training budget."""
    return cfg.fingerprint(
        "data", "model", "train", "seed", exclude=("train.device", "train.threads", "train.client_dropout")
    )


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
        return np.array(json.loads(path.read_text())["accuracies"], dtype=np.float64)
    sub = cfg.copy()
    sub.method.name, sub.method.params = "standalone", {}
    sub.eval.fairness = False
    sub.eval.every = sub.train.rounds
    summary = Simulation(sub, run_dir=None, progress=progress).run()
    acc = np.array(summary["rewards"], dtype=np.float64)
    if use_cache:
        store_standalone_accuracies(cfg, acc)
    return acc


# --------------------------------------------------------------------------------------------------------
# The simulation
# --------------------------------------------------------------------------------------------------------
def learning_rate(cfg: ExperimentConfig, rnd: int) -> float:
    """The round's learning rate: constant, cosine annealing to lr_min over the rounds, or exponential."""
    t = cfg.train
    if t.schedule == "cosine":
        return t.lr_min + 0.5 * (t.lr - t.lr_min) * (1 + math.cos(math.pi * (rnd - 1) / t.rounds))
    if t.schedule == "exponential":
        return t.lr * t.lr_decay ** (rnd - 1)
    return t.lr


def sample_clients(cfg: ExperimentConfig, rnd: int) -> list[int]:
    """Seeded uniform sampling without replacement; sorted client ids."""
    n = cfg.data.clients
    cpr = cfg.train.clients_per_round
    k = (
        n
        if (isinstance(cpr, float) and cpr >= 1.0)
        else (max(1, int(round(cpr * n))) if isinstance(cpr, float) else min(int(cpr), n))
    )
    if k >= n:
        return list(range(n))
    return sorted(int(c) for c in derived_rng(cfg.seed, "sampling", rnd).choice(n, k, replace=False))


class Simulation:
    """Run one experiment in-process: ``Simulation(cfg, run_dir=...).run()`` returns the summary dict."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        *,
        run_dir: str | os.PathLike | None = None,
        strategy: Strategy | None = None,
        trainer: Trainer | None = None,
        progress: Callable[..., None] | None = None,
        resume: bool = False,
        standalone: np.ndarray | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.progress = progress
        self.resume = resume
        self._strategy = strategy
        self._trainer = trainer
        self._standalone = standalone

    # -- set-up -------------------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        self.device = resolve_device(cfg.train.device)
        self.strategy = self._strategy or build_strategy(cfg.method.name, cfg.method.params)
        self.trainer = self._trainer or self.strategy.make_trainer()
        self.fed = build_federation(cfg, self.device, raw_inputs=self.trainer.needs_raw_inputs)
        from fedhet.models import build_model

        ds = self.fed.dataset

        def model_factory() -> nn.Module:
            return build_model(cfg.model.name, ds.input_shape, ds.num_classes, **cfg.model.params).to(
                self.device
            )

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(np.random.SeedSequence([cfg.seed, PURPOSE["model"]]).generate_state(1)[0]))
            model = model_factory()
        self.initial_weights = clone_weights(model.state_dict())
        self.work_model = model_factory()
        self.rare_classes = list(self.fed.info.get("rare_classes", [])) or None
        self.standalone: np.ndarray | None = self._standalone
        fairness = cfg.eval.fairness
        # Standalone's rewards are the standalone accuracies: its fairness against itself means nothing.
        wants_fairness = cfg.method.name != "standalone" and (
            fairness is True or (fairness == "auto" and self.strategy.has_rewards())
        )
        if wants_fairness and self.standalone is None:
            self.standalone = standalone_accuracies(cfg)
        self.srv_ctx = ServerContext(
            model=model,
            model_factory=model_factory,
            num_clients=cfg.data.clients,
            num_classes=ds.num_classes,
            client_sizes=self.fed.sizes,
            client_class_counts=self.fed.class_counts,
            rounds=cfg.train.rounds,
            train=cfg.train,
            device=self.device,
            seed=cfg.seed,
            rng=derived_rng(cfg.seed, "strategy"),
            validation=self.fed.validation,
            standalone_accuracies=self._standalone_provider,
            evaluate=lambda m, x, y: accuracy_of(m, x, y, cfg.eval.batch_size),
            info=dict(self.fed.info),
            input_shape=tuple(ds.input_shape),
        )
        self.strategy.setup(self.srv_ctx)
        self.client_states = {cid: ClientState(cid=cid) for cid in range(cfg.data.clients)}
        self.history: list[dict[str, Any]] = []
        self.timings: list[dict[str, float]] = []
        self.start_round = 1

    def _standalone_provider(self) -> np.ndarray:
        if self.standalone is None:
            self.standalone = standalone_accuracies(self.cfg)
        return self.standalone

    # -- one round --------------------------------------------------------------------------------------
    def train_round(self, rnd: int) -> dict[str, Any]:
        cfg = self.cfg
        lr = learning_rate(cfg, rnd)
        ids = sample_clients(cfg, rnd)
        dropped: list[int] = []
        if cfg.train.client_dropout > 0:
            draws = derived_rng(cfg.seed, "dropout", rnd).random(len(ids))
            dropped = [c for c, u in zip(ids, draws, strict=True) if u < cfg.train.client_dropout]
        instructions = self.strategy.configure(rnd, ids)
        replies: dict[int, Reply] = {}
        rejected: dict[int, str] = {}
        reference = self.work_model.state_dict()
        losses, weights = [], []
        for cid in sorted(instructions):
            if cid in dropped:
                continue
            ins = instructions[cid]
            ins.config.setdefault("lr", lr)
            ctx = TrainContext(
                round=rnd,
                generator=derived_torch_generator(cfg.seed, "client", rnd, cid),
                device=self.device,
                train=cfg.train,
                initial_weights=self.initial_weights,
            )
            state = self.client_states[cid]
            try:
                reply = self.trainer.fit(self.work_model, self.fed.clients[cid], ins, state, ctx)
                check_reply(cid, reply, reference, partial_ok=self.strategy.partial_replies)
            except ClientUpdateError as exc:
                log.warning("round %d: rejected the update of client %d: %s", rnd, cid, exc)
                rejected[cid] = str(exc)
                continue
            if self.strategy.keeps_client_models:
                state.weights = reply.weights
            replies[cid] = reply
            if "train_loss" in reply.metrics and math.isfinite(reply.metrics["train_loss"]):
                losses.append(reply.metrics["train_loss"])
                weights.append(max(reply.num_examples, 1))
        self.strategy.aggregate(rnd, replies)
        line: dict[str, Any] = {"round": rnd, "lr": lr, "clients": sorted(replies)}
        if dropped:
            line["dropped"] = dropped
        if rejected:
            line["rejected"] = {str(k): v for k, v in rejected.items()}
        if losses:
            line["train_loss"] = float(np.average(losses, weights=weights))
        return line

    # -- evaluation -------------------------------------------------------------------------------------
    def evaluate(self, rnd: int) -> dict[str, Any]:
        cfg, fed = self.cfg, self.fed
        out: dict[str, Any] = {}
        model = self.strategy.global_model()
        if model is not None:
            out.update(
                evaluate_model(
                    model, fed.test_x, fed.test_y, fed.num_classes, cfg.eval.batch_size, self.rare_classes
                )
            )
        rewards = None
        if cfg.eval.rewards and self.strategy.has_rewards():
            rewards = self.strategy.evaluate_rewards(fed.test_x, fed.test_y, cfg.eval.batch_size)
        if rewards is not None:
            out["rewards"] = [float(r) for r in rewards]
            if model is None:  # e.g. Standalone: report the clients' mean accuracy
                finite = [r for r in rewards if math.isfinite(r)]
                out["accuracy"] = float(np.mean(finite)) if finite else float("nan")
            if self.standalone is not None and np.all(np.isfinite(rewards)):
                s = self.standalone
                out["fairness_pearson"] = M.fairness(s, rewards, "pearson")
                out["fairness_spearman"] = M.fairness(s, rewards, "spearman")
                out["bcf_rate"] = M.bcf_rate(s, rewards, cfg.eval.bcf_alpha)
                out["bcf_rate_code"] = M.bcf_rate_fedrac_code(s, rewards, cfg.eval.bcf_alpha)
                out["ipr"] = M.incentivized_participation_rate(s, rewards)
        contrib = self.strategy.contributions()
        if contrib is not None and self.standalone is not None:
            out["contribution_fairness_pearson"] = M.fairness(contrib, self.standalone, "pearson")
        return out

    # -- checkpoints ------------------------------------------------------------------------------------
    def save(self, rnd: int) -> None:
        if self.run_dir is None:
            return
        clients = {
            str(cid): {"weights": st.weights, "extra": st.extra}
            for cid, st in self.client_states.items()
            if st.weights is not None or st.extra
        }
        state = {
            "round": rnd,
            "strategy": self.strategy.state_dict(),
            "clients": clients,
            "strategy_rng": self.srv_ctx.rng.bit_generator.state,
            "config_hash": self.cfg.run_fingerprint(),
        }
        ckpt.save_checkpoint(ckpt.checkpoint_dir(self.run_dir, rnd), state)
        ckpt.prune_checkpoints(self.run_dir, keep=2)

    def restore(self) -> bool:
        """Load the run directory's latest checkpoint; False when there is none."""
        path = ckpt.latest_checkpoint(self.run_dir)
        if path is None:
            log.info("no checkpoint in %s: starting from round 1", self.run_dir)
            return False
        state = ckpt.load_checkpoint(path)
        if state.get("config_hash") != self.cfg.run_fingerprint():
            raise ConfigError(
                f"the checkpoint in {path} was written by a different configuration; "
                "resume with the run's own config.toml or start a new run directory"
            )
        self.strategy.load_state_dict(state["strategy"])
        for cid, st in state["clients"].items():
            self.client_states[int(cid)].weights = st["weights"]
            self.client_states[int(cid)].extra = st["extra"]
        self.srv_ctx.rng.bit_generator.state = state["strategy_rng"]
        self.start_round = int(state["round"]) + 1
        mfile = self.run_dir / "metrics.jsonl"
        if mfile.is_file():
            kept = [json.loads(s) for s in mfile.read_text().splitlines() if s.strip()]
            self.history = [h for h in kept if h["round"] <= state["round"]]
            mfile.write_text("".join(json.dumps(h) + "\n" for h in self.history))
        tfile = self.run_dir / "timings.jsonl"
        if tfile.is_file():
            kept = [json.loads(s) for s in tfile.read_text().splitlines() if s.strip()]
            self.timings = [t for t in kept if t["round"] <= state["round"]]
            tfile.write_text("".join(json.dumps(t) + "\n" for t in self.timings))
        log.info("resumed %s from round %d", self.run_dir, state["round"])
        return True

    # -- the loop ---------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run all rounds (resuming from the last checkpoint if asked) and return the summary."""
        t0 = time.perf_counter()
        self.setup()
        cfg = self.cfg
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if not (self.resume and self.restore()):
                (self.run_dir / "metrics.jsonl").write_text("")
                (self.run_dir / "timings.jsonl").write_text("")
            # A run counts as finished only once its summary is written.
            (self.run_dir / "summary.json").unlink(missing_ok=True)
            (self.run_dir / "config.toml").write_text(to_toml(cfg))
            self._write_partition()
        for rnd in range(self.start_round, cfg.train.rounds + 1):
            tr = time.perf_counter()
            line = self.train_round(rnd)
            timing = {"round": rnd, "train_s": time.perf_counter() - tr}
            if rnd % cfg.eval.every == 0 or rnd == cfg.train.rounds:
                te = time.perf_counter()
                line.update(self.evaluate(rnd))
                timing["eval_s"] = time.perf_counter() - te
            line.update(self.strategy.round_metrics(rnd))
            self.history.append(line)
            self.timings.append(timing)
            if self.run_dir is not None:
                # Timings live apart from metrics.jsonl, which is bit-identical across runs with one seed.
                with open(self.run_dir / "metrics.jsonl", "a") as fh:
                    fh.write(json.dumps(_jsonable(line)) + "\n")
                with open(self.run_dir / "timings.jsonl", "a") as fh:
                    fh.write(json.dumps(timing) + "\n")
                every = cfg.eval.checkpoint_every
                if rnd == cfg.train.rounds or (every and rnd % every == 0):
                    self.save(rnd)
            if self.progress is not None:
                self.progress(rnd, cfg.train.rounds, line)
        summary = self.summary(time.perf_counter() - t0)
        if self.run_dir is not None:
            (self.run_dir / "summary.json").write_text(json.dumps(_jsonable(summary), indent=2))
            self.strategy.write_artifacts(self.run_dir)
            if self.standalone is not None:
                (self.run_dir / "standalone.json").write_text(json.dumps(list(map(float, self.standalone))))
        return summary

    def summary(self, wall: float) -> dict[str, Any]:
        evals = [h for h in self.history if "accuracy" in h or "rewards" in h]
        final = _metric_view(evals[-1]) if evals else {}
        best: dict[str, Any] = {}
        for h in evals:
            for k, v in _metric_view(h).items():
                if isinstance(v, float) and math.isfinite(v):
                    if k not in best or (v < best[k] if k == "loss" else v > best[k]):
                        best[k] = v
        recent = [h for h in evals if h["round"] > self.cfg.train.rounds - LAST_ROUNDS]
        last = evals[-1] if evals else {}
        contrib = self.strategy.contributions()
        return {
            "method": self.cfg.method.name,
            "run_dir": str(self.run_dir) if self.run_dir else None,
            "rounds": self.cfg.train.rounds,
            "seed": self.cfg.seed,
            "final": final,
            "best": best,
            "last": mean_scalars([_metric_view(h) for h in recent]),
            "contributions": [float(c) for c in contrib] if contrib is not None else None,
            "rewards": last.get("rewards"),
            "standalone": [float(s) for s in self.standalone] if self.standalone is not None else None,
            "client_sizes": self.fed.sizes,
            "partition_info": _jsonable(self.fed.info),
            "wall_time_s": wall,
        }

    def _write_partition(self) -> None:
        info = {
            "sizes": self.fed.sizes,
            "counts": self.fed.class_counts.tolist(),
            "classes": list(self.fed.dataset.classes),
            "info": _jsonable(self.fed.info),
        }
        (self.run_dir / "partition.json").write_text(json.dumps(info))


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
)


#: ``summary["last"]``: the mean over the evaluations of the last LAST_ROUNDS rounds (baselines.md §3.1 asks
#: for final, best and the mean of the last 10 rounds; it also steadies curves that swing between rounds).
LAST_ROUNDS = 10


def mean_scalars(views: list[dict[str, Any]]) -> dict[str, float]:
    """Per key, the mean of the finite float values among ``views`` (keys with none are left out)."""
    out: dict[str, float] = {}
    for k in {k for v in views for k in v}:
        vals = [v[k] for v in views if isinstance(v.get(k), float) and math.isfinite(v[k])]
        if vals:
            out[k] = float(np.mean(vals))
    return dict(sorted(out.items()))


def _metric_view(line: dict[str, Any]) -> dict[str, Any]:
    out = {k: line[k] for k in SCALAR_KEYS if k in line}
    if "per_class_recall" in line:
        out["per_class_recall"] = line["per_class_recall"]
    return out


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Tensor):
        return _jsonable(obj.tolist())
    return obj


def run_experiment(
    cfg: ExperimentConfig, run_dir: str | os.PathLike | None = None, **kw: Any
) -> dict[str, Any]:
    """Convenience wrapper: ``Simulation(cfg, run_dir=run_dir, **kw).run()``."""
    return Simulation(cfg, run_dir=run_dir, **kw).run()
