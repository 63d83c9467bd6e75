"""Flower from the command line on one machine.

- ``flwr run`` as Flower users type it, on Flower's own local simulation federation (``local``, address
  ``:local:``), from a copy of the example app (docs/flower.md): nothing is installed at run time, the run's
  metrics equal the embedded engine's, and no process it started outlives it. The SuperLink is started as
  the docs start it (a simulation SuperLink with runtime dependency installation off) on free ports of
  127.0.0.1, which ``flwr`` finds through FLWR_LOCAL_SUPERLINK_HTTP_API_PORT and FLWR_LOCAL_CONTROL_API_PORT
  (Flower's defaults are 39091 and 39093), with a private FLWR_HOME.
- A simulation federation whose SuperNode count differs from ``data.clients`` is refused at once.
- ``fedhet run --engine flower-simulation --quiet`` prints no Flower or Ray line below WARNING."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the Flower tests need fedhet[flower]; make setup installs it")

from flwr.superlink.grid import InMemoryGrid  # noqa: E402

from fedhet.config import load_config  # noqa: E402
from fedhet.errors import ConfigError  # noqa: E402
from fedhet.experiment import make_simulation  # noqa: E402
from fedhet.flower.server import wait_for_nodes  # noqa: E402
from flower_cluster import BIN, free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

DIGITS = """seed = 0
[data]
dataset = "digits"
split = "iid"
clients = 3
[model]
name = "mlp"
[train]
rounds = 2
local_steps = 5
threads = 1
[method]
name = "fedavg"
[eval]
fairness = false
"""


def _processes_with(variable: str) -> list[str]:
    """The live processes whose environment holds ``variable`` (``NAME=value``), as "pid command"."""
    found, needle = [], variable.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")[:160]
                found.append(f"{entry.name} {command!r}")
        except OSError:  # gone, or not ours to read
            continue
    return found


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGINT (Ctrl-C) to the process group ``proc`` leads, then SIGTERM, then SIGKILL; each with a
    deadline."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=15)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").is_file(), reason="reads /proc to find leftover processes")
def test_flwr_run_on_the_local_simulation_federation_installs_nothing_and_leaves_nothing_running(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))
    app = tmp_path / "app"
    shutil.copytree(
        ROOT / "examples" / "flower-app", app, ignore=shutil.ignore_patterns("runs", "__pycache__")
    )
    (app / "digits.toml").write_text(DIGITS)
    home, run_dir = tmp_path / "flwr-home", tmp_path / "run"
    http_port, control_port = free_port(), free_port()
    env = {
        **os.environ,
        "FLWR_HOME": str(home),  # a fresh one: flwr writes its default config.toml, federation "local"
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
        "FEDHET_CACHE": str(tmp_path / "cache"),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", None)  # the SuperLink's flag alone turns it off
    superlink_args = [
        str(BIN / "flower-superlink"),
        "--insecure",
        "--simulation",
        "--disable-runtime-dependency-installation",
        "--host",
        "127.0.0.1",
        "--port",
        str(http_port),
        "--control-api-address",
        f"127.0.0.1:{control_port}",
    ]
    log = tmp_path / "superlink.log"
    superlink = None
    try:
        with open(log, "wb") as out:
            superlink = subprocess.Popen(
                superlink_args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=tmp_path,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while "Uvicorn running on" not in log.read_text(errors="replace"):
            assert superlink.poll() is None, (
                f"the SuperLink exited:\n{log.read_text(errors='replace')[-3000:]}"
            )
            assert time.monotonic() < deadline, (
                f"no SuperLink within 60 s:\n{log.read_text(errors='replace')}"
            )
            time.sleep(0.3)
        command = [
            str(BIN / "flwr"),
            "run",
            ".",  # the default federation of a fresh FLWR_HOME: "local", Flower's local simulation
            "--federation-config",
            "num-supernodes=3",
            "--run-config",
            f"config='digits.toml' run-dir='{run_dir}'",
            "--stream",
        ]
        with open(tmp_path / "flwr-run.log", "wb") as out:
            flwr_run = subprocess.Popen(command, env=env, cwd=app, stdout=out, stderr=subprocess.STDOUT)
        try:  # meanwhile, the embedded engine on the same config
            make_simulation(load_config(app / "digits.toml"), run_dir=tmp_path / "embedded").run()
            flwr_run.wait(timeout=180)
        finally:
            if flwr_run.poll() is None:
                flwr_run.kill()
                flwr_run.wait()
    finally:
        if superlink is not None:
            _stop_group(superlink)  # Ctrl-C, as in the docs' terminal
    stream = (tmp_path / "flwr-run.log").read_text(errors="replace")
    assert flwr_run.returncode == 0, stream
    assert "Using SuperLink: local" in stream and "Starting local SuperLink" not in stream, stream
    # nothing installed at run time (Flower would say "Installing application dependencies" and make a
    # runtime environment under FLWR_HOME/runtime-envs)
    assert "Installing application dependencies" not in stream, stream
    assert not any((home / "runtime-envs").glob("*")), sorted((home / "runtime-envs").iterdir())
    assert f"fedhet: run folder: {run_dir}" in stream, stream
    # every process it started is gone: the SuperLink, its SuperExec (its own session), flwr-simulation and
    # Ray's processes all carry this FLWR_HOME in their environment
    deadline = time.monotonic() + 20
    while (left := _processes_with(f"FLWR_HOME={home}")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, left
    # the same metrics as the embedded engine, line for line: the same code path on one machine, one torch
    # thread per client, replies in client-id order (as the other Flower bit-identity tests compare)
    assert (run_dir / "metrics.jsonl").read_bytes() == (tmp_path / "embedded" / "metrics.jsonl").read_bytes()


@pytest.mark.slow
def test_quiet_quiets_flower_and_ray_too_but_not_their_warnings(tmp_path):
    config = tmp_path / "digits.toml"
    config.write_text(DIGITS.replace("rounds = 2", "rounds = 1"))
    # --quiet wins even where Flower was asked for its DEBUG lines
    env = {**os.environ, "FEDHET_CACHE": str(tmp_path / "cache"), "FLWR_LOG_LEVEL": "DEBUG"}
    command = [str(BIN / "fedhet"), "run", str(config), "--engine", "flower-simulation", "--quiet"]
    with open(tmp_path / "quiet.err", "wb") as out:
        proc = subprocess.Popen(
            [*command, "--out", str(tmp_path / "run")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=out,
            start_new_session=True,  # Ray's processes too are stopped with the group if it overruns
        )
    try:
        proc.wait(timeout=240)
    finally:
        _stop_group(proc)
    quiet = (tmp_path / "quiet.err").read_text(errors="replace")
    assert proc.returncode == 0, quiet
    # a record's level opens its line (after Ray's "(pid=...)" prefix for a worker's; colours dropped):
    # Flower's "INFO :" / "DEBUG <time>:", Ray's "... INFO worker.py", fedhet's root handler "DEBUG flwr:"
    level = re.compile(r"^(?:\(\S*\s*pid=\d+\)\s*)?(?:\S+ \S+ )?(INFO|DEBUG)\b")
    quiet = re.sub(r"\x1b\[[0-9;]*m", "", quiet)
    assert not [line for line in quiet.splitlines() if level.match(line)], quiet
    assert "round 1/1" not in quiet, quiet  # no progress (tests/test_cli.py: printed without --quiet)
    # Flower's warnings still show, once (its own handler prints them; fedhet's does not print them again)
    assert quiet.count("DEPRECATED FEATURE: The `run_simulation` function is deprecated") == 1, quiet


def test_without_verbose_fedhet_does_not_print_flowers_records_a_second_time(tmp_path):
    """Flower sets its logger to DEBUG and prints its records with its own handler; fedhet's command-line
    handler (``fedhet.cli.main``) must neither print them again nor add Flower's DEBUG records: the records
    a Flower run makes, made here without starting Ray."""
    script = (
        "import logging\n"
        "import flwr.common.logger  # Flower's logger at DEBUG, with its own handler\n"
        "from fedhet.cli import main\n"
        "assert main(['methods']) == 0  # any command sets up fedhet's handler\n"
        "logging.getLogger('flwr').debug('a Flower debug record')\n"
        "logging.getLogger('flwr').warning('a Flower warning')\n"
        "logging.getLogger('fedhet.test').warning('a fedhet warning')\n"
    )
    done = subprocess.run(
        [str(BIN / "python"), "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    err = re.sub(r"\x1b\[[0-9;]*m", "", done.stderr)
    assert not re.search(r"^DEBUG flwr", err, re.M), err  # fedhet's format: "LEVEL name: message"
    assert err.count("a Flower warning") == 1, err  # Flower's handler alone prints it
    assert "WARNING fedhet.test: a fedhet warning" in err, err  # fedhet's handler still prints its own


class SimulatedGrid(InMemoryGrid):
    """Flower's simulation Grid as fedhet's ServerApp sees it before round 0: the SuperNodes Flower
    registered (``num-supernodes`` of them, all at once)."""

    def __init__(self, nodes: list[int]) -> None:  # no link state: only the node list is asked for
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)


def test_a_simulation_with_another_number_of_supernodes_than_clients_is_refused_at_once_naming_the_fix():
    started = time.monotonic()
    with pytest.raises(ConfigError, match='runs 2 SuperNodes .* data.clients = 3.* "num-supernodes=3"'):
        wait_for_nodes(SimulatedGrid([11, 12]), 3, timeout=120.0)  # flwr run's default: 2 SuperNodes
    with pytest.raises(ConfigError, match='runs 4 SuperNodes .* "num-supernodes=3"'):
        wait_for_nodes(SimulatedGrid([11, 12, 13, 14]), 3, timeout=120.0)
    assert time.monotonic() - started < 10  # not the 120 s connect-timeout
    assert wait_for_nodes(SimulatedGrid([13, 11, 12]), 3, timeout=120.0) == [11, 12, 13]
