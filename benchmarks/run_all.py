"""`make bench`: run every benchmark, gather their JSON results and write docs/performance.md with a plot.

    python benchmarks/run_all.py                  # run all (about 10 minutes on 2 cores), write the page
    python benchmarks/run_all.py --only vectorized --only celm_probe   # rerun some, keep the others' results
    python benchmarks/run_all.py --render         # rewrite the page from the saved results, run nothing

Each benchmark runs as its own process with ``--json`` (its last output line is the result object of
benchmarks/common.py); the objects are saved to build/bench/<name>.json and the page is rendered from them,
with the machine described and the commit they were measured at. A GPU result is included when
benchmarks/gpu_check.sh has left build/gpu-check/gpu_round.json (or CUDA is present here, when it runs).
The page is generated: change the text in this script, not in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from common import attainment, target_met

from fedhet.code_version import commit
from fedhet.report.provenance import machine

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "build" / "bench"
GPU_RESULT = ROOT / "build" / "gpu-check" / "gpu_round.json"
PAGE = ROOT / "docs" / "performance.md"
PLOT = ROOT / "docs" / "figures" / "benchmark_targets.png"
SCALING_PLOT = "docs/figures/round_time_vs_clients.png"


@dataclass(frozen=True)
class Bench:
    name: str
    title: str
    args: tuple[str, ...]
    timeout_s: int
    about: str  # what it measures and why it matters (fixed text)
    cuda_only: bool = False

    @property
    def command(self) -> str:
        return " ".join(["python", *self.args])


BENCHES = (
    Bench(
        "engine_overhead",
        "Engine overhead against a bare PyTorch loop",
        ("benchmarks/engine_overhead.py", "--repeats", "5", "--json"),
        300,
        "One FedAvg round through the engine (instructions, replies, validation, guards, aggregation) "
        "against "
        "a plain loop that trains the same clients on the same batches with the same optimizer and averages "
        "by sample count; the resulting weights are compared too. Then the peak memory of a separate "
        "3-round run.",
    ),
    Bench(
        "vectorized",
        "Vectorized clients against the sequential engine",
        ("benchmarks/vectorized.py", "--clients", "10", "50", "200", "--repeats", "5", "--json"),
        300,
        '`engine.mode = "vectorized"` (src/fedhet/engine/vectorized.py) trains all clients of a round at '
        "once: their start weights are stacked on a group axis and each local step computes every client's "
        "gradient in one batched program, then takes a functional SGD step with `torch.optim.SGD`'s "
        "semantics (momentum, weight decay, Nesterov) and `clip_grad_norm_`'s clipping. The gradients come "
        "from one of two paths: a model that declares itself a plain ReLU stack (`relu_stack_layers()`, as "
        "fedhet's `mlp` does) takes their closed form, two batched products per layer "
        "(`relu_stack_step`), and with plain SGD (no momentum, weight decay or clipping) the step is taken "
        "inside the weight-gradient product (`baddbmm_`), so no gradient is materialised; any other model, "
        "and FedProx's proximal term, takes `torch.func.vmap` over `grad` of a functional loss. Every client "
        "takes exactly its own steps on its own batches, drawn from its own seeded generator in the "
        "sequential trainer's order; a short last batch is padded and masked out of the loss, and a client "
        "past its last step is masked out of the update. Rounds of more than 64 clients run in chunks of "
        "64.\n\n"
        "It honours the trainers of FedAvg (`SGDTrainer`, which CELM and Standalone use too), FedProx and "
        "FedRS (CELM(RS)) with SGD, any trainer that keeps one of their training loops (`fit`, `prepare`, "
        "`make_optimizer`, `batches`, `loss`; the own-model trainer of CFFL, IAFL, CGSV and ShapFed, whose "
        "step count, reply and kept model are its own), and FedRAC's and FedSAC's submodels of `mlp200`: "
        "each client's 0/1 mask multiplies its hidden activations in the closed form, so a masked unit's "
        "weights get exactly zero gradient, as in the sequential trainer. It refuses, naming the reason, "
        "other trainers (their "
        "hooks are not expressible there), Adam, BatchNorm models, masks on any other model or under the "
        "`vmap` path, and injected `[faults]`; "
        '`engine.mode = "auto"` then falls back to sequential and logs why (it picks vectorized for rounds '
        "of 8 or more clients). Equivalence is tested in CI (tests/test_vectorized.py), by both gradient "
        "paths: FedAvg with momentum, weight decay, Nesterov, clipping and unequal client sizes, FedAvg with "
        "clipping alone and with weight decay alone, FedProx, FedRS, CELM, FedRAC (clipped), FedSAC "
        "(momentum), CFFL and CGSV run 3 rounds in both modes; "
        "every weight must agree within 1e-5 and test accuracy within 0.5 points, and a 0.1 % change of one "
        "mode's learning rate must break that tolerance. The closed form is checked against autograd member "
        "by member (padding, an idle member, FedRS scales, submodel masks, the fused step). The "
        "`max_weight_gap` column "
        "below is the same comparison after one benchmark round. `speedup` is the engine as it runs this "
        "MLP (closed form, fused), `speedup_vmap` its general path.",
    ),
    Bench(
        "vectorized_scaling",
        "Round time against the client count",
        (
            "benchmarks/vectorized.py",
            "--scaling",
            "10",
            "50",
            "200",
            "1000",
            "--repeats",
            "3",
            "--plot",
            SCALING_PLOT,
            "--json",
        ),  # fmt: skip
        420,
        "Both modes at 10, 50, 200 and 1,000 clients of 60 samples (2 local steps each): the round time "
        "should grow linearly with the total work; the per-client constant is the slope of a least-squares "
        "line.",
    ),
    Bench(
        "engine_compare",
        "Embedded engine against Flower's simulation engine",
        (
            "benchmarks/engine_compare.py",
            "--rounds",
            "4",
            "--clients",
            "10,50",
            "--methods",
            "fedavg",
            "--one-step",
            "--json",
        ),
        600,
        "The same FedAvg work in fedhet's embedded engine and in Flower's simulation engine (Ray), each cell "
        "in its own process: the per-round time (rounds 2 onwards, the server's evaluation included in both),"
        " the start-up before round 1 (Ray's included for Flower) and the peak memory of the process tree. "
        "Flower runs one client per CPU with one thread each, so it may use both cores where the embedded "
        "engine uses one. The target (embedded at least 5x faster per round at 10 clients) is about "
        "Flower's per-round cost, so the cells are run twice: with one local epoch per client (the work of "
        "a real round) and with one local step (one batch: the same messages and evaluation, almost no "
        "training), where each engine's round time is its own per-round cost. "
        "`flower_over_embedded_round_one_step_N` is the ratio of those costs; "
        "`flower_training_share_N` is the part of Flower's one-epoch round left once its one-step round is "
        "taken out, the part no engine can save. `flower_split_*` splits each Flower round (medians, "
        "seconds) with the times the nodes report in their replies and the server's own: `nodes_s`, the "
        "nodes' handlers as they overlap on the workers (their summed time over the workers that ran them, "
        "one per CPU; `node_training_s` the training inside them); `flower_transport_s`, the rest of the "
        "exchange (Flower carrying the messages through its SuperLink state and Ray to the workers and back, "
        "including its two 0.1 s polling loops); `server_codec_s`, the server turning instructions into "
        "Flower records and replies back; `round_loop_s`, the round loop's own work (aggregation, "
        "evaluation).",
    ),
    Bench(
        "celm_probe",
        "CELM's probes",
        ("benchmarks/celm_probe.py", "--repeats", "3", "--json"),
        600,
        "CELM's logit-maximisation probes (all models and classes in one batch: closed-form input gradients "
        "for the MLP, and the generic vmap over stacked models) against the per-(client, class) loop, and "
        "against one FedAvg round of local training, on the maverick split with 10 clients. Ratios are of "
        "this process's CPU time, the stable measure on a shared machine.",
    ),
    Bench(
        "fedrac_candidates",
        "FedRAC's candidate evaluation",
        ("benchmarks/fedrac_candidates.py", "--rounds", "20", "--json"),
        600,
        "FedRAC scores K/step candidate submodels on the validation set every round. The batched evaluation "
        "(one pass sharing the nested prefixes) against the generic batched masked forward and the per-mask "
        "loop of the reference code; `samples_differing` is the largest accuracy difference in validation "
        "samples (different kernels may flip an argmax on a near-tie). `candidate_share` is the candidate "
        "evaluation's share of a FedRAC round.",
    ),
    Bench(
        "augment_speed",
        "FixMatch's augmentations, batched",
        ("benchmarks/augment_speed.py", "--repeats", "30", "--json"),
        300,
        "fedhet's batched weak view (flip + 4-px reflect crop) and strong view (weak + RandAugment(2, 10) "
        "with per-sample ops + Cutout 16) against FixMatch's per-image PIL augmentation, on a batch of 256 "
        "CIFAR-10 images (the shared JPEG tarball, else random images).",
    ),
    Bench(
        "fssl_step",
        "One local step of each semi-supervised method",
        ("benchmarks/fssl_step.py", "--dataset", "cifar10", "--width", "8", "--batch-size", "32", "--json"),
        600,
        "One client's local step through the engine's trainer (augmentations, the frozen global model, ICPL, "
        "...) for every FSSL method and the supervised baselines, relative to the labeled-only FedAvg step; "
        "and ProxyFL's server-side proxy tuning (GPT) per round. It sizes the CPU-scale configurations of "
        "configs/proxyfl/.",
    ),
    Bench(
        "compare_jobs",
        "Parallel cells: `fedhet compare --jobs 2`",
        ("benchmarks/compare_jobs.py", "--repeats", "1", "--json"),
        600,
        "The same 4-cell comparison with one worker and with two on this 2-core machine, at 15 and at 60 "
        "rounds per cell; both settings must give the same metrics. A straight line through the two round "
        "counts splits each setting's wall time into a fixed part (`fixed_s_jobs1`, `fixed_s_jobs2`: the "
        "process start, each spawned worker importing torch and fedhet and loading the data set, the "
        "figures every finished cell draws) and a per-round part; `jobs2_per_round_speedup` is the speed-up "
        "of the cells' steady state, the one a long comparison approaches, and the short comparison's "
        "speed-up falls below it by the fixed part.",
    ),
    Bench(
        "gpu_round",
        "GPU: CELM round against a bare loop, utilisation, ProxyFL client round",
        ("benchmarks/gpu_round.py", "--json"),
        300,
        "On a GPU (benchmarks/gpu_check.sh runs it with the CUDA tests): the CELM CIFAR-10 CNN round "
        "(configs/celm/cifar10-dir0.05.toml, probes included) against the same training and probes written "
        "as a bare PyTorch loop; a FedAvg round against the bare training alone; GPU utilisation during the"
        " rounds; host syncs per round; one ProxyFL ResNet-8 client round "
        "(configs/proxyfl/cifar10-alpha0.1.toml). A local step makes no host sync: tests/test_gpu.py counts"
        " them with `torch.cuda.set_sync_debug_mode` and checks that a round's count does not grow with its"
        " steps, for FedAvg, FedProx, FedRS, FixMatch-GPL, ProxyFL and FedProto. The training loss and the "
        "FSSL statistics are summed on the device, ProxyFL's class counts use `index_add_`, and what the CPU "
        "generators draw (batch permutations, augmentation parameters, so that a seed gives the same "
        "batches and views on every device) is copied through pinned memory without a sync "
        "(src/fedhet/devices.py); evaluation runs batched under `torch.inference_mode`; data and "
        "models stay on the device; CELM's probes and FedRAC's candidates run batched on the model's "
        "device; FedProto's prototype term weights its samples instead of selecting them by boolean masks "
        "and keeps its sums on the device until the reply; the vectorized engine maps its CPU-drawn batch "
        "positions to indices on the device. None of this has run on a GPU yet.",
        cuda_only=True,
    ),
    Bench(
        "fedrac_row",
        "A FedRAC table row: the reward evaluation",
        ("benchmarks/fedrac_row.py", "--rounds", "10", "--floor", "--json"),
        600,
        "One row of a FedRAC fairness table (fedrac-fairness-substitute, Fashion-MNIST DIR(3.0): 6 "
        "methods, 10 clients, mlp200, every round evaluated, the vectorized engine, one thread per cell) "
        "run cell by cell, each cell twice in alternating order: the own-model methods' reward models "
        "(FedAvg, CFFL, IAFL) evaluated one at a time, and stacked in one pass (`torch.func.vmap` over "
        "`functional_call`, `accuracies_of_states` in src/fedhet/engine/evaluation.py; FedRAC and FedSAC "
        "use their own batched masked pass in both). The full row (2,000 rounds x 3 seeds, summed "
        "compute) is extrapolated from the measured rounds (per cell: its fixed part plus its mean round "
        "time x 2,000). Where the time went at 94294f2 (cProfile over 100 rounds of one DIR(3.0) cell; "
        "`python -m cProfile -s cumtime -m fedhet run configs/fedrac/fashion-mnist-dir3.toml --rounds 100"
        " --set eval.every=1 --set engine.mode=vectorized --method M` profiles one): FedAvg 87 % "
        "evaluation (10 reward models and the global model on the 10,000 test images; almost all of it "
        "`linear`), 13 % training; CFFL 54 % evaluation, 29 % scoring each upload on the validation set, "
        "11 % training; FedRAC 41 % evaluation, 22 % candidate scoring, 24 % training. On CPU the "
        "evaluation is matrix products at the core's peak rate, so stacking saves no work and measured "
        "slower here: the default stacks on an accelerator only. `--floor` measures the least any "
        "implementation needs on this CPU: every floating-point operation of a round of each method, "
        "counted by torch's `FlopCounterMode` over 3 rounds (training, scoring, evaluation), times 2,000 "
        "rounds and 3 seeds, divided by the best rate of this core on the evaluation's largest matrix "
        "product (1,000 images x 784 -> 200, best of 400 timings); half of it is the wall time on 2 cores"
        " (`row_minutes_arithmetic_floor_2_cores`). Where that floor is above the 60-minute target, no "
        "CPU implementation of the protocol as specified (every reward model on the whole test set every "
        "round, float32) reaches the target on this machine.",
    ),
    Bench(
        "coalitions",
        "Exact Shapley: every coalition trained together",
        ("benchmarks/coalitions.py", "--json"),
        900,
        "`fedhet shapley` trains the model of every coalition of a federation (FedAvg, digits, "
        "Dirichlet(0.5) "
        "per class, the default MLP, 30 rounds). Together (src/fedhet/ground_truth/coalitions.py): each "
        "round, every (coalition, client) pair is one member of the vectorized engine's stacked SGD program, "
        "one client's members at a time, so a step's batch is one input of all of them and their first "
        "layer one matrix product; round 1 is trained once per client. Against one embedded run per "
        "coalition (`train.participants`, the engine's own path). The utilities of both are compared "
        "(`max_accuracy_difference`, a row of the table). `python benchmarks/coalitions.py --fashion-mnist` "
        "adds N = 8 on 12,000 Fashion-MNIST images with mlp200.",
    ),
    Bench(
        "flower_rounds",
        "Flower deployment rounds on loopback",
        ("benchmarks/flower_rounds.py", "--rounds", "5", "--json"),
        1200,
        "The one-host walkthrough of docs/flower.md (wine, three sites, FedAvg, tabular-mlp; each SuperNode "
        "reads its own CSV, `node-tables=true`) on a real deployment: one SuperLink and three SuperNodes on "
        "127.0.0.1, `flwr run`, against a minimal Flower app on the same nodes (benchmarks/flower_echo_app/: "
        "the ServerApp sends every node the model's weights as an ArrayRecord, the ClientApp returns them "
        "unchanged) and against the embedded engine on the same config. Twice: on nodes as Flower starts "
        "them (each SuperNode starts `flower-superexec`, which starts a new `flwr-clientapp` process for "
        "every message: it imports the app, torch and fedhet for fedhet's, answers and exits) and on warm "
        "nodes (`--isolation process` with `python -m fedhet.flower.node_exec` beside each node: every "
        "message is still answered in a process of its own, by Flower's own ClientApp code, forked from a "
        "process that imported torch and fedhet once). A round is timed by fedhet's round loop "
        "(`timings.jsonl`: train + eval, the exchange and the server's evaluation) and, for the minimal app, "
        "around its `send_and_receive`; medians over the rounds, start-up (nodes joining, the table reports, "
        "the describe exchange, the minimal app's first exchange) excluded. Flower 1.42's deployment moves "
        "in steps of its pollers (a SuperNode without a message asks again after 3 s, `send_and_receive` "
        "asks for replies every 3 s, the SuperExec looks for tasks every second), so no app's round is "
        "shorter than about 3 s. The target compares fedhet on warm nodes with the minimal app on Flower's "
        "own nodes; `fedhet_warm_over_minimal_warm_round` compares both on warm nodes. Every deployment "
        "run's metrics.jsonl must equal the embedded run's byte for byte (`identical`).",
    ),
    Bench(
        "estimator_cost",
        "What each contribution estimator costs",
        ("benchmarks/estimator_cost.py", "--repeats", "5", "--json"),
        600,
        "Every estimator of docs/results/contribution-estimators.md on two of its federations (digits: "
        "`contributions/digits-n6`, 6 clients, Dirichlet(1.0), mlp200, 30 rounds; diabetes: six sites by "
        "age band, tabular-mlp), timed as the work that gives it: a method's run for CELM, CGSV, ShapFed, "
        "IAFL, CFFL and FedRAC's and FedSAC's reputation (the standalone pre-pass taken from the cache); "
        "a FedAvg run with `eval.contribution_estimators` naming GTG-Shapley or the reconstruction "
        "Shapley; the standalone pre-pass (every client alone) for standalone accuracy; every coalition "
        "trained together (`fedhet shapley`) for exact Shapley, Banzhaf and leave-one-out. Sample share "
        "costs nothing. All in one process, one thread per run, interleaved (every entry once per pass, "
        "after an untimed warm-up pass); `cost_x_fedavg` is an entry's median over the passes divided by "
        "FedAvg's median on the same federation, the number to compare estimators by (the page's wall "
        "times were recorded at different commits and loads).",
    ),
    Bench(
        "flower_table",
        "Flower's simulation engine on a small table",
        ("benchmarks/flower_table.py", "--rounds", "20", "--json"),
        900,
        "The wine run of examples/flower-app/wine.toml (FedAvg, tabular-mlp, three sites) for 20 rounds on "
        "the embedded engine and on Flower's simulation engine (Ray, one virtual SuperNode per site, "
        "`run_flower_simulation`), and a minimal Flower app on the same simulation engine, nodes and rounds, "
        "in a process of its own (a ServerApp that waits for the nodes and sends each the model's weights, "
        "a ClientApp that sends them straight back: Flower's own floor). A round is timed by fedhet's round "
        "loop (`timings.jsonl`: train + eval) and, for the minimal app, around its `send_and_receive`; "
        "medians over the rounds. On the simulation engine no round is shorter than Flower's polling: the "
        "engine looks for new messages every 0.1 s and `send_and_receive` asks for replies every 0.1 s, so "
        "a round of a model this small costs about 0.1 s (0.2 s when the two polls fall out of step), "
        "several times the embedded engine's round; the run as a whole adds Ray's and the nodes' "
        "start-up (`flower_startup_s`: the run's wall time outside its rounds). "
        "`simulation_over_embedded_round` and `fedhet_over_minimal_flower_simulation_round` compare median "
        "rounds; the `_run` ratios compare whole runs, start-up included. Both fedhet runs' metrics.jsonl "
        "must be byte-identical (`identical`). The deployment's ratios are in *Flower deployment rounds on "
        "loopback*.",
    ),
)


# -- running -----------------------------------------------------------------------------------------------
def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def run_bench(bench: Bench) -> dict:
    """Run one benchmark; its result object, or a failure record with the end of its output."""
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "benchmarks")]),
    }
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, *bench.args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=bench.timeout_s,
        )
        out, rc = done.stdout, done.returncode
        tail = (done.stdout + done.stderr)[-2000:]
    except subprocess.TimeoutExpired as exc:
        out, rc, tail = "", None, f"timed out after {bench.timeout_s} s: {str(exc.stdout or '')[-1500:]}"
    seconds = time.perf_counter() - start
    lines = [s for s in out.strip().splitlines() if s.startswith("{")]
    if rc == 0 and lines:
        result = json.loads(lines[-1])
        result["printed"] = "\n".join(s for s in out.strip().splitlines() if not s.startswith("{"))
    else:
        result = {"benchmark": bench.name, "failed": True, "returncode": rc, "output_tail": tail}
    result["wall_s"] = seconds
    return result


# -- the page ----------------------------------------------------------------------------------------------
def fmt(value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.2e}"
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {fmt(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    return str(value)


def table(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    keys = list(dict.fromkeys(k for r in rows for k in r))
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(fmt(r.get(k, "")) for k in keys) + " |" for r in rows]
    return out


def summary_rows(results: dict[str, dict]) -> list[tuple[str, str, float, str, bool | None]]:
    """(benchmark, ratio name, value, target or '', met or None) for every measured ratio."""
    rows = []
    for bench in BENCHES:
        r = results.get(bench.name)
        if not r or r.get("failed"):
            continue
        for key, value in r["ratios"].items():
            target = r["targets"].get(key, "")
            rows.append((bench.name, key, value, target, target_met(value, target) if target else None))
    return rows


def plot(rows, path: Path) -> bool:
    """Bars of measured/target for every ratio with a numeric target (1 = the target, longer is better)."""
    bars = [(f"{b}: {k}", attainment(v, t), met) for b, k, v, t, met in rows if t and attainment(v, t)]
    if not bars:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.45 * len(bars) + 1.2), constrained_layout=True)
    labels, values = [b[0] for b in bars], [b[1] for b in bars]
    colors = ["tab:green" if b[2] else "tab:red" for b in bars]
    ax.barh(range(len(bars)), values, color=colors)
    ax.axvline(1.0, color="black", lw=1, ls="--")
    ax.set_yticks(range(len(bars)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("measured relative to target (1 = target met exactly; right of the line = met)")
    ax.set_title("fedhet benchmarks against their targets")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def render(results: dict[str, dict], info: dict[str, str], at: str, plot_path: Path | None) -> str:
    lines = [
        "# Performance",
        "",
        "<!-- Generated by `make bench` (benchmarks/run_all.py): edit that script, not this page. -->",
        "",
        "Speed and memory figures, each from a benchmark script that prints ratios measured in one run "
        "(timed "
        "tests would be flaky on shared machines). Every number on this page comes from the command printed "
        "in its section; `make bench` reruns them all and rewrites the page "
        f"(measured at commit {at}; on a shared VM: repeated runs of one benchmark vary by up to about ±25 "
        f"%).",
        "",
        "## Machine",
        "",
        "| " + " | ".join(info) + " |",
        "|" + "---|" * len(info),
        "| " + " | ".join(info.values()) + " |",
        "",
        "## Targets",
        "",
        "| benchmark | ratio | measured | target | met |",
        "|---|---|---|---|---|",
    ]
    srows = summary_rows(results)
    for b, k, v, t, met in srows:
        verdict = "" if met is None else ("yes" if met else "**missed**")
        lines.append(f"| {b} | `{k}` | {fmt(v)} | {t} | {verdict} |")
    missing = [b for b in BENCHES if b.name not in results or results[b.name].get("failed")]
    for b in missing:
        r = results.get(b.name)
        why = (
            "not run: needs CUDA (no GPU here; run benchmarks/gpu_check.sh on one)"
            if b.cuda_only and not r
            else f"**failed** (exit {r.get('returncode')})"
            if r
            else "not run"
        )
        lines.append(f"| {b.name} | | | | {why} |")
    if plot_path is not None:
        lines += ["", f"![benchmarks against their targets](figures/{plot_path.name})"]
    for i, b in enumerate(BENCHES, 1):
        r = results.get(b.name)
        lines += ["", f"## {i}. {b.title}", "", b.about, ""]
        lines += [
            f"Command: `{b.command}`" + (" (on a GPU; see benchmarks/gpu_check.sh)" if b.cuda_only else "")
        ]
        if not r:
            lines += [
                "",
                "Not measured on this machine" + (": no GPU was available." if b.cuda_only else "."),
            ]
            continue
        if r.get("failed"):
            lines += ["", f"**Failed** (exit {r.get('returncode')}); the end of its output:", "", "```"]
            lines += [r.get("output_tail", "").strip(), "```"]
            continue
        lines += [
            "",
            f"Setting: {r.get('settings', '')}. Peak memory of the process {fmt(r.get('peak_rss_mb'))} MiB; "
            f"the benchmark took {fmt(r.get('wall_s'))} s"
            + (f" (measured at {r['commit']})" if r.get("commit") else "")
            + ".",
            "",
        ]
        lines += table(r.get("rows", []))
        extras = {k: v for k, v in r.items() if k not in {"benchmark", "ratios", "targets", "peak_rss_mb",
                                                            "settings", "rows", "printed", "wall_s", "plot",
                                                            "commit"}}  # fmt: skip
        if extras:
            lines += ["", "Also measured: " + "; ".join(f"{k} = {fmt(v)}" for k, v in extras.items()) + "."]
        if r.get("plot"):
            lines += ["", f"![{b.title}]({Path(r['plot']).relative_to('docs')})"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", choices=[b.name for b in BENCHES], help="run only this one")
    ap.add_argument("--render", action="store_true", help="rewrite the page from build/bench/, run nothing")
    ap.add_argument("--page", default=str(PAGE), help="where to write the page (default docs/performance.md)")
    args = ap.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    here = commit(ROOT, ("src", "benchmarks"))  # the code measured; the page itself may be modified
    if not args.render:
        todo = [b for b in BENCHES if (not args.only or b.name in args.only)]
        started = time.perf_counter()
        for n, b in enumerate(todo, 1):
            if b.cuda_only and not cuda_available():
                print(f"[{n}/{len(todo)}] {b.name}: skipped (needs CUDA)", flush=True)
                continue
            print(f"[{n}/{len(todo)}] {b.name}: {b.command} (limit {b.timeout_s} s)", flush=True)
            result = run_bench(b)
            result["commit"] = here
            (RESULTS / f"{b.name}.json").write_text(json.dumps(result, indent=1))
            state = "FAILED" if result.get("failed") else "ok"
            print(
                f"    {state} in {result['wall_s']:.0f} s (total {time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    results = {}
    for b in BENCHES:
        path = RESULTS / f"{b.name}.json"
        if b.cuda_only and not path.is_file() and GPU_RESULT.is_file():
            path = GPU_RESULT
        if path.is_file():
            results[b.name] = json.loads(path.read_text())
    if not results:
        print("no results in build/bench/: run without --render first", file=sys.stderr)
        return 1
    srows = summary_rows(results)
    plot_path = PLOT if plot(srows, PLOT) else None
    page = Path(args.page)
    measured_at = ", ".join(sorted({str(r.get("commit", "unknown")) for r in results.values()}))
    page.write_text(render(results, machine(), measured_at, plot_path))
    print(f"wrote {page}" + (f" and {PLOT}" if plot_path else ""))
    for b, k, v, t, met in srows:
        print(f"  {b:20s} {k:40s} {v:9.3f}  {t:10s} {'' if met is None else ('met' if met else 'MISSED')}")
    return 1 if any(r.get("failed") for r in results.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
