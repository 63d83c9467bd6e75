"""A minimal Flower app: the ServerApp sends every node the same ArrayRecord (a model's weights) and waits
for all replies, ``rounds`` times after a first exchange; the ClientApp returns what it got. Flower alone,
no torch, no data: what a deployment round costs before any app does anything (benchmarks/flower_rounds.py).
"""

from __future__ import annotations

import json
import time

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

server_app = ServerApp()
client_app = ClientApp()


@client_app.train()
def echo(message: Message, context: Context) -> Message:  # noqa: ARG001 - Flower's signature
    return Message(content=message.content, reply_to=message)


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    with np.load(str(cfg["weights"])) as npz:
        arrays = {key: Array(npz[key]) for key in npz.files}
    nodes, rounds = int(cfg["nodes"]), int(cfg["rounds"])
    deadline = time.monotonic() + float(cfg["connect-timeout"])
    while len(ids := sorted(grid.get_node_ids())[:nodes]) < nodes:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(ids)} of {nodes} nodes connected")
        time.sleep(1.0)
    seconds = []
    for r in range(rounds + 1):  # a first exchange (fedhet's describe), then the rounds
        begun = time.perf_counter()
        content = RecordDict({"weights": ArrayRecord(arrays)})
        sent = [Message(content, dst_node_id=i, message_type=MessageType.TRAIN, group_id=str(r)) for i in ids]
        replies = list(grid.send_and_receive(sent, timeout=600.0))
        if len(replies) != nodes or any(m.has_error() for m in replies):
            raise RuntimeError(f"exchange {r}: {len(replies)} replies of {nodes}, or an error")
        seconds.append(time.perf_counter() - begun)
    with open(str(cfg["out"]), "w") as fh:
        json.dump({"startup_s": seconds[0], "round_s": seconds[1:]}, fh)
