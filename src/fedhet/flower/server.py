"""The fedhet ServerApp: the round loop of ``fedhet.engine.rounds`` over Flower's Grid.

:class:`FlowerTransport` turns each round's Instructions into one Flower ``Message`` per node
(``grid.send_and_receive``), and the replies back into Replies. Node ids are Flower's and random; the
describe exchange (a ``query`` message to every node) learns which client id each node holds — its
``partition-id`` in simulation, its ``client-id`` in a deployment — and refuses nodes whose data do not match
the run (class names, input shape), naming the node and the mismatch. Replies are handed to the strategy in
client-id order, so the result does not depend on the order in which they arrive. A node that fails, that
Flower reports offline, or that does not answer within the round's timeout is recorded in ``metrics.jsonl``
(``failed``) and the round goes on with the others. Checkpoints, ``resume`` and the stop of a run:
``fedhet.flower.lifecycle``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedhet.config import ExperimentConfig, load_config, to_toml
from fedhet.engine.boundary import check_transport
from fedhet.engine.protocol import Failures, Instruction, Reply, Strategy, Transport
from fedhet.engine.rounds import RoundLoop
from fedhet.engine.rundir import FLOWER_NODES_FILE, write_atomic
from fedhet.errors import CALLER, ConfigError, FedhetError, ProtocolError, TrainingDivergedError
from fedhet.flower.client import TIMING_RECORD
from fedhet.flower.lifecycle import NodeState, SaveOnStop, check_resume, error_reason, run_config_flag
from fedhet.flower.records import NODE_RECORD, RUN_RECORD, content_to_reply, instruction_to_content
from fedhet.flower.server_log import FlowerLogListener, fedhet_log_to_flower, log_failure
from fedhet.report.listeners import run_listeners

log = logging.getLogger("fedhet.flower")

#: Seconds the server waits for replies in one round, and for the nodes to connect before round 0.
ROUND_TIMEOUT = 600.0
CONNECT_TIMEOUT = 120.0


def wait_for_nodes(grid: Grid, count: int, timeout: float) -> list[int]:
    """The connected nodes, waiting up to ``timeout`` seconds for ``count`` of them. On Flower's simulation
    (its in-memory Grid: ``flwr run`` on a simulation federation) every SuperNode is registered at once, so
    a count other than ``count`` is refused as soon as it stops changing, naming ``num-supernodes``."""
    from flwr.superlink.grid import InMemoryGrid  # here: a ClientApp process imports this module too

    simulated = isinstance(grid, InMemoryGrid)
    deadline = time.monotonic() + timeout
    nodes = sorted(grid.get_node_ids())
    while len(nodes) < count and time.monotonic() < deadline:
        time.sleep(1.0)
        before, nodes = nodes, sorted(grid.get_node_ids())
        if simulated and nodes and nodes == before:
            break  # the simulation registered all its SuperNodes: no more are coming
    if simulated and nodes and len(nodes) != count:
        raise ConfigError(
            f"Flower's simulation runs {len(nodes)} SuperNodes but the config has data.clients = {count}, "
            f'one SuperNode per client: pass --federation-config "num-supernodes={count}" to flwr run'
        )
    if len(nodes) < count:
        log.warning(
            "%d of %d nodes connected within %.0f s; going on without the others", len(nodes), count, timeout
        )
    return nodes


class FlowerTransport(Transport):
    """Instructions to Flower nodes and replies back, with the node ↔ client-id map of round 0."""

    name = "flower"

    def __init__(
        self,
        grid: Grid,
        run_record: dict[str, Any],
        *,
        num_clients: int,
        round_timeout: float = ROUND_TIMEOUT,
        connect_timeout: float = CONNECT_TIMEOUT,
        model_keys: Sequence[str] = (),
    ) -> None:
        self.grid = grid
        self.run_record = run_record
        self.num_clients = num_clients
        self.round_timeout = round_timeout
        self.connect_timeout = connect_timeout
        self._timing: dict[str, float] = {}
        self.node_of: dict[int, int] = {}  # client id -> Flower node id
        self.refused: dict[int, str] = {}  # node id -> why it was refused
        #: what each client's node keeps between rounds (checkpointed; a resumed run's nodes have lost it)
        self.nodes = NodeState()
        self.model_keys = list(model_keys)

    def state_dict(self) -> dict[str, Any]:
        return self.nodes.state_dict()

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.nodes.load_state_dict(sd)

    # -- round 0 --------------------------------------------------------------------------------------
    def wait_for_nodes(self) -> list[int]:
        """The connected nodes, waiting up to ``connect_timeout`` for as many as there are clients."""
        return wait_for_nodes(self.grid, self.num_clients, self.connect_timeout)

    def describe(self, client_ids: Sequence[int]) -> tuple[dict[int, Reply], Failures]:
        nodes = self.wait_for_nodes()
        messages = [
            Message(
                RecordDict({RUN_RECORD: ConfigRecord(self.run_record)}),
                dst_node_id=node,
                message_type=MessageType.QUERY,
                group_id="0",
            )
            for node in nodes
        ]
        descriptions: dict[int, Reply] = {}
        for msg in self.grid.send_and_receive(messages, timeout=self.round_timeout):
            node = msg.metadata.src_node_id
            if msg.has_error():
                self.refused[node] = msg.error.reason
                log.error("node %d refused the run: %s", node, msg.error.reason)
                continue
            try:
                if NODE_RECORD not in msg.content:
                    raise ProtocolError(
                        f"node {node} answered the describe query without a {NODE_RECORD!r} record (its "
                        "client-id and input_shape; fedhet.flower.records.description_to_content writes it)"
                    )
                cid = self._check_node(node, dict(msg.content[NODE_RECORD]))
                try:
                    descriptions[cid] = content_to_reply(msg.content, description=True)
                except ProtocolError as exc:
                    raise ProtocolError(f"node {node} (client {cid}): {exc}") from exc
            except FedhetError as exc:
                self.refused[node] = str(exc)
                log.error("refused node %d: %s", node, exc)
                continue
            self.node_of[cid] = node
        missing = [c for c in client_ids if c not in self.node_of]
        failures = {c: "no node described itself as this client" for c in missing}
        return descriptions, failures

    def _check_node(self, node: int, record: dict[str, Any]) -> int:
        """The node's client id, after checking its data against the run (ProtocolError naming the node)."""
        cid = record.get("client-id")
        if isinstance(cid, bool) or not isinstance(cid, int):
            raise ProtocolError(
                f"node {node}'s {NODE_RECORD!r} record gives client-id={cid!r}; it must be an integer"
            )
        shape, expected = record.get("input_shape"), list(self.run_record["input_shape"])
        if not isinstance(shape, list) or not all(isinstance(s, int) for s in shape):
            raise ProtocolError(
                f"node {node} (client {cid})'s {NODE_RECORD!r} record gives input_shape={shape!r}; it must "
                f"be a list of integers (the run's is {expected})"
            )
        if shape != expected:
            raise ProtocolError(
                f"node {node} (client {cid}) holds inputs of shape {shape}; the run's are {expected}"
            )
        classes = list(record.get("classes", []))
        if classes and classes != list(self.run_record["classes"])[: len(classes)]:
            raise ProtocolError(
                f"node {node} (client {cid}) names its classes {classes}; "
                f"the run's are {self.run_record['classes']}"
            )
        if not 0 <= cid < self.num_clients:
            raise ProtocolError(
                f"node {node} says it is client {cid}; the run has clients 0..{self.num_clients - 1}"
            )
        if cid in self.node_of:
            raise ProtocolError(f"node {node} and node {self.node_of[cid]} both say they are client {cid}")
        return cid

    # -- rounds -----------------------------------------------------------------------------------------
    def send(self, rnd: int, instructions: dict[int, Instruction]) -> tuple[dict[int, Reply], Failures]:
        started = time.perf_counter()
        failures: Failures = {}
        messages, client_of = [], {}
        connected = set(self.grid.get_node_ids())
        for cid in sorted(instructions):
            node = self.node_of.get(cid)
            if node is None:
                failures[cid] = "no node holds this client (it was refused or never connected)"
                continue
            if node not in connected:
                failures[cid] = f"node {node} is no longer connected"
                continue
            self.nodes.check(rnd, cid, instructions[cid], self.model_keys, f"client {cid}")
            client_of[node] = cid
            messages.append(
                Message(
                    instruction_to_content(instructions[cid]),
                    dst_node_id=node,
                    message_type=MessageType.TRAIN,
                    group_id=str(rnd),
                )
            )
        encoded = time.perf_counter()
        answers = list(self.grid.send_and_receive(messages, timeout=self.round_timeout))
        exchanged = time.perf_counter()
        # an answer is matched by the message it replies to: Flower's SuperLink itself answers for a node it
        # marked offline (NODE_UNAVAILABLE, from its own node id)
        sent = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
        replies: dict[int, Reply] = {}
        handler_s, work_s = [], []
        for msg in answers:
            node = sent.get(msg.metadata.reply_to_message_id, msg.metadata.src_node_id)
            cid = client_of.get(node)
            if cid is None:
                continue
            if msg.has_error():
                failures[cid] = error_reason(msg, node)
                continue
            try:
                replies[cid] = content_to_reply(msg.content)
            except ProtocolError as exc:  # a malformed reply: the client fails this round, the round goes on
                failures[cid] = f"node {msg.metadata.src_node_id}: {exc}"
                continue
            if TIMING_RECORD in msg.content:  # a node's own report, used for timings only
                handler_s.append(float(msg.content[TIMING_RECORD].get("handler_s", 0.0)))
                work_s.append(float(msg.content[TIMING_RECORD].get("work_s", 0.0)))
        for cid in client_of.values():
            if cid not in replies and cid not in failures:
                failures[cid] = f"no reply within {self.round_timeout:g} s"
            self.nodes.sent(cid, instructions[cid], answered=cid in replies)
        self._timing = {
            "flower_encode_s": encoded - started,
            "flower_exchange_s": exchanged - encoded,
            "flower_decode_s": time.perf_counter() - exchanged,
            "flower_node_handler_sum_s": sum(handler_s),
            "flower_node_work_sum_s": sum(work_s),
        }
        return replies, failures

    def round_timing(self) -> dict[str, float]:
        """The last round's seconds: the server encoding the instructions, the exchange (Flower carrying the
        messages and the nodes' handlers, waiting included), decoding the replies; and the nodes' own sums
        of their handlers' time and of the training inside them (run in parallel on Flower's workers)."""
        return dict(self._timing)


class FlowerServer(RoundLoop):
    """The round loop of a Flower ServerApp: evaluation data from the config (the server's own copy)."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        strategy: Strategy,
        grid: Grid,
        *,
        round_timeout: float = ROUND_TIMEOUT,
        connect_timeout: float = CONNECT_TIMEOUT,
        node_tables: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(cfg, strategy, **kwargs)
        self.grid = grid
        #: the last finished round's state, saved if the run stops before its next checkpoint
        self.stop_saver = SaveOnStop(self)
        self.listeners.insert(0, self.stop_saver)
        self.round_timeout = round_timeout
        self.connect_timeout = connect_timeout
        #: The nodes read their own tables: the encoding and statistics come from their reports.
        self.node_tables = node_tables
        self.table_encoding: Any = None
        self.table_refused: dict[int, str] = {}
        #: the round in progress (None between rounds): where a failure happened
        self.current_round: int | None = None

    def build_data(self):
        if self.node_tables:
            from fedhet.flower.site_tables import collect_table_reports, table_federation

            nodes = wait_for_nodes(self.grid, self.cfg.data.clients, self.connect_timeout)
            reports, self.table_refused = collect_table_reports(
                self.grid, nodes, self.cfg, self.cfg.data.clients, self.round_timeout
            )
            fed, self.table_encoding = table_federation(self.cfg, reports, self.device)
            return fed
        from fedhet.engine.simulation import build_federation

        return build_federation(self.cfg, self.device)

    def make_transport(self) -> FlowerTransport:
        ds = self.fed.dataset
        run_record = {
            "config": to_toml(self.cfg),
            "classes": [str(c) for c in ds.classes],
            "input_shape": [int(s) for s in ds.input_shape],
            "mean": [float(m) for m in ds.mean],
            "std": [float(s) for s in ds.std],
        }
        if self.table_encoding is not None:
            run_record["encoding"] = json.dumps(self.table_encoding.to_json())
        return FlowerTransport(
            self.grid,
            run_record,
            num_clients=self.cfg.data.clients,
            round_timeout=self.round_timeout,
            connect_timeout=self.connect_timeout,
            model_keys=list(self.template.state_dict()),
        )

    def client(self, cid: int) -> str:
        """A client as a log line names it: its number, its site's name where the data name sites, and the
        Flower node that holds it (once the describe exchange has learnt it)."""
        transport = getattr(self, "transport", None)
        node = transport.node_of.get(cid) if transport is not None else None
        return super().client(cid) + (f" (node {node})" if node is not None else "")

    def setup(self) -> None:
        if self.resume and self.run_dir is not None:  # before any data is built or a node asked
            check_resume(self.run_dir, self.cfg)
        super().setup()
        if self.run_dir is not None:  # once the nodes described themselves; it marks a Flower run's folder
            nodes = {
                "clients": {str(c): n for c, n in sorted(self.transport.node_of.items())},
                "refused": {str(n): r for n, r in {**self.table_refused, **self.transport.refused}.items()},
            }
            write_atomic(self.run_dir / FLOWER_NODES_FILE, json.dumps(nodes, indent=2))

    def _one_round(self, rnd: int) -> None:
        self.current_round = rnd
        super()._one_round(rnd)
        self.current_round = None

    def failure_state(self) -> dict[str, Any]:
        """Where a failed run stopped, for its log lines (``fedhet.flower.server_log.failure_lines``)."""
        history = getattr(self, "history", [])  # none before setup (a run folder refused, say)
        return {
            "run_dir": self.run_dir,
            "rounds": self.cfg.train.rounds,
            "failed_in": self.current_round,
            "done": int(history[-1]["round"]) if history else 0,
            "saved": getattr(self, "checkpoint_round", None),
        }

    def _train_rounds(self) -> None:
        self.stop_saver.arm()
        try:
            super()._train_rounds()
        except TrainingDivergedError:  # a result: the run ends as diverged, from the state it stopped in
            raise
        except BaseException:  # flwr stop, the SuperLink gone, an error: keep the last finished round
            if (saved := self.stop_saver.save()) is not None:
                log.warning("the run stopped; round %d is saved: resume=true continues after it", saved)
            raise
        finally:
            self.stop_saver.pending = None  # the run is over: nothing left to save at the process's exit


def make_server_app(
    cfg: ExperimentConfig | None = None,
    *,
    run_dir: str | os.PathLike | None = None,
    app_dir: str | os.PathLike | None = None,
    strategy: Strategy | None = None,
    reference_contributions: Sequence[float] | np.ndarray | None = None,
    progress: Callable[..., None] | None = None,
    on_summary: Callable[[dict[str, Any]], None] | None = None,
    overwrite: bool = False,
    resume: bool = False,
    log_to_flower: bool | None = None,
) -> ServerApp:
    """A ServerApp that runs one fedhet experiment.

    With ``cfg`` (Flower simulation from Python) it runs that config; otherwise it reads the run config of
    ``flwr run``: ``config`` (a fedhet TOML, relative to ``app_dir``), ``run-dir`` (a relative one resolves
    against the folder the SuperLink was started in), ``round-timeout``, ``connect-timeout``, ``node-tables``
    (the nodes read their own tables: ``fedhet.flower.site_tables``), ``overwrite`` (replace what
    ``run-dir`` holds) and ``resume`` (continue the stopped run in ``run-dir`` from its last checkpoint;
    ``fedhet.flower.lifecycle``), as the keywords ``overwrite`` and ``resume`` do. With ``log_to_flower``
    (the default when ``cfg`` is None: a ``flwr run``) each round's line, the end of the run and fedhet's
    warnings go to Flower's log (``flwr run --stream``, ``flwr log``; ``fedhet.flower.server_log``).
    """
    app = ServerApp()
    to_flower = cfg is None if log_to_flower is None else log_to_flower

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        if not to_flower:
            _main(grid, context)
            return
        token = CALLER.set("flower")  # advice in errors names the run config (overwrite=true), not flags
        made: dict[str, FlowerServer] = {}
        with fedhet_log_to_flower():
            try:
                _main(grid, context, made)
            except BaseException as exc:
                # only that it failed, where and how to go on; raised on, so Flower marks the run failed
                log_failure(exc, **(made["server"].failure_state() if "server" in made else {}))
                raise
            finally:
                CALLER.reset(token)

    def _main(grid: Grid, context: Context, made: dict[str, FlowerServer] | None = None) -> None:
        from fedhet.experiment import needs_reference, reference_reason, standalone_accuracies

        run_config = dict(context.run_config)
        replace = overwrite or run_config_flag(run_config, "overwrite")
        again = resume or run_config_flag(run_config, "resume")
        if replace and again:
            raise ConfigError(
                "resume and overwrite exclude each other: resume=true continues the stopped run in run-dir, "
                "overwrite=true starts it again"
            )
        config = cfg if cfg is not None else _config_from_run_config(run_config, app_dir)
        from fedhet.algorithms import build_strategy

        chosen = (
            strategy if strategy is not None else build_strategy(config.method.name, config.method.params)
        )
        node_tables = bool(run_config.get("node-tables", False))
        if node_tables:
            from fedhet.flower.site_tables import check_node_tables

            check_node_tables(config)
        reference = reference_contributions
        if reference is None and needs_reference(config, chosen) and node_tables:
            raise ConfigError(
                f"node-tables = true: {reference_reason(config, chosen)}; the server computes those "
                "accuracies on the sites' rows, which it does not hold: set eval.fairness = false, or run a "
                "method that does not need them"
            )
        if reference is None and needs_reference(config, chosen):
            # the cached pre-pass, on the server's copy of the data; one line says it runs, why and its cost
            reference = standalone_accuracies(
                config, notify=log.warning, reason=reference_reason(config, chosen)
            )
        out = run_dir if run_dir is not None else run_config.get("run-dir")
        if run_dir is None and out is not None:  # flwr run's run-dir: relative to the SuperLink's folder
            out = Path(str(out)).expanduser().resolve()
        listeners = run_listeners(config)
        if to_flower:
            listeners.append(FlowerLogListener(config.train.rounds, lambda cid: server.client(cid)))
        server = FlowerServer(
            config,
            chosen,
            grid,
            run_dir=out,
            progress=progress,
            reference_contributions=reference,
            listeners=listeners,
            overwrite=replace,
            resume=again,
            round_timeout=float(run_config.get("round-timeout", ROUND_TIMEOUT)),
            connect_timeout=float(run_config.get("connect-timeout", CONNECT_TIMEOUT)),
            node_tables=node_tables,
        )
        if made is not None:
            made["server"] = server
        summary = server.run()
        if on_summary is not None:
            on_summary(summary)

    return app


def _config_from_run_config(
    run_config: dict[str, Any], app_dir: str | os.PathLike | None
) -> ExperimentConfig:
    if "config" not in run_config:
        raise ConfigError(
            "the Flower app's run config has no 'config' (the fedhet experiment TOML); set it under "
            "[tool.flwr.app.config] in the app's pyproject.toml or with "
            "flwr run --run-config \"config='x.toml'\""
        )
    path = Path(str(run_config["config"])).expanduser()
    if not path.is_absolute() and app_dir is not None:
        path = Path(app_dir) / path
    return load_config(path)


def run_flower_simulation(
    cfg: ExperimentConfig,
    run_dir: str | os.PathLike | None = None,
    *,
    strategy: Strategy | None = None,
    reference_contributions: Sequence[float] | np.ndarray | None = None,
    progress: Callable[..., None] | None = None,
    verbose: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run ``cfg`` on Flower's simulation engine (Ray): one virtual SuperNode per client, each with one
    CPU; returns the summary, as :func:`fedhet.experiment.run_experiment` does."""
    from flwr.simulation import run_simulation

    from fedhet.algorithms import build_strategy
    from fedhet.flower.client import make_client_app

    strategy = strategy if strategy is not None else build_strategy(cfg.method.name, cfg.method.params)
    check_transport(strategy, FlowerTransport.name)  # before Ray starts
    result: dict[str, Any] = {}
    server_app = make_server_app(
        cfg,
        run_dir=run_dir,
        strategy=strategy,
        reference_contributions=reference_contributions,
        progress=progress,
        on_summary=result.update,
        overwrite=overwrite,
    )
    backend = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"include_dashboard": False, "num_cpus": os.cpu_count() or 1},
    }
    run_simulation(
        server_app,
        make_client_app(),
        num_supernodes=cfg.data.clients,
        backend_config=backend,
        verbose_logging=verbose,
    )
    if not result:
        raise FedhetError(
            "the Flower simulation ended without a summary; see the log above for the server's error"
        )
    return result
