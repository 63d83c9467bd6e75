"""The engine names nothing above it (data → models → engine → algorithms → report/cli): what a caller
makes of a run besides the run directory's records (TensorBoard scalars, CSVs, figures) reaches the round
loop as listeners it passes in."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fedhet.api import as_config
from fedhet.engine.rounds import RoundListener
from fedhet.experiment import make_simulation

ABOVE_THE_ENGINE = (
    "fedhet.algorithms",
    "fedhet.api",
    "fedhet.cli",
    "fedhet.comparison",
    "fedhet.experiment",
    "fedhet.flower",
    "fedhet.report",
    "fedhet.reproduce",
    "fedhet.studies",
)


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def test_importing_every_engine_module_loads_nothing_above_the_engine():
    code = (
        "import importlib, json, pkgutil, sys\n"
        "import fedhet.engine as engine\n"
        "for m in pkgutil.iter_modules(engine.__path__):\n"
        "    importlib.import_module('fedhet.engine.' + m.name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(done.stdout)
    assert "fedhet.engine.rounds" in loaded and "fedhet.engine.simulation" in loaded
    assert [m for m in loaded if m.startswith(ABOVE_THE_ENGINE)] == []


class Recorder(RoundListener):
    def __init__(self) -> None:
        self.heard: list[object] = []

    def start(self, run_dir):
        self.heard.append(("start", run_dir))

    def round_done(self, rnd, line):
        self.heard.append(("round", rnd, line["accuracy"]))

    def finished(self, summary):
        self.heard.append(("finished", summary["final"]["accuracy"]))

    def close(self):
        self.heard.append("close")


def test_a_listener_hears_each_round_then_the_summary_and_replaces_reports_listeners(tmp_path):
    cfg = as_config(
        {
            "data": {"dataset": "digits", "clients": 3, "split": "iid"},
            "model": {"name": "mlp"},
            "method": {"name": "celm", "params": {"warmup_fraction": 0.34, "probe_steps": 5}},
            "train": {"rounds": 2, "lr": 0.1},
            "eval": {"fairness": False, "tensorboard": True},
        }
    )
    recorder = Recorder()
    sim = make_simulation(cfg, run_dir=tmp_path / "run", listeners=[recorder])
    summary = sim.run()
    accuracies = [line["accuracy"] for line in sim.history]
    assert recorder.heard == [
        ("start", tmp_path / "run"),
        ("round", 1, accuracies[0]),
        ("round", 2, accuracies[1]),
        ("finished", summary["final"]["accuracy"]),
        "close",
    ]
    # the records are the engine's; TensorBoard scalars and CELM's CSVs are report/'s, not asked for here
    assert (tmp_path / "run" / "records.json").is_file() and (tmp_path / "run" / "summary.json").is_file()
    assert not (tmp_path / "run" / "tensorboard").exists()
    assert not (tmp_path / "run" / "contributions.csv").exists()
