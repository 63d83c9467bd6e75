"""No method may crash the interpreter (issue 17 reported glibc heap-corruption aborts in fedprox-labeled's
standalone pre-pass on digits with a ResNet-8). Each check runs in a subprocess, so a native crash fails
the test with the method it happened in instead of killing the test run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedhet.algorithms import method_names

HERE = Path(__file__).parent


def _run(cmd: list[str], tmp_path: Path, timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "FEDHET_CACHE": str(tmp_path / "cache"), "PYTHONFAULTHANDLER": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)


def test_the_reported_fedprox_labeled_command_completes(tmp_path):
    cmd = [sys.executable, "-m", "fedhet.cli", "run", "--method", "fedprox-labeled", "--dataset", "digits"]
    cmd += [
        "--split",
        "labeled-unlabeled",
        "--set",
        "data.split_params.labeled_per_class=20",
        "--clients",
        "4",
    ]
    cmd += ["--rounds", "2", "--seed", "0", "--model", "resnet8", "--set", "model.params.width=4"]
    cmd += ["--set", "train.local_steps=2", "--set", "train.threads=1", "--out", "r", "--quiet", "--json"]
    done = _run(cmd, tmp_path, timeout=300)
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stderr[-3000:]}"
    assert '"method": "fedprox-labeled"' in done.stdout


@pytest.mark.slow
@pytest.mark.xdist_group("every-method-run")  # one worker runs the shared subprocess once
def test_every_method_runs_on_digits_without_a_native_crash(every_method_run):
    done = every_method_run
    lines = done.stdout.splitlines()
    started = [ln.split()[1] for ln in lines if ln.startswith("start ")]
    if done.returncode != 0:  # a negative code is the signal that killed it (-6 SIGABRT, -7 SIGBUS, -11 ...)
        pytest.fail(
            f"exit {done.returncode} in method {started[-1] if started else '?'}:\n{done.stderr[-3000:]}"
        )
    finished = {ln.split()[1] for ln in lines if ln.startswith("done ")}
    refused = [ln for ln in lines if ln.startswith("refused ")]
    methods = [name for name in started if "+" not in name]  # the rest: FedAvg variants
    assert methods == method_names()
    assert not refused, refused  # every method accepts this setting
    assert set(method_names()) <= finished
