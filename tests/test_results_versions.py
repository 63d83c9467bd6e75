"""Results versions: a cell record is reused exactly while the code at hand computes the same numbers for it.

Each method's stamp (``fedhet.code_version.results_stamp``) names the versions of the core and of every
``fedhet.algorithms`` module its run reaches. The golden runs (tests/every_method_digits.py: every method and
a few FedAvg variants, 2 rounds on digits) hold the numbers each stamp computes: a change of numbers without a
bump of the changed module's ``RESULTS_VERSION`` fails here, so records are never reused for numbers the code
no longer computes; a bump without a change of numbers only costs a rerun.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fedhet.algorithms import method_names, strategy_class
from fedhet.algorithms.fedavg import FedAvg
from fedhet.code_version import algorithm_modules, results_stamp

sys.path.insert(0, str(Path(__file__).parent))
from every_method_digits import config, golden_values, relative_differences  # noqa: E402

GOLDEN = Path(__file__).parent / "golden" / "results.json"
REWRITE = "python tests/every_method_digits.py --write tests/golden/results.json"

# Tolerances: per case and value, 20x the difference measured when the case was recorded between this
# machine's kernels and the default (no SIMD) ones (``kernel_noise``: a semi-supervised case, whose
# pseudo-label threshold can flip under rounding, differs by up to 3e-5 of its weights, FedAvg by 1e-8),
# never below the floors; a change of what a method computes moves the values by more (lr x 1.01 below).
NOISE_FACTOR = 20
FLOORS = {"loss": 1e-6, "tensor_sum": 1e-7, "tensor_abs_sum": 1e-7, "contributions": 1e-6}
ACCURACY_ATOL = 4 / 450  # four test images of 450


def parse_done(stdout: str) -> dict[str, dict]:
    lines = [ln.split(" ", 2) for ln in stdout.splitlines() if ln.startswith("done ")]
    return {name: json.loads(values) for _, name, values in lines}


def differences(now: dict, then: dict) -> list[str]:
    """What differs between two golden values beyond the case's tolerances (empty: the same numbers)."""
    if (now["loss"] is None) != (then["loss"] is None) or len(now["contributions"] or []) != len(
        then["contributions"] or []
    ):
        return [f"defined values differ: {now} (was {then})"]
    noise = then.get("kernel_noise") or {}
    out = [
        f"{key}: {diff:.2e} of its scale (tolerance {tol:.2e})"
        for key, diff in relative_differences(now, then).items()
        if diff > (tol := max(NOISE_FACTOR * noise.get(key, 0.0), FLOORS[key]))
    ]
    if now["accuracy"] is not None and abs(now["accuracy"] - then["accuracy"]) > ACCURACY_ATOL:
        out.append(f"accuracy {now['accuracy']} (was {then['accuracy']})")
    return out


@pytest.mark.xdist_group("every-method-run")  # one worker runs the shared subprocess once
def test_golden_runs_compute_what_their_stamps_recorded(every_method_run):
    assert every_method_run.returncode == 0, every_method_run.stderr[-3000:]
    now = parse_done(every_method_run.stdout)
    golden = json.loads(GOLDEN.read_text())
    problems = []
    for case in sorted(set(now) | set(golden)):
        if case not in golden or case not in now:
            problems.append(f"{case}: in {'the run' if case in now else 'the golden file'} only; {REWRITE}")
            continue
        if now[case].get("experiment") != golden[case].get("experiment"):
            problems.append(
                f"{case}: another experiment than the golden run's (a default it runs with changed): record "
                f"its numbers with `{REWRITE}`"
            )
        elif now[case]["stamp"] != golden[case]["stamp"]:
            problems.append(
                f"{case}: stamp {now[case]['stamp']!r}, golden {golden[case]['stamp']!r} (a version was "
                f"bumped): record its numbers with `{REWRITE}`"
            )
        elif diff := differences(now[case], golden[case]):
            problems.append(
                f"{case}: the numbers changed under the same stamp {now[case]['stamp']!r}: "
                f"{'; '.join(diff)}. Bump RESULTS_VERSION of the fedhet.algorithms module you changed (or "
                "CORE_RESULTS_VERSION in fedhet/code_version.py for the engine, data or models), then "
                f"`{REWRITE}`"
            )
    assert not problems, "\n".join(problems)


def test_every_algorithms_module_declares_a_results_version():
    import importlib
    import pkgutil

    import fedhet.algorithms as package

    missing = []
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"fedhet.algorithms.{info.name}")
        if not isinstance(getattr(module, "RESULTS_VERSION", None), int):
            missing.append(info.name)
    assert not missing, f"declare RESULTS_VERSION = 1 in {missing}"


def test_a_stamp_names_the_modules_a_method_reaches_and_no_others():
    """Hand-checked against the imports: CELM's strategy subclasses FedAvg and its module imports the logit
    probes and FedRS's trainer; FedAvg reaches neither."""
    celm = algorithm_modules(strategy_class("celm"))
    assert {"fedhet.algorithms.celm", "fedhet.algorithms.fedavg", "fedhet.algorithms.logit_probes"} <= set(
        celm
    )
    assert "fedhet.algorithms.fedrs" in celm
    fedavg = algorithm_modules(strategy_class("fedavg"))
    assert "fedhet.algorithms.celm" not in fedavg and "fedhet.algorithms.logit_probes" not in fedavg
    assert results_stamp(strategy_class("fedavg")).startswith("core=")


def test_a_bump_changes_the_stamps_of_the_methods_reaching_the_module_only(monkeypatch):
    import fedhet.algorithms.logit_probes as probes

    before = {m: results_stamp(strategy_class(m)) for m in method_names()}
    monkeypatch.setattr(probes, "RESULTS_VERSION", probes.RESULTS_VERSION + 1)
    changed = {m for m in method_names() if results_stamp(strategy_class(m)) != before[m]}
    reaching = {
        m for m in method_names() if "fedhet.algorithms.logit_probes" in algorithm_modules(strategy_class(m))
    }
    assert changed == reaching and "celm" in changed and "fedavg" not in changed


def test_a_users_own_method_has_no_stamp():
    class Mine(FedAvg):
        name = "mine"

    assert results_stamp(Mine) is None


@pytest.mark.parametrize("factor", [1.01])
def test_the_tolerances_see_a_one_percent_change_of_the_learning_rate(tmp_path, factor):
    """The golden comparison is not blind: FedAvg with lr x 1.01 differs from FedAvg beyond the tolerances."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from fedhet.experiment import run_experiment

    values = []
    for lr_factor in (1.0, factor):  # the recorded FedAvg case's noise and the floors as tolerances
        cfg = config("fedavg", 0)
        cfg.train.lr = cfg.learning_rate() * lr_factor
        run_dir = tmp_path / str(lr_factor)
        values.append(golden_values(run_experiment(cfg, run_dir=str(run_dir)), run_dir))
    golden = json.loads(GOLDEN.read_text())["fedavg"]
    values[0]["kernel_noise"] = golden["kernel_noise"]
    assert not differences(values[0], golden)  # the same code: the same numbers
    assert differences(values[1], values[0])
