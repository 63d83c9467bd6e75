"""The audit's "low marginal value" finding (a fact about the client's data, read from its standalone
accuracy's gain over chance) against "low weight" (the method's view) and "free-rider suspect". Hand-built
runs whose answers are computed by hand below; the last test shows the finding equal to exact Shapley's
definition on an additive federation, where Shapley values are the clients' own gains (computed here from
the definition over every order, sharing no helper with fedhet)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np

from fedhet.report.audit import Audit, AuditSettings, flag_clients


def audit_of(weights, standalone, classes=4, method="cgsv") -> Audit:
    """Four clients that each described every one of ``classes`` classes (no maverick), final weights
    ``weights`` held in every round, the standalone accuracies ``standalone`` (None: not recorded)."""
    n = len(weights)
    return Audit(
        run_dir=Path("hand-built"),
        method=method,
        seed=0,
        weights=np.asarray(weights, dtype=np.float64),
        weight_source="contribution",
        history=[(r, list(weights)) for r in range(1, 6)],
        sample_share=np.full(n, 1.0 / n),
        class_shares=None,
        described=np.full((n, classes), 10.0),
        standalone=None if standalone is None else np.asarray(standalone, dtype=np.float64),
    )


def informative_rounds(silent=()) -> list[dict]:
    """Three kept rounds in which every client's update shares the others' direction (|cos| 0.3 over
    d = 10,000: 30 in units of chance), except ``silent`` clients' (|cos| 0.004: 0.4, noise)."""
    return [
        {"round": r, "clients": [0, 1, 2, 3],
         "update_alignment": {str(c): (0.004 if c in silent else 0.3) for c in range(4)},
         "update_alignment_size": 10_000}
        for r in (1, 2, 3)
    ]  # fmt: skip


def kinds(flags) -> list[tuple[int, str]]:
    return [(f.client, f.kind) for f in flags]


def test_a_client_whose_data_learns_little_is_of_low_marginal_value_whatever_its_weight():
    # By hand, K = 4 (chance 0.25): gains 0.15, 0.60, 0.55, 0.65, mean 0.4875; 0.75 × 0.4875 = 0.3656.
    # Client 0: 0.15 / 0.4875 = 0.31 < 0.75; the others >= 1.13. Its weight (0.4) is the largest: the finding
    # is about its data, not about what the method gave it, and its updates carried information.
    audit = audit_of([0.4, 0.2, 0.2, 0.2], [0.40, 0.85, 0.80, 0.90])
    flags = flag_clients(audit, informative_rounds(), AuditSettings())
    assert kinds(flags) == [(0, "low marginal value")]
    assert flags[0].evidence == (
        "its data alone learns little: standalone accuracy 0.400, a gain over chance 1/4 of 0.31 × the "
        "clients' mean (< 0.75); its contribution 0.400"
    )


def test_a_client_the_method_under_weights_but_whose_data_learns_well_is_only_the_methods_low_weight():
    # Client 1: weight 0.04 = 0.16 × 1/N in every round (< 0.75), but its standalone gain 0.60 / 0.4875 =
    # 1.23 × the mean: the method's view, never a claim of low marginal value
    audit = audit_of([0.32, 0.04, 0.32, 0.32], [0.70, 0.85, 0.80, 0.90])
    flags = flag_clients(audit, informative_rounds(), AuditSettings())
    # gains 0.45, 0.60, 0.55, 0.65 (mean 0.5625, 0.75 × = 0.42): nobody learns little
    assert kinds(flags) == [(1, "low weight")]
    assert flags[0].evidence == "cgsv's view: weight 0.040 = 0.16 × 1/N; below 0.75 × 1/N in 5 of 5 rounds"


def test_a_silent_client_is_a_free_rider_suspect_not_of_low_marginal_value():
    # client 0's data learns little (as in the first test) and its updates point nowhere: the free-rider
    # finding names it, the low-marginal-value finding does not (an honest finding never covers a free rider)
    audit = audit_of([0.25, 0.25, 0.25, 0.25], [0.40, 0.85, 0.80, 0.90])
    flags = flag_clients(audit, informative_rounds(silent={0}), AuditSettings())
    assert kinds(flags) == [(0, "free-rider suspect")]


def test_the_gain_is_counted_over_chance_and_nothing_is_claimed_without_standalone_accuracies():
    # Two classes (chance 0.5): gains 0.12, 0.25, 0.25, 0.25, mean 0.2175, 0.75 × = 0.163: client 0 is low
    # (0.55 × the mean). Its accuracy itself is 0.62 / 0.7175 = 0.86 × the mean: read without chance, it
    # would pass.
    audit = audit_of([0.25] * 4, [0.62, 0.75, 0.75, 0.75], classes=2)
    flags = flag_clients(audit, informative_rounds(), AuditSettings())
    assert kinds(flags) == [(0, "low marginal value")] and "of 0.55 × the clients' mean" in flags[0].evidence
    # no standalone accuracies recorded: the audit claims nothing about marginal value
    assert flag_clients(audit_of([0.25] * 4, None, classes=2), informative_rounds(), AuditSettings()) == []
    # a client the pre-pass could not train (NaN) is left out of the mean and of the finding
    audit = audit_of([0.25] * 4, [0.62, 0.75, 0.75, math.nan], classes=2)
    # gains 0.12, 0.25, 0.25: mean 0.2067, 0.75 × = 0.155: client 0 still low (0.58 × the mean)
    flags = flag_clients(audit, informative_rounds(), AuditSettings())
    assert kinds(flags) == [(0, "low marginal value")] and "of 0.58 × the clients' mean" in flags[0].evidence


def test_on_an_additive_federation_the_finding_names_exactly_the_clients_of_low_shapley_value():
    # u(S) = chance + Σ_{i ∈ S} g_i: each client adds its own gain to any coalition, so every marginal gain
    # of client i is g_i and its Shapley value is g_i, and its standalone accuracy is chance + g_i.
    chance, gains = 0.1, [0.05, 0.20, 0.15, 0.30]

    def utility(coalition) -> float:
        return chance + sum(gains[i] for i in coalition)

    shapley = []
    for i in range(4):  # the definition: i's marginal gain averaged over the 4! orders
        orders = list(itertools.permutations(range(4)))
        total = sum(utility(o[: o.index(i) + 1]) - utility(o[: o.index(i)]) for o in orders)
        shapley.append(total / len(orders))
    low_shapley = [i for i, v in enumerate(shapley) if v < 0.75 * sum(shapley) / 4]
    assert low_shapley == [0]  # 0.05 < 0.75 × 0.175 = 0.131; 0.15 is not
    audit = audit_of([0.25] * 4, [chance + g for g in gains], classes=10)
    flagged = [f.client for f in flag_clients(audit, informative_rounds(), AuditSettings())]
    assert flagged == low_shapley
