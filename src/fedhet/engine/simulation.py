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
from fedhet.config import ExperimentConfig, to_toml
from fedhet.engine import checkpoint as ckpt
from fedhet.engine.boundary import check_description, check_reply
from fedhet.engine.client import describe_instruction, run_client
from fedhet.engine.evaluation import evaluate_model
from fedhet.engine.protocol import (
    LR_KEY,
    ClientData,
    ClientState,
    FederationInfo,
    Reply,
    Strategy,
    TrainContext,
    Trainer,
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
    """Run one experiment in-process: ``Simulation(cfg, strategy, run_dir=...).run()`` returns the summary.

    The server side (``strategy``) and the clients (one ``trainer``, each client's state and data) meet
    only through messages: a round-0 describe exchange, then per round the instructions of
    ``strategy.configure`` and the clients' replies from :func:`~fedhet.engine.client.run_client`.
    ``reference_contributions`` are the per-client standalone accuracies (fairness metrics, and the input
    of methods that require them); ``fedhet.experiment`` computes them with a cached pre-pass.
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        strategy: Strategy,
        *,
        run_dir: str | os.PathLike | None = None,
        trainer: Trainer | None = None,
        progress: Callable[..., None] | None = None,
        resume: bool = False,
        reference_contributions: Sequence[float] | np.ndarray | None = None,
    ) -> None:
        self.cfg = cfg
        self.strategy = strategy
        self.trainer = trainer if trainer is not None else strategy.trainer_class()
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.progress = progress
        self.resume = resume
        self.reference = (
            None if reference_contributions is None else np.asarray(reference_contributions, dtype=np.float64)
        )

    # -- set-up -------------------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg, strategy = self.cfg, self.strategy
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        self.device = resolve_device(cfg.train.device)
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
        self.work_model = model_factory()
        self.rare_classes = list(self.fed.info.get("rare_classes", [])) or None
        self._check_inputs()
        self.info = FederationInfo(
            model=model,
            num_clients=cfg.data.clients,
            num_classes=ds.num_classes,
            input_shape=tuple(ds.input_shape),
            rounds=cfg.train.rounds,
            seed=cfg.seed,
            rng=derived_rng(cfg.seed, "strategy"),
            device=self.device,
            eval_batch_size=cfg.eval.batch_size,
            validation=self.fed.validation,
            reference_contributions=self.reference,
        )
        strategy.setup(self.info)
        self.client_states = {cid: ClientState() for cid in range(cfg.data.clients)}
        #: Memory every client of this run shares: offered by the simulation only (simulation-only quirks).
        self.shared: dict[str, Any] = {}
        strategy.receive_descriptions(self.describe_clients())
        self.history: list[dict[str, Any]] = []
        self.timings: list[dict[str, float]] = []
        self.start_round = 1

    def _check_inputs(self) -> None:
        """The declared inputs are present: a validation split, reference contributions (one per client)."""
        cfg, name = self.cfg, self.strategy.name
        needs = self.strategy.requirements()
        if "validation" in needs and self.fed.validation is None:
            raise ConfigError(
                f"method {name!r} needs a server validation set and the run holds none; set "
                "data.validation_fraction (e.g. --set data.validation_fraction=0.1)"
            )
        ref = self.reference
        if "reference_contributions" in needs and ref is None:
            raise ConfigError(
                f"method {name!r} needs reference contributions (the clients' standalone accuracies); run it "
                "through fedhet.experiment.run_experiment (fedhet run/compare), which computes them"
            )
        if ref is not None and (ref.shape != (cfg.data.clients,) or not np.all(np.isfinite(ref))):
            raise ConfigError(
                f"reference contributions {ref.tolist()} must hold one finite value per client "
                f"({cfg.data.clients}); a standalone pre-pass in which some client never trained gives none "
                "(raise train.rounds or train.clients_per_round, or delete the standalone cache FEDHET_CACHE)"
            )
        if cfg.eval.fairness is True and ref is None and not self.strategy.rewards_are_reference:
            raise ConfigError(
                "eval.fairness=true needs the standalone accuracies; run through fedhet.experiment."
                "run_experiment (fedhet run/compare), which computes them, or pass reference_contributions"
            )

    def describe_clients(self) -> dict[int, Reply]:
        """The round-0 exchange: every client's self-reported sample and class counts (validated)."""
        out: dict[int, Reply] = {}
        for cid in range(self.cfg.data.clients):
            ctx = self._train_context(0, cid)
            reply, _ = run_client(
                self.trainer, describe_instruction(), self.client_states[cid], self.fed.clients[cid], ctx
            )
            try:
                check_description(cid, reply, self.fed.num_classes)
            except ClientUpdateError as exc:
                log.warning("round 0: rejected the description of client %d: %s", cid, exc)
                continue
            out[cid] = reply
        return out

    def _train_context(self, rnd: int, cid: int) -> TrainContext:
        return TrainContext(
            round=rnd,
            generator=derived_torch_generator(self.cfg.seed, "client", rnd, cid),
            device=self.device,
            train=self.cfg.train,
            model=self.work_model,
            shared=self.shared,
        )

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
            ins.config[LR_KEY] = lr
            reply, self.client_states[cid] = run_client(
                self.trainer,
                ins,
                self.client_states[cid],
                self.fed.clients[cid],
                self._train_context(rnd, cid),
            )
            try:
                check_reply(cid, reply, reference)
            except ClientUpdateError as exc:
                log.warning("round %d: rejected the update of client %d: %s", rnd, cid, exc)
                rejected[cid] = str(exc)
                continue
            replies[cid] = reply
            if "train_loss" in reply.metrics and math.isfinite(reply.metrics["train_loss"]):
                losses.append(reply.metrics["train_loss"])
                weights.append(max(reply.num_examples, 1))
        self.strategy.before_aggregate(rnd, replies)
        self.strategy.aggregate(rnd, replies)
        self.strategy.after_aggregate(rnd, replies)
        line: dict[str, Any] = {"round": rnd, "lr": lr, "clients": sorted(replies)}
        if dropped:
            line["dropped"] = dropped
        if rejected:
            line["rejected"] = {str(k): v for k, v in rejected.items()}
        if losses:
            line["train_loss"] = float(np.average(losses, weights=weights))
        return line

    # -- evaluation -------------------------------------------------------------------------------------
    @property
    def fairness_reference(self) -> np.ndarray | None:
        """The standalone accuracies fairness is measured against, or None when fairness is off."""
        if self.cfg.eval.fairness is False or self.strategy.rewards_are_reference:
            return None
        return self.reference

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
        reference = self.fairness_reference
        if rewards is not None:
            out["rewards"] = [float(r) for r in rewards]
            if model is None:  # e.g. Standalone: report the clients' mean accuracy
                finite = [r for r in rewards if math.isfinite(r)]
                out["accuracy"] = float(np.mean(finite)) if finite else float("nan")
            if reference is not None and np.all(np.isfinite(rewards)):
                out["fairness_pearson"] = M.fairness(reference, rewards, "pearson")
                out["fairness_spearman"] = M.fairness(reference, rewards, "spearman")
                out["bcf_rate"] = M.bcf_rate(reference, rewards, cfg.eval.bcf_alpha)
                out["bcf_rate_code"] = M.bcf_rate_fedrac_code(reference, rewards, cfg.eval.bcf_alpha)
                out["ipr"] = M.incentivized_participation_rate(reference, rewards)
        contrib = self.strategy.contributions()
        if contrib is not None and reference is not None:
            out["contribution_fairness_pearson"] = M.fairness(contrib, reference, "pearson")
        return out

    # -- checkpoints ------------------------------------------------------------------------------------
    def save(self, rnd: int) -> None:
        if self.run_dir is None:
            return
        clients = {
            str(cid): {"weights": st.weights, "values": st.values}
            for cid, st in self.client_states.items()
            if st.weights is not None or st.values
        }
        state = {
            "round": rnd,
            "strategy": self.strategy.state_dict(),
            "clients": clients,
            "strategy_rng": self.info.rng.bit_generator.state,
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
            self.client_states[int(cid)] = ClientState(weights=st["weights"], values=dict(st["values"]))
        self.info.rng.bit_generator.state = state["strategy_rng"]
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
            if self.fairness_reference is not None:
                (self.run_dir / "standalone.json").write_text(json.dumps(list(map(float, self.reference))))
            (self.run_dir / RECORDS_FILE).write_text(json.dumps(_jsonable(self.strategy.run_records())))
            from fedhet.report.artifacts import write_run_artifacts

            write_run_artifacts(self.run_dir)
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
        reference = self.fairness_reference
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
            "standalone": [float(s) for s in reference] if reference is not None else None,
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


#: The run directory's file of method records (``Strategy.run_records``), read by the report layer.
RECORDS_FILE = "records.json"


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
