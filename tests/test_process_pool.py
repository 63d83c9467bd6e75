"""The pool `fedhet compare --jobs N` runs its cells in: a fresh process per task, at most N at once."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

from fedhet.process_pool import FreshProcessPool, WorkerDied

SPAWN = mp.get_context("spawn")


def test_every_task_runs_in_a_fresh_process_and_results_and_errors_come_back():
    with FreshProcessPool(2, SPAWN) as pool:
        pids = [pool.submit(os.getpid) for _ in range(3)]
        bad = pool.submit(int, "not a number")
        died = pool.submit(os._exit, 3)
        big = pool.submit(bytes, 3_000_000)  # larger than a pipe's buffer: read while the child waits
        pids = [f.result(timeout=120) for f in pids]
    assert len(set(pids)) == 3 and os.getpid() not in pids  # a long-lived worker would repeat a pid
    with pytest.raises(ValueError, match="not a number"):
        bad.result()
    with pytest.raises(WorkerDied, match="exit code 3"):
        died.result()
    assert big.result() == bytes(3_000_000)


def test_at_most_jobs_tasks_run_at_once_and_an_exception_cancels_the_queued_ones():
    started = time.perf_counter()
    with FreshProcessPool(1, SPAWN) as pool:
        first = pool.submit(time.sleep, 0.5)
        second = pool.submit(os.getpid)
        assert second.result(timeout=120) and first.done()  # one slot: the second waited for the first
    assert time.perf_counter() - started >= 0.5
    with pytest.raises(KeyError):
        with FreshProcessPool(1, SPAWN) as pool:
            running = pool.submit(time.sleep, 0.3)
            queued = [pool.submit(os.getpid) for _ in range(3)]
            while not running.running():
                time.sleep(0.01)
            raise KeyError("stop")
    assert running.done() and running.exception() is None  # the running task finished
    assert all(f.cancelled() for f in queued)
