"""Which code computed a number: the git commit of the fedhet checkout. A ground-floor module (it imports
only the standard library): the round loop records it in every summary, result pages and the benchmark
page cite it (``fedhet.report.provenance`` adds the machine)."""

from __future__ import annotations

import subprocess
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def commit(where: Path | None = None, paths: tuple[str, ...] = (".",)) -> str:
    """The short commit of the checkout at ``where`` (default: the fedhet package's own folder), marked when
    tracked files under ``paths`` (relative to ``where``) have uncommitted changes: by default the package's
    code only, so that regenerating a committed result page does not mark the next one; "unknown" outside a
    git checkout."""
    cwd = where or PACKAGE
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True, text=True)
        if rev.returncode:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *paths],
            cwd=cwd,
            capture_output=True,
            text=True,
        )
    except OSError:
        return "unknown"
    return rev.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")
