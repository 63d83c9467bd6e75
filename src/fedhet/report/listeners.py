"""What report/ makes of a run while it runs: the round loop's listeners
(:class:`fedhet.engine.rounds.RoundListener`), which ``fedhet.experiment.make_simulation`` and the Flower
server app pass to the loop. The engine writes the run directory's records; these build on them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedhet.config import ExperimentConfig
from fedhet.engine.rounds import RoundListener
from fedhet.report.artifacts import write_run_artifacts
from fedhet.report.tensorboard import TensorBoardLog


class TensorBoardScalars(RoundListener):
    """Every round's metrics line as TensorBoard scalars under ``RUN_DIR/tensorboard/``, written as the round
    ends, so that TensorBoard follows a run live (``eval.tensorboard``; nothing when off or without a run
    directory)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.log: TensorBoardLog | None = None

    def start(self, run_dir: Path | None) -> None:
        # opened only now: the run directory is claimed (and, with overwrite, emptied) before the rounds
        self.log = TensorBoardLog(run_dir, self.enabled)

    def round_done(self, rnd: int, line: Mapping[str, Any]) -> None:
        if self.log is not None:
            self.log.write(rnd, line)

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None


class RunArtifacts(RoundListener):
    """The run's CSVs and method figures (:func:`~fedhet.report.artifacts.write_run_artifacts`), built from
    its records once its summary is written (a diverged run's too)."""

    def __init__(self) -> None:
        self.run_dir: Path | None = None

    def start(self, run_dir: Path | None) -> None:
        self.run_dir = run_dir

    def finished(self, summary: Mapping[str, Any]) -> None:
        if self.run_dir is not None:
            write_run_artifacts(self.run_dir)


def run_listeners(cfg: ExperimentConfig) -> list[RoundListener]:
    """The listeners of a run of ``cfg``: TensorBoard scalars (``eval.tensorboard``), the run's artifacts."""
    return [TensorBoardScalars(cfg.eval.tensorboard), RunArtifacts()]
