"""Warm starts: a run that begins from another run's final model (``model.init_from``).

The source is the latest checkpoint of a run directory; the digest of its weights is recorded in the new
run's ``warm_start.json``, so that a finished run is reused (``fedhet compare``) and an unfinished one
resumed only while its source still holds the same weights.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path

from torch import Tensor, nn

from fedhet.engine import checkpoint as ckpt
from fedhet.engine.rundir import is_finished
from fedhet.engine.weights import weights_digest
from fedhet.errors import ConfigError

log = logging.getLogger("fedhet")

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
    if not is_finished(Path(run_dir)):
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
