"""A process pool that runs every task in a fresh process, at most ``jobs`` at once.

``fedhet compare --jobs N`` runs each cell here. A long-lived worker (``ProcessPoolExecutor``) keeps the
modules it imported at its start and imports the others lazily from the tree as it is then, so editing
fedhet while a sweep runs gave cells a mix of old and new code (or an ``ImportError``). A fresh process per
cell runs the code of the tree when the cell starts, all of it. ``ProcessPoolExecutor(max_tasks_per_child=1)``
would do the same, but on Python 3.11 it stops scheduling once a worker has exited (CPython gh-115634).

Results come back through a pipe per task, read as soon as they arrive (a child blocked on a full pipe
never exits); a child that dies without a result fails its future with its exit code. Leaving the ``with``
block on an exception cancels the queued tasks and waits for the running ones.
"""

from __future__ import annotations

import collections
import multiprocessing.connection
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class WorkerDied(RuntimeError):
    """A task's process ended without sending a result (killed, or ``os._exit``)."""


def _run_task(send, initializer, initargs, fn, args) -> None:
    if initializer is not None:
        initializer(*initargs)
    try:
        outcome = (True, fn(*args))
    except BaseException as exc:  # sent back to fail the future; the traceback as text if it cannot pickle
        outcome = (False, exc)
    try:
        send.send(outcome)
    except Exception as exc:  # an unpicklable result or exception: its text instead
        failed = exc if outcome[0] else outcome[1]
        send.send((False, RuntimeError("".join(traceback.format_exception(failed)))))
    finally:
        send.close()


class FreshProcessPool:
    """``submit(fn, *args) -> Future``: each task in its own process of ``mp_context``, ``jobs`` at once."""

    def __init__(
        self,
        jobs: int,
        mp_context: Any,
        initializer: Callable[..., None] | None = None,
        initargs: tuple = (),
    ) -> None:
        self.jobs, self.ctx = max(1, int(jobs)), mp_context
        self.initializer, self.initargs = initializer, initargs
        self._queued: collections.deque = collections.deque()
        self._running: dict[Any, tuple[Any, Future]] = {}  # a task's result pipe -> (its process, its future)
        self._lock = threading.Lock()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="fedhet-process-pool", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self._closing:
                raise RuntimeError("the pool is shut down")
            self._queued.append((future, fn, args))
        return future

    def _start_queued(self) -> None:
        with self._lock:
            while self._queued and len(self._running) < self.jobs:
                future, fn, args = self._queued.popleft()
                if not future.set_running_or_notify_cancel():
                    continue
                recv, send = self.ctx.Pipe(duplex=False)
                # not a daemon: a cell may start processes of its own (a daemon may not)
                process = self.ctx.Process(
                    target=_run_task, args=(send, self.initializer, self.initargs, fn, args)
                )
                process.start()
                send.close()  # the child holds the only write end: its exit closes the pipe
                self._running[recv] = (process, future)

    def _loop(self) -> None:
        while True:
            self._start_queued()
            with self._lock:
                if self._closing and not self._queued and not self._running:
                    return
                pipes = list(self._running)
            if not pipes:
                time.sleep(0.05)
                continue
            for pipe in multiprocessing.connection.wait(pipes, timeout=0.2):
                process, future = self._running[pipe]
                try:
                    ok, value = pipe.recv()
                except (EOFError, OSError):
                    ok, value = None, None
                process.join()
                with self._lock:
                    del self._running[pipe]
                pipe.close()
                if ok is None:
                    future.set_exception(
                        WorkerDied(f"a worker process ended without a result (exit code {process.exitcode})")
                    )
                elif ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)

    def shutdown(self, cancel: bool = False) -> None:
        """Wait for the tasks; with ``cancel`` the queued ones are dropped first (the running ones finish:
        their results are kept on disk, and a Ctrl-C has already reached them)."""
        with self._lock:
            self._closing = True
            if cancel:
                for future, _, _ in self._queued:
                    future.cancel()
                self._queued.clear()
        self._thread.join()

    def __enter__(self) -> FreshProcessPool:
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            self.interrupt()
        self.shutdown(cancel=kind is not None)

    def interrupt(self) -> None:
        """Pass a Ctrl-C on to the running tasks (SIGINT), as a terminal does to its whole process group: a
        ``kill -INT`` of this process alone stops its cells too, each at its last checkpoint."""
        with self._lock:
            processes = [process for process, _ in self._running.values()]
        for process in processes:
            if process.is_alive() and process.pid is not None:
                try:
                    os.kill(process.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass


__all__ = ["FreshProcessPool", "WorkerDied"]
