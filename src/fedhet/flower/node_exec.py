"""A warm SuperExec for a fedhet SuperNode: each ClientApp process starts with torch and fedhet imported.

A Flower 1.42 SuperNode answers every message in a new ``flwr-clientapp`` process (process isolation): it
installs the app, imports it, answers the one message and exits. A fedhet ClientApp's process imports torch
(and, at its first optimizer step, ``torch._dynamo``) and fedhet before it can train, seconds per message
on a small machine, where a ClientApp that needs neither starts in a fraction of that.

This process takes the place of the ``flower-superexec`` that the SuperNode would start (run the node with
``--isolation process`` and this process beside it, pointed at the node's runtime API, the node's
``--port``)::

    flower-supernode --insecure --superlink HOST:9092 --isolation process --port 9094 --node-config "..."
    python -m fedhet.flower.node_exec --insecure --runtime-api-address 127.0.0.1:9094

It imports torch, ``torch._dynamo`` and fedhet's ClientApp path once, then runs Flower's own SuperExec loop
(``run_superexec``: it asks the node for tasks and launches each), except that a ClientApp task is launched
by forking this process: the child runs Flower's own ``run_clientapp`` (pulls the message and the node's
context, installs and loads the app, answers, pushes the reply and the context, exits), so every message is
still answered in a process of its own, by the app Flower sent, as with ``flower-superexec``; only the
imports are already done. No number changes (the same code runs on the same inputs). The parent runs no
torch operation (its thread pools start in the children). Stop it with SIGTERM or Ctrl-C, or give it
``--parent-pid`` to stop with that process.
"""

from __future__ import annotations

import os
import sys
import traceback

#: What the ClientApp path imports before it can answer (imported here once, before any fork).
WARM_MODULES = (
    "torch",
    "torch._dynamo",  # imported by torch.optim's first step
    "torch.optim",
    "fedhet.flower.client",
    "fedhet.algorithms",
    "fedhet.models",
    "fedhet.engine.simulation",
    "fedhet.data.datasets",
    "fedhet.data.datasets.site_tables",
)


def warm_up(modules: tuple[str, ...] = WARM_MODULES) -> None:
    """Import what a fedhet ClientApp process needs, so that every forked child has it."""
    import importlib

    for name in modules:
        importlib.import_module(name)


def _answer_task(spec) -> int:
    """In the forked child: Flower's own ClientApp process for one task; its exit code."""
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    try:
        run_clientapp(
            runtime_api_address=spec.runtime_api_address,
            token=spec.token,
            insecure=spec.insecure,
            certificates=validate_and_resolve_root_certificates(spec.root_certificates_path, spec.insecure),
            parent_pid=spec.parent_pid,
            runtime_dependency_install=spec.runtime_dependency_install,
        )
    except SystemExit as done:  # flwr_exit ends the process with the task's exit code
        return done.code if isinstance(done.code, int) else 1
    except BaseException:  # noqa: BLE001 - the child must never return into the parent's loop
        traceback.print_exc()
        return 1
    return 0


def fork_executor():
    """Flower's subprocess executor, except that a ClientApp task runs in a fork of this process."""
    from flwr.supercore.constant import TaskType
    from flwr.supercore.superexec.executor import LaunchResult
    from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor

    class ForkExecutor(SubprocessExecutor):
        def __init__(self) -> None:
            self.children: set[int] = set()

        def launch(self, spec):
            if spec.task_type != TaskType.CLIENT_APP:
                return super().launch(spec)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the child: answer the task, then leave without the parent's exit handlers
                code = _answer_task(spec)
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
            self.children.add(pid)
            return LaunchResult.accepted()

        def reconcile(self) -> None:
            """Reap the children that finished (each round of the SuperExec loop)."""
            for pid in list(self.children):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    self.children.discard(pid)

    return ForkExecutor()


def main(argv: list[str] | None = None) -> None:
    """``python -m fedhet.flower.node_exec``: ``flower-superexec``'s arguments (``--runtime-api-address``,
    ``--insecure`` or ``--root-certificates``, ``--parent-pid``)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m fedhet.flower.node_exec",
        description="A SuperExec for a fedhet SuperNode started with --isolation process: each ClientApp "
        "process starts with torch and fedhet imported (docs/flower.md).",
    )
    parser.add_argument(
        "--runtime-api-address", required=True, help="the SuperNode's runtime API (its --port)"
    )
    parser.add_argument("--insecure", action="store_true", help="the runtime API without TLS (its default)")
    parser.add_argument("--root-certificates", help="the runtime API's CA certificate, where it uses TLS")
    parser.add_argument("--parent-pid", type=int, help="stop when this process exits")
    args = parser.parse_args(argv)
    if not args.insecure and args.root_certificates is None:
        parser.error(
            "give --insecure (a SuperNode's runtime API is plain HTTP unless started with --ssl-certfile) or "
            "--root-certificates CA.crt"
        )
    # This process holds a gRPC channel to the node when it forks, and each child opens its own: gRPC
    # supports that only with its fork handlers on (grpc/doc/fork_support.md), read when gRPC loads, so
    # before warm_up() imports Flower. A site that set either variable keeps its value.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "true")
    os.environ.setdefault("GRPC_POLL_STRATEGY", "poll")
    warm_up()
    import flwr.supercore.superexec.run_superexec as superexec

    superexec.get_executor = lambda *_args, **_kwargs: fork_executor()  # this process's executor
    superexec.run_superexec(
        runtime_api_address=args.runtime_api_address,
        insecure=args.insecure,
        root_certificates_path=args.root_certificates,
        parent_pid=args.parent_pid,
        runtime_dependency_install=False,
    )


if __name__ == "__main__":
    main()
