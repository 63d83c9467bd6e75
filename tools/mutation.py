"""Mutation testing of the formula modules (``make mutation``): run mutmut on the functions that hold the
methods' formulas, then print the kill rate per module and every surviving mutant.

    python tools/mutation.py              # run (resumes where a previous run stopped), then summarise
    python tools/mutation.py --summary    # summarise the results already in mutants/
    python tools/mutation.py --module celm --max-children 2

mutmut's settings (the files it copies and mutates, the test files it runs, fork-server isolation for torch)
are in pyproject.toml ``[tool.mutmut]``. The mutants of a function are run against the tests that call it
(mutmut records which, in a first pass over the selected test files). Results live in ``mutants/``
(git-ignored); ``mutmut show NAME`` prints one mutant's diff and ``mutmut apply NAME`` writes it into src/.

Plumbing (constructors validating options, state_dict, record writing) is left out on purpose: its
mutants are caught, if at all, by behaviour tests, and they would triple the run time without saying
anything about whether a formula is tested.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: module -> the functions (mutmut's names without the package prefix and mutant number) that are formulas.
FORMULAS: dict[str, list[str]] = {
    "algorithms.celm": [
        "x_warmup_rounds",
        "x_baseline_from_global",
        "x_debias",
        "x_class_shares",
        "x_client_scores",
        "x_to_simplex",
        "x_ema_contributions",
        "x_estimate_contributions",
        "xǁEvidenceContributionsǁprobe",
        "xǁEvidenceContributionsǁupdate",
    ],
    "algorithms.logit_probes": [
        "x_probe_noise",
        "x__ascent_gradient",
        "xǁAdamAscentǁ__init__",
        "xǁAdamAscentǁstep",
        "x_maximize_logits_batched",
        "x_stacked_relu_layers",
        "x_maximize_logits_mlp",
        "x_maximize_logits_loop",
        "x_maximize_class_logits",
        "x_grow_class_inputs",
    ],
    "algorithms.allocation": [
        "x_sharpen_contributions",
        "x_reputation_thresholds",
        "x_candidate_sizes",
        "x_allocate_sizes",
        "x_masked_average_update",
        "x_evidence_coverage",
        "x_relative_reputation",
        "x_relative_scores",
    ],
    "algorithms.submodel": [
        "xǁSubmodelStrategyǁallocate",
        "xǁSubmodelStrategyǁthreshold_base",
        "xǁSubmodelStrategyǁfix_reputation",
    ],
    "algorithms.fedrac": [
        "x_dynamic_ratio",
        "xǁFedRACǁthreshold_ratio",
        "xǁFedRACFixedRatioǁthreshold_ratio",
    ],
    "algorithms.proxyfl": [
        "x_indecisive_sets",
        "x_candidate_class_sets",
        "x_predicted_class_sets",
        "x_icpl_loss",
        "x_proxy_margin",
        "x_gpt_loss",
        "x_global_proxy_tuning",
        "x_update_class_prior",
        "xǁProxyFLTrainerǁextra_losses",
        "xǁProxyFLTrainerǁobserve",
        "xǁProxyFLǁ_class_counts",
    ],
    "engine.vectorized": [
        "x_relu_stack_names",
        "x_relu_stack_step",
    ],
    "metrics": [
        "x_confusion_matrix",
        "x_accuracy",
        "x_per_class_recall",
        "x_balanced_accuracy",
        "x_rare_class_recall",
        "x_classification_metrics",
        "x_fairness",
        "x_bcf_bounds",
        "x_bcf_rate",
        "x_bcf_rate_fedrac_code",
        "x_any_worse_than_standalone",
        "x_incentivized_participation_rate",
        "x_free_rider_report",
        "x_summarize_over_seeds",
        "x_best_final_lastk",
    ],
}
#: mutmut's exit codes (mutmut.stats.status_by_exit_code); anything else is "suspicious".
STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
}
STATUS.update({24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout", None: "not checked"})


def patterns(modules: list[str]) -> list[str]:
    return [f"fedhet.{m}.{f}__mutmut_*" for m in modules for f in FORMULAS[m]]


def results(modules: list[str]) -> dict[str, dict[str, str]]:
    """module -> {mutant name: status} for the formula functions, read from mutants/**/*.meta."""
    out: dict[str, dict[str, str]] = {}
    for m in modules:
        meta = ROOT / "mutants" / "src" / "fedhet" / (m.replace(".", "/") + ".py.meta")
        if not meta.is_file():
            continue
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        wanted = {f"fedhet.{m}.{f}" for f in FORMULAS[m]}
        out[m] = {
            name: STATUS.get(code, "suspicious")
            for name, code in codes.items()
            if re.sub(r"__mutmut_\d+$", "", name) in wanted
        }
    return out


def summarise(modules: list[str]) -> int:
    res = results(modules)
    if not res:
        print("no results in mutants/: run `make mutation` first", file=sys.stderr)
        return 1
    print("| module | mutants | killed | survived | timeout | no tests | not checked | kill rate |")
    print("|---|---|---|---|---|---|---|---|")
    survivors: list[str] = []
    for m, by_name in res.items():
        c = Counter(by_name.values())
        checked = c["killed"] + c["survived"] + c["timeout"] + c["suspicious"]
        # a timeout is a kill (the mutant made the tests hang); "no tests" are counted as survivors
        killed = c["killed"] + c["timeout"]
        rate = killed / (checked + c["no tests"]) if checked + c["no tests"] else float("nan")
        print(
            f"| {m} | {len(by_name)} | {c['killed']} | {c['survived']} | {c['timeout']} | {c['no tests']} | "
            f"{c['not checked']} | {100 * rate:.1f}% |"
        )
        survivors += sorted(n for n, s in by_name.items() if s in ("survived", "no tests", "suspicious"))
    if survivors:
        print(f"\n{len(survivors)} surviving mutants (`mutmut show NAME` for the diff):")
        for n in survivors:
            print(" ", n)
    return 0


def _module_name(text: str) -> str:
    """A FORMULAS key from its full name or its last part (``celm`` -> ``algorithms.celm``)."""
    matches = [m for m in FORMULAS if text in (m, m.rsplit(".", 1)[-1])]
    if len(matches) != 1:
        raise argparse.ArgumentTypeError(
            f"unknown module {text!r}; choose from {', '.join(sorted(FORMULAS))}"
        )
    return matches[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--module",
        action="append",
        type=_module_name,
        help=f"only this module (repeatable): {', '.join(sorted(FORMULAS))}, or the last part (celm)",
    )
    ap.add_argument("--summary", action="store_true", help="summarise existing results, run nothing")
    ap.add_argument("--max-children", type=int, default=None, help="parallel mutant runs (mutmut's default)")
    args = ap.parse_args()
    modules = args.module or list(FORMULAS)
    if not args.summary:
        cmd = [str(Path(sys.executable).parent / "mutmut"), "run", *patterns(modules)]
        if args.max_children:
            cmd += ["--max-children", str(args.max_children)]
        rc = subprocess.call(cmd, cwd=ROOT)
        if rc not in (0, 1):  # mutmut exits 1 when mutants survive; anything else is a failure to run
            print(f"mutmut exited with {rc}", file=sys.stderr)
            return rc
    return summarise(modules)


if __name__ == "__main__":
    raise SystemExit(main())
