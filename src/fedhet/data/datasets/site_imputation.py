"""Federated imputation when each site's table stays at its deployment node (``node-tables = true`` with
``data.impute``): what a node answers about its numeric columns, and how the server turns the answers into
the fill values the embedded engine computes on the same rows (``fedhet.data.datasets.imputation``).

The exchange, every answer about the node's own training rows only, never a row:

1. the node's table report (``fedhet.data.datasets.site_tables.site_report``) names, per numeric column, its
   missing cells and the count and sum of its present values (what the mean needs);
2. the server picks the columns to fill: those with a missing cell at a site or in its own test rows;
3. ``most_frequent``: each node answers how often each present value of those columns occurs
   (:func:`site_answer`, ``value-counts``); ``median``: the server bisects, each step asking every node how
   many present values of each column are <= a threshold (``count-at-most``), all columns in lockstep, at
   most 32 steps: the values are float32, so the bisection runs over the float32 values
   (``fedhet.data.datasets.standardization.order_statistic_search``; the embedded engine's runs over the
   float64 values in at most 64 steps, and ends on the same value);
4. the server sends the fill values; each node fills its cells and reports its standardisation sums anew.

Each statistic is exact and the sums are summed in client-id order, so the fill values equal the embedded
engine's on the same rows bit for bit (its values are the float32 features, as here).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedhet.data.datasets.standardization import (
    IMPUTE_STRATEGIES,
    PresentSum,
    client_count_at_most,
    client_value_counts,
    federated_mean,
    federated_most_frequent,
    median_of,
    median_ranks,
    order_statistic_search,
)
from fedhet.errors import DataError, ProtocolError

#: What the server may ask a node about its numeric columns, beyond its table report.
QUERIES = ("value-counts", "count-at-most")


@dataclass(frozen=True)
class ImputationPlan:
    """The fill value of every column to fill, the columns that gain a missing indicator, and the missing
    cells per client (its training rows) and in the server's test rows, for the log."""

    strategy: str
    fills: dict[str, float] = field(default_factory=dict)
    indicators: tuple[str, ...] = ()
    train_cells: dict[str, dict[int, int]] = field(default_factory=dict)
    test_cells: dict[str, int] = field(default_factory=dict)


def present_values(numbers: np.ndarray) -> np.ndarray:
    """A numeric column as the run keeps it (float32, then float64 for the statistics), NaN = missing."""
    return np.asarray(numbers, dtype=np.float32).astype(np.float64)


def site_answer(values: Mapping[str, np.ndarray], query: Mapping[str, Any]) -> dict[str, list]:
    """A node's answer about its own numeric columns (``values``: name -> :func:`present_values`):
    ``value-counts`` of the named columns as [value, count] pairs, or ``count-at-most`` of each column's
    thresholds."""
    kind = query.get("kind")
    if kind == "value-counts":
        return {
            name: [[v, c] for v, c in client_value_counts(_column(values, name)).items()]
            for name in query["columns"]
        }
    if kind == "count-at-most":
        return {
            name: [client_count_at_most(_column(values, name), float(t)) for t in thresholds]
            for name, thresholds in query["thresholds"].items()
        }
    raise ProtocolError(f"unknown table query {kind!r}; a node answers {list(QUERIES)}")


def _column(values: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    if name not in values:
        raise ProtocolError(
            f"the server asked about column {name!r}, which this node's table has not as numbers"
        )
    return values[name]


def plan_imputation(
    reports: Mapping[int, Mapping[str, Any]],
    test_missing: Mapping[str, int],
    strategy: str,
    indicator: bool,
    ask: Callable[[dict[str, Any]], Mapping[int, Mapping[str, list]]],
    source: str = "the sites' tables",
) -> ImputationPlan:
    """The fill values from the nodes' reports (client id -> :func:`site_report` in its first form) and the
    server's own test rows (``test_missing``: numeric column -> missing test cells); ``ask(query)`` sends a
    query to every reporting node and returns their answers by client id."""
    if strategy not in IMPUTE_STRATEGIES:
        raise DataError(f"{source}: data.impute = {strategy!r}; choose one of {list(IMPUTE_STRATEGIES)}")
    clients = sorted(reports)
    numeric = [c for c in reports[clients[0]]["numeric"] if all(c in reports[i]["numeric"] for i in clients)]
    train_cells = {c: {i: int(reports[i]["missing"][c]) for i in clients} for c in numeric}
    present = {c: sum(int(reports[i]["rows"]) - train_cells[c][i] for i in clients) for c in numeric}
    columns = [c for c in numeric if sum(train_cells[c].values()) or test_missing.get(c, 0)]
    for name in columns:
        if not present[name]:
            raise DataError(
                f"{source}: column {name!r} has no present value in any site's training rows: there is "
                "nothing to impute it from; drop the column, or fill it before federating"
            )
    fills: dict[str, float] = {}
    if strategy == "mean":
        for name in columns:
            fills[name] = federated_mean(
                [
                    PresentSum(
                        int(reports[i]["rows"]) - train_cells[name][i], float(reports[i]["present_sum"][name])
                    )
                    for i in clients
                ]
            )
    elif strategy == "most_frequent" and columns:
        answers = ask({"kind": "value-counts", "columns": columns})
        for name in columns:
            fills[name] = federated_most_frequent(
                [{float(v): int(n) for v, n in answers[i][name]} for i in clients]
            )
    elif columns:
        fills = _lockstep_medians(columns, present, ask, clients)
    return ImputationPlan(
        strategy=strategy,
        fills=fills,
        indicators=tuple(c for c in columns if indicator and sum(train_cells[c].values())),
        train_cells={c: train_cells[c] for c in columns},
        test_cells={c: int(test_missing.get(c, 0)) for c in columns},
    )


def _lockstep_medians(
    columns: Sequence[str],
    present: Mapping[str, int],
    ask: Callable[[dict[str, Any]], Mapping[int, Mapping[str, list]]],
    clients: Sequence[int],
) -> dict[str, float]:
    """Every column's exact median, the bisections of all their middle values run in lockstep over the
    float32 values (the nodes' values are float32: :func:`present_values`): one query to the nodes per step,
    each carrying every unfinished search's threshold."""
    searches = {
        (name, k): order_statistic_search(k, width=32)
        for name in columns
        for k in median_ranks(present[name])
    }
    thresholds = {key: next(search) for key, search in searches.items()}
    found: dict[tuple[str, int], float] = {}
    while thresholds:
        query: dict[str, list[float]] = {}
        for name, k in thresholds:
            query.setdefault(name, []).append(thresholds[(name, k)])
        answers = ask({"kind": "count-at-most", "thresholds": query})
        asked = {name: [k for n, k in thresholds if n == name] for name in query}
        following = {}
        for name, ranks in asked.items():
            for j, k in enumerate(ranks):
                count = sum(int(answers[i][name][j]) for i in clients)
                try:
                    following[(name, k)] = searches[(name, k)].send(count)
                except StopIteration as done:
                    found[(name, k)] = float(done.value)
        thresholds = following
    return {name: median_of([found[(name, k)] for k in median_ranks(present[name])]) for name in columns}
