"""GPU rounds: the CELM CIFAR-10 CNN round against a bare PyTorch loop on the same device,
the GPU's utilisation during those rounds, host syncs per round, and one ProxyFL ResNet-8 client round.

    python benchmarks/gpu_round.py [--device auto] [--scale full|tiny] [--repeats 3] [--json]

``full`` is configs/celm/cifar10-dir0.05.toml (5 clients, 1 local epoch over all of CIFAR-10, the 5-layer CNN)
and configs/proxyfl/cifar10-alpha0.1.toml (ResNet-8 width 64, 5 local epochs). ``tiny`` cuts both to a few
hundred samples and steps so that the script can be tested on a CPU in a minute. CIFAR-10 must be found (the
shared tarball, ``--data-root`` or $FEDHET_DATA); nothing is downloaded.

Measured, alternately in one process (median of ``--repeats``, after one warm-up round each):
- a FedAvg round and a CELM round (its probes included: the first rounds are CELM's warm-up, when it probes),
  both with CELM's local training, against a bare loop that trains the same clients on the same batches with
  a plain ``torch.optim.SGD`` and averages by sample count. Target: CELM round / bare ≤ 1.10;
- GPU utilisation (``nvidia-smi`` sampled every 50 ms during the timed rounds; absent without it);
- host syncs of one FedAvg round and of one ProxyFL client round (``torch.cuda.set_sync_debug_mode``);
- the ProxyFL client-round time: one client's local update (augmentations, the frozen global model, ICPL).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import threading
import time
import warnings
from datetime import datetime
from pathlib import Path

import torch
from common import emit
from torch import nn

from fedhet.config import apply_override, load_config
from fedhet.engine.schedule import learning_rate, resolve_device
from fedhet.engine.seeds import derived_torch_generator
from fedhet.experiment import make_simulation

ROOT = Path(__file__).resolve().parents[1]
CELM = ROOT / "src" / "fedhet" / "configs" / "celm" / "cifar10-dir0.05.toml"
PROXYFL = ROOT / "src" / "fedhet" / "configs" / "proxyfl" / "cifar10-alpha0.1.toml"
TINY = {  # a CPU-sized cut of both configurations, to test this script
    "celm": {"data.max_train_samples": 500, "data.max_test_samples": 200, "method.params.probe_steps": 5},
    "proxyfl": {
        "data.max_train_samples": 2000,
        "data.max_test_samples": 200,
        "data.split_params.labeled_per_class": 10,
        "data.clients": 4,
        "train.clients_per_round": 1,
        "train.local_steps": 2,
        "train.batch_size": 8,
        "model.params.width": 4,
        "method.params.gpt_epochs": 1,
    },
}


def simulation(kind: str, device: str, scale: str, method: str | None = None, data_root: str | None = None):
    """The CELM or ProxyFL CIFAR-10 simulation (``kind``), set up, at the given scale on the given device."""
    cfg = load_config(CELM if kind == "celm" else PROXYFL)
    overrides: dict = {"train.device": device, "eval.every": 10_000}
    if method:  # another method on the same federation and local training (FedAvg: no parameters)
        overrides["method.name"] = method
        overrides["method.params"] = {} if method == "fedavg" else cfg.method.params
    for key, value in (TINY[kind] if scale == "tiny" else {}).items():  # after the method's parameters
        if method != "fedavg" or not key.startswith("method.params"):
            overrides[key] = value
    if data_root:
        overrides["data.root"] = data_root
    for key, value in overrides.items():
        apply_override(cfg, key, value)
    sim = make_simulation(cfg)
    sim.setup()
    return sim


def bare_round(sim, start: dict, rnd: int) -> dict:
    """The round's local training as a plain loop: same clients, batches, optimizer settings; then a
    sample-weighted average. No fedhet object on the hot path."""
    cfg, model = sim.cfg, sim.work_model
    lr, t = learning_rate(cfg, rnd), cfg.train
    states, sizes = [], []
    for data in sim.fed.clients:
        model.load_state_dict(start)
        model.train()
        opt = torch.optim.SGD(
            model.parameters(), lr=lr, momentum=t.momentum, weight_decay=t.weight_decay, nesterov=t.nesterov
        )
        g = derived_torch_generator(cfg.seed, "client", rnd, data.cid)
        n = data.indices.numel()
        perm = data.indices[torch.randperm(n, generator=g).to(data.indices.device)]
        for i in range(0, n, t.batch_size):
            idx = perm[i : i + t.batch_size]
            opt.zero_grad(set_to_none=True)
            x, y = data.inputs.index_select(0, idx), data.labels.index_select(0, idx)  # as the engine gathers
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        sizes.append(n)
    total = sum(sizes)
    return {k: sum(s[k] * (n / total) for s, n in zip(states, sizes, strict=True)) for k in states[0]}


def bare_probes(sim, states: list[dict]) -> torch.Tensor:
    """CELM's evidence written plainly: per model, Adam ascent on K inputs (one per class) maximising
    s_c(x) - λ‖x‖², the models one after another (CELM's own path batches them with vmap)."""
    strategy, model = sim.strategy.estimator, sim.work_model
    k, shape = sim.fed.num_classes, tuple(sim.fed.dataset.input_shape)
    out, cls = [], torch.arange(k, device=sim.fed.test_x.device)
    model.eval()
    for state in states:
        model.load_state_dict(state)
        x = (strategy.probe_init_scale * torch.randn(k, *shape, device=cls.device)).requires_grad_(True)
        opt = torch.optim.Adam([x], lr=strategy.probe_lr)
        for _ in range(strategy.probe_steps):
            opt.zero_grad(set_to_none=True)
            objective = model(x)[cls, cls] - strategy.probe_l2 * x.pow(2).flatten(1).sum(1)
            (-objective.sum()).backward()
            opt.step()
        with torch.no_grad():
            out.append(model(x)[cls, cls])
    model.train()
    return torch.stack(out)


class Utilisation:
    """GPU utilisation (%) from ``nvidia-smi`` every 50 ms, with its own timestamps, so that only samples
    taken inside the timed windows count (however the pipe buffers its lines). ``utilization.gpu`` is itself
    an average over the driver's last sampling period (1/6 s to 1 s), so samples repeat values."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self.windows: list[tuple[float, float]] = []
        self.proc = None
        if shutil.which("nvidia-smi") and torch.cuda.is_available():
            cmd = ["nvidia-smi", "--query-gpu=timestamp,utilization.gpu", "--format=csv,noheader,nounits",
                   "-lms", "50"]  # fmt: skip
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            stamp, _, value = line.strip().rpartition(",")
            try:
                when = datetime.strptime(stamp.strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
                self.samples.append((when, float(value)))
            except ValueError:
                continue

    def measure(self, fn):
        """``fn()``, its wall time recorded as a window whose samples count."""
        start = time.time()
        try:
            return fn()
        finally:
            self.windows.append((start, time.time()))

    def stop(self) -> float | None:
        if self.proc is not None:
            time.sleep(0.3)  # the last samples of the last window
            self.proc.terminate()
            self.proc.wait(timeout=10)
        inside = [u for t, u in self.samples if any(a <= t <= b for a, b in self.windows)]
        return statistics.mean(inside) if inside else None


def synced(fn):
    """Wall seconds of ``fn()``, waiting for the device before and after (kernels are asynchronous)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def count_syncs(fn) -> int | None:
    """Host syncs made by ``fn()`` (CUDA only; None on a CPU)."""
    if not torch.cuda.is_available():
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cuda or cpu")
    ap.add_argument("--scale", choices=("full", "tiny"), default="full")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data-root", help="a directory holding CIFAR-10 (else the shared copy, $FEDHET_DATA)")
    ap.add_argument("--json", action="store_true", help="end with the JSON result line")
    args = ap.parse_args()
    device = resolve_device(args.device)
    print(f"device {device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))

    sims = {m: simulation("celm", args.device, args.scale, m, args.data_root) for m in ("fedavg", "celm")}
    start = {k: v.clone() for k, v in sims["celm"].strategy.model.state_dict().items()}
    times: dict[str, list[float]] = {"fedavg": [], "celm": [], "bare": [], "bare_celm": []}
    probed = [start] * (sims["celm"].cfg.data.clients + 1)  # the clients' models and the previous global
    util = Utilisation()
    for rnd in range(1, args.repeats + 2):  # round 1 warms every path up and is not counted
        for name, sim in sims.items():
            seconds = util.measure(lambda s=sim, r=rnd: synced(lambda: s.train_round(r)))
            if rnd > 1:
                times[name].append(seconds)
        seconds = synced(lambda r=rnd: bare_round(sims["fedavg"], start, r))
        probe_seconds = synced(lambda: bare_probes(sims["celm"], probed))
        if rnd > 1:
            times["bare"].append(seconds)
            times["bare_celm"].append(seconds + probe_seconds)
    utilisation = util.stop()
    fedavg_syncs = count_syncs(lambda: sims["fedavg"].train_round(args.repeats + 2))
    med = {k: statistics.median(v) for k, v in times.items()}
    cfg = sims["celm"].cfg
    print(f"CELM CIFAR-10 ({cfg.data.clients} clients, {sum(sims['celm'].fed.sizes)} samples, cnn), "
          f"median of {args.repeats}:")  # fmt: skip
    labels = {
        "bare": "bare loop: training",
        "fedavg": "FedAvg round",
        "bare_celm": "bare loop: training + probes",
        "celm": "CELM round",
    }
    for name, label in labels.items():
        print(f"  {label:30s} {med[name]:8.3f} s")
    print(f"  RATIO CELM / bare = {med['celm'] / med['bare_celm']:.3f} (target <= 1.10); "
          f"FedAvg / bare = {med['fedavg'] / med['bare']:.3f}")  # fmt: skip
    print(
        "  GPU utilisation during the rounds: "
        + ("not measured (no nvidia-smi or no CUDA)" if utilisation is None else f"{utilisation:.0f}%")
    )
    print(f"  host syncs in one FedAvg round: {fedavg_syncs}")

    proxy = simulation("proxyfl", args.device, args.scale, None, args.data_root)
    trainer = proxy.transport.trainer
    fit, fit_times = trainer.fit, []

    def timed_fit(update):
        seconds_box = {}
        seconds_box["s"] = synced(lambda: seconds_box.setdefault("reply", fit(update)))
        fit_times.append(seconds_box["s"])
        return seconds_box["reply"]

    trainer.fit = timed_fit
    proxy.train_round(1)  # warm-up (and the frozen global model's first copy)
    fit_times.clear()
    for rnd in range(2, args.repeats + 2):
        proxy.train_round(rnd)
    proxy_syncs = count_syncs(lambda: proxy.train_round(args.repeats + 2))
    per_round = len(fit_times) // args.repeats
    client_s = statistics.median(fit_times)
    print(f"ProxyFL ResNet-8 (width {proxy.cfg.model.params.get('width')}): client round {client_s:.3f} s "
          f"(median of {len(fit_times)} client updates, {per_round} per round); host syncs in one round "
          f"{proxy_syncs}")  # fmt: skip
    if args.json:
        ratios = {
            "celm_round_over_bare": med["celm"] / med["bare_celm"],
            "fedavg_round_over_bare": med["fedavg"] / med["bare"],
        }
        emit(
            "gpu_round",
            ratios,
            {"celm_round_over_bare": "<= 1.10"},
            settings=f"{args.scale} scale on {device}: CELM {CELM.name} and ProxyFL {PROXYFL.name}, median "
            f"of {args.repeats} rounds after a warm-up round",
            rows=[
                {"what": "bare loop: training", "seconds": med["bare"]},
                {"what": "FedAvg round (CELM's training)", "seconds": med["fedavg"]},
                {"what": "bare loop: training + probes", "seconds": med["bare_celm"]},
                {"what": "CELM round (training + probes)", "seconds": med["celm"]},
                {"what": "ProxyFL client round", "seconds": client_s},
            ],
            device=str(device),
            gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            gpu_utilisation_percent=utilisation,
            host_syncs={"fedavg_round": fedavg_syncs, "proxyfl_round": proxy_syncs},
        )


if __name__ == "__main__":
    main()
