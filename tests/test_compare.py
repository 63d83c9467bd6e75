"""`fedhet compare` as a resumable job: finished runs are reused, unfinished ones resume, workers agree."""

from __future__ import annotations

import json

import pytest

from fedhet.comparison import run_comparison
from fedhet.config import ExperimentConfig, apply_override
from fedhet.engine import checkpoint as ckpt
from fedhet.errors import RunDirectoryError


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def _base(rounds: int = 3) -> ExperimentConfig:
    cfg = ExperimentConfig()
    for key, value in {
        "data.dataset": "fashion-mnist",
        "data.split": "pure-label-skew",
        "data.clients": 3,
        "data.max_train_samples": 1500,
        "data.max_test_samples": 500,
        "model.name": "mlp",
        "train.rounds": rounds,
        "train.local_steps": 3,
        "train.threads": 1,
        "eval.checkpoint_every": 1,
    }.items():
        apply_override(cfg, key, value)
    return cfg


def _metrics(run_dir) -> list[dict]:
    return [json.loads(s) for s in (run_dir / "metrics.jsonl").read_text().splitlines() if s.strip()]


def test_finished_runs_are_reused_and_a_changed_config_is_refused_unless_rerun(tmp_path):
    out = tmp_path / "cmp"
    first = run_comparison(_base(), ["fedavg"], [0], out)
    stamp = (out / "fedavg-seed0" / "summary.json").stat().st_mtime_ns
    again = run_comparison(_base(), ["fedavg"], [0], out)
    assert (out / "fedavg-seed0" / "summary.json").stat().st_mtime_ns == stamp  # not rerun
    assert again["fedavg"][0]["final"]["accuracy"] == pytest.approx(first["fedavg"][0]["final"]["accuracy"])
    changed = _base()
    apply_override(changed, "train.lr", 0.02)
    with pytest.raises(RunDirectoryError, match=r"fedavg-seed0 \(finished, another configuration\)"):
        run_comparison(changed, ["fedavg"], [0], out)  # it would replace a finished run: asked first
    assert (out / "fedavg-seed0" / "summary.json").stat().st_mtime_ns == stamp  # untouched
    run_comparison(changed, ["fedavg"], [0], out, reuse=False)  # --rerun
    assert (out / "fedavg-seed0" / "summary.json").stat().st_mtime_ns != stamp  # other lr: rerun
    assert "lr = 0.02" in (out / "fedavg-seed0" / "config.toml").read_text()


def test_rerun_flag_ignores_finished_runs(tmp_path):
    out = tmp_path / "cmp"
    run_comparison(_base(), ["fedavg"], [0], out)
    stamp = (out / "fedavg-seed0" / "summary.json").stat().st_mtime_ns
    run_comparison(_base(), ["fedavg"], [0], out, reuse=False)
    assert (out / "fedavg-seed0" / "summary.json").stat().st_mtime_ns != stamp


def test_an_interrupted_comparison_resumes_from_the_checkpoint(tmp_path):
    full = tmp_path / "full"
    run_comparison(_base(), ["fedavg"], [0], full)
    cut = tmp_path / "cut"
    run_comparison(_base(), ["fedavg"], [0], cut)
    run_dir = cut / "fedavg-seed0"
    # Simulate a kill after round 2: drop the last checkpoint, the summary and the last metrics line.
    (run_dir / "summary.json").unlink()
    for path in ckpt_dirs(run_dir):
        if path.name.endswith("00003"):
            for f in path.iterdir():
                f.unlink()
            path.rmdir()
    kept = _metrics(run_dir)[:2]
    kept[0]["written_before_the_kill"] = True  # survives only if rounds 1-2 are not run again
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n" for h in kept))
    assert ckpt.latest_checkpoint(run_dir).name.endswith("00002")
    run_comparison(_base(), ["fedavg"], [0], cut)
    resumed = _metrics(run_dir)
    assert resumed[0].pop("written_before_the_kill") is True
    assert resumed == _metrics(full / "fedavg-seed0")


def ckpt_dirs(run_dir):
    return sorted((run_dir / "checkpoints").iterdir())


@pytest.mark.slow
def test_two_worker_processes_give_the_same_metrics_as_one(tmp_path):
    base = _base(rounds=2)
    apply_override(base, "eval.fairness", True)
    methods = ["fedavg", "cgsv", "standalone"]
    seq = run_comparison(base, methods, [0, 1], tmp_path / "seq")
    seen: list[str] = []

    def progress(label, total):
        seen.append(label)
        return lambda rnd, total_rounds, line: None

    par = run_comparison(base, methods, [0, 1], tmp_path / "par", jobs=2, progress=progress)
    for m in methods:
        for s in (0, 1):
            assert _metrics(tmp_path / "par" / f"{m}-seed{s}") == _metrics(tmp_path / "seq" / f"{m}-seed{s}")
        assert [r["final"]["accuracy"] for r in par[m]] == [r["final"]["accuracy"] for r in seq[m]]
    assert "cgsv seed 1" in seen


def test_a_standalone_cell_is_the_standalone_run_fairness_needs(tmp_path, monkeypatch):
    from fedhet.engine.simulation import Simulation
    from fedhet.experiment import standalone_accuracies

    base = _base(rounds=2)
    apply_override(base, "eval.fairness", True)
    cell = base.copy()
    cell.method.name = "standalone"
    expected = standalone_accuracies(cell, use_cache=False)  # trained apart, evaluated only at the end

    trained: list[str] = []
    original = Simulation.run

    def counting_run(self):
        trained.append(self.cfg.method.name)
        return original(self)

    monkeypatch.setattr(Simulation, "run", counting_run)
    results = run_comparison(base, ["fedavg", "standalone"], [0], tmp_path / "cmp")
    assert sorted(trained) == ["fedavg", "standalone"]  # no second standalone training for fairness
    assert results["standalone"][0]["rewards"] == pytest.approx(expected.tolist(), abs=0)
    assert results["fedavg"][0]["standalone"] == pytest.approx(expected.tolist(), abs=0)


def test_a_cell_that_diverges_is_reported_as_diverged_and_the_comparison_goes_on(tmp_path):
    from fedhet.comparison import aggregate_rows
    from fedhet.reproduce import _cell

    out, base = tmp_path / "cmp", _base(rounds=4)
    apply_override(base, "guards.max_all_rejected_rounds", 2)
    params = {"fedprox": {"mu": 1e30}}  # a proximal pull that overflows: every update is non-finite
    results = run_comparison(base, ["fedavg", "fedprox"], [0, 1], out, method_params=params)
    rows = {r["method"]: r for r in aggregate_rows(results)}
    assert rows["fedavg"]["diverged"] == {} and rows["fedprox"]["diverged"] == {0: 2, 1: 2}
    assert all(s["rounds"] == 4 and "diverged" not in s for s in results["fedavg"])
    assert len(_metrics(out / "fedavg-seed1")) == 4  # the other method ran to the end
    stamp = (out / "fedprox-seed0" / "summary.json").stat().st_mtime_ns
    again = run_comparison(base, ["fedavg", "fedprox"], [0, 1], out, method_params=params)
    assert (out / "fedprox-seed0" / "summary.json").stat().st_mtime_ns == stamp  # a result: reused, not rerun
    assert again["fedprox"][0]["diverged"]["round"] == 2
    cell = _cell({"ours": 10.0, "ours_std": 0.0, "paper": (80.0, 1.0), "diverged": {0: 2, 1: 2}}, seeds=2)
    assert "diverged in 2 of 2 seeds (stopped in round 2, 2)" in cell
    assert "diverged" not in _cell({"ours": 10.0, "ours_std": 0.0, "paper": (80.0, 1.0)}, seeds=2)


def test_a_metric_without_a_value_in_some_seeds_is_averaged_over_the_others_and_the_cell_says_so():
    from fedhet.comparison import aggregate_rows
    from fedhet.reproduce import _cell

    # Pearson of equal rewards has no value: None in the final view, absent from best (as the runs write it)
    seeds = [
        {"seed": 0, "final": {"acc": 0.5, "fair": None}, "best": {"acc": 0.6}},
        {"seed": 1, "final": {"acc": 0.7, "fair": 0.2}, "best": {"acc": 0.8, "fair": 0.4}},
        {"seed": 2, "final": {"acc": 0.9, "fair": 0.6}, "best": {"acc": 0.9, "fair": 0.8}},
    ]
    never = [{"seed": s, "final": {"fair": None}, "best": {}} for s in range(2)]
    rows = {r["method"]: r for r in aggregate_rows({"some": seeds, "never": never})}
    some = rows["some"]
    assert some["best_mean"]["fair"] == pytest.approx(0.6) and some["best_std"]["fair"] == pytest.approx(0.2)
    assert some["defined"]["best"] == {"acc": 3, "fair": 2} and some["defined"]["final"]["fair"] == 2
    assert rows["never"]["defined"]["best"] == {"fair": 0} and "fair" not in rows["never"]["best_mean"]
    cell = _cell({"ours": 60.0, "ours_std": 20.0, "paper": (80.0, None), "defined_seeds": 2}, seeds=3)
    assert cell == "**60.00 ± 20.00** (a value in 2 of 3 seeds) / paper 80.00 / Δ -20.00"
    one = _cell({"ours": 60.0, "ours_std": 0.0, "paper": None, "defined_seeds": 1}, seeds=3)
    assert one == "**60.00** (a value in 1 of 3 seeds)"
    assert _cell({"ours": None, "paper": (99.55, None), "defined_seeds": 0}, seeds=3).startswith(
        "undefined in every seed / paper 99.55"
    )
    every = _cell({"ours": 1.0, "ours_std": 0.5, "paper": None, "defined_seeds": 3}, seeds=3)
    assert every == "**1.00 ± 0.50**"
    assert _cell({"ours": 1.0, "paper": None}, seeds=1) == "**1.00** (1 seed)"
    assert _cell({}, seeds=3) == "—"  # a method the row did not run
