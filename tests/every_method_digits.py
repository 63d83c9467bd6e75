"""Run every registered method for 2 rounds on digits with a ResNet-8 (width 4; FedRAC and FedSAC, which
need submodel masks, with their mlp200), in this one process.

Used by tests/test_no_native_crash.py in a subprocess, so that a native crash (heap corruption, a bus
error) fails that test with the method it happened in, instead of killing the test run. A method may refuse
the setting with a FedhetError (a clean error is not a crash); anything else is printed and exits 1.
"""

from __future__ import annotations

import sys
import tempfile

import torch

from fedhet.algorithms import method_names
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


def main() -> int:
    torch.set_num_threads(1)
    methods = sys.argv[1:] or method_names()
    with tempfile.TemporaryDirectory() as tmp:
        for method in methods:
            print(f"start {method}", flush=True)
            try:
                summary = run_experiment(config(method, 0), run_dir=f"{tmp}/{method}")
                print(f"done {method} {summary['final'].get('accuracy')}", flush=True)
            except FedhetError as exc:
                print(f"refused {method}: {exc}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
