"""What a default run costs and writes: the standalone pre-pass runs only when a method needs it or fairness
is asked for, says so when it runs, survives the run's [eval] switches and is keyed by every input of its
result; ``fedhet.compare`` without ``out=`` names the folder it writes."""

from __future__ import annotations

import numpy as np
import pytest

import fedhet
from fedhet.algorithms import build_strategy
from fedhet.cli import main
from fedhet.config import ExperimentConfig
from fedhet.experiment import measures_fairness, needs_reference, standalone_accuracies, standalone_key


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def tiny(method: str = "fedavg", **over) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.clients = "digits", 3
    cfg.model.name = "mlp"
    cfg.train.rounds = 2
    cfg.method.name = method
    for k, v in over.items():
        section, key = k.split("__")
        setattr(getattr(cfg, section), key, v)
    return cfg


def _needs(cfg: ExperimentConfig) -> bool:
    return needs_reference(cfg, build_strategy(cfg.method.name, cfg.method.params))


def test_the_pre_pass_runs_only_for_a_method_that_needs_it_or_when_fairness_is_asked_for():
    assert not _needs(tiny("fedavg"))  # the default run pays for no pre-pass
    assert not _needs(tiny("celm"))
    assert _needs(tiny("fedavg", eval__fairness=True))
    assert _needs(tiny("cgsv"))  # rewards are CGSV's result: fairness under "auto"
    assert not _needs(tiny("cgsv", eval__fairness=False))
    assert not _needs(tiny("cgsv", eval__rewards=False))  # nothing to measure fairness of
    assert _needs(tiny("fedrac", eval__fairness=False))  # an input of the method, whatever eval says
    assert not _needs(tiny("standalone", eval__fairness=True))  # its rewards are the reference
    # a comparison in which some method measures fairness measures it for every method with rewards
    cfg = tiny("fedavg")
    assert measures_fairness(cfg, build_strategy("fedavg", {}), auto=True)
    assert not measures_fairness(
        tiny("fedavg", eval__fairness=False), build_strategy("fedavg", {}), auto=True
    )


def test_a_default_run_without_out_writes_nothing_and_reports_no_fairness(tmp_path):
    notes: list[str] = []
    result = fedhet.run(tiny("fedavg"), notify=notes.append)
    assert result.summary["standalone"] is None
    assert "fairness_pearson" not in result.summary["final"]
    assert not (tmp_path / "cache").exists()  # no pre-pass cache: nothing asked for it
    assert not [n for n in notes if "pre-pass" in n]


def test_the_pre_pass_says_that_it_runs_what_it_costs_and_where_it_is_cached(tmp_path):
    notes: list[str] = []
    result = fedhet.run(tiny("fedavg", eval__fairness=True), notify=notes.append)
    [note] = [n for n in notes if "pre-pass" in n]
    assert "one standalone run per client" in note and "3 clients" in note and "eval.fairness = true" in note
    [cached] = (tmp_path / "cache" / "standalone").glob("*.json")
    assert str(cached) in note
    assert "fairness_pearson" in result.summary["final"]
    again: list[str] = []
    fedhet.run(tiny("fedavg", eval__fairness=True), notify=again.append)
    assert not [n for n in again if "pre-pass" in n]  # read back from the cache: nothing trains


@pytest.mark.parametrize("switch", ["eval.rewards=false", "eval.fairness=false", "eval.fairness=true"])
def test_eval_switches_never_crash_a_run(tmp_path, switch, capsys):
    rc = main(
        ["run", "--dataset", "digits", "--clients", "3", "--rounds", "2", "--model", "mlp"]
        + ["--set", switch, "--set", "eval.rewards=false", "--out", str(tmp_path / "run"), "--quiet"]
    )
    assert rc == 0, capsys.readouterr().err


def test_the_pre_pass_ignores_the_runs_eval_switches():
    with_rewards = standalone_accuracies(tiny("fedavg"), use_cache=False)
    without = standalone_accuracies(tiny("fedavg", eval__rewards=False, eval__every=5), use_cache=False)
    assert np.all(np.isfinite(without))
    np.testing.assert_array_equal(with_rewards, without)


def test_the_pre_pass_cache_key_covers_every_input_of_its_result():
    cfg = tiny("fedavg")
    key = standalone_key(cfg)
    # inputs of the result: a different key
    assert standalone_key(tiny("fedavg", eval__batch_size=64)) != key
    assert standalone_key(tiny("fedavg", engine__mode="vectorized")) != key
    assert standalone_key(tiny("fedavg", train__lr=0.05)) != key
    # what the pre-pass never reads (the method, the run's report switches, threads): the same key
    for over in (
        {"eval__rewards": False},
        {"eval__fairness": True},
        {"eval__every": 7},
        {"eval__checkpoint_every": 3},
        {"eval__bcf_alpha": 0.3},
        {"train__threads": 2},
    ):
        assert standalone_key(tiny("cgsv", **over)) == key, over


def test_the_pre_pass_key_follows_the_file_behind_data_path(tmp_path):
    data = tmp_path / "mine.npz"
    data.write_bytes(b"one")
    cfg = tiny("fedavg", data__path=str(data))
    first = standalone_key(cfg)
    data.write_bytes(b"other contents")
    assert standalone_key(cfg) != first


def test_compare_without_out_names_the_folder_it_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    notes: list[str] = []
    result = fedhet.compare(tiny("fedavg", train__rounds=1), ["fedavg"], notify=notes.append)
    assert result.out_dir.parent == tmp_path / "tmp" and result.out_dir.name.startswith("fedhet-compare-")
    assert (result.out_dir / "compare.json").is_file()
    assert any(str(result.out_dir) in n for n in notes)


def test_a_comparison_with_a_fairness_method_measures_fairness_for_fedavg_too(tmp_path):
    notes: list[str] = []
    result = fedhet.compare(
        tiny("fedavg", train__rounds=1), ["fedavg", "cgsv"], out=tmp_path / "cmp", notify=notes.append
    )
    for m in ("fedavg", "cgsv"):
        assert "fairness_pearson" in result.runs[m][0].summary["final"], m
    assert sum("one standalone run per client" in n for n in notes) == 1
    alone = fedhet.compare(tiny("fedavg", train__rounds=1), ["fedavg"], out=tmp_path / "alone")
    assert "fairness_pearson" not in alone.runs["fedavg"][0].summary["final"]
