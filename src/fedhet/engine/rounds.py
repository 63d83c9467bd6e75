"""The round loop: the server side of a run, whatever carries its messages to the clients.

:class:`RoundLoop` does what a fedhet server does each round — sample clients, ``strategy.configure``,
send the instructions through a :class:`Transport`, validate the replies at the boundary, run the
strategy's aggregation hooks, evaluate, write ``metrics.jsonl`` and checkpoints — and knows nothing of where
the clients run. The embedded simulation (``fedhet.engine.simulation``) gives it clients in this process;
the Flower adapter (``fedhet.flower``) gives it Flower's Grid. The same config and seed then give the same
``metrics.jsonl``.

What it draws on: ``schedule`` (device, learning rate, sampled and dropped clients), ``boundary`` and
``guards`` (which replies are used), ``evaluation``, ``records`` (the run directory's files and the
summary), ``checkpoint`` and ``warm_start`` (``model.init_from``). What a caller makes of a run besides its
records (TensorBoard scalars, the run's CSVs and figures, built by report/) it passes in as RoundListeners.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedhet.attacks import check_attacks
from fedhet.code_version import commit, results_stamp
from fedhet.config import ExperimentConfig, to_toml
from fedhet.contributions.tracker import RoundEstimates
from fedhet.engine import checkpoint as ckpt
from fedhet.engine.alignment import update_alignment
from fedhet.engine.boundary import accept_descriptions, accept_replies, check_inputs, check_transport
from fedhet.engine.convergence import still_learning
from fedhet.engine.evaluation import accuracies_of_states, evaluate_round
from fedhet.engine.faults import coordinated_attack
from fedhet.engine.guards import (
    clip_updates,
    guard_updates,
    model_is_finite,
    model_norm,
    nothing_trained_message,
    update_cosines,
    update_norms,
)
from fedhet.engine.protocol import LR_KEY, FederationInfo, Reply, Strategy, Transport
from fedhet.engine.records import jsonable, read_rounds, run_summary, write_partition, zero_lost_clients
from fedhet.engine.rundir import (
    CONFIG_FILE,
    METRICS_FILE,
    RECORDS_FILE,
    SUMMARY_FILE,
    TIMINGS_FILE,
    claim_run_dir,
    write_atomic,
)
from fedhet.engine.schedule import (
    dropped_clients,
    evaluates,
    learning_rate,
    participants,
    resolve_device,
    sample_clients,
)
from fedhet.engine.seeds import derived_rng, model_seed
from fedhet.engine.warm_start import WARM_START_FILE, recorded_warm_start, warm_start_weights
from fedhet.engine.weights import snapshot_state, weights_digest
from fedhet.errors import CheckpointError, ConfigError, RunInterrupted, TrainingDivergedError
from fedhet.models.registry import check_model_contract

log = logging.getLogger("fedhet")


@functools.lru_cache(maxsize=1)
def process_commit() -> str:
    """The commit of the code this process runs, read once, at its first run (near when it imported the
    code): a tree edited or committed while it works, or by the time a summary is written, is not credited
    to its runs, nor to later runs of a long-lived process (a notebook). Modules reloaded in place are not
    seen. ``compare --jobs`` starts a process per cell, so each cell reads its own."""
    return commit()


class RoundListener:
    """Told of a run as it goes, for what the caller makes of it besides the run directory's records:
    TensorBoard scalars and the run's CSVs and figures (report/'s ``listeners`` module, passed in by
    ``fedhet.experiment.make_simulation`` and the Flower server app). Every hook does nothing by default."""

    def start(self, run_dir: Path | None) -> None:
        """Before the first round this process runs (set-up done, a resumed run restored)."""

    def round_done(self, rnd: int, line: Mapping[str, Any]) -> None:
        """Round ``rnd`` is over: its ``metrics.jsonl`` line written and its checkpoint saved."""

    def finished(self, summary: Mapping[str, Any]) -> None:
        """``summary.json`` and ``records.json`` are written (a run stopped as diverged too)."""

    def close(self) -> None:
        """The run is over, however it ended (an error included)."""


# --------------------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------------------
class StopAfterRound:
    """Within the ``with`` block (in the main thread), a first Ctrl-C (SIGINT) only sets ``requested`` and
    says so; a second one raises KeyboardInterrupt at once. Elsewhere (a Flower ServerApp's thread) Ctrl-C
    keeps its default behaviour."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> StopAfterRound:
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is (
            signal.default_int_handler
        ):
            self._previous = signal.signal(signal.SIGINT, self._first)
        return self

    def _first(self, signum: int, frame: Any) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the next Ctrl-C stops at once
        print(
            "fedhet: stopping after the round in progress (it is saved, nothing is lost); Ctrl-C again to "
            "stop at once",
            file=sys.stderr,
            flush=True,
        )

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


class RoundLoop:
    """The server side of one experiment: ``RoundLoop(cfg, strategy, ...).run()`` returns the summary.

    Subclasses provide the data the server evaluates on (:meth:`build_data`: the test set, the server's
    validation split, the partition for the run directory) and the transport (:meth:`make_transport`).
    ``reference_contributions`` are the per-client standalone accuracies (fairness metrics, and the input of
    methods that require them); ``fedhet.experiment`` computes them with a cached pre-pass. ``listeners``
    are told of every round and of the end of the run (:class:`RoundListener`).
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
        listeners: Sequence[RoundListener] = (),
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
        self.listeners = list(listeners)

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
        check_attacks(cfg.faults)  # every named attack and its parameters, before any data or training
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
        check_inputs(strategy, cfg, self.fed.validation, self.reference)
        #: The estimators of eval.contribution_estimators, run after each aggregation (None: none named).
        self.estimates = RoundEstimates.for_run(
            cfg, strategy, self.fed.validation, self.template, len(sample_clients(cfg, 1)),
            evaluate=accuracies_of_states, rng=functools.partial(derived_rng, cfg.seed, "estimates")
        )  # fmt: skip
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
            aggregation=asdict(cfg.aggregation),
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

    @property
    def who(self) -> str:
        """Which run a log line is about (a comparison logs many): its method and seed."""
        return f"{self.cfg.method.name} seed {self.cfg.seed}"

    def client(self, cid: int) -> str:
        """A client as a log line names it: its number, and its site's name where the data name sites."""
        return f"client {self.fed.names.client(cid)}"

    def describe_clients(self) -> dict[int, Reply]:
        """The round-0 exchange: every client's self-reported sample and class counts (validated)."""
        replies, failures = self.transport.describe(participants(self.cfg))
        for cid, reason in sorted(failures.items()):
            log.warning("%s, round 0: %s sent no description: %s", self.who, self.client(cid), reason)
        accepted, rejected = accept_descriptions(
            replies, self.fed.num_classes, self.cfg.guards.max_num_examples
        )
        for cid, reason in rejected.items():
            log.warning("%s, round 0: rejected the description of %s: %s", self.who, self.client(cid), reason)
        self.descriptions = accepted  # summary.json keeps their class counts (the audit's holders of a class)
        return accepted

    # -- one round --------------------------------------------------------------------------------------
    def train_round(self, rnd: int) -> dict[str, Any]:
        """Round ``rnd`` up to its aggregation; returns its metrics line, without the evaluation."""
        cfg = self.cfg
        lr = learning_rate(cfg, rnd)
        ids = sample_clients(cfg, rnd)
        dropped = dropped_clients(cfg, rnd, ids)
        instructions = self.strategy.configure(rnd, ids)
        outgoing = {cid: ins for cid, ins in sorted(instructions.items()) if cid not in dropped}
        for ins in outgoing.values():
            ins.config[LR_KEY] = lr
        received, failures = self.transport.send(rnd, outgoing)
        replies, rejected = accept_replies(received, self.template.state_dict())
        # the scale of the model the round started from: the update-norm guard's floor (and the adaptive
        # adversary's, which aims just below the guard's bound); not measured while that guard is off
        guard = cfg.guards
        floored = (guard.update_norm_factor or guard.update_norm_clip) and guard.update_norm_floor
        global_norm = model_norm(self.strategy.global_model()) if floored else None
        # -- [faults] the coordinated adversary (fedhet.attacks of kind coordinated; fedhet.engine.faults) -
        # Its colluders replace their replies with the round's honest updates in view, after the boundary and
        # before the guards and the aggregation; the same step on every transport. Nothing without [faults].
        if cfg.faults.clients:
            uploads = self.strategy.trainer_class.uploads_updates
            replies = coordinated_attack(cfg, rnd, replies, outgoing, uploads, global_norm)
        # -- end of the coordinated adversary -----------------------------------------------------------
        # ‖w_i − w_sent‖ of each well-formed reply: the guards judge by it; the audit reads it (stale)
        uploads = self.strategy.trainer_class.uploads_updates
        norms = update_norms(replies, outgoing, uploads)
        # cos(Δ_i, the round's median Δ): only when the direction guard is on (it stacks every update)
        cosines = (
            update_cosines(replies, outgoing, uploads) if cfg.guards.min_update_cosine is not None else {}
        )
        guarded = guard_updates(
            replies, outgoing, cfg.guards, norms, cosines=cosines, global_norm=global_norm
        )
        for cid in guarded:
            del replies[cid]
        rejected.update(guarded)
        for cid, reason in sorted(rejected.items()):
            log.warning(
                "%s, round %d: rejected the update of %s: %s", self.who, rnd, self.client(cid), reason
            )
        # bound what each kept update can move (guards.update_norm_clip); measured on what was sent
        replies, clipped = clip_updates(replies, outgoing, cfg.guards, norms, uploads, global_norm)
        for cid, scale in sorted(clipped.items()):
            log.info(
                "%s, round %d: clipped the update of %s to %.3g of its norm",
                self.who,
                rnd,
                self.client(cid),
                scale,
            )
        for cid, reason in sorted(failures.items()):
            log.warning("%s, round %d: %s failed: %s", self.who, rnd, self.client(cid), reason)
        # cos(Δ_i, Σ of the other kept updates): recorded for the audit's free-rider finding, read by nothing
        alignment, aligned_size = update_alignment(replies, outgoing, uploads)
        self._count_unusable_rounds(rnd, replies, failures, rejected)
        # The strategy's state before this round, to undo an aggregate that turns the global model
        # non-finite (finite updates can still overflow); one copy of the server's state per round.
        snapshot = snapshot_state(self.strategy.state_dict()) if cfg.guards.rollback_non_finite else None
        start = self.estimates.start_weights(self.strategy) if self.estimates else None  # w_t, copied
        self.strategy.before_aggregate(rnd, replies)
        self.strategy.aggregate(rnd, replies)
        self.strategy.after_aggregate(rnd, replies)
        rolled_back = snapshot is not None and not model_is_finite(self.strategy.global_model())
        if rolled_back:
            log.warning("round %d: the aggregated global model is not finite; the round is undone", rnd)
            self.strategy.load_state_dict(snapshot)
        # a reply may name no train_loss (a user's own ClientApp): the mean is over those that do
        losses = [(r.metrics.get("train_loss"), max(r.num_examples, 1)) for r in replies.values()]
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
        if clipped:
            line["clipped"] = {str(c): v for c, v in sorted(clipped.items())}
        if norms:
            line["update_norms"] = {str(c): v for c, v in norms.items()}
        if cosines:
            line["update_cosines"] = {str(c): v for c, v in cosines.items()}
        if alignment:
            line["update_alignment"] = {str(c): v for c, v in alignment.items()}
            line["update_alignment_size"] = aligned_size
        if losses:
            line["train_loss"] = float(np.average([v for v, _ in losses], weights=[n for _, n in losses]))
        if self.estimates:  # the values of the replies aggregated (none in a round undone)
            line.update(self.estimates.round(rnd, start, {} if rolled_back else replies))
        return line

    def _count_unusable_rounds(
        self, rnd: int, replies: Mapping[int, Reply], failed: Mapping[int, str], rejected: Mapping[int, str]
    ) -> None:
        """Stop the run when every reply of ``guards.max_all_rejected_rounds`` consecutive rounds (or of
        every round of a shorter run) was rejected or never came (``failed``, ``rejected``: client → reason):
        it would otherwise exit 0 having trained nothing (e.g. a train.lr that overflows)."""
        limit = self.cfg.guards.max_all_rejected_rounds
        self.unusable_rounds = self.unusable_rounds + 1 if (failed or rejected) and not replies else 0
        whole_run = rnd == self.cfg.train.rounds and self.unusable_rounds == rnd
        if limit and (self.unusable_rounds >= limit or whole_run):
            rounds = f"{rnd - self.unusable_rounds + 1}..{rnd}"
            raise TrainingDivergedError(
                nothing_trained_message(rounds, failed, rejected, self.client), round=rnd
            )

    # -- evaluation -------------------------------------------------------------------------------------
    @property
    def fairness_reference(self) -> np.ndarray | None:
        """The standalone accuracies fairness is measured against, or None when fairness is off."""
        if self.cfg.eval.fairness is False or self.strategy.rewards_are_reference:
            return None
        return self.reference

    def evaluate(self, rnd: int) -> dict[str, Any]:
        """The evaluation part of round ``rnd``'s metrics line (``fedhet.engine.evaluation``)."""
        fed = self.fed
        return evaluate_round(
            self.strategy,
            fed.test_x,
            fed.test_y,
            fed.num_classes,
            self.cfg.eval,
            rare_classes=self.rare_classes,
            reference=self.fairness_reference,
        )

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
        self.checkpoint_round = rnd

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
                f"resume with the run's own {CONFIG_FILE} or start a new run directory"
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
        self.checkpoint_round = int(state["round"])
        self.history = read_rounds(self.run_dir / METRICS_FILE, int(state["round"]))
        self.timings = read_rounds(self.run_dir / TIMINGS_FILE, int(state["round"]))
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
                (self.run_dir / METRICS_FILE).write_text("")
                (self.run_dir / TIMINGS_FILE).write_text("")
            # A run counts as finished only once its summary is written.
            (self.run_dir / SUMMARY_FILE).unlink(missing_ok=True)
            write_atomic(self.run_dir / CONFIG_FILE, to_toml(cfg))
            if self.warm_start is not None:
                write_atomic(self.run_dir / WARM_START_FILE, json.dumps(self.warm_start, indent=2))
            write_partition(self.run_dir, self.fed)
        # a stretch of rounds per commit and results stamp: a record of the run is reused only where every
        # stretch ran under the stamp of the code at hand (fedhet.reproduce.store)
        here = {"commit": process_commit(), "results": results_stamp(type(self.strategy))}
        if not self.code_commits or any(self.code_commits[-1].get(k) != v for k, v in here.items()):
            self.code_commits.append({**here, "from_round": self.start_round})
        try:
            for listener in self.listeners:
                listener.start(self.run_dir)
            self._train_rounds()
        except TrainingDivergedError as exc:
            exc.summary = self._finish(t0, diverged=exc)
            raise
        else:
            return self._finish(t0)
        finally:
            for listener in self.listeners:
                listener.close()

    def _finish(self, t0: float, diverged: TrainingDivergedError | None = None) -> dict[str, Any]:
        """The summary, written with the records (listeners then make figures of them). A run stopped by
        ``diverged`` ends the same way, marked ``diverged``: what it ends with is a result (a method that
        diverges, deterministically under its seed), so a comparison reports it and reuses it rather than
        rerunning it. Its final view is the global model evaluated at the stop (no update of the last rounds
        could be used); metrics.jsonl keeps only the rounds that completed."""
        if diverged is not None:
            self.history.append({"round": diverged.round, **self.evaluate(diverged.round)})
        summary = self.summary(time.perf_counter() - t0)
        if diverged is not None:
            summary["diverged"] = {"round": diverged.round, "reason": str(diverged)}
        elif note := still_learning(self.history):  # a warning only: it changes nothing recorded
            log.warning("%s: %s", self.who, note)
        if self.run_dir is not None:
            if self.fairness_reference is not None:
                write_atomic(self.run_dir / "standalone.json", json.dumps(list(map(float, self.reference))))
            write_atomic(self.run_dir / RECORDS_FILE, json.dumps(jsonable(self.strategy.run_records())))
            # A run counts as finished once its summary exists (compare's reuse, run_dir_state); figures
            # and CSVs are derived from it and the records (the listeners; `fedhet report` rebuilds them).
            write_atomic(self.run_dir / SUMMARY_FILE, json.dumps(jsonable(summary), indent=2))
        for listener in self.listeners:
            listener.finished(summary)
        return summary

    def _train_rounds(self) -> None:
        """Rounds start_round..rounds: train, evaluate, record (metrics.jsonl), checkpoint, tell listeners.

        A first Ctrl-C lets the round in progress finish, saves it (a checkpoint of that round) and stops with
        :class:`RunInterrupted`; a resumed run continues after it, losing nothing. A second Ctrl-C stops at
        once: the round in progress is lost and resuming repeats the rounds after the last checkpoint."""
        rnd = self.start_round
        try:
            with StopAfterRound() as stop:
                for rnd in range(self.start_round, self.cfg.train.rounds + 1):
                    self._one_round(rnd)
                    if stop.requested and rnd < self.cfg.train.rounds:
                        if getattr(self, "checkpoint_round", None) != rnd:
                            self.save(rnd)
                        raise RunInterrupted(rnd, getattr(self, "checkpoint_round", None), self.run_dir, True)
        except RunInterrupted:
            raise
        except KeyboardInterrupt:
            raise RunInterrupted(rnd, getattr(self, "checkpoint_round", None), self.run_dir) from None

    def _one_round(self, rnd: int) -> None:
        cfg = self.cfg
        tr = time.perf_counter()
        line = self.train_round(rnd)
        timing = {"round": rnd, "train_s": time.perf_counter() - tr, **self.transport.round_timing()}
        if self.estimates:  # within train_s
            timing["estimates_s"] = self.estimates.seconds
        if evaluates(cfg, rnd):
            te = time.perf_counter()
            line.update(self.evaluate(rnd))
            timing["eval_s"] = time.perf_counter() - te
        line.update(self.strategy.round_metrics(rnd))
        zero_lost_clients(line)
        self.history.append(line)
        self.timings.append(timing)
        if self.run_dir is not None:
            # Timings live apart from metrics.jsonl, which is bit-identical across runs with one seed.
            with open(self.run_dir / METRICS_FILE, "a") as fh:
                fh.write(json.dumps(jsonable(line)) + "\n")
            with open(self.run_dir / TIMINGS_FILE, "a") as fh:
                fh.write(json.dumps(timing) + "\n")
            every = cfg.eval.checkpoint_every
            if rnd == cfg.train.rounds or (every and rnd % every == 0):
                self.save(rnd)
        for listener in self.listeners:
            listener.round_done(rnd, line)
        if self.progress is not None:
            self.progress(rnd, cfg.train.rounds, line)

    def summary(self, wall: float) -> dict[str, Any]:
        """The run's ``summary.json`` from its metrics lines so far (``fedhet.engine.records``; estimates)."""
        summary = run_summary(
            self.cfg,
            self.history,
            run_dir=self.run_dir,
            federation=self.fed,
            contributions=self.strategy.contributions(),
            standalone=self.fairness_reference,
            wall=wall,
            commit=self.code_commits[-1]["commit"] if self.code_commits else process_commit(),
            code_commits=self.code_commits,
            descriptions=self.descriptions,
        )
        if self.estimates:
            summary["estimates"] = self.estimates.sums(self.history)
        return summary
