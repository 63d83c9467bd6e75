"""`fedhet reproduce`: tiny-scale rows print our number beside the paper's value and the difference."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedhet.cli import main
from fedhet.errors import ConfigError
from fedhet.reproduce import QUICK, list_specs, load_spec, parse_paper_value, row_config


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def test_parse_paper_value():
    assert parse_paper_value("80.64 ± 2.25") == (80.64, 2.25)
    assert parse_paper_value(49.1) == (49.1, None)
    assert parse_paper_value("-22.21") == (-22.21, None)


def test_every_shipped_table_loads_and_points_at_existing_configs():
    names = list_specs()
    assert {"celm-table1-fmnist", "celm-table2-maverick", "fedrac-accuracy", "proxyfl-table1"} <= set(names)
    for name in names:
        spec = load_spec(name)
        assert spec.rows and spec.methods
        for row in spec.rows:
            assert not row.available or row.config.is_file()
            assert set(row.paper) <= set(row.methods or spec.methods)
            for scale in ("quick", "cpu", "full"):  # every scale's overrides apply to every row's config
                if row.available:
                    row_config(row, list(spec.at_scale(scale).overrides))


def test_reproduce_runs_rows_and_reports_differences(tmp_path, capsys):
    cfg = tmp_path / "small.toml"
    cfg.write_text(
        "[data]\ndataset = 'fashion-mnist'\nsplit = 'iid'\nclients = 3\nmax_train_samples = 1500\n"
        "max_test_samples = 500\n[train]\nrounds = 2\n[eval]\nfairness = false\n"
    )
    spec = tmp_path / "table.toml"
    spec.write_text(
        "title = 'toy'\nmetric = 'accuracy'\nseeds = 1\nmethods = ['fedavg']\n"
        "[[rows]]\nname = 'iid'\nconfig = 'small.toml'\npaper = { fedavg = '50.00 ± 1.00' }\n"
        "[[rows]]\nname = 'iid again'\nconfig = 'small.toml'\nmetric = 'balanced_accuracy'\n"
        "paper = { fedavg = 50.0 }\n"
        "[[rows]]\nname = 'offline'\navailable = false\nnote = 'not here'\nmetric = 'balanced_accuracy'\n"
        "paper = { fedavg = 61.0 }\n"
        "[[rows]]\nname = 'svhn'\nconfig = 'small.toml'\nset = ['data.dataset=svhn']\n"
        "paper = { fedavg = 80.0 }\n"
    )
    out = tmp_path / "out"
    assert main(["reproduce", str(spec), "--out", str(out), "--json", "--quiet"]) == 0
    d = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    first, second, offline, svhn = d["results"]
    ours = first["methods"]["fedavg"]["ours"]
    assert 30.0 < ours <= 100.0 and first["methods"]["fedavg"]["paper"] == [50.0, 1.0]
    assert second["run_dir"] == first["run_dir"]  # same runs, another metric: not run twice
    assert second["metric"] == "balanced_accuracy"  # the row's own metric, read from the same runs
    summary = json.loads((Path(first["run_dir"]) / "fedavg-seed0" / "summary.json").read_text())
    assert second["methods"]["fedavg"]["ours"] == pytest.approx(100 * summary["final"]["balanced_accuracy"])
    assert ours == pytest.approx(100 * summary["final"]["accuracy"])
    assert not offline["available"] and not svhn["available"] and "svhn" in svhn["note"]
    md = (out / "reproduce.md").read_text()
    assert f"Δ {ours - 50.0:+.2f}" in md and "not run" in md
    # A row that does not run still prints its own metric, as a measured one does, so two rows of one name
    # (a table's two metrics) stay told apart.
    assert "| offline (balanced_accuracy) | — |" in md and "| iid again (balanced_accuracy) | 2 |" in md
    import csv

    with (out / "reproduce.csv").open() as handle:
        lines = list(csv.DictReader(handle))
    assert [line["row"] for line in lines] == ["iid", "iid again", "offline", "svhn"]
    assert float(lines[0]["ours"]) == pytest.approx(ours) and float(lines[0]["delta"]) == pytest.approx(
        ours - 50
    )
    assert lines[2]["ours"] == "" and float(lines[2]["paper"]) == 61.0
    metrics = [line["metric"] for line in lines]
    assert metrics == ["accuracy", "balanced_accuracy", "balanced_accuracy", "accuracy"]


def test_a_row_with_its_own_view_reads_it_from_the_same_runs(tmp_path, capsys):
    cfg = tmp_path / "small.toml"
    cfg.write_text(
        "[data]\ndataset = 'fashion-mnist'\nsplit = 'iid'\nclients = 3\nmax_train_samples = 900\n"
        "max_test_samples = 300\n[train]\nrounds = 3\nlocal_steps = 2\n[eval]\nevery = 1\nfairness = false\n"
    )
    spec = tmp_path / "table.toml"
    spec.write_text(
        "title = 'toy'\nseeds = 1\nmethods = ['fedavg']\n"
        "[[rows]]\nname = 'final'\nconfig = 'small.toml'\n"
        "[[rows]]\nname = 'level'\nconfig = 'small.toml'\nview = 'last_100'\n"
        "[[rows]]\nname = 'peak'\nconfig = 'small.toml'\nview = 'best'\n"
    )
    out = tmp_path / "out"
    assert main(["reproduce", str(spec), "--out", str(out), "--json", "--quiet"]) == 0
    final, level, peak = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]
    assert final["run_dir"] == level["run_dir"] == peak["run_dir"]  # one set of runs, three views
    metrics = Path(final["run_dir"]) / "fedavg-seed0" / "metrics.jsonl"
    accuracies = [
        line["accuracy"] for line in map(json.loads, metrics.read_text().splitlines()) if "accuracy" in line
    ]
    assert len(accuracies) == 3  # every round evaluated: fewer than 100, so the level is their mean
    assert level["methods"]["fedavg"]["ours"] == pytest.approx(100 * sum(accuracies) / 3, abs=1e-9)
    assert peak["methods"]["fedavg"]["ours"] == pytest.approx(100 * max(accuracies), abs=1e-9)
    assert final["methods"]["fedavg"]["ours"] == pytest.approx(100 * accuracies[-1], abs=1e-9)
    md = (out / "reproduce.md").read_text()
    assert (
        "| level (mean of the last 100) | 3 |" in md and "| peak (best) | 3 |" in md and "| final | 3 |" in md
    )
    spec.write_text(spec.read_text().replace("view = 'best'", "view = 'top'"))
    with pytest.raises(
        ConfigError, match="row 'peak' view='top'; accepted: 'final', 'best', 'last', 'last_100'"
    ):
        load_spec(str(spec))


def test_method_params_of_a_table_and_a_row_reach_the_runs(tmp_path, capsys):
    cfg = tmp_path / "small.toml"
    cfg.write_text(
        "[data]\ndataset = 'fashion-mnist'\nsplit = 'iid'\nclients = 3\nmax_train_samples = 900\n"
        "max_test_samples = 300\n[train]\nrounds = 1\n[eval]\nfairness = false\n"
    )
    spec = tmp_path / "table.toml"
    spec.write_text(
        "title = 'toy'\nmetric = 'accuracy'\nseeds = 1\nmethods = ['fedavg', 'cgsv']\n"
        "[method_params]\ncgsv = { protocol = 'global' }\n"
        "[[rows]]\nname = 'table params'\nconfig = 'small.toml'\n"
        "[[rows]]\nname = 'row params'\nconfig = 'small.toml'\n"
        "method_params = { fedavg = { weighting = 'uniform' } }\n"
    )
    loaded = load_spec(str(spec))
    assert loaded.method_params == {"cgsv": {"protocol": "global"}}
    assert loaded.rows[1].method_params == {"fedavg": {"weighting": "uniform"}}
    out = tmp_path / "out"
    assert main(["reproduce", str(spec), "--out", str(out), "--json", "--quiet"]) == 0
    first, second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]
    from fedhet.config import load_config

    cgsv = load_config(f"{first['run_dir']}/cgsv-seed0/config.toml")
    assert cgsv.method.params == {"protocol": "global"}
    fedavg = load_config(f"{second['run_dir']}/fedavg-seed0/config.toml")
    assert fedavg.method.params == {"weighting": "uniform"} and second["run_dir"] != first["run_dir"]
    bad = tmp_path / "bad.toml"
    bad.write_text(
        "title = 'x'\nmethods = ['fedavg']\nmethod_params = { fedavg = 3 }\n"
        "[[rows]]\nname = 'r'\nconfig = 'small.toml'\n"
    )
    with pytest.raises(Exception, match="method_params"):
        load_spec(str(bad))


def test_scales_of_a_table(tmp_path):
    cfg = tmp_path / "small.toml"
    cfg.write_text("[data]\ndataset = 'digits'\n")
    spec = tmp_path / "table.toml"
    body = "title = 't'\nmethods = ['fedavg']\n[[rows]]\nname = 'r'\nconfig = 'small.toml'\n"
    spec.write_text(body + "[scales.cpu]\nseeds = 2\nset = ['train.rounds=7']\nnote = 'rounds cut to 7'\n")
    loaded = load_spec(str(spec))
    cpu = loaded.at_scale("cpu")
    assert (cpu.seeds, cpu.overrides, cpu.note) == (2, ("train.rounds=7",), "rounds cut to 7")
    assert loaded.at_scale("quick") == QUICK and loaded.at_scale("full").overrides == ()
    with pytest.raises(ConfigError, match="huge"):
        loaded.at_scale("huge")
    spec.write_text(body + "[scales.cpu]\nset = ['train.rounds=7']\n")
    with pytest.raises(ConfigError, match="note"):
        load_spec(str(spec))
    spec.write_text(body + "[scales.gpu]\nnote = 'x'\n")
    with pytest.raises(ConfigError, match="gpu"):
        load_spec(str(spec))


def test_a_row_adds_its_own_overrides_at_a_reduced_scale_only(tmp_path, capsys):
    from fedhet.config import load_config

    cfg = tmp_path / "small.toml"
    cfg.write_text(
        "[data]\ndataset = 'fashion-mnist'\nsplit = 'iid'\nclients = 3\nmax_train_samples = 900\n"
        "max_test_samples = 300\n[train]\nrounds = 1\nlr = 0.01\n[eval]\nfairness = false\n"
    )
    spec = tmp_path / "table.toml"
    spec.write_text(
        "title = 't'\nmetric = 'accuracy'\nseeds = 1\nmethods = ['fedavg']\n"
        "[scales.cpu]\nset = ['train.lr=0.02']\nnote = 'lr 0.02'\n"
        "[[rows]]\nname = 'plain'\nconfig = 'small.toml'\n"
        "[[rows]]\nname = 'own'\nconfig = 'small.toml'\nscales = { cpu = ['train.lr=0.03'] }\n"
    )
    assert load_spec(str(spec)).rows[1].scale_overrides == {"cpu": ["train.lr=0.03"]}
    out = tmp_path / "out"
    argv = ["reproduce", str(spec), "--out", str(out), "--json", "--quiet", "--scale", "cpu"]
    assert main([*argv, "--set", "train.rounds=1"]) == 0
    plain, own = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]
    lr = {r["row"]: load_config(f"{r['run_dir']}/fedavg-seed0/config.toml").train.lr for r in (plain, own)}
    assert lr == {"plain": 0.02, "own": 0.03}  # the row's own after the scale's
    assert "train.lr=0.03" in own["note"] and not plain["note"]
    assert "- own: At the cpu scale this row also sets train.lr=0.03" in (out / "reproduce.md").read_text()
    argv[argv.index(str(out))] = str(tmp_path / "out2")
    assert main([*argv, "--set", "train.lr=0.04"]) == 0  # the user's --set comes last
    own = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"][1]
    assert load_config(f"{own['run_dir']}/fedavg-seed0/config.toml").train.lr == 0.04
    # A reproduction of some rows (--rows) lists the others on its page as not part of it.
    assert main([*argv, "--set", "train.lr=0.04", "--rows", "own"]) == 0
    plain, own = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]
    assert own["available"] and not plain["available"] and "--rows 'own'" in plain["note"]
    assert (
        "| plain | — | — | — | — | — |  ← not run: not part of this reproduction"
        in (tmp_path / "out2" / "reproduce.md").read_text()
    )
    # --rows repeated: rows matching any of the texts run (their runs are reused here), the rest are listed
    assert main([*argv, "--set", "train.lr=0.04", "--rows", "own", "--rows", "PLAIN"]) == 0
    plain, own = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]
    assert own["available"] and plain["available"]
    page = tmp_path / "page.md"
    argv += ["--set", "train.lr=0.04", "--rows", "own", "--rows", "neither", "--page", str(page)]
    assert main(argv) == 0
    plain, own = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]
    assert own["available"] and "made with --rows 'own' --rows 'neither'" in plain["note"]
    assert "--rows own --rows neither --set train.lr=0.04 --page" in page.read_text()  # its command
    spec.write_text(spec.read_text().replace("scales = { cpu = ['train.lr=0.03'] }", "scales = { gpu = [] }"))
    with pytest.raises(ConfigError, match="'quick' or 'cpu'"):
        load_spec(str(spec))


def test_two_tables_share_a_rows_runs_through_its_folder(tmp_path, capsys):
    cfg = tmp_path / "small.toml"
    cfg.write_text(
        "[data]\ndataset = 'fashion-mnist'\nsplit = 'iid'\nclients = 3\nmax_train_samples = 900\n"
        "max_test_samples = 300\n[train]\nrounds = 1\n[eval]\nfairness = false\n"
    )
    first, second = tmp_path / "first.toml", tmp_path / "second.toml"
    first.write_text(
        "title = 'a'\nseeds = 1\nmethods = ['fedavg']\n[[rows]]\nname = 'IID'\nconfig = 'small.toml'\n"
    )
    second.write_text(
        "title = 'b'\nseeds = 1\nmethods = ['fedavg']\n[[rows]]\nname = 'IID, another metric'\n"
        "config = 'small.toml'\nmetric = 'balanced_accuracy'\nruns = 'iid'\n"
    )
    out = tmp_path / "out"
    assert main(["reproduce", str(first), "--out", str(out), "--json", "--quiet"]) == 0
    (row,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]
    summary = Path(row["run_dir"]) / "fedavg-seed0" / "summary.json"
    assert Path(row["run_dir"]) == out / "iid"
    written = summary.stat().st_mtime_ns
    assert main(["reproduce", str(second), "--out", str(out), "--json", "--quiet"]) == 0
    (row,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]
    assert Path(row["run_dir"]) == out / "iid" and summary.stat().st_mtime_ns == written  # reused, not rerun
    assert row["methods"]["fedavg"]["ours"] == pytest.approx(
        100 * json.loads(summary.read_text())["final"]["balanced_accuracy"]
    )
    second.write_text(second.read_text().replace("runs = 'iid'", "runs = '../elsewhere'"))
    with pytest.raises(ConfigError, match="folder name"):
        load_spec(str(second))


def _two_round_fairness_config(path: Path) -> None:
    """A 2-round, 3-client Fashion-MNIST config that measures fairness (a reward table's row)."""
    path.write_text(
        "[data]\ndataset = 'fashion-mnist'\nsplit = 'iid'\nclients = 3\nmax_train_samples = 900\n"
        "max_test_samples = 300\n[train]\nrounds = 2\n[eval]\nfairness = true\n"
    )


def test_a_reward_metric_page_draws_the_metric_per_round_and_rewards_against_standalone(tmp_path):
    _two_round_fairness_config(tmp_path / "small.toml")
    spec = tmp_path / "fair.toml"
    spec.write_text(
        "title = 'f'\nmetric = 'fairness_pearson'\nview = 'best'\nscale = 1\nseeds = 1\n"
        "methods = ['fedavg']\n[[rows]]\nname = 'IID'\nconfig = 'small.toml'\n"
        "[[rows]]\nname = 'later'\nconfig = 'small.toml'\n"
        "[[rows]]\nname = 'offline'\navailable = false\n"
    )
    page = tmp_path / "results" / "fair.md"
    argv = ["reproduce", str(spec), "--out", str(tmp_path / "out"), "--page", str(page), "--quiet"]
    assert main([*argv, "--rows", "IID"]) == 0
    # One of the two rows that can run here was run (the offline row does not count).
    assert page.read_text().startswith("<!-- fedhet reproduce: table=fair scale=full commit=")
    assert page.read_text().split("\n", 1)[0].endswith(" rows=1/2 -->")
    linked = re.findall(r"\]\((figures/[^)]+)\)", page.read_text())
    assert linked == ["figures/fair-metric.png", "figures/fair-accuracy.png", "figures/fair-rewards.png"]
    assert all((page.parent / f).is_file() for f in linked)


def test_a_table_measured_a_few_rows_at_a_time_keeps_the_rows_already_on_its_page(tmp_path, capsys):
    """--keep-page-rows: a second reproduction of other rows keeps the first one's rows on the page, each
    line as printed, with its command, provenance and figures; refused for a page of another scale."""
    _two_round_fairness_config(tmp_path / "small.toml")
    spec = tmp_path / "fair.toml"
    spec.write_text(
        "title = 'f'\nmetric = 'fairness_pearson'\nview = 'best'\nscale = 1\nseeds = 1\n"
        "methods = ['fedavg', 'standalone']\n"
        "[[rows]]\nname = 'IID'\nconfig = 'small.toml'\npaper = { fedavg = 90.0 }\n"
        "[[rows]]\nname = 'later'\nconfig = 'small.toml'\nset = ['train.lr=0.02']\n"
        "paper = { fedavg = 80.0 }\n"
        "[[rows]]\nname = 'offline'\navailable = false\n"
    )
    page = tmp_path / "results" / "fair.md"
    argv = ["reproduce", str(spec), "--out", str(tmp_path / "out"), "--page", str(page), "--quiet", "--json"]
    assert main([*argv, "--rows", "IID"]) == 0
    capsys.readouterr()
    first = page.read_text()
    (iid_line,) = [ln for ln in first.splitlines() if ln.startswith("| IID | ")]
    first_figures = re.findall(r"\]\((figures/[^)]+)\)", first)
    # Without the flag the other rows are listed as not run; with it, the IID row is kept as it was.
    assert main([*argv, "--rows", "later", "--keep-page-rows"]) == 0
    (_, later, _) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]
    text = page.read_text()
    lines = text.splitlines()
    assert iid_line in lines and not any(ln.startswith("| IID |") and ln != iid_line for ln in lines)
    (later_line,) = [ln for ln in lines if ln.startswith("| later | ")]
    assert "← not run" not in later_line
    assert lines[0].endswith(" rows=2/2 -->")  # both rows that can run here are measured
    # the two commands, in the order they ran: the first as it was, then this one with --keep-page-rows
    block = text.split("```")[1].strip().splitlines()
    assert block[0].endswith("--rows IID --page " + str(page))
    assert block[1].endswith("--rows later --page " + str(page) + " --keep-page-rows")
    assert "Its 2 runs (rows `later`) took " in text
    assert "Rows kept from the page as it was at commit " in text and "`IID`" in text
    assert "That page said of the runs it ran: Its 2 runs took " in text
    # the first page's figures stay linked and on disk; this run's are named after its row
    linked = re.findall(r"\]\((figures/[^)]+)\)", text)
    assert set(first_figures) < set(linked) and all((page.parent / f).is_file() for f in linked)
    assert "figures/fair-metric-later.png" in linked
    # Mean |Δ| over the cells of both rows: the kept row's Δ as printed, this row's from its numbers
    kept_delta = float(re.search(r"Δ ([+-][0-9.]+)", iid_line).group(1))
    ours = later["methods"]["fedavg"]["ours"]
    expected = (abs(kept_delta) + abs(ours - 80.0)) / 2
    assert f"Mean |Δ| over 2 cells: {expected:.2f}." in text
    # The same command again (a page re-rendered after its gaps were written): the IID row is still kept,
    # described once, by what the first page said of it, not by what the second said of `later`
    assert main([*argv, "--rows", "later", "--keep-page-rows"]) == 0
    again = page.read_text()
    assert iid_line in again.splitlines()
    kept_paragraphs = [ln for ln in again.splitlines() if ln.startswith("Rows kept from the page")]
    assert len(kept_paragraphs) == 1 and "(rows `later`)" not in kept_paragraphs[0]
    assert again.count("```") == 2 and len(again.split("```")[1].strip().splitlines()) == 2
    # --page-only: the page rewritten from its rows with the table's current text; nothing runs, the
    # commands that measured the rows stay, the lines of the rows stay as printed, and so does the page's
    # provenance (its commit and "Page written" line: no run, no new commit)
    spec.write_text("gaps = 'Rewritten prose.'\n" + spec.read_text())
    runs_before = sorted(p.name for p in (tmp_path / "out").rglob("summary.json"))
    assert main(["reproduce", str(spec), "--page", str(page), "--page-only", "--quiet", "--json"]) == 0
    capsys.readouterr()
    rewritten = page.read_text()
    assert rewritten.split("```")[1] == again.split("```")[1]  # the same two commands
    assert iid_line in rewritten.splitlines() and later_line in rewritten.splitlines()
    assert "Rewritten prose." in rewritten and rewritten.splitlines()[0] == again.splitlines()[0]
    (written,) = [ln for ln in again.splitlines() if ln.startswith("Page written at commit ")]
    assert written in rewritten.splitlines() and kept_paragraphs[0] in rewritten.splitlines()
    assert sorted(p.name for p in (tmp_path / "out").rglob("summary.json")) == runs_before
    # and once more: the same page, byte for byte
    assert main(["reproduce", str(spec), "--page", str(page), "--page-only", "--quiet"]) == 0
    assert page.read_text() == rewritten
    assert "| offline | — | — | — | — | — | — |" in rewritten  # the row it never measured stays unmeasured
    text = again = rewritten
    assert main(["reproduce", str(spec), "--page-only", "--quiet"]) == 2
    assert "--page-only rewrites an existing result page; give it with --page PATH" in capsys.readouterr().err
    # A page of another scale is not a source of rows: refused before anything runs
    capsys.readouterr()
    assert main([*argv, "--rows", "later", "--keep-page-rows", "--scale", "cpu"]) == 2
    assert "holds table fair at scale full, not fair at cpu" in capsys.readouterr().err
    assert page.read_text() == text  # the page as it was
    assert main(["reproduce", str(spec), "--rows", "later", "--keep-page-rows", "--quiet"]) == 2
    assert "add --page PATH" in capsys.readouterr().err
    # A table whose view changed since the page was written: its rows would be kept under the new heading
    spec.write_text(spec.read_text().replace("view = 'best'", "view = 'last_100'"))
    assert main([*argv, "--rows", "later", "--keep-page-rows"]) == 2
    assert "shows `fairness_pearson` (best) and the table now `fairness_pearson` (last_100)" in (
        capsys.readouterr().err
    )
    assert page.read_text() == text


def test_the_index_says_when_a_page_holds_only_some_rows(tmp_path):
    from fedhet.reproduce import write_index

    head = "<!-- fedhet reproduce: table={} scale=full commit=abc1234{} -->\n# page\n"
    (tmp_path / "celm-table1-fmnist.md").write_text(head.format("celm-table1-fmnist", " rows=2/5"))
    (tmp_path / "proxyfl-gated.md").write_text(head.format("proxyfl-gated", " rows=1/1"))
    (tmp_path / "proxyfl-table1.md").write_text(head.format("proxyfl-table1", ""))  # a page from before
    index = write_index(tmp_path).read_text()
    assert "[celm-table1-fmnist.md](celm-table1-fmnist.md) | full (2 of 5 rows) | abc1234 |" in index
    assert "[proxyfl-gated.md](proxyfl-gated.md) | full | abc1234 |" in index
    assert "[proxyfl-table1.md](proxyfl-table1.md) | full | abc1234 |" in index


def _page_cells(page: str, methods: list[str]) -> dict[tuple[str, str], str]:
    """(row, method) -> cell text of the result page's table."""
    all_lines = page.splitlines()
    start = next(i for i, ln in enumerate(all_lines) if ln.startswith("| row |"))
    end = next((i for i in range(start, len(all_lines)) if not all_lines[i].startswith("|")), len(all_lines))
    lines = [ln for ln in all_lines[start:end] if ln.startswith("| ")]  # the separator row starts "|---"
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = {}
    for ln in lines[1:]:
        values = [c.strip() for c in ln.split("|")[1:-1]]
        for m in methods:
            cells[(values[0], m)] = values[header.index(m)]
    return cells


@pytest.mark.slow
def test_quick_reproduction_writes_a_result_page_with_every_cell_and_continues(tmp_path, capsys):
    """`fedhet reproduce NAME --scale quick --page`: every (row, method) cell of the table holds our number
    beside the paper's, the page says how to regenerate it and at which scale and commit, its figures exist,
    the index links it; rerunning reuses the finished cells and gives the same page numbers."""
    page, out = tmp_path / "results" / "celm-table1-fmnist.md", tmp_path / "out"
    args = ["reproduce", "celm-table1-fmnist", "--scale", "quick", "--page", str(page), "--out", str(out)]
    assert main([*args, "--quiet"]) == 0
    text = page.read_text()
    spec = load_spec("celm-table1-fmnist")
    cells = _page_cells(text, spec.methods)
    assert len(cells) == len(spec.rows) * len(spec.methods)
    for row in spec.rows:
        for m in spec.methods:
            paper, std = row.paper[m]
            assert re.match(
                rf"\*\*\d+\.\d\d\*\* \(1 seed\) / paper {paper:.2f} ± {std:.2f} / Δ [+-]\d",
                cells[(row.name, m)],
            )
    assert f"fedhet reproduce celm-table1-fmnist --scale quick --out {out} --page {page}" in text
    assert (
        "scale **quick**" in text and "Page written at commit" in text and "## Gaps and their causes" in text
    )
    assert f"Its {len(spec.rows) * len(spec.methods)} runs took" in text and "were computed at commit" in text
    figures = re.findall(r"\]\((figures/[^)]+)\)", text)
    assert figures == [f"figures/{page.stem}-accuracy.png", f"figures/{page.stem}-weights.png"]
    for figure in figures:
        assert (page.parent / figure).is_file()
    index = (page.parent / "README.md").read_text()
    assert "[celm-table1-fmnist.md](celm-table1-fmnist.md) | quick" in index
    assert "| `proxyfl-table1` |" in index and "not measured yet" in index
    capsys.readouterr()
    assert main([*args, "--quiet", "--json"]) == 0  # the finished cells are reused, not rerun
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert _page_cells(page.read_text(), spec.methods) == cells
    assert again["scale"] == "quick" and all(r["rounds"] == 2 for r in again["results"])


@pytest.mark.slow
def test_a_two_phase_table_runs_its_warm_start_first_and_prints_its_gates(tmp_path):
    """proxyfl-gated at the quick scale: phase A (labeled-only FedAvg) runs first with the same seeds and
    scale, every method of the row starts from its model (model.init_from), and the page holds every cell
    and the three validity gates and the ordering's steps, each judged from the runs
    (fedhet.report.fssl_gates)."""
    page, out = tmp_path / "results" / "proxyfl-gated.md", tmp_path / "out"
    assert main(["reproduce", "proxyfl-gated", "--scale", "quick", "--page", str(page), "--out", str(out),
                 "--quiet"]) == 0  # fmt: skip
    spec = load_spec("proxyfl-gated")
    row = spec.rows[0]
    warm = next(out.glob("*-warmstart"))
    assert (warm / "fedavg-labeled-seed0" / "summary.json").is_file()
    run_dir = warm.parent / warm.name.removesuffix("-warmstart")
    for m in spec.methods:
        config = (run_dir / f"{m}-seed0" / "config.toml").read_text()
        assert f'init_from = "{warm}/fedavg-labeled-seed{{seed}}"' in config
    text = page.read_text()
    cells = _page_cells(text, spec.methods)
    assert {name for name, _ in cells} == {row.name} and len(cells) == len(spec.methods)
    assert all(re.fullmatch(r"\*\*\d+\.\d\d\*\* \(1 seed\)", c) for c in cells.values())
    gates = re.findall(r"^- \[(pass|FAIL)\] (.+)$", text, flags=re.M)
    assert len(gates) == 3
    acc = {
        m: 100 * json.loads((run_dir / f"{m}-seed0" / "summary.json").read_text())["last"]["accuracy"]
        for m in spec.methods
    }
    gap = acc["fedavg-full"] - acc["fedavg-labeled"]
    assert gates[0] == ("pass" if gap >= 8 else "FAIL", f"all labels − labeled-only ≥ 8 points ({gap:+.2f})")
    # one seed has no interval: every step of the ordering is not resolved, whatever its sign
    steps = re.findall(r"^- \*\*(holds|contradicted|not resolved)\*\*: (\S+) [>≥] ", text, flags=re.M)
    assert steps == [("not resolved", "ProxyFL"), ("not resolved", "SAGE"), ("not resolved", "FixMatch-GPL")]
    ok = all(g[0] == "pass" for g in gates)
    assert ("the ordering as a whole **not resolved** at 1 seed(s)" in text) == ok
    assert ("a validity gate failed" in text) == (not ok)
    # the gates live in the records: GPL's record holds the mean over rounds of its unlabeled fraction used
    # (by hand from its metrics lines), and with the runs gone the page re-rendered from its records alone
    # prints the same gates
    lines = (run_dir / "fixmatch-gpl-seed0" / "metrics.jsonl").read_text().splitlines()
    fractions = [json.loads(ln)["unlabeled_used_fraction"] for ln in lines if "unlabeled_used_fraction" in ln]
    record = json.loads(next((page.parent / "cells").rglob("fixmatch-gpl-seed0.json")).read_text())
    assert record["round_means"]["unlabeled_used_fraction"] == pytest.approx(sum(fractions) / len(fractions))
    import shutil

    shutil.rmtree(out)
    assert main(["reproduce", "proxyfl-gated", "--scale", "quick", "--page", str(page), "--page-only",
                 "--quiet"]) == 0  # fmt: skip
    assert re.findall(r"^- \[(pass|FAIL)\] (.+)$", page.read_text(), flags=re.M) == gates


def _two_seed_digits_table(tmp_path: Path) -> tuple[Path, list[str]]:
    """A one-row table (digits, 3 IID clients, 2 rounds; FedAvg and FedProx, 2 seeds) in ``tmp_path``: its
    page's path and the reproduce command's arguments (without --out)."""
    (tmp_path / "small.toml").write_text(
        "[data]\ndataset = 'digits'\nsplit = 'iid'\nclients = 3\n[model]\nname = 'mlp'\n[train]\nrounds = 2\n"
    )
    spec = tmp_path / "t.toml"
    spec.write_text(
        "title = 't'\nmetric = 'accuracy'\nscale = 100\nseeds = 2\nmethods = ['fedavg', 'fedprox']\n"
        "[[rows]]\nname = 'IID'\nconfig = 'small.toml'\npaper = { fedavg = 90.0 }\n"
    )
    page = tmp_path / "results" / "t.md"
    return page, ["reproduce", str(spec), "--page", str(page), "--quiet", "--json"]


def test_a_cell_whose_record_still_holds_is_taken_from_it_and_not_run_again(tmp_path, capsys, monkeypatch):
    """--page leaves a record per cell; a later reproduction into an empty output folder takes every cell
    whose record holds the same experiment and results stamp from it (nothing runs, the same numbers), and
    runs again the cells whose record names another stamp."""
    import fedhet.comparison as comparison
    from fedhet.reproduce.store import method_stamp

    page, argv = _two_seed_digits_table(tmp_path)
    assert main([*argv, "--out", str(tmp_path / "first")]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"][0]
    records = sorted(p.name for p in (page.parent / "cells" / "t" / "full" / "iid").glob("*.json"))
    assert records == ["fedavg-seed0.json", "fedavg-seed1.json", "fedprox-seed0.json", "fedprox-seed1.json"]
    # each record names the stamp its run computed under: today's
    record_dir = page.parent / "cells" / "t" / "full" / "iid"
    stamps = {p.name.split("-seed")[0]: json.loads(p.read_text())["code"] for p in record_dir.glob("*.json")}
    assert stamps == {m: method_stamp(m) for m in ("fedavg", "fedprox")}
    ran = []
    real = comparison.run_comparison
    monkeypatch.setattr(
        comparison,
        "run_comparison",
        lambda base, methods, seeds, *a, **k: (
            ran.append((methods, seeds)) or real(base, methods, seeds, *a, **k)
        ),
    )
    assert main([*argv, "--out", str(tmp_path / "second")]) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"][0]
    assert ran == [] and not (tmp_path / "second" / "iid").exists()  # nothing ran
    for m in ("fedavg", "fedprox"):
        assert second["methods"][m]["per_seed"] == first["methods"][m]["per_seed"]
        assert second["methods"][m]["ours"] == pytest.approx(first["methods"][m]["ours"], abs=1e-9)
    assert set(second["recorded"]["fedavg"]) == {"0", "1"}
    assert "Its 4 runs (4 of them taken from their cell records" in page.read_text()
    provenance = page.read_text().split("Its 4 runs", 1)[1].split(". Cells:", 1)[0]
    assert "computed at commit " in provenance and "not recorded" not in provenance and "{" not in provenance
    # fedprox seed 1's record names other code: that cell's method runs again (both seeds: a sub-grid)
    path = page.parent / "cells" / "t" / "full" / "iid" / "fedprox-seed1.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "code": "0000000000000000"}))
    assert main([*argv, "--out", str(tmp_path / "third")]) == 0
    third = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"][0]
    assert ran == [(["fedprox"], [1])]
    assert third["methods"]["fedprox"]["per_seed"] == first["methods"]["fedprox"]["per_seed"]  # same code
    assert set(third["recorded"]) == {"fedavg", "fedprox"} and set(third["recorded"]["fedprox"]) == {"0"}


def test_fedhet_records_counts_the_cells_a_page_would_take_from_records_and_those_it_would_run(
    tmp_path, capsys, monkeypatch
):
    """After --page, every cell of the page stands in its record (nothing to run). A bump of FedProx's module
    version invalidates FedProx's cells and no others: 2 to run, estimated at the sum of their records' own
    wall times (read here from the files); FedAvg's two still come from records."""
    import fedhet.algorithms.fedprox as fedprox_module
    import fedhet.comparison as comparison
    from fedhet.cli.records import table_page
    from fedhet.reproduce import load_spec

    page, argv = _two_seed_digits_table(tmp_path)
    assert main([*argv, "--out", str(tmp_path / "runs")]) == 0
    capsys.readouterr()
    spec = load_spec(str(tmp_path / "t.toml"))
    cells_dir = page.parent / "cells"
    plan = table_page(page, cells_dir, spec)
    assert (plan["from_records"], plan["to_run"], plan["cpu_hours"]) == (4, 0, 0.0)
    monkeypatch.setattr(fedprox_module, "RESULTS_VERSION", fedprox_module.RESULTS_VERSION + 1)
    monkeypatch.setattr(comparison, "run_comparison", lambda *a, **k: pytest.fail("a plan ran a cell"))
    plan = table_page(page, cells_dir, spec)
    assert (plan["from_records"], plan["to_run"], plan["rows_to_run"]) == (2, 2, ["IID"])
    walls = [
        json.loads((cells_dir / "t" / "full" / "iid" / f"fedprox-seed{s}.json").read_text()) for s in (0, 1)
    ]
    assert plan["cpu_hours"] == pytest.approx(sum(r["wall_time_s"] for r in walls) / 3600)


def test_an_interrupted_table_keeps_the_records_of_its_finished_seeds(tmp_path, capsys, monkeypatch):
    """Each seed of a row is recorded as it ends, not when the table ends: a reproduction stopped in its
    second seed leaves the first seed's records, and a later one into an empty output folder (the runs are
    gone) runs only the second seed."""
    import fedhet.comparison as comparison

    page, argv = _two_seed_digits_table(tmp_path)
    ran = []
    real = comparison.run_comparison

    def stopped_in_seed_1(base, methods, seeds, *a, **k):
        ran.append((methods, seeds))
        if 1 in seeds:
            raise KeyboardInterrupt  # the user's Ctrl-C, or the session's end, in seed 1
        return real(base, methods, seeds, *a, **k)

    monkeypatch.setattr(comparison, "run_comparison", stopped_in_seed_1)
    assert main([*argv, "--out", str(tmp_path / "first")]) != 0  # interrupted: it says how to resume
    assert "resume with: fedhet reproduce" in capsys.readouterr().err
    record_dir = page.parent / "cells" / "t" / "full" / "iid"
    assert sorted(p.name for p in record_dir.glob("*.json")) == ["fedavg-seed0.json", "fedprox-seed0.json"]
    summary = json.loads((tmp_path / "first" / "iid" / "fedavg-seed0" / "summary.json").read_text())
    record = json.loads((record_dir / "fedavg-seed0.json").read_text())
    assert record["views"]["final"]["accuracy"] == summary["final"]["accuracy"]
    ran.clear()
    monkeypatch.setattr(
        comparison, "run_comparison", lambda base, methods, seeds, *a, **k: (
            ran.append((methods, seeds)) or real(base, methods, seeds, *a, **k)
        ),
    )  # fmt: skip
    assert main([*argv, "--out", str(tmp_path / "second")]) == 0
    capsys.readouterr()
    assert ran == [(["fedavg", "fedprox"], [1])]
    assert sorted(p.name for p in record_dir.glob("*.json")) == [
        "fedavg-seed0.json", "fedavg-seed1.json", "fedprox-seed0.json", "fedprox-seed1.json",
    ]  # fmt: skip


def test_the_store_reuses_a_record_only_for_the_same_experiment_under_todays_stamp(tmp_path):
    from fedhet.reproduce import store

    stamp = store.method_stamp("celm")
    record = {"experiment": "f" * 16, "code": stamp}
    assert store.is_reusable(record, "f" * 16, "celm")
    assert not store.is_reusable(record, "e" * 16, "celm")  # another experiment
    assert not store.is_reusable({**record, "code": stamp.replace("celm=1", "celm=0")}, "f" * 16, "celm")
    assert not store.is_reusable({**record, "code": None}, "f" * 16, "celm")  # no stamp: never
    assert not store.is_reusable(record, "f" * 16, "fedavg")  # another method's stamp
    assert not store.is_reusable(None, "f" * 16, "celm")
    assert not store.is_reusable({**record, "method": "gone"}, "f" * 16, "no-such-method")  # unregistered
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "torn.json").write_text('{"experiment": ')
    assert (
        store.read_record(tmp_path / "list.json") is None
        and store.read_record(tmp_path / "torn.json") is None
    )
    # a run's stamp: the one every stretch of its rounds names; none where they differ or name none
    one = {"commit": "abc1234", "results": stamp}
    assert store.run_stamp({"fedhet_commits": [one, {**one, "commit": "def5678"}]}) == stamp
    assert store.run_stamp({"fedhet_commits": [one, {"commit": "def5678", "results": "core=1"}]}) is None
    assert store.run_stamp({"fedhet_commits": [{"commit": "abc1234"}]}) is None
    assert store.run_stamp({"fedhet_commit": "abc1234"}) is None
    # written again from a summary that names no stamp, a record keeps the stamp it was written with
    path = tmp_path / "celm-seed0.json"
    kept = {"experiment": "f" * 16, "commits": ["abc1234"], "code": stamp, "values": {"a": 1}}
    store.write_record(path, kept)
    store.write_record(path, {**kept, "code": None, "values": {"a": 2}})
    assert json.loads(path.read_text()) == kept
    store.write_record(path, {**kept, "commits": ["def5678"], "code": None})  # another run: replaced
    assert json.loads(path.read_text())["code"] is None


def test_a_tables_own_set_runs_every_row_with_it_before_the_rows_own_and_the_page_says_so(tmp_path):
    from fedhet.reproduce.render import render_markdown

    (tmp_path / "small.toml").write_text("[data]\ndataset = 'digits'\n[train]\nlr = 0.01\n")
    spec = tmp_path / "table.toml"
    spec.write_text(
        "title = 't'\nmethods = ['fedavg']\nset = ['guards.update_norm_clip=0', 'train.lr=0.02']\n"
        "[[rows]]\nname = 'plain'\nconfig = 'small.toml'\n"
        "[[rows]]\nname = 'own'\nconfig = 'small.toml'\nset = ['train.lr=0.03']\n"
    )
    loaded = load_spec(str(spec))
    plain, own = (row_config(row, []) for row in loaded.rows)
    assert (plain.guards.update_norm_clip, plain.train.lr) == (0.0, 0.02)
    assert (own.guards.update_norm_clip, own.train.lr) == (0.0, 0.03)  # the row's own after the table's
    text = render_markdown(loaded, [])
    assert "Every row runs with `--set guards.update_norm_clip=0` `--set train.lr=0.02`" in text


def test_rows_that_share_their_runs_count_each_run_and_each_record_once():
    from fedhet.reproduce import cell_provenance

    # three rows (the mean of the last 100, the best, the final) read the same two runs, taken from records
    recorded = {
        "fedavg": {str(s): {"wall_time_s": 10.0 + s, "commits": [{"commit": "abc1234"}]} for s in (0, 1)}
    }
    row = {"available": True, "run_dir": "runs/t/pow", "methods": {"fedavg": {}}, "seeds": [0, 1]}
    provenance = cell_provenance([{**row, "recorded": recorded} for _ in range(3)])
    assert (provenance["runs"], provenance["from_records"]) == (2, 2)
    assert provenance["run_seconds"] == pytest.approx(21.0) and provenance["commits"] == ["abc1234"]


def test_records_plans_a_warm_started_table_as_its_page_command_runs_it(monkeypatch):
    """proxyfl-gated's rows start from phase-A models named by the folder `fedhet reproduce` runs them in
    (model.init_from, part of the fingerprint): planned in any other folder, none of its 15 committed cells
    would match its record."""
    from fedhet.cli.records import table_page

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    results = root / "docs" / "results"
    plan = table_page(results / "proxyfl-gated.md", results / "cells")
    assert (plan["from_records"], plan["to_run"]) == (15, 0)
