"""A table's findings as data, and their verdicts computed from the recorded cells.

A table states the paper's claims (``[[claims]]`` in its TOML): "``better`` beats ``than`` on these rows". A
claim is judged per row from the seeds both methods ran: the paired differences d_s = better_s − than_s
(same seed, so the same split and initial model), their mean and a 95 % Student-t interval. It **holds** on
a row only when the interval excludes 0 in the claimed direction, is **contradicted** when it excludes 0 the
other way, and is otherwise **not resolved at n seeds** (one seed has no interval). Over its rows a claim
holds when it holds on every row, is contradicted when it is contradicted on any, and is otherwise not
resolved. Prose on a page may explain a verdict; it never states one.

    [[claims]]
    text = "CELM's global model is more accurate than FedAvg's"
    better = "celm"
    than = "fedavg"
    rows = ["Dir"]            # optional: rows whose name contains one of these (default: every row)
    lower_is_better = false   # optional: for a metric where less is better
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scipy import stats

from fedhet.errors import ConfigError

HOLDS, CONTRADICTED, UNRESOLVED = "holds", "contradicted", "not resolved"


@dataclass(frozen=True)
class Claim:
    """One finding of the paper, as a comparison of two methods on some rows."""

    text: str
    better: str
    than: str
    rows: tuple[str, ...] = ()
    lower_is_better: bool = False

    def applies_to(self, row: str) -> bool:
        return not self.rows or any(part.lower() in row.lower() for part in self.rows)


@dataclass(frozen=True)
class RowVerdict:
    """A claim on one row: the paired differences' mean, 95 % interval (None below 2 seeds) and verdict."""

    row: str
    seeds: int
    mean: float | None
    low: float | None
    high: float | None
    verdict: str
    why: str = ""  # for a row that could not be judged: what was missing

    def describe(self) -> str:
        if self.mean is None:
            return f"{self.verdict} ({self.why})"
        interval = "" if self.low is None else f", 95 % interval [{self.low:+.2f}, {self.high:+.2f}]"
        resolved = f" at {self.seeds} seeds" if self.verdict == UNRESOLVED else ""
        paired = f"mean difference {self.mean:+.2f} over {self.seeds} paired seeds"
        return f"{self.verdict}{resolved}: {paired}{interval}"


def load_claims(path: Path, raw: Any, methods: Sequence[str]) -> list[Claim]:
    """The ``[[claims]]`` of a table file, checked against the table's methods."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(f"{path}: claims must be an array of tables ([[claims]])")
    claims = []
    for n, item in enumerate(raw, 1):
        if not isinstance(item, dict):
            raise ConfigError(f"{path}: claim {n} must be a table")
        unknown = set(item) - {"text", "better", "than", "rows", "lower_is_better"}
        if unknown:
            raise ConfigError(f"{path}: claim {n} has unknown keys {sorted(unknown)}")
        for key in ("text", "better", "than"):
            if not isinstance(item.get(key), str) or not item[key]:
                raise ConfigError(f'{path}: claim {n} needs {key} = "..."')
        for key in ("better", "than"):
            if item[key] not in methods:
                raise ConfigError(
                    f"{path}: claim {n}: {key} = {item[key]!r} is not one of the table's methods"
                )
        rows = item.get("rows", [])
        if not isinstance(rows, list) or not all(isinstance(r, str) for r in rows):
            raise ConfigError(f"{path}: claim {n}: rows must be a list of row-name parts")
        claims.append(
            Claim(item["text"], item["better"], item["than"], tuple(rows), bool(item.get("lower_is_better")))
        )
    return claims


def paired_interval(differences: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean of the paired differences and its two-sided Student-t interval (n ≥ 2)."""
    n = len(differences)
    mean = math.fsum(differences) / n
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in differences) / (n - 1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def judge(
    differences: Sequence[float], lower_is_better: bool = False
) -> tuple[str, float | None, float | None]:
    """(verdict, low, high) of the paired differences better − than."""
    if len(differences) < 2:
        return UNRESOLVED, None, None
    _, low, high = paired_interval(differences)
    good_low, good_high = (-high, -low) if lower_is_better else (low, high)
    if good_low > 0:
        return HOLDS, low, high
    if good_high < 0:
        return CONTRADICTED, low, high
    return UNRESOLVED, low, high


def judge_row(claim: Claim, row: Mapping[str, Any]) -> RowVerdict:
    """The claim on one result row, from its methods' per-seed values (``per_seed``: seed -> value)."""
    name = row["row"]
    methods = row.get("methods", {})
    a = (methods.get(claim.better) or {}).get("per_seed")
    b = (methods.get(claim.than) or {}).get("per_seed")
    if a is None or b is None:
        why = (
            "measured earlier and kept on the page; its per-seed values were not recorded"
            if row.get("kept")
            else "the row was not run"
            if not row.get("available", True)
            else "no per-seed values were recorded for this row"
        )
        return RowVerdict(name, 0, None, None, None, UNRESOLVED, why)
    seeds = sorted(set(a) & set(b), key=int)
    pairs = [(a[s], b[s]) for s in seeds if a[s] is not None and b[s] is not None]
    pairs = [(x, y) for x, y in pairs if math.isfinite(x) and math.isfinite(y)]
    if not pairs:
        return RowVerdict(name, 0, None, None, None, UNRESOLVED, "no seed has a value for both methods")
    differences = [x - y for x, y in pairs]
    verdict, low, high = judge(differences, claim.lower_is_better)
    return RowVerdict(name, len(pairs), math.fsum(differences) / len(pairs), low, high, verdict)


def overall(verdicts: Sequence[RowVerdict]) -> str:
    """Over the rows with values (a row not run judges nothing): holds on every one -> holds; contradicted on
    any -> contradicted; else (or no row with values) not resolved."""
    measured = [v for v in verdicts if v.seeds]
    if measured and all(v.verdict == HOLDS for v in measured):
        return HOLDS
    if any(v.verdict == CONTRADICTED for v in measured):
        return CONTRADICTED
    return UNRESOLVED


def evaluate(
    claims: Sequence[Claim], results: Sequence[Mapping[str, Any]]
) -> list[tuple[Claim, str, list[RowVerdict]]]:
    """Every claim's overall verdict and its verdict per applicable row."""
    names = [r["row"] for r in results]
    out = []
    for claim in claims:
        rows = []
        for r in results:
            if claim.applies_to(r["row"]):
                verdict = judge_row(claim, r)
                if names.count(r["row"]) > 1 and r.get("metric"):  # one row name, two metrics: say which
                    verdict = dataclasses.replace(verdict, row=f"{r['row']} ({r['metric']})")
                rows.append(verdict)
        out.append((claim, overall(rows), rows))
    return out


def findings_section(claims: Sequence[Claim], results: Sequence[Mapping[str, Any]], unit: str) -> list[str]:
    """Markdown: the verdict of each claim, then per row, computed from the cells (none: no section)."""
    if not claims:
        return []
    lines = [
        "## Findings (computed from the cells)",
        "",
        "Each of the paper's claims, judged per row by the paired differences between the two methods over "
        "the seeds both ran (same seed: same split and initial model), their mean and 95 % t-interval, in "
        f"{unit}: **holds** only when the interval excludes 0 in the claimed direction, **contradicted** "
        "when it excludes 0 the other way, otherwise **not resolved**.",
        "",
    ]
    for claim, verdict, rows in evaluate(claims, results):
        measured = sum(1 for row in rows if row.seeds)
        lines.append(
            f"- **{verdict}**: {claim.text} (`{claim.better}` vs `{claim.than}`; {measured} of {len(rows)} "
            "rows measured)"
        )
        for row in rows:
            lines.append(f"  - {row.row}: {row.describe()}")
    return lines
