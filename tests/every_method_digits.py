"""Run every registered method for 2 rounds on digits with a ResNet-8 (width 4; FedRAC and FedSAC, which
need submodel masks, with their mlp200), and a few variants of FedAvg (attacks, robust rules, a non-IID
split), in this one process.

Used by the tests in a subprocess (tests/conftest.py, ``every_method_run``), so that a native crash (heap
corruption, a bus error) fails with the method it happened in, instead of killing the test run. A method may
refuse the setting with a FedhetError (a clean error is not a crash); anything else is printed and exits 1.

Each finished case prints ``done NAME {json}``: its results stamp and what its numbers are (final loss,
accuracy, contributions, and sums over every tensor of the last checkpoint): the golden runs that
tests/test_results_versions.py compares with tests/golden/results.json. ``--write FILE`` records them there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from fedhet.algorithms import method_names, strategy_class
from fedhet.code_version import results_stamp
from fedhet.config import ExperimentConfig
from fedhet.errors import FedhetError
from fedhet.experiment import run_experiment

FSSL = {
    "fedavg-labeled",
    "fedavg-full",
    "fedprox-labeled",
    "fedprox-fixmatch",
    "fixmatch-lpl",
    "fixmatch-gpl",
}
FSSL |= {"sage", "proxyfl", "fedproto-fssl"}


def config(method: str, seed: int) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.seed = seed
    cfg.data.dataset = "digits"
    cfg.data.clients = 4
    cfg.data.validation_fraction = 0.2
    if method in FSSL:
        cfg.data.split = "labeled-unlabeled"
        cfg.data.split_params = {"labeled_per_class": 20}
    cfg.model.name = "resnet8"
    cfg.model.params = {"width": 4}
    cfg.train.rounds = 2
    cfg.train.local_steps = 2
    cfg.train.threads = 1
    cfg.method.name = method
    if method.startswith(("fedrac", "fedsac")):  # submodel masks: the MLP of FedRAC's paper
        cfg.model.name, cfg.model.params = "mlp200", {}
    return cfg


#: FedAvg variants whose numbers the shared core computes: attacks with the default guards, robust rules, a
#: non-IID split (case name -> overrides).
VARIANTS: dict[str, dict[str, object]] = {
    "fedavg+attacks": {"faults.clients": {"1": "sign-flip", "2": "alie", "3": "scale"}},
    "fedavg+median": {"aggregation.rule": "median"},
    "fedavg+krum": {"aggregation.rule": "multi-krum", "aggregation.num_nodes_to_select": 2},
    "fedavg+trimmed-mean": {"aggregation.rule": "trimmed-mean", "aggregation.beta": 0.25},
    "fedavg+centered-clipping": {"aggregation.rule": "centered-clipping"},
    "fedavg+dirichlet": {"data.split": "dirichlet-per-class", "data.split_params": {"alpha": 0.3}},
}


def golden_values(summary: dict, run_dir: Path) -> dict:
    """What a case computed: final loss and accuracy, contributions, and float64 sums over every tensor of the
    last checkpoint (models and client states; any change to the numbers moves them)."""
    last = sorted((run_dir / "checkpoints").glob("round_*"))[-1]
    tensors = [
        t.double() for t in load_file(str(last / "tensors.safetensors")).values() if t.is_floating_point()
    ]
    return {
        "loss": summary["final"].get("loss"),
        "accuracy": summary["final"].get("accuracy"),
        "contributions": summary.get("contributions"),
        "tensor_sum": float(sum(t.nan_to_num().sum() for t in tensors)),
        "tensor_abs_sum": float(sum(t.nan_to_num().abs().sum() for t in tensors)),
    }


#: The relative differences a golden comparison measures (tests/test_results_versions.py).
COMPARED = ("loss", "tensor_sum", "tensor_abs_sum", "contributions")


def relative_differences(a: dict, b: dict) -> dict[str, float]:
    """Per compared value, how far ``a`` is from ``b``: the loss relative to itself, the tensor sums relative
    to the absolute sum, contributions absolute (0 where both lack one)."""
    scale = abs(b["tensor_abs_sum"]) or 1.0
    contributions = [
        abs(x - y) for x, y in zip(a["contributions"] or [], b["contributions"] or [], strict=True)
    ]
    return {
        "loss": abs(a["loss"] - b["loss"]) / abs(b["loss"]) if b["loss"] else 0.0,
        "tensor_sum": abs(a["tensor_sum"] - b["tensor_sum"]) / scale,
        "tensor_abs_sum": abs(a["tensor_abs_sum"] - b["tensor_abs_sum"]) / scale,
        "contributions": max(contributions, default=0.0),
    }


def run_cases(chosen: list[str]) -> dict[str, dict]:
    cases = {m: (m, {}) for m in method_names()} | {name: ("fedavg", o) for name, o in VARIANTS.items()}
    golden = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in chosen or list(cases):
            method, overrides = cases[name]
            print(f"start {name}", flush=True)
            try:
                cfg = config(method, 0).copy(**overrides)
                summary = run_experiment(cfg, run_dir=f"{tmp}/{name}")
            except FedhetError as exc:
                print(f"refused {name}: {exc}", flush=True)
                continue
            values = {
                "stamp": results_stamp(strategy_class(method)),
                "experiment": cfg.run_fingerprint(),
                **golden_values(summary, Path(tmp, name)),
            }
            golden[name] = values
            print(f"done {name} {json.dumps(values)}", flush=True)
    return golden


def write_golden(path: Path, golden: dict[str, dict]) -> None:
    """Record the golden values with each case's kernel noise: the differences of the same cases run again
    under the default (no SIMD) kernels, from which the test takes its tolerances."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    again = subprocess.run(
        [sys.executable, __file__, *golden], capture_output=True, text=True, env=env, check=True
    )
    other = {ln.split(" ", 2)[1]: json.loads(ln.split(" ", 2)[2]) for ln in again.stdout.splitlines()
             if ln.startswith("done ")}  # fmt: skip
    for name, values in golden.items():
        values["kernel_noise"] = relative_differences(other[name], values)
    path.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")


def main() -> int:
    torch.set_num_threads(1)
    args = sys.argv[1:]
    write = Path(args.pop(args.index("--write") + 1)) if "--write" in args else None
    golden = run_cases([a for a in args if a != "--write"])
    if write is not None:
        write_golden(write, golden)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
