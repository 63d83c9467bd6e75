"""What the ``fedhet`` commands share: experiment arguments, the config they build, output paths checked
before any work, the console, the progress display and the number format of the tables."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from fedhet.errors import ConfigError

# --------------------------------------------------------------------------------------------------------
# Shared argument groups
# --------------------------------------------------------------------------------------------------------
SHORTCUTS = {
    "method": "method.name",
    "dataset": "data.dataset",
    "split": "data.split",
    "model": "model.name",
    "clients": "data.clients",
    "rounds": "train.rounds",
    "seed": "seed",
    "data_root": "data.root",
    "data_path": "data.path",
    "device": "train.device",
}


def add_experiment_args(p: argparse.ArgumentParser, *, with_method: bool = True) -> None:
    p.add_argument("config", nargs="?", help="experiment TOML file (see configs/); flags override it")
    if with_method:
        p.add_argument("--method", help="method name (see `fedhet methods`)")
    p.add_argument("--dataset", help="dataset name (see `fedhet datasets`), or npz / folder with --data-path")
    p.add_argument("--split", help="data split name (see `fedhet partition --help`)")
    p.add_argument("--model", help="model name: mlp, cnn, mlp200, resnet8, resnet18gn")
    p.add_argument("--clients", type=int, help="number of clients")
    p.add_argument("--rounds", type=int, help="communication rounds")
    p.add_argument("--seed", type=int, help="random seed")
    p.add_argument("--data-root", dest="data_root", help="directory holding the dataset files")
    p.add_argument(
        "--data-path", dest="data_path", help="your own data: an .npz file or an image folder (train/, test/)"
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="device (default auto)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override any config key, e.g. --set data.split_params.alpha=0.05 (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress display")


def build_config(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> Any:
    """The experiment config of a command line: its TOML file (or the defaults), the flags, then --set."""
    from fedhet.config import ExperimentConfig, apply_overrides, load_config, parse_set_args

    cfg = load_config(args.config) if args.config else ExperimentConfig()
    flags = [
        (dotted, value if not isinstance(value, str) else json.dumps(value))
        for attr, dotted in SHORTCUTS.items()
        if attr not in skip and (value := getattr(args, attr, None)) is not None
    ]
    apply_overrides(cfg, [*flags, *parse_set_args(args.set)])  # built and validated once
    return cfg


# --------------------------------------------------------------------------------------------------------
# Output paths, checked before any work
# --------------------------------------------------------------------------------------------------------
def writable_dir(path: Path, flag: str) -> Path:
    """``path`` as an output directory: not a file, and creatable/writable (checked before any work)."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file; pass a directory (it is created if missing)")
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: {existing} is not writable; pass a directory you can write to")
    return path


def writable_file(path: Path, flag: str) -> Path:
    """``path`` as an output file: not a directory, in a writable directory."""
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a directory; pass a file name, e.g. {path / 'report.md'}")
    writable_dir(path.parent if str(path.parent) else Path("."), f"{flag} {path}: its folder")
    return path


# --------------------------------------------------------------------------------------------------------
# Ctrl-C
# --------------------------------------------------------------------------------------------------------
def interrupted_line(exc: BaseException, resume_command: str | None) -> str:
    """The one line a command prints when Ctrl-C stops it: where, and the command that continues."""
    rnd = getattr(exc, "round", None)
    where = f"at round {rnd}" if rnd is not None else "before its first round ended"
    if rnd is not None and getattr(exc, "completed", False):
        where = f"after round {rnd}"
    line = f"interrupted {where}"
    if resume_command:
        line += f" — resume with: {resume_command}"
        ckpt = getattr(exc, "checkpoint_round", "unknown")
        if ckpt is None:
            line += " (no checkpoint yet: it starts from round 1)"
        elif ckpt != "unknown":
            line += f" (it continues after round {ckpt}, the last checkpoint)"
    return line


def rerun_command(argv: list[str], out_dir: Path, drop: tuple[str, ...] = ()) -> str:
    """``fedhet ARGV`` with ``--out out_dir`` (replacing any given) and without the flags in ``drop``: the
    command that, run again, reuses the finished cells in ``out_dir`` and resumes the unfinished ones."""
    import shlex

    kept: list[str] = []
    skip = False
    for item in argv:
        if skip:
            skip = False
            continue
        if item == "--out":
            skip = True
            continue
        if item.startswith("--out=") or item in drop:
            continue
        kept.append(item)
    return shlex.join(["fedhet", *kept, "--out", str(out_dir)])


# --------------------------------------------------------------------------------------------------------
# Console, progress, numbers
# --------------------------------------------------------------------------------------------------------
#: Columns for tables written to a pipe or a log file (rich's default there is 80, which wraps them).
PIPED_WIDTH = 200


def make_console(*, stderr: bool = False, quiet: bool = False):
    """A rich console: rich sizes it on a terminal or with $COLUMNS set; otherwise PIPED_WIDTH wide."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or "COLUMNS" in os.environ else PIPED_WIDTH
    return Console(stderr=stderr, quiet=quiet, width=width)


def status_console(args: argparse.Namespace):
    """The console of a command's progress and messages: stderr, silent with --quiet."""
    return make_console(stderr=True, quiet=getattr(args, "quiet", False))


def results_console():
    """The console of a command's results (tables, where they were written): stdout, so ``> file`` keeps
    them, and printed with --quiet too, which silences progress only."""
    return make_console()


class RunProgress:
    """A rich progress bar per run: round, accuracy, ETA.

    The display starts when the ``with`` block is entered or, with ``lazy``, when the first bar is added
    (a command whose checks run inside the block then draws nothing when they fail)."""

    def __init__(self, console, enabled: bool = True, *, lazy: bool = False) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.enabled = enabled and not console.quiet
        self.lazy = lazy
        self.started = False
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("round {task.completed}/{task.total}"),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
            disable=not self.enabled,
        )

    def __enter__(self) -> RunProgress:
        if not self.lazy:
            self._start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.started:
            self.progress.__exit__(*exc)

    def _start(self) -> None:
        if not self.started:
            self.progress.__enter__()
            self.started = True

    def callback(self, description: str, total: int):
        self._start()
        task = self.progress.add_task(description, total=total, status="")

        def update(rnd: int, total_rounds: int, line: dict[str, Any]) -> None:
            status = ""
            if "accuracy" in line and line["accuracy"] is not None and math.isfinite(line["accuracy"]):
                status = f"acc {100 * line['accuracy']:.2f}%"
            if "fairness_pearson" in line and math.isfinite(line.get("fairness_pearson") or float("nan")):
                status += f"  fair {line['fairness_pearson']:.1f}"
            self.progress.update(task, completed=rnd, status=status)

        return update


PERCENT_KEYS = {"accuracy", "balanced_accuracy", "rare_class_recall"}


def in_percent(key: str) -> bool:
    """Whether a metric is shown in percent: every accuracy and recall (``PERCENT_KEYS``, ``*_accuracy``,
    ``*_recall``), so one table never mixes a percent with a fraction of the same kind."""
    return key in PERCENT_KEYS or key.endswith(("_accuracy", "_recall"))


def fmt_metric(key: str, v: Any, std: Any = None) -> str:
    """A table cell: ``v`` (± ``std``), in percent for the accuracy-like keys (:func:`in_percent`); — when
    missing."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    pct = in_percent(key)
    scale = 100.0 if pct else 1.0
    digits = 2
    s = f"{scale * v:.{digits}f}"
    if std is not None and isinstance(std, float) and math.isfinite(std):
        s += f" ± {scale * std:.{digits}f}"
    return s
