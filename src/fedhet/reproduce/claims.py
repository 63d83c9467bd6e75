"""A table's findings as data, and their verdicts computed from the recorded cells.

A table states the paper's claims (``[[claims]]`` in its TOML): "``better`` beats ``than`` on these rows". A
claim is judged per row from the seeds both methods ran: the paired differences d_s = better_s − than_s
(same seed, so the same split and initial model), their mean and a 95 % Student-t interval. It **holds** on
a row only when the interval excludes 0 in the claimed direction, is **contradicted** when it excludes 0 the
other way, and is otherwise **not resolved at n seeds** (one seed has no interval). Over its rows a claim
holds when it holds on every row, is contradicted when it is contradicted on any, and is otherwise not
resolved. Only rows in the table's ``view`` are judged: a row shown in another view (the best over rounds
beside the mean of the last 100 evaluations) is there for reading. Prose on a page may explain a verdict;
it never states one.

    [[claims]]
    text = "CELM's global model is more accurate than FedAvg's"
    better = "celm"
    than = "fedavg"
    rows = ["Dir"]            # optional: rows whose name contains one of these (default: every row)
    lower_is_better = false   # optional: for a metric where less is better

Two more forms compare one method with itself across two rows (a trend: d_s = value on ``better_row`` −
value on ``than_row``, same seed), or with a fixed level on each row (d_s = value − ``above``, or ``below`` −
value), judged the same way; ``better`` and ``than`` with ``better_row`` and ``than_row`` compare two methods
on two rows (an ablation whose variants are rows: the full method on its row against the baseline on its):

    [[claims]]
    text = "On Dir 0.05 a short warm-up ends more accurate than a long one"
    method = "celm"
    better_row = "Dir 0.05, 5%"   # a row's name, or part of exactly one row's name
    than_row = "Dir 0.05, 30%"

    [[claims]]
    text = "CELM gives the free rider less than a uniform share"
    method = "celm"
    below = 1.0
    rows = ["weight × N"]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhet.errors import ConfigError
from fedhet.verdicts import CONTRADICTED, HOLDS, UNRESOLVED, judge, paired_interval

__all__ = [
    "CONTRADICTED",
    "HOLDS",
    "UNRESOLVED",
    "Claim",
    "RowVerdict",
    "evaluate",
    "findings_section",
    "judge",
    "judge_row",
    "load_claims",
    "paired_interval",
]


@dataclass(frozen=True)
class Claim:
    """One finding of the paper, as a comparison of two methods on some rows."""

    text: str
    better: str  # the method (one method's claims: better = than = it)
    than: str
    rows: tuple[str, ...] = ()
    lower_is_better: bool = False
    #: across rows: the rows whose name contains these (the claim is then judged once, on the pair)
    better_row: str | None = None
    than_row: str | None = None
    #: against a level: ("above" | "below", level)
    level: tuple[str, float] | None = None

    def applies_to(self, row: str) -> bool:
        return not self.rows or any(part.lower() in row.lower() for part in self.rows)

    def compares(self) -> str:
        """What the claim compares, for its line on a page."""
        if self.better_row is not None and self.better != self.than:
            return f"`{self.better}` on {self.better_row} vs `{self.than}` on {self.than_row}"
        if self.better_row is not None:
            return f"`{self.better}`: {self.better_row} vs {self.than_row}"
        if self.level is not None:
            return f"`{self.better}` {self.level[0]} {self.level[1]:g}"
        return f"`{self.better}` vs `{self.than}`"


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
        interval = (
            f", 95 % interval [{self.low:+.2f}, {self.high:+.2f}]"
            if self.low is not None
            else ", every seed the same: no spread to build an interval from"
            if self.seeds > 1
            else ""
        )
        seeds = f"{self.seeds} seed" + ("s" if self.seeds != 1 else "")
        resolved = f" at {seeds}" if self.verdict == UNRESOLVED else ""
        paired = f"mean difference {self.mean:+.2f} over {self.seeds} paired {seeds.split()[1]}"
        return f"{self.verdict}{resolved}: {paired}{interval}"


def load_claims(path: Path, raw: Any, methods: Sequence[str]) -> list[Claim]:
    """The ``[[claims]]`` of a table file, checked against the table's methods."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(f"{path}: claims must be an array of tables ([[claims]])")
    return [_load_claim(path, n, item, methods) for n, item in enumerate(raw, 1)]


def _load_claim(path: Path, n: int, item: Any, methods: Sequence[str]) -> Claim:
    where = f"{path}: claim {n}"
    if not isinstance(item, dict):
        raise ConfigError(f"{where} must be a table")
    two_methods = {"better", "than"}
    one_method = {"method", "better_row", "than_row", "above", "below"}
    unknown = set(item) - {"text", "rows", "lower_is_better", *two_methods, *one_method}
    if unknown:
        raise ConfigError(f"{where} has unknown keys {sorted(unknown)}")
    if not isinstance(item.get("text"), str) or not item["text"]:
        raise ConfigError(f'{where} needs text = "..."')
    rows = item.get("rows", [])
    if not isinstance(rows, list) or not all(isinstance(r, str) for r in rows):
        raise ConfigError(f"{where}: rows must be a list of row-name parts")
    forms = (
        "better, than",
        "better, than with better_row and than_row",
        "method with better_row and than_row",
        "method with above or below",
    )
    if "method" in item:
        keys: tuple[str, ...] = ("method",)
        across = "better_row" in item or "than_row" in item
        levels = [k for k in ("above", "below") if k in item]
        if item.keys() & two_methods or across == bool(levels) or len(levels) > 1:
            raise ConfigError(f"{where} must have one of: {'; '.join(forms)}")
    else:
        keys = ("better", "than")
        across_methods = {"better_row", "than_row"} if "better_row" in item or "than_row" in item else set()
        if item.keys() & (one_method - across_methods) or not all(
            isinstance(item.get(k), str) and item[k] for k in keys
        ):
            raise ConfigError(f"{where} must have one of: {'; '.join(forms)}")
    for key in keys:
        if item[key] not in methods:
            raise ConfigError(f"{where}: {key} = {item[key]!r} is not one of the table's methods")
    common = dict(text=item["text"], rows=tuple(rows), lower_is_better=bool(item.get("lower_is_better")))
    if "method" not in item and "better_row" not in item and "than_row" not in item:
        return Claim(better=item["better"], than=item["than"], **common)
    better, than = (item["method"],) * 2 if "method" in item else (item["better"], item["than"])
    if "above" in item or "below" in item:
        direction = "above" if "above" in item else "below"
        return Claim(better=better, than=than, level=(direction, float(item[direction])), **common)
    for key in ("better_row", "than_row"):
        if not isinstance(item.get(key), str) or not item[key]:
            raise ConfigError(f'{where} needs {key} = "part of a row name"')
    return Claim(better=better, than=than, better_row=item["better_row"], than_row=item["than_row"], **common)


def judge_row(claim: Claim, row: Mapping[str, Any], than_row: Mapping[str, Any] | None = None) -> RowVerdict:
    """The claim on one result row, from its methods' per-seed values (``per_seed``: seed -> value); a claim
    across rows compares ``row`` with ``than_row``, a claim against a level each value with the level."""
    name = row["row"] if than_row is None else f"{row['row']} vs {than_row['row']}"
    a = (row.get("methods", {}).get(claim.better) or {}).get("per_seed")
    b = ((than_row or row).get("methods", {}).get(claim.than) or {}).get("per_seed")
    if claim.level is not None and a is not None:
        direction, level = claim.level
        b = dict.fromkeys(a, level)
        if direction == "below":  # level − value: swap the roles
            a, b = b, a
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
    names = [r["row"] for r in results if r.get("judged", True)]
    out = []
    for claim in claims:
        rows = []
        if claim.better_row is not None:
            pair = [_the_row(claim, results, part) for part in (claim.better_row, claim.than_row)]
            if any(p is None for p in pair):
                rows.append(RowVerdict(claim.better_row, 0, None, None, None, UNRESOLVED, "a row is missing"))
            else:
                rows.append(judge_row(claim, pair[0], pair[1]))
            out.append((claim, overall(rows), rows))
            continue
        for r in results:
            if claim.applies_to(r["row"]) and r.get("judged", True):
                verdict = judge_row(claim, r)
                if names.count(r["row"]) > 1 and r.get("metric"):  # one row name, two metrics: say which
                    verdict = dataclasses.replace(verdict, row=f"{r['row']} ({r['metric']})")
                rows.append(verdict)
        out.append((claim, overall(rows), rows))
    return out


def _the_row(claim: Claim, results: Sequence[Mapping[str, Any]], part: str) -> Mapping[str, Any] | None:
    """The row named ``part``, else the one result row whose name contains it (None if none); a ConfigError
    if several do."""
    judged = [r for r in results if r.get("judged", True)]
    exact = [r for r in judged if r["row"].lower() == part.lower()]
    found = exact or [r for r in judged if part.lower() in r["row"].lower()]
    if len(found) > 1:
        raise ConfigError(
            f"claim {claim.text!r}: {part!r} is part of {len(found)} row names "
            f"({', '.join(r['row'] for r in found)}); name one row"
        )
    return found[0] if found else None


def findings_section(claims: Sequence[Claim], results: Sequence[Mapping[str, Any]], unit: str) -> list[str]:
    """Markdown: the verdict of each claim, then per row, computed from the cells (none: no section)."""
    if not claims:
        return []
    lines = [
        "## Findings (computed from the cells)",
        "",
        "Each of the paper's claims, judged per row by its paired differences over the seeds (two methods on "
        "the same seed: same split and initial model; or one method on two rows, or against a level), their "
        f"mean and 95 % t-interval, in {unit}: **holds** only when the interval excludes 0 in the claimed "
        "direction, **contradicted** when it excludes 0 the other way, otherwise **not resolved**.",
        "",
    ]
    for claim, verdict, rows in evaluate(claims, results):
        measured = sum(1 for row in rows if row.seeds)
        lines.append(
            f"- **{verdict}**: {claim.text} ({claim.compares()}; {measured} of {len(rows)} rows measured)"
        )
        for row in rows:
            lines.append(f"  - {row.row}: {row.describe()}")
    return lines
