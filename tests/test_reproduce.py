"""`fedhet reproduce`: tiny-scale rows print our number beside the paper's value and the difference."""

from __future__ import annotations

import json

import pytest
import torch

from fedhet.cli import main
from fedhet.reproduce import list_specs, load_spec, parse_paper_value

torch.set_num_threads(1)


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
            assert set(row.paper) <= set(spec.methods)


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
        "[[rows]]\nname = 'offline'\navailable = false\nnote = 'not here'\npaper = { fedavg = 61.0 }\n"
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
    assert not offline["available"] and not svhn["available"] and "svhn" in svhn["note"]
    md = (out / "reproduce.md").read_text()
    assert f"Δ {ours - 50.0:+.2f}" in md and "not run" in md
    import csv

    with (out / "reproduce.csv").open() as handle:
        lines = list(csv.DictReader(handle))
    assert [line["row"] for line in lines] == ["iid", "iid again", "offline", "svhn"]
    assert float(lines[0]["ours"]) == pytest.approx(ours) and float(lines[0]["delta"]) == pytest.approx(
        ours - 50
    )
    assert lines[2]["ours"] == "" and float(lines[2]["paper"]) == 61.0


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
