"""What a fedhet ServerApp tells Flower's log: the lines ``flwr run --stream`` and ``flwr log`` show.

Flower 1.42 runs a ServerApp in its own process (``flwr-serverapp``, or the simulation's) whose stdout and
stderr it mirrors to the SuperLink's log store (``flower.supercore.logger.mirror_output_to_queue``); its own
``flwr`` logger writes to that stdout. fedhet's records are logged through the ``flwr`` logger, so they reach
the stream with Flower's ``INFO :`` / ``WARNING :`` / ``ERROR :`` prefixes: each round's line (round, accuracy
where evaluated, rejected and failed clients with their node), the contributions, the final metrics and the
absolute run folder at the end. A run that fails says only that (:func:`failure_lines`): the round it failed
in, the error, the run folder and how to continue it; Flower then marks the run ``finished:failed`` (``flwr
ls``), but ``flwr run --stream`` itself exits 0 whatever became of the run (Flower 1.42's ``start_stream``
prints the log until the SuperLink ends the stream and returns; no run status reaches its exit code).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from flwr.common.logger import log as flower_log

from fedhet.engine.rounds import RoundListener
from fedhet.errors import TrainingDivergedError, option

#: The metrics a round line shows, in this order, where the line has them.
ROUND_METRICS = ("accuracy", "balanced_accuracy", "loss", "train_loss")


def _percent(key: str, value: float) -> str:
    return f"{100 * value:.2f} %" if "accuracy" in key else f"{value:.4g}"


def round_text(rnd: int, rounds: int, line: Mapping[str, Any], client: Callable[[int], str]) -> str:
    """One round as the log shows it: ``round 2/3: accuracy 81.25 %, ..., clients 0, 1; failed: client 2
    (node 77): <reason>`` (``client`` names a client: ``client 2 (node 77)``)."""
    parts = [f"{k.replace('_', ' ')} {_percent(k, float(line[k]))}" for k in ROUND_METRICS if k in line]
    used = line.get("clients", [])
    parts.append(f"{len(used)} updates used (clients {', '.join(map(str, used)) or 'none'})")
    text = f"round {rnd}/{rounds}: " + ", ".join(parts)
    for what in ("rejected", "failed"):
        for cid, reason in sorted(line.get(what, {}).items(), key=lambda kv: int(kv[0])):
            first = str(reason).splitlines()[0] if str(reason) else ""
            text += f"; {what}: {client(int(cid))}: {first}"
    return text


def summary_lines(summary: Mapping[str, Any], client: Callable[[int], str]) -> list[str]:
    """The end of a run: its final metrics, the contributions (and rewards) per client, the run folder."""
    final = summary.get("final") or {}
    metrics = [f"{k.replace('_', ' ')} {_percent(k, float(v))}" for k, v in final.items() if _scalar(v)]
    out = [f"{summary.get('method')}: {summary.get('rounds')} rounds done; final " + ", ".join(metrics)]
    for key, label in (("contributions", "contributions"), ("rewards", "reward-model accuracy")):
        values = summary.get(key)
        if values is not None:
            cells = [
                f"{client(i)} {_percent('accuracy' if key == 'rewards' else key, float(v))}"
                for i, v in enumerate(values)
            ]
            out.append(f"{label}: " + ", ".join(cells))
    if summary.get("run_dir"):
        out.append(f"run folder: {summary['run_dir']}")
    return out


def _scalar(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class FlowerLogListener(RoundListener):
    """Writes each round's line and the end of the run to Flower's log (``client`` names a client)."""

    def __init__(self, rounds: int, client: Callable[[int], str]) -> None:
        self.rounds = rounds
        self.client = client

    def start(self, run_dir: Path | None) -> None:
        if run_dir is not None:
            flower_log(logging.INFO, "fedhet: writing the run folder %s", run_dir)

    def round_done(self, rnd: int, line: Mapping[str, Any]) -> None:
        level = logging.WARNING if line.get("failed") or line.get("rejected") else logging.INFO
        flower_log(level, "fedhet: %s", round_text(rnd, self.rounds, line, self.client))

    def finished(self, summary: Mapping[str, Any]) -> None:
        if summary.get("diverged"):  # the run fails: its failure lines say so, not "N rounds done"
            return
        for text in summary_lines(summary, self.client):
            flower_log(logging.INFO, "fedhet: %s", text)


class _ToFlower(logging.Handler):
    """Hands fedhet's log records to Flower's logger (so they reach ``flwr log``), level kept."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            flower_log(record.levelno, "%s: %s", record.name, record.getMessage())
        except Exception:  # a log line must never stop a run
            self.handleError(record)


@contextlib.contextmanager
def fedhet_log_to_flower() -> Iterator[None]:
    """While the block runs, fedhet's INFO and higher log records go to Flower's log — unless this process
    already shows them (a handler on the ``fedhet`` logger or above: ``fedhet run`` configures one)."""
    logger = logging.getLogger("fedhet")
    if logger.hasHandlers():
        yield
        return
    handler, level = _ToFlower(logging.INFO), logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def failure_lines(
    exc: BaseException,
    *,
    run_dir: Path | None = None,
    rounds: int | None = None,
    failed_in: int | None = None,
    done: int = 0,
    saved: int | None = None,
) -> list[str]:
    """What the log says of a run that failed or was stopped: the round it failed in (``failed_in`` of
    ``rounds``; after the last one when ``done == rounds``; none before round 1), the error, and, once rounds
    ran, the run folder and how to continue it: after round ``saved`` (its last saved round), from round 1
    when none was saved, not at all when the run diverged (its summary records a result)."""
    what = "was stopped" if isinstance(exc, KeyboardInterrupt) else "failed"
    if failed_in is not None:
        where = f" in round {failed_in} of {rounds}"
    elif rounds and done >= rounds:
        where = f" after its last round ({rounds})"
    else:  # before round 1 (config, run folder, nodes): the error names the cause and the fix
        return [f"the run {what}: {type(exc).__name__}: {exc}"]
    lines = [f"the run {what}{where}: {type(exc).__name__}: {exc}"]
    if run_dir is None:
        return lines
    folder = f"run folder: {Path(run_dir).resolve()}"
    if isinstance(exc, TrainingDivergedError):
        lines.append(
            f"{folder}; its summary.json records the run as diverged in round {exc.round}, a result that "
            f"{option('resume')} does not continue; {option('overwrite')} runs it again"
        )
    elif saved is not None:
        lines.append(
            f"{folder}; its last saved round is {saved}: {option('resume')} continues the run after it"
        )
    else:
        lines.append(f"{folder}; no round was saved: {option('resume')} runs it again from round 1")
    return lines


def log_failure(exc: BaseException, **state: Any) -> None:
    """The ERROR lines of a run that failed (:func:`failure_lines`; ``state``: its keywords)."""
    for text in failure_lines(exc, **state):
        flower_log(logging.ERROR, "fedhet: %s", text)
