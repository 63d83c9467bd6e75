"""A deployment a site runs from the docs: each site's data exported from a split, tables read at the nodes
(their reports combined into the embedded engine's encoding and statistics), and the one-host walkthrough of
docs/flower.md run as written (TLS, three SuperNodes reading their own CSV files)."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="the Flower tests need fedhet[flower]; make setup installs it")

from fedhet.cli import main as fedhet_main  # noqa: E402
from fedhet.config import ExperimentConfig, load_config  # noqa: E402
from fedhet.data.datasets import site_tables as st  # noqa: E402
from fedhet.engine.simulation import build_federation  # noqa: E402
from fedhet.errors import DataError  # noqa: E402
from fedhet.experiment import make_simulation  # noqa: E402
from flower_cluster import BIN, free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "examples" / "flower-app"


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


# -- exporting each site's data -----------------------------------------------------------------------------
def test_export_sites_writes_each_clients_rows_of_the_embedded_split_and_refuses_a_full_folder(
    tmp_path, capsys
):
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "digits", "dirichlet-per-client", 3
    cfg.data.split_params = {"alpha": 0.5}  # the config below, as an object
    (tmp_path / "digits.toml").write_text(
        '[data]\ndataset = "digits"\nsplit = "dirichlet-per-client"\nsplit_params = { alpha = 0.5 }\n'
        "clients = 3\n"
    )
    out = tmp_path / "sites"
    assert fedhet_main(["partition", str(tmp_path / "digits.toml"), "--export-sites", str(out)]) == 0
    fed = build_federation(cfg, torch.device("cpu"))
    ds = fed.dataset
    lines = (out / "nodes.txt").read_text().splitlines()
    for client in fed.clients:
        with np.load(out / f"site-{client.cid}" / "data.npz") as npz:
            idx = client.indices.numpy()
            assert np.array_equal(npz["x_train"], ds.train_x[idx].numpy())
            assert np.array_equal(npz["y_train"], ds.train_y[idx].numpy())
            assert list(npz["classes"]) == list(ds.classes)
        assert (
            lines[client.cid] == f"client-id={client.cid} data-dir='{(out / f'site-{client.cid}').resolve()}'"
        )
    assert sum(len(np.load(out / f"site-{c}" / "data.npz")["y_train"]) for c in range(3)) == len(
        fed.pool_indices
    )
    capsys.readouterr()
    assert fedhet_main(["partition", str(tmp_path / "digits.toml"), "--export-sites", str(out)]) == 2
    err = capsys.readouterr().err
    assert "not empty" in err and "--force" in err
    (out / "stray.txt").write_text("x")
    assert (
        fedhet_main(["partition", str(tmp_path / "digits.toml"), "--export-sites", str(out), "--force"]) == 0
    )
    assert not (out / "stray.txt").exists()
    other = tmp_path / "not-an-export"
    other.mkdir()
    (other / "keep.txt").write_text("x")  # --force never deletes a folder that is not an export
    argv = ["partition", str(tmp_path / "digits.toml"), "--export-sites", str(other), "--force"]
    assert fedhet_main(argv) == 2
    assert (other / "keep.txt").is_file() and "not an earlier export" in capsys.readouterr().err


# -- tables at the nodes --------------------------------------------------------------------------------
HEADER = ["alcohol", "malic_acid", "color", "grade", "label"]


def write_site_tables(root: Path) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """wine's rows as a table folder: train/<site>.csv for three sites (each row's site a seeded draw),
    test.csv; a text column whose level 'rose' client 0's site (alpha) lacks, and a number column declared
    categorical. Returns each site's rows (indices into wine, in file order) and wine's features."""
    from sklearn.datasets import load_wine

    wine = load_wine()
    x, y = wine.data, wine.target
    rng = np.random.default_rng(0)
    color = np.array(["red", "white", "rose"])[rng.integers(0, 3, len(y))]
    site = np.array(["alpha", "beta", "gamma"])[rng.integers(0, 3, len(y))]
    test = rng.random(len(y)) < 0.25
    (root / "train").mkdir(parents=True)

    def write(path: Path, rows: np.ndarray) -> None:
        body = [f"{x[i, 0]},{x[i, 1]},{color[i]},{int(x[i, 4]) % 3},{wine.target_names[y[i]]}" for i in rows]
        path.write_text("\n".join([",".join(HEADER), *body]) + "\n")

    rows = {}
    for name in ("alpha", "beta", "gamma"):
        rows[name] = np.flatnonzero((site == name) & ~test & ((color != "rose") | (name != "alpha")))
        write(root / "train" / f"{name}.csv", rows[name])
    write(root / "test.csv", np.flatnonzero(test))
    return rows, x


@pytest.mark.numerics
def test_site_reports_combine_into_the_encoding_and_statistics_the_embedded_engine_computes(tmp_path):
    rows, x = write_site_tables(tmp_path / "table")
    cfg = ExperimentConfig()
    d = cfg.data
    d.dataset, d.path, d.split, d.clients, d.categorical_columns = (
        "csv",
        str(tmp_path / "table"),
        "sites",
        3,
        ["grade"],
    )
    from fedhet.flower.sites import export_sites

    sites = export_sites(cfg, tmp_path / "sites")
    assert [s.folder.name for s in sites] == ["alpha", "beta", "gamma"]  # a table split by its sites
    # each exported site file holds the source file's rows, cell for cell
    for s in sites:
        assert (s.folder / "train.csv").read_text() == (
            tmp_path / "table" / "train" / f"{s.folder.name}.csv"
        ).read_text()
    reports = {
        s.cid: st.site_report(
            st.read_table_file(s.folder / "train.csv"), label="label", categorical=["grade"]
        )
        for s in sites
    }
    assert "rose" not in reports[0]["levels"]["color"] and "sum" in reports[0]  # counts and sums, no rows
    test = st.server_test_columns(d.path, None, "test")
    encoding, mean, std = st.combine_site_reports(reports, test, label="label")
    assert encoding.vocabularies == {"color": ("red", "rose", "white"), "grade": ("0", "1", "2")}
    # by hand: alcohol's mean and population std over every site's rows, as float32 features
    alcohol = (
        np.concatenate([x[rows[s], 0] for s in ("alpha", "beta", "gamma")])
        .astype(np.float32)
        .astype(np.float64)
    )
    assert mean[0] == pytest.approx(alcohol.mean(), rel=1e-12) and std[0] == pytest.approx(
        alcohol.std(), rel=1e-12
    )
    assert mean[2:] == (0.0,) * 6 and std[2:] == (1.0,) * 6  # one-hot columns are not standardised
    # the embedded engine on the whole folder: the same features, classes and statistics (float64 sums of
    # the same float32 values in the same order: equal to rounding, 1e-12 relative)
    fed = build_federation(cfg, torch.device("cpu"))
    ds = fed.dataset
    assert encoding.feature_names == ds.feature_names and encoding.classes == ds.classes
    np.testing.assert_allclose(mean, ds.mean, rtol=1e-12, atol=0)
    np.testing.assert_allclose(std, ds.std, rtol=1e-12, atol=0)
    for s, client in zip(sites, fed.clients, strict=True):
        features, labels = st.encode_rows(st.read_table_file(s.folder / "train.csv"), encoding, s.folder.name)
        assert np.array_equal(features, ds.train_x[client.indices].numpy())  # parsed and cast alike
        assert np.array_equal(labels, ds.train_y[client.indices].numpy())
    test_x, _ = st.encode_rows(test, encoding, "test")
    assert np.array_equal(test_x, ds.test_x.numpy())


def test_a_column_numeric_at_one_site_and_text_at_another_is_refused_naming_it(tmp_path):
    a = {"grade": np.array(["1", "2"], dtype=object), "label": np.array(["x", "y"], dtype=object)}
    b = {"grade": np.array(["high", "low"], dtype=object), "label": np.array(["x", "y"], dtype=object)}
    reports = {0: st.site_report(a, label="label"), 1: st.site_report(b, label="label")}
    with pytest.raises(DataError, match=r"\['grade'\] are numbers at some sites.*data.categorical_columns"):
        st.combine_site_reports(reports, a, label="label")
    c = {"other": np.array(["1", "2"], dtype=object), "label": np.array(["x", "y"], dtype=object)}
    with pytest.raises(
        DataError, match=r"client 1's table and client 0's differ in column\(s\) \['grade', 'other'\]"
    ):
        st.combine_site_reports({0: reports[0], 1: st.site_report(c, label="label")}, a, label="label")
    missing = {"grade": np.array(["1", ""], dtype=object), "label": np.array(["x", "y"], dtype=object)}
    with pytest.raises(DataError, match="missing or non-finite"):
        st.site_report(missing, label="label")


# -- the one-host walkthrough of docs/flower.md ------------------------------------------------------------
def docs_block(name: str) -> str:
    """The fenced bash block that follows ``<!-- walkthrough: NAME -->`` in docs/flower.md."""
    text = (ROOT / "docs" / "flower.md").read_text()
    match = re.search(rf"<!-- walkthrough: {name} -->\s*```bash\n(.*?)```", text, re.S)
    assert match, f"docs/flower.md has no walkthrough block {name!r}"
    return match.group(1)


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running (a zombie, dead and waiting to be reaped by
    init, is not)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def stop_group(pid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and group_alive(pid):
            time.sleep(0.2)


@pytest.mark.slow
def test_the_one_host_walkthrough_with_tls_and_three_table_nodes_gives_the_embedded_runs_metrics(tmp_path):
    t0 = time.monotonic()
    config = APP / "wine.toml"
    assert fedhet_main(["partition", str(config), "--export-sites", str(tmp_path / "sites")]) == 0
    subprocess.run(
        ["bash", "-euo", "pipefail", "-c", docs_block("certificates")], cwd=tmp_path, check=True, timeout=60
    )
    work = tmp_path / "one-host"
    env = {
        **os.environ,
        "FLWR_HOME": str(work / "flwr-home"),
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
    }
    app = tmp_path / "app"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("runs", "__pycache__"))
    port = free_port()
    with open(tmp_path / "one_host.log", "wb") as log:
        script = subprocess.Popen(
            [str(APP / "one_host.sh"), "sites", "--tls", "certs", "--port", str(port), "--work", "one-host"],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    said = lambda: (tmp_path / "one_host.log").read_text(errors="replace")  # noqa: E731
    try:
        deadline = time.monotonic() + 120
        while "ready" not in said() and script.poll() is None and time.monotonic() < deadline:
            time.sleep(0.3)
        assert "ready" in said(), said()
        phases = {"export, certificates, SuperLink and SuperNodes": time.monotonic() - t0}
        run_dir = tmp_path / "runs" / "wine"
        done = subprocess.run(
            [str(BIN / "flwr"), "run", str(app), "local", "--stream", "--run-config",
             f"config='wine.toml' run-dir='{run_dir}' node-tables=true connect-timeout=30.0"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert (run_dir / "summary.json").is_file(), done.stdout[-3000:] + done.stderr[-3000:]
        phases["flwr run"] = time.monotonic() - t0 - sum(phases.values())
    finally:
        script.send_signal(signal.SIGTERM)  # its trap stops the SuperLink and every SuperNode
        stopping = time.monotonic()
        try:
            script.wait(timeout=40)
        except subprocess.TimeoutExpired:
            pass
        waited = time.monotonic() - stopping
        snapshot = subprocess.run(
            ["ps", "-eo", "pid,ppid,pgid,stat,etime,cmd"], capture_output=True, text=True
        ).stdout
        started = (
            [int(line.split()[1]) for line in (work / "pids").read_text().splitlines()]
            if (work / "pids").is_file()
            else []
        )
        alive = [pid for pid in started if group_alive(pid)]
        for pid in [script.pid, *alive]:
            stop_group(pid)
    assert len(started) == 4 and alive == [], (
        f"the script left {alive} running after {waited:.1f} s:\n{snapshot}"
    )
    print({k: round(v, 1) for k, v in phases.items()}, f"stop {waited:.1f} s")
    nodes = json.loads((run_dir / "flower_nodes.json").read_text())
    assert sorted(nodes["clients"]) == ["0", "1", "2"] and nodes["refused"] == {}
    embedded = make_simulation(load_config(config), run_dir=tmp_path / "embedded").run()
    # Byte-identical: the nodes' encoding and the server's combined statistics equal the embedded engine's
    # (test_site_reports_combine_...), and then the code path is the same (run_client, one thread a node).
    assert (run_dir / "metrics.jsonl").read_bytes() == (tmp_path / "embedded" / "metrics.jsonl").read_bytes()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final"] == embedded["final"] and summary["client_sizes"] == embedded["client_sizes"]


@pytest.mark.numerics
def test_nodes_reading_their_csv_hold_the_embedded_clients_standardised_rows(tmp_path):
    """The node and server code of a table deployment, without the network: each node's ClientData and the
    server's test set equal the embedded engine's, categorical columns included."""
    from fedhet.config import to_toml
    from fedhet.flower.client import NodeRuntime
    from fedhet.flower.site_tables import table_federation
    from fedhet.flower.sites import export_sites

    write_site_tables(tmp_path / "table")
    cfg = ExperimentConfig()
    d = cfg.data
    d.dataset, d.path, d.split, d.clients = "csv", str(tmp_path / "table"), "sites", 3
    d.categorical_columns = ["grade"]
    cfg.model.name = "tabular-mlp"
    sites = export_sites(cfg, tmp_path / "sites")
    reports = {
        s.cid: st.site_report(
            st.read_table_file(s.folder / "train.csv"), label="label", categorical=["grade"]
        )
        for s in sites
    }
    server, encoding = table_federation(cfg, reports, torch.device("cpu"))
    embedded = build_federation(cfg, torch.device("cpu"))
    assert torch.equal(server.test_x, embedded.test_x) and torch.equal(server.test_y, embedded.test_y)
    assert server.sizes == embedded.sizes and np.array_equal(server.class_counts, embedded.class_counts)
    ds = server.dataset
    run = {
        "config": to_toml(cfg),
        "classes": list(ds.classes),
        "input_shape": list(ds.input_shape),
        "mean": list(ds.mean),
        "std": list(ds.std),
        "encoding": json.dumps(encoding.to_json()),
    }
    # exact: the same float32 features and the same (x − mean) / std with the same statistics (combined as
    # in test_site_reports_combine_...), one operation on both sides
    for s, client in zip(sites, embedded.clients, strict=True):
        node = NodeRuntime(run, {"client-id": s.cid, "data-path": str(s.folder / "train.csv")})
        assert node.cid == client.cid
        assert torch.equal(node.data.inputs, client.inputs[client.indices])
        assert torch.equal(node.data.labels, client.labels[client.indices])


@pytest.mark.numerics
def test_a_parquet_table_with_a_client_column_is_exported_and_encoded_at_its_sites_as_embedded(tmp_path):
    """One Parquet file naming each row's site, a missing category, a held-out test part: the export writes
    each site's rows and the server's test rows as Parquet, and the sites' path gives the embedded rows."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    n = 120
    columns = {
        "a": rng.normal(size=n),
        "b": rng.integers(0, 4, n).astype(float),
        "c": [["x", "y", None][i] for i in rng.integers(0, 3, n)],
        "site": [["s1", "s2"][i] for i in rng.integers(0, 2, n)],
        "y": rng.integers(0, 2, n),
    }
    pq.write_table(pa.table(columns), tmp_path / "all.parquet")
    cfg = ExperimentConfig()
    d = cfg.data
    d.dataset, d.path, d.split, d.clients = "parquet", str(tmp_path / "all.parquet"), "sites", 2
    d.client_column, d.label_column, d.categorical_columns = "site", "y", ["b"]
    from fedhet.flower.sites import export_sites

    sites = export_sites(cfg, tmp_path / "sites")
    fed = build_federation(cfg, torch.device("cpu"))
    ds = fed.dataset
    assert [s.folder.name for s in sites] == ["s1", "s2"] and sum(s.rows for s in sites) == len(ds.train_y)
    reports = {
        s.cid: st.site_report(
            st.read_table_file(s.folder / "train.parquet"), label="y", client="site", categorical=["b"]
        )
        for s in sites
    }
    test = st.server_test_columns(None, str(tmp_path / "sites" / "server" / "test.parquet"), "test")
    encoding, mean, _ = st.combine_site_reports(reports, test, label="y")
    assert "c=(missing)" in encoding.feature_names and encoding.feature_names == ds.feature_names
    np.testing.assert_allclose(mean, ds.mean, rtol=1e-12, atol=0)  # float64 sums of the same values
    for s, client in zip(sites, fed.clients, strict=True):
        rows = st.read_table_file(s.folder / "train.parquet")
        features, labels = st.encode_rows(rows, encoding, s.folder.name)
        assert np.array_equal(features, ds.train_x[client.indices].numpy())
        assert np.array_equal(labels, ds.train_y[client.indices].numpy())
    test_x, test_y = st.encode_rows(test, encoding, "test")
    assert np.array_equal(test_x, ds.test_x.numpy()) and np.array_equal(test_y, ds.test_y.numpy())


# -- imputation at the nodes ---------------------------------------------------------------------------------
def blank_cells(path: Path, column: str, rows: list[int], marker: str = "NA") -> list[float]:
    """Replace ``column``'s cells of data ``rows`` (from 0 after the header) in a CSV by ``marker``; returns
    the values that stay (the column's present values, as the file writes them)."""
    lines = path.read_text().splitlines()
    j = lines[0].split(",").index(column)
    kept = []
    for i in range(1, len(lines)):
        cells = lines[i].split(",")
        if i - 1 in rows:
            cells[j] = marker
        else:
            kept.append(float(cells[j]))
        lines[i] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    return kept


@pytest.mark.numerics
@pytest.mark.parametrize("strategy", ["median", "mean", "most_frequent"])
def test_nodes_reading_tables_with_missing_cells_impute_as_the_embedded_engine(tmp_path, strategy, caplog):
    """Three nodes read their own CSV files with NA cells (alcohol missing at two sites, malic_acid only in
    the server's test rows); with data.impute the server works the fill values out with the nodes' answers
    (the real FlowerServer and ClientApp, carried by the loopback Grid). The fill values are the pooled
    present values' statistic computed here with numpy, and the run's metrics lines are the embedded run's on
    the same folder, byte for byte."""
    from fedhet.algorithms import build_strategy
    from fedhet.flower.client import make_client_app
    from fedhet.flower.server import FlowerServer
    from flower_loopback import LoopbackGrid, server_identity

    write_site_tables(tmp_path / "table")
    train = tmp_path / "table" / "train"
    alcohol = blank_cells(train / "alpha.csv", "alcohol", [0, 3])
    alcohol += blank_cells(train / "beta.csv", "alcohol", [])
    alcohol += blank_cells(train / "gamma.csv", "alcohol", [1], marker="n/a")
    malic = [
        v for site in ("alpha", "beta", "gamma") for v in blank_cells(train / f"{site}.csv", "malic_acid", [])
    ]
    blank_cells(tmp_path / "table" / "test.csv", "malic_acid", [2])
    cfg = ExperimentConfig()
    d = cfg.data
    d.dataset, d.path, d.split, d.clients = "csv", str(tmp_path / "table"), "sites", 3
    d.categorical_columns, d.impute, d.missing_indicator = ["grade"], strategy, True
    cfg.model.name, cfg.train.rounds, cfg.train.threads, cfg.eval.fairness = "tabular-mlp", 2, 1, False
    nodes = {
        101 + cid: (make_client_app(), {"client-id": cid, "data-path": str(train / f"{site}.csv")})
        for cid, site in enumerate(("alpha", "beta", "gamma"))
    }
    server = FlowerServer(
        cfg, build_strategy("fedavg", {}), LoopbackGrid(nodes), run_dir=tmp_path / "flower",
        connect_timeout=0, node_tables=True,
    )  # fmt: skip
    with server_identity(), caplog.at_level(logging.WARNING, logger="fedhet"):
        server.run()

    def expected(values: list[float]) -> float:  # the statistic of the pooled present float32 values
        v = np.asarray(values, dtype=np.float32).astype(np.float64)
        if strategy == "mean":
            return float(v.mean())
        if strategy == "median":
            return float(np.median(v))
        distinct, counts = np.unique(v, return_counts=True)
        return float(distinct[np.argmax(counts)])  # the smallest of the most frequent

    encoding = server.table_encoding
    assert set(encoding.fills) == {"alcohol", "malic_acid"} and encoding.indicators == ("alcohol",)
    assert encoding.fills["alcohol"] == pytest.approx(expected(alcohol), rel=1e-12)
    assert encoding.fills["malic_acid"] == pytest.approx(expected(malic), rel=1e-12)
    said = caplog.text
    assert "imputed column 'alcohol'" in said and "client 0 2, client 1 0, client 2 1; test rows 0" in said
    assert "alcohol=missing" in encoding.feature_names
    assert encoding.feature_names == build_federation(cfg, torch.device("cpu")).dataset.feature_names
    make_simulation(cfg, run_dir=tmp_path / "embedded").run()
    flower_lines = (tmp_path / "flower" / "metrics.jsonl").read_bytes()
    assert len(flower_lines.splitlines()) == 2  # two rounds
    assert flower_lines == (tmp_path / "embedded" / "metrics.jsonl").read_bytes()


def test_one_host_sh_warm_starts_fedhets_superexec_beside_each_node_on_its_port_and_pid(tmp_path):
    """``--warm`` (or FEDHET_WARM_NODES=1): each SuperNode with --isolation process and fedhet's warm
    SuperExec pointed at that node's runtime port and pid; without it, Flower's own nodes. A dry run: nothing
    starts."""
    (tmp_path / "sites").mkdir()
    (tmp_path / "sites" / "nodes.txt").write_text(
        "client-id=0 data-path='a.csv'\nclient-id=1 data-path='b.csv'\n"
    )
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("FEDHET_WARM_NODES", None)

    def dry(*args: str, **extra: str) -> list[list[str]]:
        out = subprocess.run(
            [str(APP / "one_host.sh"), "sites", "--port", "9300", "--dry-run", *args],
            cwd=tmp_path, env={**env, **extra}, capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        return [shlex.split(line) for line in out.splitlines()]

    warm = dry("--warm")
    assert dry(FEDHET_WARM_NODES="1") == warm
    python = str(BIN / "python")
    assert [c[0] for c in warm] == [
        "flower-superlink",
        "flower-supernode",
        python,
        "flower-supernode",
        python,
    ]
    for k, (node, superexec) in enumerate([warm[1:3], warm[3:5]]):
        assert node[node.index("--isolation") + 1] == "process"
        assert node[node.index("--port") + 1] == str(9310 + k)
        assert node[node.index("--node-config") + 1] == f"client-id={k} data-path='{'ab'[k]}.csv'"
        assert superexec[1:] == [
            "-m", "fedhet.flower.node_exec", "--insecure", "--runtime-api-address", f"127.0.0.1:{9310 + k}",
            "--parent-pid", f"NODE{k}_PID",
        ]  # fmt: skip
    cold = dry()
    assert [c[0] for c in cold] == ["flower-superlink", "flower-supernode", "flower-supernode"]
    assert not any("--isolation" in c for c in cold)
    assert not (tmp_path / "one-host").exists()  # a dry run writes nothing
