"""A Flower run's life: ``resume`` and ``overwrite`` in the run config, what nodes keep between rounds, a
stop that keeps the last finished round, and nodes that Flower reports offline.

- **Checkpoints** are the round loop's (``fedhet.engine.rounds``: every ``eval.checkpoint_every`` rounds and
  the last one, the same files as the embedded engine). A Flower run can also stop between checkpoints
  (``flwr stop``, the SuperLink going away, an error): :class:`SaveOnStop` then saves the last finished
  round, as Ctrl-C does in the embedded engine, so a resumed run repeats no finished round (a ServerApp
  process killed outright, SIGKILL, saves nothing: it resumes from the last checkpoint).
- **Resume** (``resume=true``) continues from the folder's last checkpoint on the nodes that join now. A
  node's ``context.state`` belongs to one Flower run, so what the nodes kept (CELM's heads during warm-up,
  an own-model method's model, an attack's memory) is gone in the resumed run. :class:`NodeState` records
  what each client's node was told to keep; a resumed round whose instruction would need what a node lost
  stops the run with a ConfigError (no silent wrong answer), and a run with injected reply faults is not
  resumed at all. A run folder the embedded engine wrote is refused (``fedhet run --resume`` continues it).
- **Offline nodes.** Flower 1.42's SuperLink marks a node offline when it hears no heartbeat within
  ``HEARTBEAT_PATIENCE`` × its interval (a SuperNode stopped with SIGTERM or Ctrl-C says goodbye and is
  offline at once) and answers every message to it with a ``NODE_UNAVAILABLE`` error from the SuperLink
  itself, at the same moment ``grid.get_node_ids()`` stops listing it. :func:`error_reason` words that
  error; the transport matches such an answer to its client by the message it replies to.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from flwr.app import Message
from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL, HEARTBEAT_PATIENCE, ErrorCode

from fedhet.engine import checkpoint as ckpt
from fedhet.engine.protocol import KEEP_KEY, Instruction
from fedhet.engine.rounds import RoundListener
from fedhet.engine.rundir import FLOWER_NODES_FILE
from fedhet.engine.weights import snapshot_state
from fedhet.errors import ConfigError, option

#: What a checkpoint of a Flower run holds for its clients (the transport's state): client -> keep.
KEPT_KEY = "flower_kept"


def run_config_flag(run_config: Mapping[str, Any], key: str) -> bool:
    """A true/false keyword of flwr run's run config (``resume``, ``overwrite``); absent is false."""
    value = run_config.get(key, False)
    if isinstance(value, bool):
        return value
    raise ConfigError(
        f'{key}={value!r} in flwr run\'s --run-config must be true or false: --run-config "{key}=true"'
    )


def check_resume(run_dir: Path, cfg: Any) -> None:
    """Refuse ``resume`` where a Flower run cannot continue exactly: a folder whose checkpoints the embedded
    engine wrote, or a run whose injected reply faults keep a memory on the nodes."""
    if ckpt.latest_checkpoint(run_dir) is not None and not (run_dir / FLOWER_NODES_FILE).is_file():
        raise ConfigError(
            f"{run_dir} cannot be resumed on Flower: it holds a run of the embedded engine (checkpoints "
            f"but no {FLOWER_NODES_FILE}); continue it where it ran, fedhet run --resume {run_dir}, or pass "
            f"{option('overwrite')} to start it again on Flower"
        )
    from fedhet.attacks import attack_class

    remembering = sorted(
        {str(a) for a in cfg.faults.clients.values() if attack_class(str(a)).kind == "reply"}
    )
    if remembering:
        raise ConfigError(
            f"{run_dir} cannot be resumed on Flower: the run injects faults ({', '.join(remembering)}) "
            "whose memory lives in the nodes' Flower state, which a resumed Flower run does not have; pass "
            f"{option('overwrite')} to start it again"
        )


class NodeState:
    """What each client's node keeps between rounds (``keep``: "head", "model"; absent: nothing), as the
    instructions said; after a resume, what the nodes lost (:meth:`check` refuses a round that needs it)."""

    def __init__(self) -> None:
        self.kept: dict[int, str] = {}
        self.lost: dict[int, str] = {}

    def sent(self, cid: int, instruction: Instruction, answered: bool) -> None:
        """The node of ``cid`` was sent ``instruction``; ``answered``: it replied (and stored what it keeps).
        A node that failed may or may not have stored it: it is taken to keep it (the safe side)."""
        keep = str(instruction.config.get(KEEP_KEY, "none"))
        if keep != "none":
            self.kept[cid] = keep
        elif answered:
            self.kept.pop(cid, None)

    def state_dict(self) -> dict[str, Any]:
        return {KEPT_KEY: {str(c): k for c, k in sorted(self.kept.items())}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """A checkpoint's record, read by a resumed run: every node that kept something has lost it."""
        self.kept = {}
        self.lost = {int(c): str(k) for c, k in dict(state.get(KEPT_KEY, {})).items()}

    def check(self, rnd: int, cid: int, instruction: Instruction, keys: Collection[str], who: str) -> None:
        """Refuse round ``rnd``'s instruction to ``cid`` (``who`` names it) where it needs what its node lost
        in the resume: an increment, or a model short of some of its weights."""
        if cid not in self.lost:
            return
        missing = set(keys) - set(instruction.weights)
        if instruction.delta or missing:
            what = "its head" if self.lost[cid] == "head" else "its own model"
            sends = (
                "an increment to it"
                if instruction.delta
                else f"{len(keys) - len(missing)} of the model's {len(keys)} weights"
            )
            raise ConfigError(
                f"the resumed run cannot go on: round {rnd} needs what {who}'s node kept between rounds "
                f"({what}; the instruction sends {sends}), and a resumed Flower run's nodes start without "
                "it, so this run cannot continue exactly from its last checkpoint; pass "
                f"{option('overwrite')} to start it again"
            )
        del self.lost[cid]


class SaveOnStop(RoundListener):
    """Keeps a copy of the state after each finished round that was not checkpointed, and saves it (as that
    round's checkpoint) when the run stops before its end: nothing finished is lost."""

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.pending: tuple[int, dict[str, Any]] | None = None

    def round_done(self, rnd: int, line: Mapping[str, Any]) -> None:
        loop = self.loop
        if loop.run_dir is None or getattr(loop, "checkpoint_round", None) == rnd:
            self.pending = None
            return
        self.pending = (
            rnd,
            {
                "strategy": snapshot_state(loop.strategy.state_dict()),
                "kept": dict(loop.transport.nodes.kept),
                "rng": copy.deepcopy(loop.info.rng.bit_generator.state),
                "unusable_rounds": loop.unusable_rounds,
            },
        )

    def arm(self) -> None:
        """Have Flower's own exit save the kept round first. ``flwr stop`` ends a ServerApp process through
        Flower's exit (``flwr.supercore.exit.flwr_exit``: a SIGINT the process sends itself when the
        SuperLink refuses it), which runs its handlers and then force-exits within a few seconds, maybe before
        the exception reaches the round loop; a handler that runs before that timer starts saves in time."""
        from flwr.supercore.exit import add_exit_handler

        ref = weakref.ref(self)  # Flower keeps its handlers for the process's life: it must not keep the run

        def on_exit() -> None:
            saver = ref()
            if saver is not None:
                saver.save()

        add_exit_handler(on_exit, run_before_force_exit=True)

    def save(self) -> int | None:
        """Write the kept state as its round's checkpoint (the run is stopping: the live state is left as the
        copy's); returns that round, or None when there was nothing to save."""
        if self.pending is None:
            return None
        (rnd, state), self.pending = self.pending, None
        loop = self.loop
        loop.strategy.load_state_dict(state["strategy"])
        loop.transport.nodes.kept = state["kept"]
        loop.info.rng.bit_generator.state = state["rng"]
        loop.unusable_rounds = state["unusable_rounds"]
        loop.save(rnd)
        return rnd


def error_reason(msg: Message, node: int) -> str:
    """Why a node's answer is an error: Flower's own words, and for a node Flower marked offline, since
    when it counts as offline."""
    if msg.error.code == ErrorCode.NODE_UNAVAILABLE:
        return (
            f"node {node} went offline: Flower heard no heartbeat from it within {HEARTBEAT_PATIENCE} × "
            f"{HEARTBEAT_DEFAULT_INTERVAL:g} s (or it stopped)"
        )
    return msg.error.reason
