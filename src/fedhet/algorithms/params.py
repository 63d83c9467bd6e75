"""Validation of ``[method] params``: one helper per kind of value, one error style.

Every check raises :class:`~fedhet.errors.ConfigError` as ``method.params.<name>=<value> must be ...``,
followed by a hint (the paper's value, what the option does) when one is given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fedhet.errors import ConfigError

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1


def is_finite_number(value: Any) -> bool:
    """True for a finite int or float that is not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _fail(name: str, value: Any, requirement: str, hint: str) -> ConfigError:
    return ConfigError(
        f"method.params.{name}={value!r} must be {requirement}" + (f"; {hint}" if hint else "")
    )


def check_number(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    hint: str = "",
) -> float:
    """``value`` as a float in the interval (bounds None = unbounded; ``*_open`` excludes the bound)."""
    ok = is_finite_number(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        raise _fail(name, value, "a number " + _interval(low, high, low_open, high_open), hint)
    return float(value)


def check_positive(name: str, value: Any, *, hint: str = "") -> float:
    """``value`` as a float in (0, inf): a positive, finite number."""
    return check_number(name, value, 0.0, math.inf, low_open=True, high_open=True, hint=hint)


def check_integer(
    name: str, value: Any, low: int | None = None, high: int | None = None, *, hint: str = ""
) -> int:
    """``value`` as an int in [low, high] (a float with an integer value is accepted, a bool is not)."""
    ok = is_finite_number(value) and float(value).is_integer()
    if ok:
        ok = (low is None or value >= low) and (high is None or value <= high)
    if not ok:
        raise _fail(name, value, "an integer " + _interval(low, high, False, False), hint)
    return int(value)


def check_choice(name: str, value: Any, accepted: Sequence[Any], *, hint: str = "") -> Any:
    """``value`` if it is one of ``accepted``."""
    if value not in accepted:
        raise _fail(name, value, f"one of {list(accepted)}", hint)
    return value


def check_flag(name: str, value: Any, *, hint: str = "") -> bool:
    """``value`` if it is a bool (TOML true/false)."""
    if not isinstance(value, bool):
        raise _fail(name, value, "true or false", hint)
    return value


def _interval(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is None and high is None:
        return "(any finite value)"
    if high is None:
        return f"{'>' if low_open else '>='} {low:g}"
    if low is None:
        return f"{'<' if high_open else '<='} {high:g}"
    return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
