"""The server's side of a deployment whose nodes read their own tables (``flwr run`` run config
``node-tables = true``; each node's ``--node-config "client-id=<i> data-path='<file>.csv'"``).

Before the describe exchange the server asks every node for its table's report (a ``query`` message with
``table-report``): row count, which columns are numbers, per numeric column its sum and sum of squares,
per categorical column its level set, its label counts — never a row
(``fedhet.data.datasets.site_tables``). It combines the reports, in client-id order, into the run's
encoding (the union of the sites' level sets, the classes) and the per-feature mean and std that the
embedded engine computes on the same rows, encodes its own test table with them, and sends the encoding and
the statistics to the nodes in the run description, with which each node encodes and standardises its rows.

With ``data.impute`` the server first works out each column's fill value with the nodes (their missing
cells and present sums in the report; value counts or, for the median, counts at most a threshold in
further ``table-query`` exchanges: ``fedhet.data.datasets.site_imputation``), sends the fill values, and takes
the nodes' reports on their filled rows for the statistics; the encoding carries the fill values and the
missing indicators, so every node and the server's test rows are filled alike.

The server holds no training row: methods that need a validation split or the clients' standalone
accuracies (fairness metrics) are refused, naming the setting to change.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedhet.config import ExperimentConfig, to_toml
from fedhet.data.datasets.site_imputation import ImputationPlan
from fedhet.engine.seeds import derived_rng
from fedhet.engine.simulation import Federation
from fedhet.errors import ConfigError, FedhetError, ProtocolError
from fedhet.flower.client import NODE_RECORD, RUN_RECORD, TABLE_RECORD

log = logging.getLogger("fedhet.flower")


@dataclass
class ReportedFederation(Federation):
    """The server's view of a federation whose rows stay at the nodes: its test set, and the sizes and
    class counts the nodes reported."""

    reported_sizes: list[int] = field(default_factory=list)

    @property
    def sizes(self) -> list[int]:
        return list(self.reported_sizes)


def check_node_tables(cfg: ExperimentConfig) -> None:
    """Refuse, before any node is asked, what a server without the sites' rows cannot do."""
    from fedhet.data.datasets.site_tables import SKLEARN_TABLES

    d = cfg.data
    if d.dataset not in (*SKLEARN_TABLES, "csv", "parquet"):
        raise ConfigError(
            f"node-tables = true: the nodes read tables, but data.dataset = {d.dataset!r}; set it to 'csv' "
            "or 'parquet' (with data.test_path, the server's test table), or to 'wine' / 'breast-cancer'"
        )
    if d.validation_fraction > 0:
        raise ConfigError(
            "node-tables = true: the server holds none of the sites' rows, so it cannot hold out "
            f"data.validation_fraction = {d.validation_fraction:g} of them; set it to 0 (a method that needs "
            "a validation split cannot run on tables the nodes keep)"
        )


class TableReports(dict):
    """The nodes' table reports by client id, and the imputation the server worked out with them."""

    imputation: ImputationPlan | None = None


def _messages(cfg: ExperimentConfig, nodes: list[int], query: dict[str, Any] | None) -> list[Message]:
    run = {"config": to_toml(cfg), "table-report": True}
    if query is not None:
        run["table-query"] = json.dumps(query)
    return [
        Message(
            RecordDict({RUN_RECORD: ConfigRecord(run)}),
            dst_node_id=n,
            message_type=MessageType.QUERY,
            group_id="0",
        )
        for n in nodes
    ]


def _ask(
    grid: Grid, node_of: dict[int, int], cfg: ExperimentConfig, query: dict[str, Any], timeout: float
) -> dict[int, Any]:
    """Every reporting node's answer to one table query, by client id; a node that fails to answer stops
    the run (the fill values need every site that reported)."""
    client_of = {n: c for c, n in node_of.items()}
    answers: dict[int, Any] = {}
    for msg in grid.send_and_receive(_messages(cfg, sorted(client_of), query), timeout=timeout):
        node = msg.metadata.src_node_id
        if msg.has_error():
            raise ProtocolError(
                f"node {node} (client {client_of.get(node)}) did not answer the server's imputation query "
                f"{query['kind']!r}: {msg.error.reason}"
            )
        answers[client_of[node]] = json.loads(str(msg.content[TABLE_RECORD]["json"]))
    silent = sorted(set(node_of) - set(answers))
    if silent:
        raise ProtocolError(
            f"clients {silent} did not answer the server's imputation query {query['kind']!r} within "
            f"{timeout:g} s; data.impute needs every site that reported its table"
        )
    return answers


def server_test_table(cfg: ExperimentConfig) -> tuple[dict[str, np.ndarray], tuple[str, ...] | None]:
    """The server's own test rows (label column named as the run's) and, for scikit-learn's tables, their
    classes."""
    from fedhet.data.datasets import site_tables as st

    d = cfg.data
    if d.dataset in st.SKLEARN_TABLES:
        _, test = st.sklearn_table_columns(d.dataset)
        test[d.label_column] = test.pop("label")
        return test, st.sklearn_classes(d.dataset)
    return st.server_test_columns(d.path, d.test_path, "the sites' tables"), None


def _impute(
    grid: Grid, node_of: dict[int, int], cfg: ExperimentConfig, reports: dict[int, Any], timeout: float
) -> TableReports:
    """data.impute at the nodes: the fill values from their answers, then their reports on the filled rows."""
    from fedhet.data.datasets.imputation import Imputed, log_imputed
    from fedhet.data.datasets.site_imputation import plan_imputation
    from fedhet.data.formats import tables

    d = cfg.data
    test, _ = server_test_table(cfg)
    test_missing = {}
    for name, values in test.items():
        numbers = tables._as_numbers(np.asarray(values))
        if numbers is not None:
            test_missing[name] = int(np.count_nonzero(np.isnan(numbers)))
    plan = plan_imputation(
        reports,
        test_missing,
        d.impute,
        d.missing_indicator,
        lambda query: _ask(grid, node_of, cfg, query, timeout),
    )
    for name, fill in plan.fills.items():
        cells = {f"client {c}": n for c, n in plan.train_cells[name].items()}
        item = Imputed(name, float(np.float32(fill)), cells, plan.test_cells[name], name in plan.indicators)
        log_imputed(item, d.impute, "the nodes' tables")
    out = TableReports(
        _ask(grid, node_of, cfg, {"kind": "report", "fills": plan.fills}, timeout) if plan.fills else reports
    )
    out.imputation = plan
    return out


def collect_table_reports(
    grid: Grid, nodes: list[int], cfg: ExperimentConfig, num_clients: int, timeout: float
) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    """Each node's report on its table, by client id (with data.impute, on its rows filled with the fill
    values the server worked out with the nodes); and the nodes that failed, with why."""
    messages = _messages(cfg, nodes, None)
    reports: dict[int, dict[str, Any]] = {}
    node_of: dict[int, int] = {}
    refused: dict[int, str] = {}
    for msg in grid.send_and_receive(messages, timeout=timeout):
        node = msg.metadata.src_node_id
        try:
            if msg.has_error():
                raise ProtocolError(msg.error.reason)
            cid = int(msg.content[NODE_RECORD]["client-id"])
            if not 0 <= cid < num_clients:
                raise ProtocolError(f"node {node} says it is client {cid}; the run has 0..{num_clients - 1}")
            if cid in node_of:
                raise ProtocolError(f"node {node} and node {node_of[cid]} both say they are client {cid}")
            reports[cid] = json.loads(str(msg.content[TABLE_RECORD]["json"]))
            node_of[cid] = node
        except (FedhetError, KeyError, ValueError) as exc:
            refused[node] = str(exc)
            log.error("node %d sent no table report: %s", node, exc)
    missing = [c for c in range(num_clients) if c not in reports]
    if missing:
        log.warning(
            "clients %s sent no table report: the encoding and the statistics are the other sites'", missing
        )
    if cfg.data.impute is not None and reports:
        return _impute(grid, node_of, cfg, reports, timeout), refused
    return reports, refused


def table_federation(
    cfg: ExperimentConfig, reports: dict[int, dict[str, Any]], device: torch.device
) -> tuple[ReportedFederation, Any]:
    """The server's federation from the nodes' reports and its own test table; and the run's encoding."""
    from fedhet.data.datasets import Dataset, to_tensor
    from fedhet.data.datasets import site_tables as st

    d = cfg.data
    test, classes = server_test_table(cfg)
    encoding, mean, std = st.combine_site_reports(
        reports,
        test,
        label=d.label_column,
        classes=classes,
        imputation=getattr(reports, "imputation", None),
    )
    test_x, test_y = st.encode_rows(test, encoding, "the server's test table")
    width = len(encoding.feature_names)
    ds = Dataset(
        name=d.dataset,
        train_x=torch.zeros((0, width), dtype=torch.float32),
        train_y=torch.zeros(0, dtype=torch.int64),
        test_x=to_tensor(test_x),
        test_y=to_tensor(test_y),
        classes=encoding.classes,
        mean=mean,
        std=std,
        source=f"{d.dataset}: the nodes' own tables (reports of clients {sorted(reports)})",
        feature_names=encoding.feature_names,
        numeric=encoding.numeric,
    )
    tx, ty = ds.test_x, ds.test_y
    if d.max_test_samples is not None and d.max_test_samples < len(ty):  # as build_federation subsets
        sel = np.sort(derived_rng(cfg.seed, "test_subset").choice(len(ty), d.max_test_samples, replace=False))
        tx, ty = tx[torch.as_tensor(sel)], ty[torch.as_tensor(sel)]
    sizes = [int(reports[c]["rows"]) if c in reports else 0 for c in range(d.clients)]
    counts = np.zeros((d.clients, len(encoding.classes)), dtype=np.int64)
    counts[sorted(reports)] = st.reported_class_counts(reports, encoding)
    fed = ReportedFederation(
        dataset=ds,
        partition=None,
        clients=[],
        test_x=ds.normalize(tx).to(device),
        test_y=ty.to(device),
        validation=None,
        class_counts=counts,
        pool_indices=np.zeros(0, dtype=np.int64),
        reported_sizes=sizes,
    )
    return fed, encoding
