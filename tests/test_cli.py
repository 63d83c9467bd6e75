"""The command line: machine-readable output formats, reports, partition and dataset listings, errors."""

from __future__ import annotations

import json

import pytest

from fedhet.cli import main

SMALL = ["--set", "data.max_train_samples=2000", "--set", "data.max_test_samples=1000", "--quiet"]


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def _json_out(capsys) -> dict:
    out = capsys.readouterr().out
    return json.loads(out.strip().splitlines()[-1])


def test_run_json_summary_format(tmp_path, capsys):
    rc = main(
        [
            "run",
            "--method",
            "fedavg",
            "--dataset",
            "fashion-mnist",
            "--split",
            "cla",
            "--clients",
            "3",
            "--rounds",
            "2",
            "--set",
            "data.split_params.samples_per_client=300",
            "--set",
            "eval.fairness=true",  # FedAvg measures fairness only when asked
            "--out",
            str(tmp_path / "run"),
            "--json",
            *SMALL,
        ]
    )
    assert rc == 0
    captured = capsys.readouterr()
    assert "one standalone run per client" in captured.err  # the pre-pass says that it runs, and why
    assert "eval.fairness = true" in captured.err
    d = json.loads(captured.out.strip().splitlines()[-1])
    assert set(d) >= {"method", "run_dir", "rounds", "final", "best", "contributions", "rewards"}
    assert d["method"] == "fedavg" and d["rounds"] == 2 and d["contributions"] is None
    final = d["final"]
    assert 0.0 <= final["accuracy"] <= 1.0 and 0.0 <= final["balanced_accuracy"] <= 1.0
    assert len(final["per_class_recall"]) == 10
    assert len(d["rewards"]) == 3 and all(0 <= r <= 1 for r in d["rewards"])
    assert {"fairness_pearson", "fairness_spearman", "bcf_rate"} <= set(final)
    assert -100.0 <= final["fairness_pearson"] <= 100.0
    for name in ("config.toml", "metrics.jsonl", "summary.json", "partition.json"):
        assert (tmp_path / "run" / name).is_file()
    assert list((tmp_path / "run" / "checkpoints").glob("round_*/tensors.safetensors"))


def test_compare_json_rows_and_report(tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main(
        [
            "compare",
            "--methods",
            "fedavg,standalone",
            "--dataset",
            "fashion-mnist",
            "--split",
            "maverick",
            "--clients",
            "3",
            "--rounds",
            "2",
            "--seeds",
            "2",
            "--set",
            "eval.fairness=false",
            "--out",
            str(out),
            "--json",
            *SMALL,
        ]
    )
    assert rc == 0
    d = _json_out(capsys)
    assert [r["method"] for r in d["rows"]] == ["fedavg", "standalone"]
    row = d["rows"][0]
    assert row["seeds"] == [0, 1]
    assert {"accuracy", "balanced_accuracy", "rare_class_recall"} <= set(row["mean"])
    assert set(row["mean"]) == set(row["std"])
    assert "accuracy" in row["last_mean"] and set(row["last_mean"]) == set(row["last_std"])
    # compare.csv: the same rows; its mean is the mean of the seeds' summaries, recomputed here
    import csv

    with (out / "compare.csv").open() as handle:
        lines = {line["method"]: line for line in csv.DictReader(handle)}
    finals = [json.loads((out / f"fedavg-seed{k}" / "summary.json").read_text())["final"] for k in (0, 1)]
    assert float(lines["fedavg"]["final_accuracy_mean"]) == pytest.approx(
        sum(f["accuracy"] for f in finals) / 2, abs=1e-12
    )
    assert float(lines["standalone"]["best_accuracy_std"]) == pytest.approx(
        d["rows"][1]["best_std"]["accuracy"]
    )
    assert lines["fedavg"]["seeds"] == "0 1"
    report = (out / "report.md").read_text()
    assert "| fedavg | 2 |" in report and "accuracy.png" in report
    assert (out / "report_figures" / "accuracy.png").stat().st_size > 1000
    # `fedhet report` on the same directories
    rc = main(
        ["report", str(out / "fedavg-seed0"), str(out / "standalone-seed1"), "--out", str(tmp_path / "r.md")]
    )
    assert rc == 0 and "fedavg" in (tmp_path / "r.md").read_text()
    # a report whose name has spaces keeps working figure links (angle brackets around the target)
    rc = main(["report", str(out / "fedavg-seed0"), "--out", str(tmp_path / "my report.md")])
    text = (tmp_path / "my report.md").read_text()
    assert rc == 0 and "](<my report_figures/accuracy.png>)" in text
    assert (tmp_path / "my report_figures" / "accuracy.png").is_file()


def test_partition_json_matches_cla_rule(capsys):
    rc = main(
        [
            "partition",
            "--dataset",
            "fashion-mnist",
            "--split",
            "cla",
            "--clients",
            "10",
            "--seed",
            "0",
            "--json",
        ]
    )
    assert rc == 0
    d = _json_out(capsys)
    assert d["sizes"] == [2000] * 10
    for i, row in enumerate(d["counts"]):
        assert [c > 0 for c in row] == [k <= i for k in range(10)]


def test_partition_shows_exactly_the_split_a_run_trains_on(tmp_path, capsys):
    """Same flags and seed: `fedhet partition` prints the class counts the run records in partition.json,
    including the seeded training subset and the validation hold-out taken before splitting."""
    flags = ["--dataset", "fashion-mnist", "--split", "dirichlet-per-client", "--clients", "4", "--seed", "3"]
    flags += ["--set", "data.split_params.alpha=0.3", "--set", "data.validation_fraction=0.2"]
    flags += ["--set", "data.max_train_samples=1500"]
    rc = main(
        [
            "run",
            *flags,
            "--rounds",
            "1",
            "--set",
            "eval.fairness=false",
            "--quiet",
            "--out",
            str(tmp_path / "r"),
        ]
    )
    assert rc == 0
    recorded = json.loads((tmp_path / "r" / "partition.json").read_text())
    capsys.readouterr()
    assert main(["partition", *flags, "--json"]) == 0
    shown = _json_out(capsys)
    assert shown["counts"] == recorded["counts"] and shown["sizes"] == recorded["sizes"]
    assert sum(shown["sizes"]) == 1200  # 1,500 drawn, 20 % held out for validation
    assert main(["partition", *flags[:-2], "--json"]) == 0  # all 60,000 samples: a different split
    assert _json_out(capsys)["counts"] != recorded["counts"]


def test_datasets_json_reports_offline_data(capsys):
    assert main(["datasets", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    for name in ("fashion-mnist", "digits"):
        assert rows[name]["available"], rows[name]


def test_bad_config_value_is_a_clear_error(capsys):
    rc = main(["run", "--method", "fedavg", "--set", "train.lr=-1", "--quiet"])
    assert rc == 2
    assert "train.lr" in capsys.readouterr().err
    rc = main(["run", "--method", "nosuch", "--quiet"])
    assert rc == 2 and "fedavg" in capsys.readouterr().err


def test_contribution_table_marks_roles_beside_sample_shares():
    from rich.console import Console

    from fedhet.cli.compare import print_contributions

    summary = {
        "contributions": [0.5, 0.3, 0.2],
        "client_sizes": [100, 100, 200],
        "partition_info": {"maverick_clients": [0]},
    }
    console = Console(record=True, width=120)
    print_contributions(console, {"celm": [summary, {**summary, "contributions": [0.3, 0.3, 0.4]}]})
    text = console.export_text()
    row0 = next(line for line in text.splitlines() if "maverick" in line)
    assert "0.250" in row0 and "0.400" in row0  # n_0/n = 100/400, mean of 0.5 and 0.3
    assert "1/N = 0.333; n_i/n = FedAvg's sample-count weight" in text  # the legend stays on one line
    print_contributions(console, {"fedavg": [{"contributions": None}]})  # nothing to show: no table
    assert console.export_text() == ""


def test_tables_written_to_a_pipe_do_not_wrap_at_80_columns(monkeypatch):
    """Piped output (CI logs, `| tee`) gets PIPED_WIDTH columns, so a compare table keeps one line per
    method and whole headers; $COLUMNS still wins."""
    from fedhet.cli.common import PIPED_WIDTH, make_console
    from fedhet.cli.compare import TABLE_METRICS, print_compare_table

    monkeypatch.setenv("COLUMNS", "100")
    assert make_console().width == 100
    monkeypatch.delenv("COLUMNS")
    console = make_console(stderr=True)  # pytest's capture is not a terminal
    assert console.width == PIPED_WIDTH
    mean = {k: 0.8047 if k.startswith(("acc", "bal", "rare", "bcf")) else 98.71 for k, _, _ in TABLE_METRICS}
    std = {k: 0.007 if k.startswith(("acc", "bal", "rare", "bcf")) else 11.4 for k, _, _ in TABLE_METRICS}
    row = {"method": "fedrac-random-masks", "mean": mean, "std": std}
    row.update(best_mean=mean, best_std=std, last_mean=mean, last_std=std)
    console.begin_capture()
    print_compare_table(console, [row])
    text = console.end_capture()
    assert "…" not in text and "best fairness" in text and "fairness = 100·Pearson" in text
    assert sum("fedrac-random-masks" in line for line in text.splitlines()) == 1
    body = [line for line in text.splitlines() if line.startswith("│")]
    assert [line.count("±") for line in body] == [len(TABLE_METRICS)]  # every metric, no wrapped cells


def test_compare_table_explains_fairness_only_when_it_shows_it():
    from fedhet.cli.common import make_console
    from fedhet.cli.compare import print_compare_table

    stats = {"accuracy": 0.8, "balanced_accuracy": 0.8}
    console = make_console(stderr=True)
    console.begin_capture()
    print_compare_table(
        console, [{"method": "fedavg", "mean": stats, "std": stats, "best_mean": {}, "best_std": {}}]
    )
    text = console.end_capture()
    assert "mean ± std over seeds" in text and "Pearson" not in text and "diverged" not in text


def test_compare_table_marks_a_method_whose_runs_diverged():
    from fedhet.cli.common import make_console
    from fedhet.cli.compare import print_compare_table

    stats = {"accuracy": 0.1}
    row = {"method": "fedprox", "mean": stats, "std": stats, "diverged": {0: 7, 2: 9}}
    console = make_console(stderr=True)
    console.begin_capture()
    print_compare_table(console, [row, {**row, "method": "fedavg", "diverged": {}}])
    text = console.end_capture()
    assert "diverged: seed 0 round 7, seed 2 round 9" in " ".join(text.split())
    assert "fedavg (diverged" not in text and "global model at the stop" in " ".join(text.split())


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--method", "celmx"], "not a known method"),
        (["--set", "method.params.foo=1"], "no parameter(s) ['foo']"),
    ],
)
def test_run_rejects_a_bad_method_before_any_work(tmp_path, capsys, flags, message):
    rc = main(["run", "--rounds", "1", "--out", str(tmp_path / "r"), *flags])
    err = capsys.readouterr().err
    assert rc == 2 and message in err
    assert "round 0/1" not in err and not (tmp_path / "r").exists()  # no progress bar, no run directory


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["compare", "--methods", "fedavg", "--seed-list", "1,x"],
            "--seed-list '1,x' must be comma-separated",
        ),
        (["compare", "--methods", "fedavg", "--seeds", "0"], "--seeds 0: give a number of seeds >= 1"),
        (["run", "--out", "{tmp}/afile"], "afile is a file; pass a directory"),
        (["compare", "--methods", "fedavg", "--out", "{tmp}/afile"], "afile is a file; pass a directory"),
        (["report", "{tmp}", "--out", "{tmp}"], "is a directory; pass a file name"),
        (["run", "--set", "train.lr=inf"], "train.lr=inf must be a finite number"),
        # one client of 2,000 samples: ⌈2000/64⌉ = 32 batches, so one step is 1/32 = 0.03125 epochs
        (
            ["run", "--set", "train.local_epochs=0.0001"],
            "2000 samples (batch 64) 0 local steps; use train.local_epochs >= 0.0312",
        ),
    ],
)
def test_bad_arguments_are_one_line_errors_naming_the_fix(tmp_path, capsys, argv, message):
    """Each is refused with `fedhet: error: ...` (exit 2), no traceback."""
    (tmp_path / "afile").write_text("")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    base = ["--dataset", "fashion-mnist", "--clients", "1", "--rounds", "1", *SMALL]
    rc = main(argv + (base if argv[0] in ("run", "compare") else []))
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err


def test_results_go_to_stdout_and_quiet_silences_only_progress(tmp_path, capsys):
    """`fedhet compare ... --quiet > results.txt` keeps the table: results on stdout, printed with --quiet;
    progress and notes on stderr. The same for `fedhet run`."""
    digits = ["--dataset", "digits", "--clients", "3", "--rounds", "1", "--quiet"]
    rc = main(
        ["compare", "--methods", "fedavg,fedprox", "--seeds", "1", *digits, "--out", str(tmp_path / "c")]
    )
    out, err = capsys.readouterr()
    assert rc == 0
    assert "fedavg" in out and "fedprox" in out and "acc %" in out and "runs and report:" in out
    assert "fedprox" not in err
    rc = main(["run", "--method", "fedavg", *digits, "--out", str(tmp_path / "r")])
    out, err = capsys.readouterr()
    assert rc == 0 and "accuracy %" in out and "run directory:" in out and "run directory:" not in err


def test_every_accuracy_of_a_table_is_in_percent():
    """best_reward_accuracy is shown in percent like accuracy (it was a fraction beside it)."""
    from fedhet.cli.common import fmt_metric

    assert fmt_metric("best_reward_accuracy", 0.8123) == fmt_metric("accuracy", 0.8123) == "81.23"
    assert fmt_metric("rare_class_recall", 0.5) == "50.00" and fmt_metric("loss", 0.5) == "0.50"
