"""Each site's data for a deployment, from a config's split: what ``fedhet partition CONFIG --export-sites
DIR`` writes.

For every client i it writes exactly the rows the embedded engine gives client i under the config, its seed
and its split (same rows, same order), in the form a deployment node reads:

- images: ``DIR/site-<i>/data.npz`` (``x_train`` as the data set holds them, ``y_train``, ``classes``); the
  node takes ``--node-config "client-id=<i> data-dir='DIR/site-<i>'"``;
- a table: the site's rows of the source table, columns as they are (``DIR/<site>/train.csv``, or
  ``.parquet`` for a Parquet source, ``<site>`` the site's name for a table split by its sites, else
  ``site-<i>``); the node takes ``--node-config "client-id=<i> data-path='DIR/<site>/train.csv'"`` and the
  run is started with ``node-tables=true``. The server evaluates on its own test table:
  ``DIR/server/test.<ext>`` holds it for a csv / parquet source (set ``data.test_path`` to it).

``DIR/nodes.txt`` lists each node's ``--node-config`` value, one line per client (``one_host.sh`` reads it),
and ``DIR/README.md`` the ``flower-supernode`` commands to start.
"""

from __future__ import annotations

import csv
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedhet.config import ExperimentConfig
from fedhet.errors import ConfigError

NODES_FILE = "nodes.txt"


@dataclass(frozen=True)
class ExportedSite:
    """One exported site: its client id, its folder, the rows written and the node's ``--node-config``."""

    cid: int
    folder: Path
    rows: int
    node_config: str


def raw_table_columns(
    cfg: ExperimentConfig,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None, str]:
    """The config's table as raw (train, test) columns, train rows in the order the embedded engine encodes
    them, and the file format to write ("csv" or "parquet")."""
    from fedhet.data.datasets import site_tables
    from fedhet.data.datasets.tables import DEFAULT_TEST_FRACTION

    d = cfg.data
    if d.dataset in site_tables.SKLEARN_TABLES:
        train, _ = site_tables.sklearn_table_columns(d.dataset)
        return train, None, "csv"
    if d.dataset in ("csv", "parquet") and d.path is not None:
        train, test = site_tables.table_file_columns(
            d.path, label=d.label_column, test_path=d.test_path, test_fraction=DEFAULT_TEST_FRACTION
        )
        if test is None:  # the held-out test rows: what the server evaluates on
            _, test = _held_out(d.path, d.label_column)
        return train, test, d.dataset
    raise ConfigError(
        f"--export-sites: the table {d.dataset!r} is not read from files here (a data set registered in "
        "memory); export its rows yourself, one CSV per site with the same columns"
    )


def _held_out(path: str, label: str) -> tuple[Any, Any]:
    from fedhet.data.datasets import site_tables
    from fedhet.data.datasets.tables import DEFAULT_TEST_FRACTION, _held_out_test

    return _held_out_test(
        site_tables.read_table_file(path), label, DEFAULT_TEST_FRACTION, str(Path(path).resolve())
    )


def _write_table(columns: dict[str, np.ndarray], rows: np.ndarray, path: Path, kind: str) -> None:
    names = [c for c in columns if c != "__client__"]  # a folder's site files name no client column
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({c: list(np.asarray(columns[c])[rows]) for c in names}), path)
        return

    def cell(v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, (float, np.floating)):
            return repr(float(v))  # the shortest text that reads back as the same float64
        return str(v)

    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(names)
        for r in rows:
            writer.writerow([cell(columns[c][r]) for c in names])


def export_sites(cfg: ExperimentConfig, out: str | os.PathLike, *, force: bool = False) -> list[ExportedSite]:
    """Write each client's data of ``cfg``'s split under ``out`` (see the module docstring)."""
    from fedhet.engine.simulation import build_federation

    root = Path(out).expanduser()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--export-sites {root}: a file is there; give a folder")
    if root.is_dir() and any(root.iterdir()):
        if not force:
            raise ConfigError(
                f"--export-sites {root}: the folder is not empty; give an empty or new folder, or add "
                "--force to replace an earlier export"
            )
        if not (root / NODES_FILE).is_file():  # --force replaces an export, never an arbitrary folder
            raise ConfigError(
                f"--export-sites {root}: the folder holds files but no {NODES_FILE}, so it is not an earlier "
                "export; --force replaces only an export: give an empty or new folder"
            )
        shutil.rmtree(root)
    fed = build_federation(cfg, torch.device("cpu"))
    if any(c.unlabeled_indices is not None for c in fed.clients):
        raise ConfigError(
            f"--export-sites: split {cfg.data.split!r} gives clients unlabeled rows, which a deployment "
            "node's data cannot hold yet; export a labeled split"
        )
    ds = fed.dataset
    root.mkdir(parents=True, exist_ok=True)
    sites: list[ExportedSite] = []
    if ds.is_table:
        train, test, kind = raw_table_columns(cfg)
        n_raw = len(next(iter(train.values())))
        if n_raw != len(ds.train_y):
            raise ConfigError(
                f"--export-sites: the table reads as {n_raw} training rows but the run encodes "
                f"{len(ds.train_y)}; report this"
            )
        by_site = cfg.data.split == "sites" and len(ds.sites) == len(fed.clients)
        for client in fed.clients:
            name = ds.sites[client.cid] if by_site else f"site-{client.cid}"
            folder = root / name
            folder.mkdir(parents=True)
            rows = client.indices.numpy()  # indices of the data set's training rows, in the client's order
            path = folder / f"train.{kind}"
            _write_table(train, rows, path, kind)
            sites.append(
                ExportedSite(
                    client.cid, folder, len(rows), f"client-id={client.cid} data-path='{path.resolve()}'"
                )
            )
        if test is not None:
            (root / "server").mkdir()
            _write_table(
                test, np.arange(len(next(iter(test.values())))), root / "server" / f"test.{kind}", kind
            )
    else:
        for client in fed.clients:
            folder = root / f"site-{client.cid}"
            folder.mkdir(parents=True)
            idx = client.indices.numpy()
            np.savez(
                folder / "data.npz",
                x_train=ds.train_x[idx].numpy(),
                y_train=ds.train_y[idx].numpy(),
                classes=np.array(ds.classes),
            )
            sites.append(
                ExportedSite(
                    client.cid, folder, len(idx), f"client-id={client.cid} data-dir='{folder.resolve()}'"
                )
            )
    (root / NODES_FILE).write_text("".join(f"{s.node_config}\n" for s in sites))
    (root / "README.md").write_text(readme(cfg, sites, ds.is_table, root))
    return sites


def readme(cfg: ExperimentConfig, sites: list[ExportedSite], table: bool, root: Path) -> str:
    """What the export holds and the commands that start its nodes."""
    lines = [
        f"# Sites of {cfg.data.dataset} · {cfg.data.split} · {cfg.data.clients} clients · seed {cfg.seed}",
        "",
        "Each folder holds exactly what client i trains on in the embedded engine under this config.",
        "Start one SuperNode per site, on the site's own machine (add `--port P` to run several on one host, "
        "and `--root-certificates ca.crt` for TLS instead of `--insecure`; docs/flower.md):",
        "",
        "```bash",
    ]
    for s in sites:
        lines.append(
            f'flower-supernode --superlink SUPERLINK:9092 --insecure --node-config "{s.node_config}"'
        )
    lines += ["```", ""]
    if table:
        lines.append(
            "The nodes read their own tables: submit the run with `node-tables=true` in `flwr run`'s "
            "`--run-config`."
        )
        if (root / "server").is_dir():
            lines.append(
                "The server evaluates on `server/` (its test table): set `data.test_path` to that file in "
                "the run's config."
            )
    return "\n".join(lines) + "\n"
