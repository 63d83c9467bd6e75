"""Optional TensorBoard scalars (``eval.tensorboard = true``; the ``fedhet[tensorboard]`` extra): every number
of every ``metrics.jsonl`` line, at its round, under ``RUN_DIR/tensorboard/``. During a run the round loop
feeds them line by line through ``fedhet.report.listeners.TensorBoardScalars``."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fedhet.errors import ConfigError


def scalars(line: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """(tag, value) for every finite number in a metrics line: lists and dicts become ``name/index`` tags
    (``per_class_recall/3``, ``contributions/0``, ``aggregation_weights/7``); strings are skipped."""
    for key, value in line.items():
        tag = f"{prefix}{key}"
        if key == "round" and not prefix:
            continue
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            if math.isfinite(value):
                yield tag, float(value)
        elif isinstance(value, Mapping):
            yield from scalars(value, f"{tag}/")
        elif isinstance(value, list | tuple):
            yield from scalars({str(i): v for i, v in enumerate(value)}, f"{tag}/")


class TensorBoardLog:
    """Writes each round's metrics line as scalars; a no-op object when tracking is off."""

    def __init__(self, run_dir: Path | None, enabled: bool) -> None:
        self.writer = None
        if not enabled or run_dir is None:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # torch raises ImportError when the tensorboard package is missing
            raise ConfigError(
                "eval.tensorboard = true needs the tensorboard package: pip install 'fedhet[tensorboard]' "
                "(or set eval.tensorboard = false)"
            ) from exc
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def write(self, rnd: int, line: Mapping[str, Any]) -> None:
        if self.writer is not None:
            for tag, value in scalars(line):
                self.writer.add_scalar(tag, value, global_step=rnd)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
