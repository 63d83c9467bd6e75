"""What every benchmark script shares: the one-line JSON result that ``make bench`` gathers.

A script run with ``--json`` prints its human-readable table as usual and then, as its last line, one object
``{"benchmark", "ratios", "targets", "peak_rss_mb", "settings", "rows"}``: ``ratios`` maps a name to a
measured ratio, ``targets`` maps some of those names to a target such as ``"<= 1.05"`` or ``">= 3"``,
``rows`` holds the measured table (a list of flat dicts) and ``settings`` says in words what was measured.
"""

from __future__ import annotations

import json
import re
import resource
from typing import Any


def peak_rss_mb() -> float:
    """Peak resident memory of this process and of its finished children, in MiB (Linux reports KiB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024


def emit(
    benchmark: str,
    ratios: dict[str, float],
    targets: dict[str, str],
    *,
    settings: str,
    rows: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> None:
    """Print the result object as one JSON line (the last line of the script's output)."""
    unknown = set(targets) - set(ratios)
    if unknown:
        raise ValueError(f"targets for ratios that were not measured: {sorted(unknown)}")
    out = {
        "benchmark": benchmark,
        "ratios": {k: float(v) for k, v in ratios.items()},
        "targets": targets,
        "peak_rss_mb": peak_rss_mb(),
        "settings": settings,
        "rows": rows or [],
        **extra,
    }
    print(json.dumps(out), flush=True)


_TARGET = re.compile(r"^\s*(<=|>=)\s*([0-9.]+)\s*$")


def target_met(value: float, target: str) -> bool | None:
    """Whether ``value`` meets a target written ``"<= x"`` or ``">= x"``; None for a target in words."""
    match = _TARGET.match(target)
    if not match:
        return None
    op, bound = match.group(1), float(match.group(2))
    return value <= bound if op == "<=" else value >= bound


def attainment(value: float, target: str) -> float | None:
    """How far a ratio is toward its target, oriented so that 1 is the target and more is better."""
    match = _TARGET.match(target)
    if not match or value <= 0:
        return None
    op, bound = match.group(1), float(match.group(2))
    return bound / value if op == "<=" else value / bound
