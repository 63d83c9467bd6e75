"""Which code computed a number: the git commit of the fedhet checkout. A ground-floor module (it imports
only the standard library): the round loop records it in every summary, result pages and the benchmark
page cite it (``fedhet.report.provenance`` adds the machine)."""

from __future__ import annotations

import functools
import subprocess
import sys
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


# -- the version of the numbers a method computes ------------------------------------------------------------
# A cell record (a finished run kept beside its result page) is reused exactly while the code at hand computes
# the same numbers for it. Each module of ``fedhet.algorithms`` declares ``RESULTS_VERSION``, and the shared
# core (engine, data, models, metrics, guards, faults) the number below; a commit that changes what one of
# them computes bumps its number, which invalidates the records of the methods that reach that module and
# no others. A comment, a docstring, a refactor, a new config key with a neutral default, a new method or
# attack bump nothing and keep every record. The golden runs of the test suite
# (tests/test_results_versions.py) fail when a method's numbers change while its stamp does not
# (docs/reliability.md, "When a record is reused").
#: The version of the numbers the shared core computes (everything outside ``fedhet.algorithms``).
CORE_RESULTS_VERSION = 1


@functools.cache
def algorithm_modules(strategy_class: type) -> tuple[str, ...]:
    """The ``fedhet.algorithms`` modules that compute a run of ``strategy_class``: those of its strategy and
    trainer class hierarchies and every ``fedhet.algorithms`` module they import, transitively."""
    import ast
    import inspect

    classes = [*strategy_class.__mro__, *getattr(strategy_class, "trainer_class", object).__mro__]
    todo = [c.__module__ for c in classes if c.__module__.startswith("fedhet.algorithms.")]
    reached: set[str] = set()
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        source = Path(inspect.getsourcefile(sys.modules[name]) or "")
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fedhet.algorithms."):
                todo.append(".".join(node.module.split(".")[:3]))
    return tuple(sorted(reached))


def results_stamp(strategy_class: type) -> str | None:
    """What a run of ``strategy_class`` computes, as versions: ``"core=1 celm=1 fedavg=1 ..."``; None for a
    method outside fedhet (a user's own: fedhet cannot vouch for its numbers; its records are not reused)."""
    if not strategy_class.__module__.startswith("fedhet.algorithms."):
        return None
    versions = [f"core={CORE_RESULTS_VERSION}"]
    for name in algorithm_modules(strategy_class):
        version = getattr(sys.modules[name], "RESULTS_VERSION", None)
        if version is None:
            raise TypeError(f"{name} declares no RESULTS_VERSION (fedhet.code_version explains it)")
        versions.append(f"{name.rsplit('.', 1)[1]}={version}")
    return " ".join(versions)
