"""Data-free FedRAC against the paper's FedRAC on Fashion-MNIST CLA, POW and DIR(7.0)
(docs/data-free-fairness.md).

``run`` compares, per setting, FedRAC (standalone contributions, validation scores) and
``fedrac-data-free`` (CELM-evidence reputations, probe scores) for the configs' rounds (CLA 1,000 as in
docs/fedrac.md; POW and DIR(7.0) 2,000); then the one-sided ablations (CLA both, POW and DIR(7.0) the probe
score with standalone contributions); then, per setting, one timed standalone run (seed 0): the pre-pass
the paper's FedRAC needs before its first round.

``table`` gives fairness (100 × Pearson of the final reward accuracies with the standalone accuracies,
which only the evaluation computes) best over the evaluated rounds, final, and the mean of the last 100
rounds; maximum accuracy; BCF rate; the reputation's Pearson with the standalone accuracies; wall time per
run. Mean ± std over seeds.

``calibrate CHECKPOINT...`` loads FedRAC global models from run checkpoints
(``.../checkpoints/round_NNNNN``) and, over the nested least-used-first candidates of step 8, compares the
probe score of each setting below with the real relative accuracy (test accuracy ÷ the full model's, on
5,000 test images): Pearson and mean absolute error. The default score settings were chosen this way on the
CLA seed-0 checkpoints (docs/data-free-fairness.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.engine.rundir import RECORDS_FILE, finished_runs, is_finished, read_summary
from fedhet.studies.base import CompareCell, Study

#: setting -> (shipped experiment, overrides)
SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {
    "cla": ("fedrac/fashion-mnist-cla", {"train.rounds": 1000}),
    "pow": ("fedrac/fashion-mnist-pow", {}),
    "dir7": ("fedrac/fashion-mnist-dir7", {}),
}
LABELS = {"cla": "CLA", "pow": "POW", "dir7": "DIR(7.0)"}
#: The one-sided ablations: directory -> (setting, the parameter set back to the paper's).
ABLATIONS = {
    "cla-celm-only": ("cla", "fedrac-data-free.candidate_score=validation"),
    "cla-probe-only": ("cla", "fedrac-data-free.contributions=standalone"),
    "pow-probe-only": ("pow", "fedrac-data-free.contributions=standalone"),
    "dir7-probe-only": ("dir7", "fedrac-data-free.contributions=standalone"),
}
METHODS = {"fedrac": "FedRAC (standalone + validation)", "fedrac-data-free": "FedRAC, data-free"}


def cells() -> list[CompareCell]:
    out = [
        CompareCell(name, config, ("fedrac", "fedrac-data-free"), sets)
        for name, (config, sets) in SETTINGS.items()
    ]
    for name, (setting, param) in ABLATIONS.items():
        config, sets = SETTINGS[setting]
        method, assignment = param.split(".", 1)
        key, value = assignment.split("=", 1)
        out.append(CompareCell(name, config, (method,), sets, {method: {key: value}}))
    return out


def standalone_timings(out: Path, echo: Callable[[str], None]) -> None:
    """One timed standalone run (seed 0) per setting: the paper's FedRAC's pre-pass."""
    from fedhet.api import run

    for name, (config, sets) in SETTINGS.items():
        target = out / "standalone" / name
        if is_finished(target):
            continue
        echo(f"standalone/{name}: {config} standalone seed 0 (timed)")
        started = time.perf_counter()
        run(config, overrides={**sets, "method.name": "standalone", "seed": 0}, out=target, overwrite=True)
        (target / "elapsed.json").write_text(json.dumps({"seconds": time.perf_counter() - started}))


def _summaries(directory: Path, method: str) -> list[dict]:
    """Each run's summary.json, with its fairness_summary.json (best / final / last-100 means) as "window"."""
    out = []
    for run in finished_runs(directory, method):
        summary = read_summary(run)
        summary["window"] = json.loads((run / "fairness_summary.json").read_text())
        out.append(summary)
    return out


def _cell(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    v = np.asarray([x for x in values if x is not None], dtype=np.float64) * scale
    if v.size == 0:
        return "—"
    return f"{v.mean():.{digits}f} ± {v.std():.{digits}f}"


def _row(label: str, runs: list[dict]) -> str:
    pick = lambda view, key: [r[view].get(key) for r in runs]  # noqa: E731
    cells = [
        _cell(pick("best", "fairness_pearson")),
        _cell(pick("final", "fairness_pearson")),
        _cell([r["window"]["fairness_pearson"]["last100_mean"] for r in runs]),
        _cell(pick("best", "accuracy"), scale=100.0),
        _cell(pick("final", "bcf_rate")),
        _cell(pick("final", "contribution_fairness_pearson"))
        if runs[0]["contributions"]
        else "(c = standalone)",
        _cell([r["window"]["candidate_eval_seconds_mean"] * 1000 for r in runs], digits=0),
        _cell([r["wall_time_s"] / 60 for r in runs], digits=1),
    ]
    return f"| {label} | " + " | ".join(cells) + f" | {len(runs)} |"


def table(dirs: list[Path], options: Mapping[str, Any]) -> str:
    out, lines = dirs[0], []
    head = (
        "| method | fairness best | fairness final | fairness last 100 | max accuracy % | BCF rate final "
        "| reputation ρ vs standalone | candidates ms / round | wall min / run | seeds |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    for name in SETTINGS:
        if not (out / name).is_dir():
            continue
        lines += ["", f"**{LABELS[name]}**", "", head]
        for method, label in METHODS.items():
            runs = _summaries(out / name, method)
            if runs:
                lines.append(_row(label, runs))
        for ablation, (setting, param) in ABLATIONS.items():
            runs = _summaries(out / ablation, "fedrac-data-free") if setting == name else []
            if runs:
                lines.append(_row(f"data-free with `{param.split('.', 1)[1]}`", runs))
        weights = _weights_pearson(out / name)
        if weights:
            lines.append(
                f"\nReputation from CELM's weights instead of the coverage (recomputed from the recorded "
                f'evidence, `reputation = "weights"`): Pearson with the standalone accuracies '
                f"{_cell(weights, scale=100.0)}."
            )
        elapsed = out / "standalone" / name / "elapsed.json"
        if elapsed.is_file():
            seconds = json.loads(elapsed.read_text())["seconds"]
            lines.append(f"\nStandalone pre-pass (seed 0, the paper's FedRAC only): {seconds / 60:.1f} min.")
    return "\n".join(lines)


def _weights_pearson(directory: Path) -> list[float]:
    """Per data-free run: Pearson of CELM's own weights c (the EMA of the recorded per-round c̄, β = 0.5 from
    c⁰ = 1/N, every client present) with the standalone accuracies."""
    out = []
    for run in _summaries(directory, "fedrac-data-free"):
        record = json.loads((Path(run["run_dir"]) / RECORDS_FILE).read_text())["submodel"]
        scores = [np.asarray(e["scores"], dtype=np.float64) for e in record.get("evidence", [])]
        if not scores:
            continue
        c = np.full(scores[0].shape, 1.0 / scores[0].size)
        for c_bar in scores:
            c = 0.5 * c + 0.5 * c_bar
        out.append(float(np.corrcoef(c, run["standalone"])[0, 1]))
    return out


def figure(dirs: list[Path], png: Path, options: Mapping[str, Any]) -> Path:
    """Reward against standalone accuracy, every client of every seed, per setting."""
    from fedhet.report.figures import new_figure, save_figure

    out = dirs[0]
    names = [n for n in SETTINGS if (out / n).is_dir()]
    fig = new_figure(4.2 * max(1, len(names)), 3.8)
    axes = fig.subplots(1, max(1, len(names)), squeeze=False)
    for ax, name in zip(axes[0], names, strict=False):
        for method, marker in (("fedrac", "o"), ("fedrac-data-free", "x")):
            for k, run in enumerate(_summaries(out / name, method)):
                ax.scatter(
                    np.asarray(run["standalone"]) * 100,
                    np.asarray(run["rewards"]) * 100,
                    marker=marker,
                    color=f"C{0 if method == 'fedrac' else 1}",
                    alpha=0.8,
                    label=METHODS[method] if k == 0 else None,
                )
        ax.set_title(f"Fashion-MNIST {LABELS[name]}")
        ax.set_xlabel("standalone accuracy, % (evaluation only)")
        ax.set_ylabel("final reward accuracy, %")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return save_figure(fig, png)


#: Probe-score settings ``calibrate`` compares: label -> grow_class_inputs arguments.
SCORE_SETTINGS = {
    "lr 0.05, iterates 1,2,3,5,8": {"depths": (1, 2, 3, 5, 8), "lr": 0.05},
    "lr 0.2, iterates 1,2,3,5,8": {"depths": (1, 2, 3, 5, 8), "lr": 0.2},
    "lr 0.2, iterates 1-8 (default)": {"depths": tuple(range(1, 9)), "lr": 0.2},
    "lr 0.5, iterates 1,2,3,5,8": {"depths": (1, 2, 3, 5, 8), "lr": 0.5},
}


def calibrate(checkpoints: list[Path], options: Mapping[str, Any]) -> str:
    import torch
    from safetensors.torch import load_file

    from fedhet.algorithms.allocation import candidate_sizes, masked_accuracies, relative_scores
    from fedhet.algorithms.logit_probes import grow_class_inputs
    from fedhet.data.datasets import load_dataset
    from fedhet.models import build_model
    from fedhet.models.masks import nested_prefix_masks

    torch.set_num_threads(1)
    ds = load_dataset("fashion-mnist")
    x_test, y_test = ds.normalize(ds.test_x[:5000]), ds.test_y[:5000]
    if not checkpoints:
        raise ValueError("calibrate needs checkpoint directories, e.g. RUN/checkpoints/round_01000")
    lines = [
        "| checkpoint | full model accuracy | score setting | Pearson with real | mean abs. error |",
        "|---|---|---|---|---|",
    ]
    for checkpoint in checkpoints:
        tensors = load_file(checkpoint / "tensors.safetensors")
        prefix = "/strategy/model/"
        model = build_model("mlp200", ds.input_shape, ds.num_classes)
        model.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
        order = torch.argsort(tensors["/strategy/frequency"], stable=True)
        masks = nested_prefix_masks(order, candidate_sizes(model.maskable_units, 8), model.maskable_units)
        real = masked_accuracies(model, x_test, y_test, masks)
        relative = real / real[-1]
        for label, kwargs in SCORE_SETTINGS.items():
            gen = torch.Generator().manual_seed(5)
            gx, gy = grow_class_inputs(
                model, ds.input_shape, ds.num_classes, per_class=20, generator=gen, **kwargs
            )
            score = relative_scores(masked_accuracies(model, gx, gy, masks))
            r = np.corrcoef(score, relative)[0, 1]
            error = np.abs(score - relative).mean()
            name = "/".join(checkpoint.parts[-4:])
            lines.append(f"| {name} | {real[-1] * 100:.2f} | {label} | {r:.3f} | {error:.3f} |")
    return "\n".join(lines)


STUDY = Study(
    name="data-free-fairness",
    title="data-free FedRAC (CELM evidence, probe scores) against the paper's FedRAC on Fashion-MNIST",
    page="docs/data-free-fairness.md",
    default_out="runs/data-free",
    cells=cells,
    after_cells=standalone_timings,
    table=table,
    figure=figure,
    default_figure="docs/figures/data_free_fairness.png",
    actions={"calibrate": calibrate},
)
