"""Result parity across a refactor: tiny runs of every registered method, and a byte-level comparison.

    python tools/parity.py record OUT_DIR            # one tiny run per (method, scenario) via `fedhet run`
    python tools/parity.py compare BEFORE_DIR AFTER_DIR
    python tools/parity.py tree BEFORE_DIR AFTER_DIR [--rename NEW=OLD] [--unless KEY]

``record`` runs each registered method on a small real-data scenario (Fashion-MNIST subsets, 4 clients,
3 rounds, seed 0) through the command line, with a private standalone cache, so only the package's public
interface is used and the script runs unchanged before and after a redesign. ``compare`` checks that every
run's ``metrics.jsonl`` is byte-identical and lists the other files that differ (CSV/JSON artifacts;
``summary.json`` and ``timings.jsonl`` hold wall times and are compared without them). It exits 1 when a
``metrics.jsonl`` differs or is missing.

``tree`` compares two run trees of any depth (e.g. two ``fedhet robustness run`` outputs, before and after a
change that must not move the runs it does not act in): every finished run under AFTER (a folder with a
``metrics.jsonl`` and a ``summary.json``) against the run at the same relative path under BEFORE, a folder
named NEW read as OLD (``--rename``); runs whose lines hold KEY (``--unless clipped``: the change acted
there) are counted apart. Files that are not byte-identical are compared on the keys both lines hold, and
said so (a run made alone records no fairness where the same run beside reward methods does). It exits 1
when a run differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

SUPERVISED = (
    "fedavg",
    "standalone",
    "celm",
    "celm-rs",
    "fedrs",
    "fedprox",
    "cffl",
    "cgsv",
    "shapfed",
    "iafl",
)
SUBMODEL = ("fedrac", "fedrac-fixed-ratio", "fedrac-random-masks", "fedsac")
SEMI_SUPERVISED = (
    "fedavg-labeled",
    "fedprox-labeled",
    "fedavg-full",
    "fixmatch-lpl",
    "fixmatch-gpl",
    "fedprox-fixmatch",
    "sage",
    "proxyfl",
    "fedproto-fssl",
)


def supervised(method: str, **params: Any) -> dict[str, Any]:
    return {
        "seed": 0,
        "data": {
            "dataset": "fashion-mnist",
            "split": "dirichlet-per-client",
            "split_params": {"alpha": 0.5},
            "clients": 4,
            "validation_fraction": 0.1,
            "max_train_samples": 2000,
            "max_test_samples": 400,
        },
        "model": {"name": "mlp", "params": {}},
        "train": {"rounds": 3, "local_steps": 4, "batch_size": 32, "lr": 0.05, "momentum": 0.5},
        "method": {"name": method, "params": params},
        "eval": {"every": 1, "checkpoint_every": 1},
    }


def submodel(method: str, **params: Any) -> dict[str, Any]:
    return {
        "seed": 0,
        "data": {
            "dataset": "fashion-mnist",
            "split": "cla",
            "split_params": {"samples_per_client": 200},
            "clients": 4,
            "validation_fraction": 0.1,
            "max_train_samples": 3000,
            "max_test_samples": 400,
        },
        "model": {"name": "mlp200", "params": {"hidden_size": 24}},
        "train": {"rounds": 3, "local_steps": 3, "batch_size": 32, "lr": 0.03, "grad_clip": 1.0},
        "method": {"name": method, "params": params},
        "eval": {"every": 1, "checkpoint_every": 1},
    }


def semi_supervised(method: str, **params: Any) -> dict[str, Any]:
    base = {} if method in ("fedavg-labeled", "fedprox-labeled", "fedavg-full") else {"threshold": 0.5}
    if method == "proxyfl":
        base["gpt_epochs"] = 3
    return {
        "seed": 0,
        "data": {
            "dataset": "fashion-mnist",
            "split": "labeled-unlabeled",
            "split_params": {"labeled_per_class": 20, "alpha": 0.5},
            "clients": 4,
            "max_train_samples": 2000,
            "max_test_samples": 300,
        },
        "model": {"name": "resnet8", "params": {"width": 4}},
        "train": {
            "rounds": 3,
            "clients_per_round": 2,
            "local_steps": 2,
            "batch_size": 8,
            "lr": 0.05,
            "momentum": 0.9,
            "weight_decay": 1e-4,
        },
        "method": {"name": method, "params": {**base, **params}},
        "eval": {"every": 1, "fairness": False, "rewards": False, "checkpoint_every": 1},
    }


def scenarios() -> dict[str, dict[str, Any]]:
    """name -> config dict; every registered method at least once, plus the options that change the path."""
    out: dict[str, dict[str, Any]] = {}
    for m in SUPERVISED:
        params = {"probe_steps": 20} if m.startswith("celm") else {}
        out[m] = supervised(m, **params)
    # partial participation and dropped clients, where own models, heads and pending rewards get tricky
    for m in ("fedavg", "standalone", "celm", "cffl", "cgsv", "shapfed", "iafl"):
        params = {"probe_steps": 20, "warmup_fraction": 0.67} if m == "celm" else {}
        cfg = supervised(m, **params)
        cfg["train"].update(clients_per_round=2, client_dropout=0.25)
        # Standalone never trains a client that is never sampled: no reference accuracies at this scale.
        cfg["eval"]["fairness"] = False
        out[f"{m}-partial"] = cfg
    out["iafl-standalone"] = supervised("iafl", contribution="standalone")
    out["celm-options"] = supervised("celm", probe_steps=20, per_class_baseline=True, probe_backbone="global")
    for m in SUBMODEL:
        out[m] = submodel(m)
    for m in SEMI_SUPERVISED:
        out[m] = semi_supervised(m)
    out["proxyfl-quirks"] = semi_supervised(
        "proxyfl", gpt_direction="code", shared_optimizer=True, inflated_labeled_weights=True
    )
    return out


def to_toml(cfg: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return repr(v)

    lines = [f"seed = {cfg['seed']}"]
    for section in ("data", "model", "train", "method", "eval"):
        lines.append(f"[{section}]")
        lines += [f"{k} = {value(v)}" for k, v in cfg[section].items()]
    return "\n".join(lines) + "\n"


def record(out: Path, only: list[str] | None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    fedhet = Path(sys.executable).with_name("fedhet")
    env = {**os.environ, "FEDHET_CACHE": tempfile.mkdtemp(prefix="fedhet-parity-cache-")}
    failed = []
    for name, cfg in scenarios().items():
        if only and name not in only:
            continue
        run_dir = out / name
        config = out / f"{name}.toml"
        config.write_text(to_toml(cfg))
        cmd = [str(fedhet), "run", str(config), "--out", str(run_dir), "--quiet", "--json"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        status = "ok" if done.returncode == 0 else f"FAILED ({done.returncode})"
        print(f"{name:24s} {status}", flush=True)
        if done.returncode:
            failed.append(name)
            print(done.stderr[-2000:], file=sys.stderr)
    return 1 if failed else 0


#: Files whose content holds wall-clock times: compared with those fields removed.
TIMED = {
    "summary.json": ("wall_time_s", "run_dir"),
    "fairness_summary.json": ("candidate_eval_seconds_mean",),
}


def _content(path: Path) -> bytes:
    if path.name in TIMED:
        data = json.loads(path.read_text())
        for key in TIMED[path.name]:
            data.pop(key, None)
        return json.dumps(data, sort_keys=True).encode()
    return path.read_bytes()


def compare(before: Path, after: Path) -> int:
    runs = sorted(p for p in before.iterdir() if p.is_dir())
    bad = 0
    print(f"{'run':24s} metrics.jsonl  other files that differ")
    for run in runs:
        other = after / run.name
        mine, theirs = run / "metrics.jsonl", other / "metrics.jsonl"
        if not theirs.is_file():
            verdict = "MISSING"
        else:
            verdict = "identical" if mine.read_bytes() == theirs.read_bytes() else "DIFFERS"
        bad += verdict != "identical"
        diffs = []
        names = {p.relative_to(run) for p in run.rglob("*") if p.is_file()}
        names |= {p.relative_to(other) for p in other.rglob("*") if p.is_file()} if other.is_dir() else set()
        for rel in sorted(names, key=str):
            if (
                rel.name in ("metrics.jsonl", "timings.jsonl")
                or rel.suffix == ".png"
                or "checkpoints" in rel.parts
            ):
                continue
            a, b = run / rel, other / rel
            if not a.is_file():
                diffs.append(f"+{rel}")
            elif not b.is_file():
                diffs.append(f"-{rel}")
            elif _content(a) != _content(b):
                diffs.append(str(rel))
        print(f"{run.name:24s} {verdict:14s} {', '.join(diffs) or '-'}")
    print(f"\n{len(runs) - bad}/{len(runs)} metrics.jsonl byte-identical")
    return 1 if bad else 0


def _shared_keys_differ(a: Path, b: Path) -> bool:
    """Whether two metrics.jsonl files differ in their rounds or in a value of a key both lines hold (a run
    compared alone records no fairness where the same run inside a comparison with reward methods does)."""
    left, right = a.read_text().splitlines(), b.read_text().splitlines()
    if len(left) != len(right):
        return True
    for x, y in zip(map(json.loads, left), map(json.loads, right), strict=True):
        if any(x[k] != y[k] for k in x.keys() & y.keys()):
            return True
    return False


def compare_trees(before: Path, after: Path, renames: dict[str, str], unless: str | None) -> int:
    counts = {"identical": 0, "DIFFERS": 0, "no counterpart": 0, f"holds {unless!r}": 0}
    differing = []
    for mine in sorted(after.rglob("metrics.jsonl")):
        if not (mine.parent / "summary.json").is_file():
            continue  # not finished (or still running)
        rel = mine.parent.relative_to(after)
        theirs = before.joinpath(*(renames.get(part, part) for part in rel.parts)) / "metrics.jsonl"
        if unless and any(unless in json.loads(line) for line in mine.read_text().splitlines()):
            verdict = f"holds {unless!r}"
        elif not theirs.is_file():
            verdict = "no counterpart"
        elif mine.read_bytes() == theirs.read_bytes():
            verdict = "identical"
        else:
            verdict = "DIFFERS" if _shared_keys_differ(mine, theirs) else "identical on the keys both record"
        counts[verdict] = counts.get(verdict, 0) + 1
        if verdict == "DIFFERS":
            differing.append(str(rel))
    print("; ".join(f"{verdict}: {n}" for verdict, n in counts.items() if n or verdict != f"holds {None!r}"))
    for rel in differing:
        print(f"  differs: {rel}")
    return 1 if differing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run the tiny scenarios into OUT_DIR")
    rec.add_argument("out", type=Path)
    rec.add_argument("--only", help="comma-separated scenario names")
    cmp_ = sub.add_parser("compare", help="compare two recorded trees")
    cmp_.add_argument("before", type=Path)
    cmp_.add_argument("after", type=Path)
    tree = sub.add_parser("tree", help="compare two run trees of any depth, run by run")
    tree.add_argument("before", type=Path)
    tree.add_argument("after", type=Path)
    tree.add_argument("--rename", action="append", default=[], help="NEW=OLD: a folder of AFTER named NEW")
    tree.add_argument("--unless", help="count apart the runs of AFTER whose metrics lines hold this key")
    args = parser.parse_args(argv)
    if args.command == "tree":
        renames = dict(pair.split("=", 1) for pair in args.rename)
        return compare_trees(args.before, args.after, renames, args.unless)
    if args.command == "record":
        return record(args.out, args.only.split(",") if args.only else None)
    return compare(args.before, args.after)


if __name__ == "__main__":
    raise SystemExit(main())
