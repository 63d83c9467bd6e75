"""Ctrl-C: a real ``fedhet run`` / ``fedhet compare`` process, on SIGINT, finishes the round in progress,
saves it and stops with exit code 130 and one line naming the round and the command that resumes it, no
traceback; that command then finishes the run. A second SIGINT stops at once."""

from __future__ import annotations

import contextlib
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


def _default_sigint() -> None:
    # A test suite started in the background (`make test &`, nohup) hands its children SIGINT ignored,
    # which Python keeps ignored; a terminal's Ctrl-C reaches a run with the default disposition.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _fedhet(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fedhet", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_default_sigint,
    )


def _wait_for(proc: subprocess.Popen, ready) -> None:
    deadline = time.monotonic() + LIMIT_S
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run did not get there in time"
        time.sleep(0.02)


def _interrupt_after(proc: subprocess.Popen, marker: Path, times: int = 1) -> tuple[str, str]:
    """SIGINT ``proc`` (``times`` times, 0.05 s apart) once ``marker`` exists; its stdout and stderr."""
    _wait_for(proc, marker.exists)
    for _ in range(times):
        os.kill(proc.pid, signal.SIGINT)
        time.sleep(0.05)
    return proc.communicate(timeout=LIMIT_S)


def _rounds(run: Path) -> list[int]:
    return [json.loads(ln)["round"] for ln in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "FEDHET_CACHE": str(tmp_path / "cache"), "COLUMNS": "200"}


@contextlib.contextmanager
def _running(args: list[str], env: dict[str, str]):
    """``fedhet ARGS`` as a process, killed by its pid on the way out whatever happens."""
    proc = _fedhet(args, env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _stopped(proc: subprocess.Popen, err: str) -> str:
    """The one 'interrupted' line of a process Ctrl-C stopped cleanly (exit 130, no traceback)."""
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    [line] = [ln for ln in err.splitlines() if "interrupted" in ln]
    return line


def _resume(line: str, env: dict[str, str]) -> list[str]:
    """Run the command the line prints to its end (exit 0); that command, split."""
    command = shlex.split(line.split("resume with: ")[1].split(" (")[0])
    with _running(command[1:], env) as done:
        _, err = done.communicate(timeout=LIMIT_S)
        assert done.returncode == 0, err
    return command


@pytest.mark.slow
def test_ctrl_c_finishes_the_round_saves_it_and_the_printed_command_resumes_without_loss(tmp_path, env):
    out = tmp_path / "run"
    # checkpoints every 10 rounds: the round Ctrl-C stops after is saved all the same
    args = ["run", *TINY, "--rounds", "20", "--out", str(out), "--set", "eval.checkpoint_every=10"]
    with _running(args, env) as proc:
        _wait_for(proc, lambda: (out / "metrics.jsonl").exists() and len(_rounds(out)) >= 2)
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=LIMIT_S)
        line = _stopped(proc, err)
        assert "stopping after the round in progress" in err
        last = _rounds(out)[-1]
        assert 2 <= last < 10  # stopped before any scheduled checkpoint
        assert line.startswith(
            f"fedhet: interrupted after round {last} — resume with: fedhet run --resume {out}"
        )
        assert line.endswith(f"(it continues after round {last}, the last checkpoint)")
        assert (out / "checkpoints" / f"round_{last:05d}").is_dir()
        assert not (out / "summary.json").exists()
        assert _resume(line, env) == ["fedhet", "run", "--resume", str(out)]
        assert json.loads((out / "summary.json").read_text())["rounds"] == 20
        assert _rounds(out) == list(range(1, 21))  # no round lost, none repeated


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once(tmp_path, env):
    out = tmp_path / "run"
    # rounds of 10 local epochs (seconds each): both signals, 0.05 s apart, land within one round
    slow = ["--set", "train.local_epochs=10"]
    with _running(["run", *TINY, *slow, "--rounds", "400", "--out", str(out)], env) as proc:
        _, err = _interrupt_after(proc, out / "checkpoints" / "round_00002", times=2)
        line = _stopped(proc, err)
        assert line.startswith("fedhet: interrupted at round ") and "resume with: fedhet run --resume" in line


@pytest.mark.slow
def test_ctrl_c_stops_fedhet_compare_and_the_same_command_with_its_out_resumes(tmp_path, env):
    out = tmp_path / "cmp"
    args = ["compare", "--methods", "fedavg", *TINY, "--rounds", "20", "--no-report", "--out", str(out)]
    with _running(args, env) as proc:
        _, err = _interrupt_after(proc, out / "fedavg-seed0" / "checkpoints" / "round_00002")
        line = _stopped(proc, err)
        assert (
            line.startswith("fedhet: interrupted after round ") and "— resume with: fedhet compare " in line
        )
        assert _resume(line, env)[-2:] == ["--out", str(out)]
        assert json.loads((out / "fedavg-seed0" / "summary.json").read_text())["rounds"] == 20


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
