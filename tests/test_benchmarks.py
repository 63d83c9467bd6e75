"""The benchmark plumbing: targets are judged the right way round, `make bench`'s page says what was met,
missed, failed or not run, and the GPU check script runs end to end (at tiny scale on the CPU)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import common  # noqa: E402
import engine_compare  # noqa: E402
import run_all  # noqa: E402


@pytest.mark.parametrize(
    "value,target,met,attained",
    [
        (1.02, "<= 1.05", True, 1.05 / 1.02),
        (1.10, "<= 1.05", False, 1.05 / 1.10),
        (2.14, ">= 3", False, 2.14 / 3),
        (3.5, ">= 3", True, 3.5 / 3),
        (3.0, ">= 3", True, 1.0),
    ],
)
def test_targets_are_judged_in_their_direction(value, target, met, attained):
    assert common.target_met(value, target) is met
    assert common.attainment(value, target) == pytest.approx(attained)


def test_flowers_round_is_split_into_nodes_transport_codec_and_round_loop(monkeypatch):
    # By hand: 10 nodes on 2 CPUs whose handlers took 2.0 s together overlap into 1.0 s of the 1.5 s exchange,
    # leaving 0.5 s to Flower; 0.05 + 0.05 s of server encoding and decoding; 2.0 − 1.5 − 0.1 = 0.4 s of loop.
    monkeypatch.setattr(engine_compare.os, "cpu_count", lambda: 2)
    row = {
        "clients": 10,
        "round_s": 2.0,
        "flower_exchange_s": 1.5,
        "flower_node_handler_sum_s": 2.0,
        "flower_node_work_sum_s": 1.0,
        "flower_encode_s": 0.05,
        "flower_decode_s": 0.05,
    }
    split = engine_compare.flower_split(row)
    expected = {
        "nodes_s": 1.0,
        "node_training_s": 0.5,
        "flower_transport_s": 0.5,
        "server_codec_s": 0.1,
        "round_loop_s": 0.4,
    }
    assert split == pytest.approx(expected)
    monkeypatch.setattr(engine_compare.os, "cpu_count", lambda: 64)  # more CPUs than nodes: one each
    assert engine_compare.flower_split(row)["nodes_s"] == pytest.approx(0.2)


def test_a_target_in_words_is_neither_met_nor_missed():
    assert common.target_met(1.4, "close to 2") is None
    assert common.attainment(1.4, "close to 2") is None


def test_emit_refuses_a_target_for_an_unmeasured_ratio(capsys):
    with pytest.raises(ValueError, match="speedup_50"):
        common.emit("x", {"speedup_10": 1.0}, {"speedup_50": ">= 3"}, settings="s")
    common.emit("x", {"speedup_10": 1.5}, {"speedup_10": ">= 3"}, settings="s", rows=[{"a": 1}])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["benchmark"] == "x" and out["ratios"] == {"speedup_10": 1.5} and out["peak_rss_mb"] > 0


def test_the_page_says_what_was_met_missed_failed_and_not_run():
    results = {
        "engine_overhead": {
            "benchmark": "engine_overhead",
            "ratios": {"engine_over_bare": 1.02},
            "targets": {"engine_over_bare": "<= 1.05"},
            "rows": [{"path": "fedhet engine", "round_ms": 812.5}],
            "settings": "ten clients",
            "peak_rss_mb": 900.0,
            "wall_s": 60.0,
            "commit": "abc1234",
        },
        "vectorized": {
            "benchmark": "vectorized",
            "ratios": {"speedup_50": 2.14},
            "targets": {"speedup_50": ">= 3"},
            "rows": [],
            "settings": "fifty clients",
            "peak_rss_mb": 800.0,
            "wall_s": 30.0,
        },
        "celm_probe": {
            "benchmark": "celm_probe",
            "failed": True,
            "returncode": 2,
            "output_tail": "Traceback X",
        },
    }
    page = run_all.render(results, {"CPU": "test CPU", "cores available": "2"}, "abc1234", None)
    summary = page.split("## 1.")[0]
    assert "| engine_overhead | `engine_over_bare` | 1.020 | <= 1.05 | yes |" in summary
    assert "| vectorized | `speedup_50` | 2.140 | >= 3 | **missed** |" in summary
    assert "| celm_probe | | | | **failed** (exit 2) |" in summary
    assert "needs CUDA" in summary  # gpu_round: no result and no GPU
    assert "| compare_jobs | | | | not run |" in summary
    assert "Traceback X" in page and "| fedhet engine | 812.5 |" in page
    assert "test CPU" in page and "abc1234" in page
    for bench in run_all.BENCHES:  # every section prints the command that regenerates it
        assert f"`{bench.command}`" in page


def run_gpu_script(name: str, tmp_path, timeout: int, cifar10_cache, **env_vars) -> None:
    """Run benchmarks/NAME at tiny scale on the CPU (SCALE=tiny, this interpreter, a private cache that
    reads the CIFAR-10 the suite decoded once: the decoding is tested in test_datasets.py)."""
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "datasets").symlink_to(cifar10_cache / "datasets", target_is_directory=True)
    env = {**os.environ, "SCALE": "tiny", "PYTHON": sys.executable, "FEDHET_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / name), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={**env, **env_vars},
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


@pytest.mark.slow
def test_gpu_check_script_runs_at_tiny_scale_on_the_cpu(tmp_path, cifar10_cache):
    run_gpu_script("gpu_check.sh", tmp_path, 400, cifar10_cache, DEVICE="cpu")
    result = json.loads((tmp_path / "out" / "gpu_round.json").read_text())
    assert result["benchmark"] == "gpu_round"
    assert set(result["ratios"]) == {"celm_round_over_bare", "fedavg_round_over_bare"}
    assert all(v > 0 for v in result["ratios"].values())
    assert result["device"] == "cpu" and result["host_syncs"] == {"fedavg_round": None, "proxyfl_round": None}
    log = (tmp_path / "out" / "test_gpu.log").read_text()
    assert "skipped" in log.lower() and "failed" not in log.lower()  # no CUDA here: they skip, not fail


@pytest.mark.slow
def test_gpu_reproduce_script_writes_its_result_pages_at_tiny_scale_on_the_cpu(tmp_path, cifar10_cache):
    run_gpu_script("gpu_reproduce.sh", tmp_path, 600, cifar10_cache)
    results = tmp_path / "out" / "results"
    celm = (results / "celm-table1-cifar10.md").read_text()
    row = next(line for line in celm.splitlines() if line.startswith("| CIFAR-10 Dir 0.05 |"))
    assert row.count("/ paper ") == 2 and "(1 seed)" in row  # FedAvg and CELM measured beside the paper
    proxy = (results / "proxyfl-table1.md").read_text()
    row = next(line for line in proxy.splitlines() if line.startswith("| CIFAR-10 α=0.1 |"))
    assert re.search(r"\*\*\d+\.\d\d\*\* \(1 seed\) / paper 88\.56", row)
    assert (
        "scale **quick**" in proxy
        and "[proxyfl-table1.md](proxyfl-table1.md)" in (results / "README.md").read_text()
    )
