"""The round loop: the server side of a run, whatever carries its messages to the clients.

:class:`RoundLoop` does what a fedhet server does each round — sample clients, ``strategy.configure``,
send the instructions through a :class:`Transport`, validate the replies at the boundary, run the
strategy's aggregation hooks, evaluate, write ``metrics.jsonl`` and checkpoints — and knows nothing of where
the clients run. The embedded simulation (``fedhet.engine.simulation``) gives it clients in this process;
the Flower adapter (``fedhet.flower``) gives it Flower's Grid. The same config and seed then give the same
``metrics.jsonl``.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedhet import metrics as M
from fedhet.config import ExperimentConfig, to_toml
from fedhet.engine import checkpoint as ckpt
from fedhet.engine.boundary import check_description, check_reply, check_transport
from fedhet.engine.evaluation import evaluate_model
from fedhet.engine.guards import guard_updates, model_is_finite, update_norms
from fedhet.engine.protocol import LR_KEY, FederationInfo, Instruction, Reply, Strategy
from fedhet.engine.rundir import claim_run_dir, write_atomic
from fedhet.engine.seeds import derived_rng, model_seed
from fedhet.engine.weights import snapshot_state, weights_digest
from fedhet.errors import CheckpointError, ClientUpdateError, ConfigError, TrainingDivergedError
from fedhet.models.registry import check_model_contract
from fedhet.report.provenance import commit

log = logging.getLogger("fedhet")


def resolve_device(name: str) -> torch.device:
    """The torch device of ``train.device``: ``auto`` takes CUDA when present."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device='cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    return torch.device(name)


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


@functools.lru_cache(maxsize=1)
def process_commit() -> str:
    """The commit of the code this process runs, read once, at its first run (near when it imported the
    code): a tree edited or committed while it works, or by the time a summary is written, is not credited
    to its runs, nor to later runs of a long-lived process (a notebook). Modules reloaded in place are not
    seen. ``compare --jobs`` starts a process per cell, so each cell reads its own."""
    return commit()


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


#: A run started from another run's model (``model.init_from``) records here which weights it started from.
WARM_START_FILE = "warm_start.json"


def _source_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The latest checkpoint of the run in ``run_dir`` (None: no such run, or no checkpoint yet)."""
    return ckpt.latest_checkpoint(run_dir) if Path(run_dir).is_dir() else None


@functools.lru_cache(maxsize=4)  # a few sources per table; a ResNet-18 model is 45 MB
def _checkpoint_model(path: Path, written: tuple[int, int]) -> dict[str, Tensor] | None:
    """The server model saved in checkpoint ``path``, cached per writing of it (``written``: its record's
    inode and mtime, both new when a checkpoint is rewritten) because planning a table of warm-started cells
    asks for the same source several times per cell."""
    weights = ckpt.load_checkpoint(path)["strategy"].get("model")
    return weights if isinstance(weights, dict) else None


def _source_model(path: Path) -> dict[str, Tensor] | None:
    record = (path / ckpt.STATE_FILE).stat()
    return _checkpoint_model(path, (record.st_ino, record.st_mtime_ns))


def warm_start_digest(run_dir: str | os.PathLike) -> str | None:
    """The digest of the model a run started from ``run_dir`` would load now, or None without a checkpoint."""
    path = _source_checkpoint(run_dir)
    weights = _source_model(path) if path is not None else None
    return weights_digest(weights) if weights is not None else None


def recorded_warm_start(run_dir: str | os.PathLike) -> str | None:
    """The digest of the weights the run in ``run_dir`` recorded it started from (None: not recorded)."""
    path = Path(run_dir) / WARM_START_FILE
    try:
        return str(json.loads(path.read_text())["digest"]) if path.is_file() else None
    except (json.JSONDecodeError, KeyError, TypeError):
        return None


def warm_start_weights(run_dir: str | os.PathLike, model: nn.Module) -> dict[str, Tensor]:
    """The final global model of the run in ``run_dir`` (its latest checkpoint), checked against ``model``
    (``model.init_from``: e.g. the labeled-only warm start of the gated FSSL protocol)."""
    path = _source_checkpoint(run_dir)
    if path is None:
        raise ConfigError(
            f"model.init_from={str(run_dir)!r} holds no checkpoint; point it at a finished run directory "
            "(run it first, with eval.checkpoint_every >= 0: the last round is always saved)"
        )
    if not (Path(run_dir) / "summary.json").is_file():
        log.warning(
            "model.init_from: %s has not finished; starting from its checkpoint %s", run_dir, path.name
        )
    weights = _source_model(path)
    expected = model.state_dict()
    if weights is None or set(weights) != set(expected):
        raise ConfigError(
            f"model.init_from={str(run_dir)!r}: its model has other parameters than this run's "
            f"{type(model).__name__}; use a run of the same model.name and model.params"
        )
    wrong = [k for k in expected if tuple(weights[k].shape) != tuple(expected[k].shape)]
    if wrong:
        raise ConfigError(
            f"model.init_from={str(run_dir)!r}: shapes differ for {wrong[:3]}; use a run of the same model"
        )
    # copies: the cached source weights must not alias the model they initialise
    return {k: v.to(expected[k].device, expected[k].dtype, copy=True) for k, v in weights.items()}


# --------------------------------------------------------------------------------------------------------
# Transports
# --------------------------------------------------------------------------------------------------------
#: Client id -> what went wrong, for clients whose reply never came (a crash, a timeout, a lost node).
Failures = dict[int, str]


class Transport(ABC):
    """Carries instructions to clients and their replies back; holds no algorithm."""

    #: ``simulation`` (clients in this process, with memory they may share) or the name of another transport.
    name: str = "simulation"

    @abstractmethod
    def describe(self, client_ids: Sequence[int]) -> tuple[dict[int, Reply], Failures]:
        """The round-0 exchange: every client's description (sample and class counts)."""

    @abstractmethod
    def send(self, rnd: int, instructions: dict[int, Instruction]) -> tuple[dict[int, Reply], Failures]:
        """One round: each instruction to its client; the replies that came back, and the failures."""

    def round_timing(self) -> dict[str, float]:
        """Seconds of the last :meth:`send`'s parts, for ``timings.jsonl`` (none by default)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What the transport holds for its clients (their states, in the simulation), for checkpoints."""
        return {}

    def load_state_dict(self, sd: dict[str, Any]) -> None:  # noqa: B027 (nothing to restore by default)
        """Inverse of :meth:`state_dict`."""


def _read_rounds(path: Path, last_round: int) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` up to ``last_round``, rewritten to the file; lines that do not parse (a
    write torn by a kill) are dropped with a warning."""
    if not path.is_file():
        return []
    kept: list[dict[str, Any]] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            log.warning("%s line %d is torn (not JSON): dropped, its round is run again", path, number)
            continue
        if isinstance(record, dict) and int(record.get("round", last_round + 1)) <= last_round:
            kept.append(record)
    write_atomic(path, "".join(json.dumps(h) + "\n" for h in kept))
    return kept


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


# --------------------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------------------
class RoundLoop:
    """The server side of one experiment: ``RoundLoop(cfg, strategy, ...).run()`` returns the summary.

    Subclasses provide the data the server evaluates on (:meth:`build_data`: the test set, the server's
    validation split, the partition for the run directory) and the transport (:meth:`make_transport`).
    ``reference_contributions`` are the per-client standalone accuracies (fairness metrics, and the input of
    methods that require them); ``fedhet.experiment`` computes them with a cached pre-pass.
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        strategy: Strategy,
        *,
        run_dir: str | os.PathLike | None = None,
        progress: Callable[..., None] | None = None,
        resume: bool = False,
        overwrite: bool = False,
        reference_contributions: Sequence[float] | np.ndarray | None = None,
    ) -> None:
        self.cfg = cfg
        self.strategy = strategy
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.progress = progress
        self.resume = resume
        #: Replace whatever ``run_dir`` holds; without it only an empty directory (or, with ``resume``, an
        #: unfinished run) is used, so that no finished run is lost (fedhet.engine.rundir).
        self.overwrite = overwrite
        self.reference = (
            None if reference_contributions is None else np.asarray(reference_contributions, dtype=np.float64)
        )

    # -- what subclasses provide ------------------------------------------------------------------------
    def build_data(self) -> Any:
        """The run's data as the server holds it (a ``Federation``: test set, validation, partition)."""
        raise NotImplementedError

    def make_transport(self) -> Transport:
        """The transport that reaches the clients (built after the strategy's set-up)."""
        raise NotImplementedError

    # -- set-up -------------------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg, strategy = self.cfg, self.strategy
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        self.device = resolve_device(cfg.train.device)
        self.fed = self.build_data()
        ds = self.fed.dataset
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(model_seed(cfg.seed))
            model = self.model_factory()
        check_model_contract(model, strategy.model_needs, strategy.name, cfg.model.name)
        self.warm_start: dict[str, str] | None = None
        if cfg.model.init_from:  # "{seed}" in the path: one warm start per seed
            source = cfg.model.init_from.format(seed=cfg.seed)
            weights = warm_start_weights(source, model)
            model.load_state_dict(weights)
            # Recorded so that a finished run is reused only while its warm start is unchanged.
            self.warm_start = {"init_from": source, "digest": weights_digest(weights)}
        #: A model of the run's architecture, whose state dict every reply is checked against.
        self.template = self.model_factory()
        self.rare_classes = list(self.fed.info.get("rare_classes", [])) or None
        self._check_inputs()
        needs = strategy.requirements()
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
            # A strategy sees only the inputs it declares: a data-free one cannot read the validation set
            # or the standalone accuracies, which the run may still hold for evaluation.
            validation=self.fed.validation if "validation" in needs else None,
            reference_contributions=self.reference if "reference_contributions" in needs else None,
        )
        strategy.setup(self.info)
        self.transport = self.make_transport()
        check_transport(strategy, self.transport.name)
        strategy.receive_descriptions(self.describe_clients())
        self.history: list[dict[str, Any]] = []
        self.timings: list[dict[str, float]] = []
        self.start_round = 1
        #: Consecutive rounds in which every reply was rejected (guards.max_all_rejected_rounds).
        self.unusable_rounds = 0
        #: The code each stretch of the run's rounds was computed with: [{"commit", "from_round"}], one entry
        #: per process that ran rounds under a different commit (a run resumed after a code change has two).
        self.code_commits: list[dict[str, Any]] = []

    def model_factory(self) -> nn.Module:
        """A fresh model of the run's architecture on the run's device."""
        from fedhet.models import build_model

        ds, m = self.fed.dataset, self.cfg.model
        return build_model(m.name, ds.input_shape, ds.num_classes, **m.params).to(self.device)

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
                f"({cfg.data.clients}); a standalone pre-pass in which some client never trained (never "
                "sampled, or every update rejected, e.g. non-finite with a too large train.lr) gives none: "
                "raise train.rounds or train.clients_per_round, or lower train.lr"
            )
        if cfg.eval.fairness is True and ref is None and not self.strategy.rewards_are_reference:
            raise ConfigError(
                "eval.fairness=true needs the standalone accuracies; run through fedhet.experiment."
                "run_experiment (fedhet run/compare), which computes them, or pass reference_contributions"
            )

    def describe_clients(self) -> dict[int, Reply]:
        """The round-0 exchange: every client's self-reported sample and class counts (validated)."""
        replies, failures = self.transport.describe(list(range(self.cfg.data.clients)))
        for cid, reason in sorted(failures.items()):
            log.warning("round 0: client %d sent no description: %s", cid, reason)
        out: dict[int, Reply] = {}
        for cid in sorted(replies):
            try:
                check_description(cid, replies[cid], self.fed.num_classes)
                bound = self.cfg.guards.max_num_examples
                if bound is not None and replies[cid].num_examples > bound:
                    raise ClientUpdateError(
                        f"client {cid} described num_examples={replies[cid].num_examples}, above "
                        f"guards.max_num_examples={bound}"
                    )
            except ClientUpdateError as exc:
                log.warning("round 0: rejected the description of client %d: %s", cid, exc)
                continue
            out[cid] = replies[cid]
        return out

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
        outgoing = {cid: ins for cid, ins in sorted(instructions.items()) if cid not in dropped}
        for ins in outgoing.values():
            ins.config[LR_KEY] = lr
        received, failures = self.transport.send(rnd, outgoing)
        replies: dict[int, Reply] = {}
        rejected: dict[int, str] = {}
        reference = self.template.state_dict()
        for cid in sorted(received):  # client-id order: results do not depend on arrival order
            try:
                check_reply(cid, received[cid], reference)
            except ClientUpdateError as exc:
                rejected[cid] = str(exc)
                continue
            replies[cid] = received[cid]
        # ‖w_i − w_sent‖ of each well-formed reply: the guards judge by it; the audit reads it (stale)
        norms = update_norms(replies, outgoing, self.strategy.replies_are_updates)
        guarded = guard_updates(replies, outgoing, cfg.guards, norms)
        for cid in guarded:
            del replies[cid]
        rejected.update(guarded)
        for cid, reason in sorted(rejected.items()):
            log.warning("round %d: rejected the update of client %d: %s", rnd, cid, reason)
        for cid, reason in sorted(failures.items()):
            log.warning("round %d: client %d failed: %s", rnd, cid, reason)
        self._count_unusable_rounds(rnd, replies, {**failures, **rejected})
        # The strategy's state before this round, to undo an aggregate that turns the global model
        # non-finite (finite updates can still overflow); one copy of the server's state per round.
        snapshot = snapshot_state(self.strategy.state_dict()) if cfg.guards.rollback_non_finite else None
        self.strategy.before_aggregate(rnd, replies)
        self.strategy.aggregate(rnd, replies)
        self.strategy.after_aggregate(rnd, replies)
        rolled_back = snapshot is not None and not model_is_finite(self.strategy.global_model())
        if rolled_back:
            log.warning("round %d: the aggregated global model is not finite; the round is undone", rnd)
            self.strategy.load_state_dict(snapshot)
        losses = [(r.metrics["train_loss"], max(r.num_examples, 1)) for r in replies.values()]
        losses = [(v, n) for v, n in losses if isinstance(v, float) and math.isfinite(v)]
        line: dict[str, Any] = {"round": rnd, "lr": lr, "clients": sorted(replies)}
        if dropped:
            line["dropped"] = dropped
        if rejected:
            line["rejected"] = {str(k): v for k, v in rejected.items()}
        if failures:
            line["failed"] = {str(k): v for k, v in sorted(failures.items())}
        if rolled_back:
            line["rolled_back"] = "the aggregated global model was not finite"
        if norms:
            line["update_norms"] = {str(c): v for c, v in norms.items()}
        if losses:
            line["train_loss"] = float(np.average([v for v, _ in losses], weights=[n for _, n in losses]))
        return line

    def _count_unusable_rounds(self, rnd: int, replies: Mapping[int, Reply], lost: Mapping[int, str]) -> None:
        """Stop the run when every reply of ``guards.max_all_rejected_rounds`` consecutive rounds (or of
        every round of a shorter run) was rejected or never came (``lost``: client → reason): it would
        otherwise exit 0 having trained nothing (e.g. a train.lr that overflows)."""
        limit = self.cfg.guards.max_all_rejected_rounds
        self.unusable_rounds = self.unusable_rounds + 1 if lost and not replies else 0
        whole_run = rnd == self.cfg.train.rounds and self.unusable_rounds == rnd
        if limit and (self.unusable_rounds >= limit or whole_run):
            cid, reason = min(lost.items())
            raise TrainingDivergedError(
                f"every update of rounds {rnd - self.unusable_rounds + 1}..{rnd} was rejected or failed "
                f"(e.g. client {cid}: {reason}); nothing is being trained. Lower train.lr or "
                "train.weight_decay if the updates are non-finite, or loosen [guards]; "
                "guards.max_all_rejected_rounds=0 never stops",
                round=rnd,
            )

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
            finite_rewards = [r for r in rewards if math.isfinite(r)]
            if finite_rewards:  # the best participant's model (CFFL's reference metric)
                out["best_reward_accuracy"] = float(max(finite_rewards))
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
        state = {
            "round": rnd,
            "strategy": self.strategy.state_dict(),
            "clients": self.transport.state_dict(),
            "strategy_rng": self.info.rng.bit_generator.state,
            "config_hash": self.cfg.run_fingerprint(),
            "unusable_rounds": self.unusable_rounds,
            "code_commits": self.code_commits,
        }
        ckpt.save_checkpoint(ckpt.checkpoint_dir(self.run_dir, rnd), state)
        ckpt.prune_checkpoints(self.run_dir, keep=2)

    def restore(self) -> bool:
        """Load the run directory's latest checkpoint; False when there is none."""
        state, path = None, None
        for path in ckpt.checkpoints(self.run_dir):  # newest first; an unreadable one falls back
            try:
                state = ckpt.load_checkpoint(path)
                break
            except CheckpointError as exc:
                log.warning("%s; trying the previous checkpoint", exc)
        if state is None:
            log.warning("no readable checkpoint in %s: starting from round 1", self.run_dir)
            return False
        if state.get("config_hash") != self.cfg.run_fingerprint():
            raise ConfigError(
                f"the checkpoint in {path} was written by a different configuration; "
                "resume with the run's own config.toml or start a new run directory"
            )
        recorded = recorded_warm_start(self.run_dir)
        if self.warm_start is not None and recorded is not None and recorded != self.warm_start["digest"]:
            raise ConfigError(
                f"{self.run_dir} started from other weights than model.init_from="
                f"{self.warm_start['init_from']!r} holds now (that run changed since); resume is refused: "
                "start a new run directory, or overwrite this one"
            )
        self.strategy.load_state_dict(state["strategy"])
        self.transport.load_state_dict(state["clients"])
        self.info.rng.bit_generator.state = state["strategy_rng"]
        self.start_round = int(state["round"]) + 1
        self.unusable_rounds = int(state.get("unusable_rounds", 0))
        self.code_commits = list(state.get("code_commits", []))  # none in checkpoints written before 12/2026
        # Lines after the checkpoint's round are dropped (they are run again), a torn last line included.
        self.history = _read_rounds(self.run_dir / "metrics.jsonl", int(state["round"]))
        self.timings = _read_rounds(self.run_dir / "timings.jsonl", int(state["round"]))
        log.info("resumed %s from round %d", self.run_dir, state["round"])
        return True

    # -- the loop ---------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run all rounds (resuming from the last checkpoint if asked) and return the summary.

        The run directory is claimed first (locked for the whole run; a finished, unfinished or foreign
        directory is refused unless ``resume``/``overwrite`` says otherwise), before any work is done.
        """
        t0 = time.perf_counter()
        lock = None
        if self.run_dir is not None:
            lock = claim_run_dir(self.run_dir, resume=self.resume, overwrite=self.overwrite)
        try:
            return self._run(t0)
        finally:
            if lock is not None:
                lock.release()

    def _run(self, t0: float) -> dict[str, Any]:
        self.setup()
        cfg = self.cfg
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if not (self.resume and self.restore()):
                (self.run_dir / "metrics.jsonl").write_text("")
                (self.run_dir / "timings.jsonl").write_text("")
            # A run counts as finished only once its summary is written.
            (self.run_dir / "summary.json").unlink(missing_ok=True)
            write_atomic(self.run_dir / "config.toml", to_toml(cfg))
            if self.warm_start is not None:
                write_atomic(self.run_dir / WARM_START_FILE, json.dumps(self.warm_start, indent=2))
            self._write_partition()
        here = process_commit()
        if not self.code_commits or self.code_commits[-1]["commit"] != here:
            self.code_commits.append({"commit": here, "from_round": self.start_round})
        from fedhet.report.tensorboard import TensorBoardLog  # lazily: reports import matplotlib

        tensorboard = TensorBoardLog(self.run_dir, cfg.eval.tensorboard)
        try:
            self._train_rounds(tensorboard)
        except TrainingDivergedError as exc:
            exc.summary = self._finish(t0, diverged=exc)
            raise
        finally:
            tensorboard.close()
        return self._finish(t0)

    def _finish(self, t0: float, diverged: TrainingDivergedError | None = None) -> dict[str, Any]:
        """The summary, written with the records and figures. A run stopped by ``diverged`` ends the same way,
        marked ``diverged``: what it ends with is a result (a method that diverges, deterministically under
        its seed), so a comparison reports it and reuses it rather than rerunning it. Its final view is the
        global model evaluated at the stop, the model the run would end with had it gone on (no update of
        the last rounds could be used); metrics.jsonl keeps only the rounds that completed."""
        if diverged is not None:
            self.history.append({"round": diverged.round, **self.evaluate(diverged.round)})
        summary = self.summary(time.perf_counter() - t0)
        if diverged is not None:
            summary["diverged"] = {"round": diverged.round, "reason": str(diverged)}
        if self.run_dir is not None:
            if self.fairness_reference is not None:
                write_atomic(self.run_dir / "standalone.json", json.dumps(list(map(float, self.reference))))
            write_atomic(self.run_dir / RECORDS_FILE, json.dumps(_jsonable(self.strategy.run_records())))
            # A run counts as finished once its summary exists (compare's reuse, run_dir_state); the
            # figures and CSVs are derived from it and the records, and can be rebuilt by `fedhet report`.
            write_atomic(self.run_dir / "summary.json", json.dumps(_jsonable(summary), indent=2))
            from fedhet.report.artifacts import write_run_artifacts

            write_run_artifacts(self.run_dir)
        return summary

    def _train_rounds(self, tensorboard: Any) -> None:
        """Rounds start_round..rounds: train, evaluate, record (metrics.jsonl, TensorBoard), checkpoint."""
        cfg = self.cfg
        for rnd in range(self.start_round, cfg.train.rounds + 1):
            tr = time.perf_counter()
            line = self.train_round(rnd)
            timing = {"round": rnd, "train_s": time.perf_counter() - tr, **self.transport.round_timing()}
            if rnd % cfg.eval.every == 0 or rnd == cfg.train.rounds:
                te = time.perf_counter()
                line.update(self.evaluate(rnd))
                timing["eval_s"] = time.perf_counter() - te
            line.update(self.strategy.round_metrics(rnd))
            lost = [int(c) for key in ("rejected", "failed") for c in line.get(key, {})]
            if "contributions" in line and lost:
                line["contributions"] = zero_rejected(line["contributions"], lost)
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
            tensorboard.write(rnd, line)
            if self.progress is not None:
                self.progress(rnd, cfg.train.rounds, line)

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
        final.update(free_rider_view(contrib, self.fed.info.get("free_rider")))
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
            # where the numbers came from (result pages cite it): the commit the last rounds ran at, and every
            # stretch of rounds with its own
            "fedhet_commit": self.code_commits[-1]["commit"] if self.code_commits else process_commit(),
            "fedhet_commits": self.code_commits,
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
    "best_reward_accuracy",
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
