"""Site and class names in every output: a real run on a folder of three site files (scikit-learn's breast
cancer, labels written as "benign" / "malignant"), then `fedhet run`'s table, summary.json, the run's CSVs
and figures, `fedhet compare`'s tables and report, and `fedhet audit` are read back. The known answers come
from the files written here: which site holds how many rows of which class."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from fedhet.cli import main
from fedhet.cli.run import public_summary
from fedhet.report import figures

SITES = ("west", "north", "south")  # written in this order; fedhet numbers them by name
TABLE = ["--dataset", "csv", "--model", "tabular-mlp", "--set", "data.label_column=diagnosis"]
TABLE += ["--set", "data.split=sites", "--set", "data.clients=3", "--quiet"]


def write_sites(root: Path) -> dict[str, dict[str, int]]:
    """train/<site>.csv for three sites (west holds most malignant rows and the most rows) and test.csv;
    returns each site's rows per class, counted from the files as written."""
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    x, labels = bunch.data[:, :8], np.array(["malignant", "benign"])[bunch.target]
    rng = np.random.default_rng(0)
    order = rng.permutation(len(labels))
    test, train = order[:120], order[120:]
    site = np.empty(len(labels), dtype=object)
    malignant = train[labels[train] == "malignant"]
    benign = train[labels[train] == "benign"]
    site[malignant] = np.where(
        rng.random(len(malignant)) < 0.8, "west", rng.choice(["north", "south"], len(malignant))
    )
    site[benign] = rng.choice(["north", "south", "west", "north", "south"], len(benign))
    header = [f"f{j}" for j in range(x.shape[1])] + ["diagnosis"]

    def write(path: Path, rows: np.ndarray) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(header)
            writer.writerows([*(f"{v:.6g}" for v in x[i]), labels[i]] for i in rows)

    for name in SITES:
        write(root / "train" / f"{name}.csv", train[site[train] == name])
    write(root / "test.csv", test)
    counts = {}
    for name in SITES:
        with open(root / "train" / f"{name}.csv") as fh:
            held = [row["diagnosis"] for row in csv.DictReader(fh)]
        counts[name] = {k: held.count(k) for k in ("benign", "malignant")}
    return counts


@pytest.fixture(scope="module")
def saved_figures():
    """Every figure fedhet saves in this module, by file name (the real save_figure still writes it)."""
    saved: dict[str, object] = {}
    real = figures.save_figure
    mp = pytest.MonkeyPatch()

    def keep(fig, path):
        saved[Path(path).name] = fig
        return real(fig, path)

    mp.setattr(figures, "save_figure", keep)
    yield saved
    mp.undo()


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    root = tmp_path_factory.mktemp("names")
    mp = pytest.MonkeyPatch()
    mp.setenv("FEDHET_CACHE", str(root / "cache"))
    yield root, write_sites(root / "data")
    mp.undo()


def tick_labels(fig, axis: str) -> list[str]:
    ax = fig.axes[0]
    return [t.get_text() for t in (ax.get_xticklabels() if axis == "x" else ax.get_yticklabels())]


def test_the_premise_west_holds_most_rows_and_most_malignant_rows(sites):
    _, counts = sites
    total = {s: sum(c.values()) for s, c in counts.items()}
    assert max(total, key=total.get) == "west" and min(total, key=total.get) != "west"
    malignant = sum(c["malignant"] for c in counts.values())
    assert counts["west"]["malignant"] > 0.5 * malignant  # a maverick by the audit's 50 % rule


def test_run_table_summary_csvs_figures_and_audit_name_sites_and_classes(sites, saved_figures, capsys):
    root, counts = sites
    run = root / "celm"
    args = ["run", *TABLE, "--data-path", str(root / "data"), "--method", "celm", "--rounds", "3"]
    assert main([*args, "--out", str(run)]) == 0
    out = capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    names = summary["client_names"]
    # client i is the site of sorted rank i: each client's rows and class counts are those of its site's file
    assert names == sorted(SITES) and summary["class_names"] == ["benign", "malignant"]
    assert summary["client_sizes"] == [sum(counts[s].values()) for s in names]
    for i, site in enumerate(names):
        described = summary["described_class_counts"][str(i)]
        assert described == [counts[site]["benign"], counts[site]["malignant"]]
    assert public_summary(summary)["client_names"] == names  # fedhet run --json
    assert public_summary(summary)["class_names"] == ["benign", "malignant"]
    # the printed table: classes by name, clients as "i (site)"
    recall = summary["final"]["per_class_recall"]
    assert f"per-class recall %: benign {100 * recall[0]:.2f}, malignant {100 * recall[1]:.2f}" in out
    weights = summary["contributions"]
    assert "contributions: " + ", ".join(f"{i} ({s}) {weights[i]:.3f}" for i, s in enumerate(names)) in out
    # the evidence CSVs: each client row names its site
    with open(run / "evidence" / "round_001_raw.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["model"], r["site"]) for r in rows] == [("global_previous", "")] + [
        (f"client_{i}", s) for i, s in enumerate(names)
    ]
    # contributions.csv: a row per round and client, the client's site beside its number
    with open(run / "contributions.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [(int(r["round"]), int(r["client"]), r["site"]) for r in rows] == [
        (t, i, s) for t in (1, 2, 3) for i, s in enumerate(names)
    ]
    assert [float(r["contribution"]) for r in rows[-3:]] == pytest.approx(weights, abs=1e-9)
    # the figures' axes
    clients = [f"{i} ({s})" for i, s in enumerate(names)]
    assert tick_labels(saved_figures["celm_final_weights.png"], "x") == clients
    assert tick_labels(saved_figures["celm_evidence.png"], "x") == ["benign", "malignant"]
    legend = [t.get_text() for t in saved_figures["celm_contributions.png"].axes[0].get_legend().get_texts()]
    assert all(f"client {c}" in legend for c in clients)

    # fedhet audit: flags name the client and its site, classes by name
    assert main(["audit", str(run), "--out", str(root / "audit" / "audit.md")]) == 0
    out = capsys.readouterr().out
    west = names.index("west")
    assert f"maverick [{west} (west)]" in out
    page = (root / "audit" / "audit.md").read_text()
    assert f"- client {west} (west), **maverick**: class malignant: dominant holder" in page
    for i, site in enumerate(names):
        assert f"\n| {i} ({site}) | " in page
    share = saved_figures["00-celm-seed0-share.png"].axes[0]
    assert sorted(t.get_text() for t in share.texts) == clients


def test_compare_tables_report_and_client_csv_name_sites_and_classes(sites, saved_figures, capsys):
    root, counts = sites
    out_dir = root / "compare"
    args = ["compare", *TABLE, "--data-path", str(root / "data"), "--methods", "fedavg,cgsv"]
    assert main([*args, "--rounds", "2", "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    names = sorted(SITES)
    summary = json.loads((out_dir / "cgsv-seed0" / "summary.json").read_text())
    # the per-class recall table (rows by class name) and the contribution table (rows "i (site)")
    fedavg = json.loads((out_dir / "fedavg-seed0" / "summary.json").read_text())["final"]
    benign = next(line for line in out.splitlines() if "│ benign" in line)
    assert f"{100 * fedavg['per_class_recall'][0]:.2f}" in benign
    assert any("│ malignant" in line for line in out.splitlines())
    for i, site in enumerate(names):
        row = next(line for line in out.splitlines() if f"│ {i} ({site})" in line)
        assert f"{summary['contributions'][i]:.3f}" in row
    # <method>_clients.csv: a site column; the client with the most rows is the site with the largest file
    with open(out_dir / "cgsv-seed0" / "cgsv_clients.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["site"] for r in rows] == names
    largest = max(rows, key=lambda r: float(r["num_examples"]))
    assert largest["site"] == max(counts, key=lambda s: sum(counts[s].values()))
    # the report: the recall table by class name, contributions by client and site, the partition's axes
    report = (out_dir / "report.md").read_text()
    assert "| class | " in report and "\n| benign | " in report and "\n| malignant | " in report
    assert (
        "  - contributions: "
        + ", ".join(f"{i} ({s}) {summary['contributions'][i]:.3f}" for i, s in enumerate(names))
        in report
    )
    partition = saved_figures["partition.png"]
    assert tick_labels(partition, "y") == [
        f"{i} ({s}): {sum(counts[s].values())}" for i, s in enumerate(names)
    ]
    assert tick_labels(partition, "x") == ["benign", "malignant"]
    assert tick_labels(saved_figures["per_class_recall.png"], "x") == ["benign", "malignant"]


def test_fedracs_clients_csv_names_each_clients_site_in_its_site_column(sites):
    """clients.csv of FedRAC (a row per client): the header names the site column its rows fill, and client
    i's site is the site of sorted rank i (fedhet numbers a folder's site files by name)."""
    root, _ = sites
    run = root / "fedrac"
    args = ["run", *TABLE, "--data-path", str(root / "data"), "--method", "fedrac", "--rounds", "2"]
    assert main([*args, "--out", str(run)]) == 0
    with open(run / "clients.csv") as fh:
        reader = csv.reader(fh)
        header, rows = next(reader), list(reader)
    assert header[0] == "client" and header[-1] == "site"
    assert all(len(row) == len(header) for row in rows)
    named = [dict(zip(header, row, strict=True)) for row in rows]
    assert [(int(r["client"]), r["site"]) for r in named] == list(enumerate(sorted(SITES)))


def test_a_split_of_built_in_data_numbers_its_clients_and_names_its_classes():
    """No sites without a site split: the clients keep their numbers; the data set's class names stay."""
    import torch

    from fedhet.engine.names import RunNames
    from fedhet.engine.simulation import build_federation
    from support import digits_config

    fed = build_federation(digits_config(clients=3), torch.device("cpu"))
    assert fed.names.clients == () and fed.names.client(2) == "2"
    assert fed.names.classes == tuple(str(k) for k in range(10))
    assert fed.names.to_summary() == {"client_names": None, "class_names": [str(k) for k in range(10)]}
    assert RunNames.of_summary({}).client(1) == "1"  # a run recorded before the names: numbers
