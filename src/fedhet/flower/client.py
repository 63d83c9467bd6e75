"""The fedhet ClientApp: a Flower node runs ``run_client`` on its own data, its state in ``context.state``.

A node learns the run from the server's first message (a ``query``, the describe exchange): the fedhet
config, the class names, the input shape and the normalisation statistics. It then finds its data:

- **simulation style**: ``node_config`` has ``partition-id`` (Flower's simulation sets it); the node takes
  that partition of the config's named dataset, exactly as the embedded engine splits it;
- **deployment style**: ``node_config`` has ``data-dir`` (and ``client-id``, its stable id in the
  federation); the node reads its own ``.npz`` or ``train/<class>/`` image folder.

It answers with its description (sample and per-class counts, its client id, its class names and input
shape), which the server checks. Each ``train`` message is an Instruction; the reply is the Reply of
:func:`~fedhet.engine.client.run_client`. Any error is sent back as the message's error, with the client's
own text, so the server logs why a node failed instead of waiting for it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp

from fedhet.config import ExperimentConfig, load_config_text
from fedhet.engine.client import describe_instruction, run_client
from fedhet.engine.faults import fault_for
from fedhet.engine.protocol import ClientData, TrainContext, Trainer
from fedhet.engine.schedule import resolve_device
from fedhet.engine.seeds import derived_torch_generator
from fedhet.errors import DataError, FedhetError, ProtocolError
from fedhet.flower.records import (
    NODE_RECORD,
    RUN_RECORD,
    content_to_instruction,
    load_state,
    reply_to_content,
    store_state,
)

log = logging.getLogger("fedhet.flower")

#: The reply's record of the node's seconds: the whole handler, and run_client's training within it.
TIMING_RECORD = "fedhet.timing"
#: The record of a node's report on its own table (the first exchange of a run with node-tables).
TABLE_RECORD = "fedhet.table"
#: Error code of a fedhet client failure (any other is Flower's own).
CLIENT_ERROR = 1101

#: Per process: what a node built for a run (config, data, trainer, work model), by run fingerprint.
_RUNTIMES: dict[str, NodeRuntime] = {}


class NodeRuntime:
    """What one node holds for one run: the config, its ClientData, its trainer and a work model."""

    def __init__(self, run: dict[str, Any], node_config: dict[str, Any]) -> None:
        self.cfg: ExperimentConfig = load_config_text(str(run["config"]))
        cfg = self.cfg
        torch.set_num_threads(cfg.train.threads or 1)  # one thread per node process (ENVIRONMENT: threads)
        self.device = resolve_device(cfg.train.device)
        from fedhet.algorithms import strategy_class
        from fedhet.models import build_model

        self.trainer: Trainer = strategy_class(cfg.method.name).trainer_class()
        self.classes = [str(c) for c in run["classes"]]
        self.input_shape = tuple(int(s) for s in run["input_shape"])
        self.model = build_model(cfg.model.name, self.input_shape, len(self.classes), **cfg.model.params).to(
            self.device
        )
        self.data, self.cid, self.names_given = self._load_data(run, node_config)

    def _load_data(self, run: dict[str, Any], node_config: dict[str, Any]) -> tuple[ClientData, int, bool]:
        cfg = self.cfg
        raw = self.trainer.needs_raw_inputs
        if "data-path" in node_config:  # the node's own table (CSV / Parquet), encoded as the run says
            cid = _client_id(node_config, "data-path")
            data = _local_table_data(str(node_config["data-path"]), cid, run, raw, self.device)
            return data, cid, True
        if "data-dir" in node_config:
            cid = _client_id(node_config, "data-dir")
            data, names_given = _local_client_data(
                str(node_config["data-dir"]), cid, self.classes, self.input_shape, run, raw, self.device
            )
            return data, cid, names_given
        if "partition-id" not in node_config:
            raise ProtocolError(
                "the node has neither a data-dir (its own data) nor a partition-id (Flower simulation) in "
                "its node config; start it with --node-config \"client-id=0 data-dir='/srv/site-a'\" (or "
                "data-path='/srv/site-a/train.csv' for a table)"
            )
        cid = int(node_config["partition-id"])
        partitions = int(node_config.get("num-partitions", cfg.data.clients))
        if partitions != cfg.data.clients:
            raise ProtocolError(
                f"the simulation runs {partitions} nodes but the config splits the data over "
                f"data.clients={cfg.data.clients}; make them equal"
            )
        from fedhet.engine.simulation import build_federation

        fed = build_federation(cfg, self.device, raw_inputs=raw)
        return fed.clients[cid], cid, True


def _normalizer(mean: list[float], std: list[float], table: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """(x/255 − mean)/std per channel (uint8 scaled, float taken as [0, 1]) — or (x − mean)/std per feature
    of a table's rows — with the server's statistics."""
    view = (-1,) if table else (-1, 1, 1)
    m = torch.tensor(mean, dtype=torch.float32).view(view)
    s = torch.tensor(std, dtype=torch.float32).view(view)

    def normalize(x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.uint8:
            x = x.to(torch.float32).div_(255.0)
        return (x - m.to(x.device, x.dtype)) / s.to(x.device, x.dtype)

    return normalize


def _local_client_data(
    data_dir: str,
    cid: int,
    classes: list[str],
    input_shape: tuple[int, ...],
    run: dict[str, Any],
    raw: bool,
    device: torch.device,
) -> tuple[ClientData, bool]:
    """A node's own data as ClientData, normalised with the run's statistics; shape and labels checked."""
    from fedhet.data.datasets import load_local_data

    table = len(input_shape) == 1
    arrays, names_given = load_local_data(data_dir, channels=1 if table else input_shape[0])
    shape = tuple(arrays.train_x.shape[1:])
    if shape != input_shape:
        what = "rows have features" if arrays.train_x.ndim == 2 else "images are"
        raise DataError(f"data-dir {data_dir}: {what} {shape} but the run's model takes {input_shape}")
    labels = np.asarray(arrays.train_y)
    if labels.size and (labels.min() < 0 or labels.max() >= len(classes)):
        raise DataError(
            f"data-dir {data_dir}: labels span {labels.min()}..{labels.max()}, the run has {len(classes)}"
        )
    if names_given and list(arrays.classes or []) != classes[: len(arrays.classes or [])]:
        raise DataError(
            f"data-dir {data_dir}: class names {list(arrays.classes)} differ from the run's {classes}"
        )
    return _client_data(arrays.train_x, labels, cid, len(classes), run, table, raw, device), names_given


def _client_id(node_config: dict[str, Any], data_key: str) -> int:
    if "client-id" not in node_config:
        raise ProtocolError(
            f"a node with its own {data_key} needs its client id in the federation: start it with "
            f"--node-config \"client-id=0 {data_key}='...'\" (ids 0..N-1, one per node, stable across "
            "restarts)"
        )
    return int(node_config["client-id"])


def _read_site_table(path: str) -> tuple[dict[str, Any], str]:
    from fedhet.data.datasets.site_tables import read_table_file

    return read_table_file(path), f"data-path {path}"


def table_report(message: Message, context: Context) -> Message:
    """The first exchange of a run whose nodes hold their own tables: what this node's table holds (per
    numeric column its sums, per categorical column its levels, its label counts; never a row). With
    data.impute, the server's further questions (``table-query``: value counts or counts at most a
    threshold of its numeric columns, then its report on its rows filled with the fill values)."""
    from fedhet.data.datasets.site_imputation import site_answer
    from fedhet.data.datasets.site_tables import site_numeric_values, site_report

    run = dict(message.content[RUN_RECORD])
    cfg = load_config_text(str(run["config"]))
    node_config = dict(context.node_config)
    if "data-path" not in node_config:
        raise ProtocolError(
            "the run's nodes read their own tables (node-tables = true) but this node has no data-path; "
            "start it with --node-config \"client-id=0 data-path='/srv/site-a/train.csv'\""
        )
    cid = _client_id(node_config, "data-path")
    columns, source = _read_site_table(str(node_config["data-path"]))
    d = cfg.data
    query = json.loads(str(run["table-query"])) if "table-query" in run else {"kind": "report"}
    options = {"label": d.label_column, "client": d.client_column, "categorical": d.categorical_columns}
    if query.get("kind") == "report":
        report = site_report(columns, **options, source=source, impute=d.impute, fills=query.get("fills"))
    else:
        report = site_answer(site_numeric_values(columns, **options, source=source), query)
    content = RecordDict()
    content[NODE_RECORD] = ConfigRecord({"client-id": cid})
    content[TABLE_RECORD] = ConfigRecord({"json": json.dumps(report)})
    return Message(content, reply_to=message)


def _local_table_data(
    path: str, cid: int, run: dict[str, Any], raw: bool, device: torch.device
) -> ClientData:
    """A node's own table, encoded with the run's encoding (the server's combination of every site's report)
    and standardised with the run's statistics."""
    from fedhet.data.datasets.site_tables import TableEncoding, encode_rows

    if "encoding" not in run:
        raise ProtocolError(
            "this node reads its own table (data-path) but the run sends no table encoding: submit the run "
            "with node-tables=true in flwr run's --run-config"
        )
    encoding = TableEncoding.from_json(json.loads(str(run["encoding"])))
    columns, source = _read_site_table(path)
    x, y = encode_rows(columns, encoding, source)
    return _client_data(x, y, cid, len(encoding.classes), run, True, raw, device)


def _client_data(
    x: np.ndarray,
    labels: np.ndarray,
    cid: int,
    num_classes: int,
    run: dict[str, Any],
    table: bool,
    raw: bool,
    device: torch.device,
) -> ClientData:
    from fedhet.data.datasets import to_tensor

    normalize = _normalizer(list(run["mean"]), list(run["std"]), table)
    images = to_tensor(x)  # canonical strides (see datasets.to_tensor: oneDNN and NHWC)
    if table and raw:  # a table's augmentations work on standardised rows (as in the embedded engine)
        inputs, normalize = normalize(images), (lambda x: x)
    else:
        inputs = (images.float() / 255.0) if raw else normalize(images)
    return ClientData(
        cid=cid,
        inputs=inputs.to(device),
        labels=torch.from_numpy(labels.astype(np.int64)).to(device),
        indices=torch.arange(len(labels), device=device),
        num_classes=num_classes,
        normalize=normalize if raw else None,
    )


def _run_record(message: Message, context: Context) -> dict[str, Any]:
    """The run description: from the describe message, or kept in the node's state since it arrived."""
    if RUN_RECORD in message.content:
        run = dict(message.content[RUN_RECORD])
        context.state[RUN_RECORD] = ConfigRecord(run)
        return run
    if RUN_RECORD not in context.state:
        raise ProtocolError("this node was sent a train message before the run's describe exchange")
    return dict(context.state[RUN_RECORD])


def _runtime(message: Message, context: Context) -> NodeRuntime:
    run = _run_record(message, context)
    key = hashlib.sha256(
        repr((sorted(run.items()), sorted(context.node_config.items()))).encode()
    ).hexdigest()
    if key not in _RUNTIMES:
        _RUNTIMES.clear()  # one run per process at a time
        _RUNTIMES[key] = NodeRuntime(run, dict(context.node_config))
    return _RUNTIMES[key]


def describe(message: Message, context: Context) -> Message:
    """The round-0 exchange: this node's description and who it is (or, first, its table's report)."""
    if RUN_RECORD in message.content and message.content[RUN_RECORD].get("table-report", False):
        return table_report(message, context)
    rt = _runtime(message, context)
    ctx = TrainContext(0, torch.Generator(), rt.device, rt.cfg.train, rt.model, shared=None)
    fault = fault_for(rt.cfg, rt.cid, 0)
    reply, _ = run_client(rt.trainer, describe_instruction(), load_state(context.state), rt.data, ctx, fault)
    content = reply_to_content(reply)
    content[NODE_RECORD] = ConfigRecord(
        {
            "client-id": rt.cid,
            "classes": rt.classes if rt.names_given else [],
            "input_shape": [int(s) for s in rt.data.inputs.shape[1:]],
        }
    )
    return Message(content, reply_to=message)


def train(message: Message, context: Context) -> Message:
    """One local update: the Instruction in, the Reply out, the new state into ``context.state``."""
    rt = _runtime(message, context)
    rnd = int(message.metadata.group_id)
    ctx = TrainContext(
        round=rnd,
        generator=derived_torch_generator(rt.cfg.seed, "client", rnd, rt.cid),
        device=rt.device,
        train=rt.cfg.train,
        model=rt.model,
        shared=None,  # no memory shared with other clients on Flower
    )
    started = time.perf_counter()
    instruction = content_to_instruction(message.content)
    fault = fault_for(rt.cfg, rt.cid, rnd)  # injected faults (robustness experiments) act on the node
    state = load_state(context.state)
    work_started = time.perf_counter()
    reply, state = run_client(rt.trainer, instruction, state, rt.data, ctx, fault)
    work_s = time.perf_counter() - work_started
    store_state(state, context.state)
    content = reply_to_content(reply)
    # Where the node's time went (the server's timings.jsonl splits Flower's round with it); not a metric
    # of the reply, so metrics.jsonl stays the same on every transport.
    content[TIMING_RECORD] = ConfigRecord({"handler_s": time.perf_counter() - started, "work_s": work_s})
    return Message(content, reply_to=message)


def _answer(handler: Callable[[Message, Context], Message], message: Message, context: Context) -> Message:
    """Run a handler; an exception goes back to the server as the reply's error, with the client's text."""
    try:
        return handler(message, context)
    except FedhetError as exc:
        reason = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # the server must learn why, not time out waiting
        reason = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
    log.error("node %s: %s", context.node_id, reason)
    return Message(Error(code=CLIENT_ERROR, reason=reason), reply_to=message)


def make_client_app() -> ClientApp:
    """The ClientApp every fedhet node runs (``query``: describe; ``train``: one local update)."""
    app = ClientApp()

    @app.query()
    def _query(message: Message, context: Context) -> Message:
        return _answer(describe, message, context)

    @app.train()
    def _train(message: Message, context: Context) -> Message:
        return _answer(train, message, context)

    return app
