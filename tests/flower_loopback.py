"""A Flower Grid that carries the ServerApp's messages to ClientApps in this process: each message goes to the
ClientApp of its destination node, with that node's own Context (node config, ``context.state``), and the
reply comes back, as Flower's SuperLink would carry them, without Ray or a network. The server's message
handling and the ClientApps are the real ones; only the carrying is done here."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from uuid import uuid4

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity


class LoopbackGrid(Grid):
    """Nodes ``node id -> (ClientApp, node_config)``, answered in the order the messages were sent."""

    def __init__(self, nodes: dict[int, tuple[ClientApp, dict]]) -> None:
        self.apps = {node: app for node, (app, _) in nodes.items()}
        self.contexts = {
            node: Context(run_id=1, node_id=node, node_config=dict(cfg), state=RecordDict(), run_config={})
            for node, (_, cfg) in nodes.items()
        }

    def get_node_ids(self) -> list[int]:
        return sorted(self.apps)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid4())  # what the SuperLink sets on arrival
            node = msg.metadata.dst_node_id
            replies.append(self.apps[node](msg, self.contexts[node]))
        return replies

    def _unused(self, *args, **kwargs):
        raise NotImplementedError("the loopback grid only sends and receives")

    set_run = run = create_message = push_messages = pull_messages = _unused


@contextmanager
def server_identity() -> Iterator[None]:
    """The identity a ServerApp process has in Flower (a Message is stamped with it), restored afterwards."""
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved
