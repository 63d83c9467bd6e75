"""Ctrl-C: a real ``fedhet run`` / ``fedhet compare`` process stops at once on SIGINT with exit code 130, one
line naming the round and the command that resumes it, no traceback; that command then finishes the run."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedhet.cli.common import interrupted_line, rerun_command
from fedhet.errors import RunInterrupted

TINY = ["--dataset", "digits", "--clients", "3", "--model", "mlp", "--quiet"]
TINY += ["--set", "eval.checkpoint_every=1", "--set", "guards.update_norm_factor=0"]
LIMIT_S = 120


def _fedhet(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fedhet", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _interrupt_after(proc: subprocess.Popen, marker: Path) -> tuple[str, str]:
    """SIGINT ``proc`` once ``marker`` exists (a checkpoint written); its stdout and stderr."""
    deadline = time.monotonic() + LIMIT_S
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGINT)
    return proc.communicate(timeout=LIMIT_S)


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "FEDHET_CACHE": str(tmp_path / "cache"), "COLUMNS": "200"}


def test_ctrl_c_stops_fedhet_run_cleanly_and_the_printed_command_resumes_it(tmp_path, env):
    out = tmp_path / "run"
    proc = _fedhet(["run", *TINY, "--rounds", "20", "--out", str(out)], env)
    try:
        _, err = _interrupt_after(proc, out / "checkpoints" / "round_00002")
        assert proc.returncode == 130, err
        assert "Traceback" not in err
        [line] = [ln for ln in err.splitlines() if "interrupted" in ln]
        assert line.startswith("fedhet: interrupted at round ")
        assert f"— resume with: fedhet run --resume {out}" in line
        assert not (out / "summary.json").exists()
        resume = shlex.split(line.split("resume with: ")[1].split(" (")[0])
        assert resume == ["fedhet", "run", "--resume", str(out)]
        done = _fedhet(resume[1:], env)
        try:
            _, err = done.communicate(timeout=LIMIT_S)
        finally:
            if done.poll() is None:
                done.kill()
        assert done.returncode == 0, err
        summary = json.loads((out / "summary.json").read_text())
        assert summary["rounds"] == 20
        rounds = [json.loads(ln)["round"] for ln in (out / "metrics.jsonl").read_text().splitlines()]
        assert rounds == list(range(1, 21))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_ctrl_c_stops_fedhet_compare_and_the_same_command_with_its_out_resumes(tmp_path, env):
    out = tmp_path / "cmp"
    args = ["compare", "--methods", "fedavg", *TINY, "--rounds", "20", "--no-report", "--out", str(out)]
    proc = _fedhet(args, env)
    try:
        _, err = _interrupt_after(proc, out / "fedavg-seed0" / "checkpoints" / "round_00002")
        assert proc.returncode == 130, err
        assert "Traceback" not in err
        [line] = [ln for ln in err.splitlines() if "interrupted" in ln]
        assert line.startswith("fedhet: interrupted at round ") and "— resume with: fedhet compare " in line
        resume = shlex.split(line.split("resume with: ")[1].split(" (")[0])
        assert resume[-2:] == ["--out", str(out)]
        done = _fedhet(resume[1:], env)
        try:
            _, err = done.communicate(timeout=LIMIT_S)
        finally:
            if done.poll() is None:
                done.kill()
        assert done.returncode == 0, err
        assert json.loads((out / "fedavg-seed0" / "summary.json").read_text())["rounds"] == 20
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_the_interrupted_line_and_the_rerun_command():
    exc = RunInterrupted(7, 5, "runs/x")
    line = interrupted_line(exc, "fedhet run --resume runs/x")
    assert line == (
        "interrupted at round 7 — resume with: fedhet run --resume runs/x (it continues after round 5, "
        "the last checkpoint)"
    )
    assert "no checkpoint yet" in interrupted_line(RunInterrupted(1, None), "fedhet run --resume d")
    assert interrupted_line(KeyboardInterrupt(), None) == "interrupted before its first round ended"
    argv = ["compare", "--methods", "fedavg,celm", "--out", "old", "--rerun", "--seeds", "2"]
    assert rerun_command(argv, Path("runs/c"), drop=("--rerun",)) == (
        "fedhet compare --methods fedavg,celm --seeds 2 --out runs/c"
    )
    # a worker process sends it back through a pipe: it keeps its fields
    import pickle

    back = pickle.loads(pickle.dumps(exc))
    assert (back.round, back.checkpoint_round, back.run_dir) == (7, 5, "runs/x")
