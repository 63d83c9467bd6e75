"""The error types fedhet raises at its boundaries (config, files, client replies).

Each message says what was wrong and how to fix it.
"""

from __future__ import annotations

from contextvars import ContextVar


class FedhetError(Exception):
    """Base class of every error fedhet raises on purpose."""


class ConfigError(FedhetError, ValueError):
    """A configuration value, split parameter or CLI argument is invalid."""


class DataError(FedhetError, OSError):
    """A dataset is missing, malformed or refused (e.g. an unsafe pickle)."""


class ClientUpdateError(FedhetError, ValueError):
    """A client's reply cannot be aggregated (wrong keys, shapes, NaN/inf values)."""


class CheckpointError(FedhetError, OSError):
    """A checkpoint cannot be written or read back."""


class ProtocolError(FedhetError, ValueError):
    """A message breaks the protocol between server and client (e.g. an instruction it cannot follow)."""


class RunDirectoryError(FedhetError, OSError):
    """A run directory cannot be used: it holds a run that would be lost, or another process is using it."""


class TrainingDivergedError(FedhetError, RuntimeError):
    """A run stopped because no update could be used (e.g. every one non-finite, round after round).

    ``round`` is the round it stopped in; ``summary`` the stopped run's summary (marked ``diverged``) once the
    engine has written it, so that a comparison can report the cell as diverged and go on.
    """

    def __init__(self, message: str, round: int | None = None) -> None:
        super().__init__(message)
        self.round = round
        self.summary: dict | None = None


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run during round ``round`` (not an error: a KeyboardInterrupt that says where).

    The run directory keeps what the run saved: its ``metrics.jsonl`` lines and its checkpoints, the last of
    round ``checkpoint_round`` (None: none yet); a resumed run continues from that checkpoint and repeats the
    rounds after it exactly.
    """

    def __init__(
        self, round: int, checkpoint_round: int | None, run_dir: object = None, completed: bool = False
    ) -> None:
        super().__init__(f"interrupted {'after' if completed else 'at'} round {round}")
        self.round, self.checkpoint_round, self.run_dir = round, checkpoint_round, run_dir
        #: True when the run stopped after finishing (and saving) round ``round``; False: during it
        self.completed = completed

    def __reduce__(self):  # across a worker process's pipe, with its fields
        return (type(self), (self.round, self.checkpoint_round, self.run_dir, self.completed))


# --------------------------------------------------------------------------------------------------------
# Advice in the caller's words: a flag on the command line, a keyword argument in Python
# --------------------------------------------------------------------------------------------------------
#: "python" (the default: fedhet.run, fedhet.compare), "cli" (set by the ``fedhet`` command) or "flower"
#: (set by the ServerApp under ``flwr run``, whose run config holds the options).
CALLER: ContextVar[str] = ContextVar("fedhet_caller", default="python")

#: option -> how the command line, the Python API and ``flwr run`` spell it; ``{dir}`` is the directory.
_OPTIONS = {
    "overwrite": ("--overwrite", "overwrite=True", "overwrite=true in flwr run's --run-config"),
    "resume": (
        "--resume {dir}",
        "resume=True (with out={dir!r})",
        "resume=true in flwr run's --run-config",
    ),
    "rerun": ("--rerun", "rerun=True", "overwrite=true in flwr run's --run-config"),
    "out": ("--out", "out=", "run-dir in flwr run's --run-config"),
}


def option(name: str, run_dir: object = "") -> str:
    """How the caller names option ``name`` in advice: ``--resume DIR`` on the command line,
    ``resume=True`` from Python (``fedhet.run``/``fedhet.compare``), the run config under ``flwr run``."""
    cli, python, flower = _OPTIONS[name]
    return {"cli": cli, "flower": flower}.get(CALLER.get(), python).format(dir=str(run_dir))
