"""The contribution-estimators page's table of the audit's flags, from hand-written records: the findings
pooled over methods, low marginal value split where its rule was chosen (digits) and checked (the diabetes
tables), per method only where methods differ, and the methods' view (low weight) apart. Counts by hand."""

from __future__ import annotations

import json

from fedhet.studies import contribution_estimators as study


def write(path, record):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def test_the_flag_table_pools_findings_and_keeps_the_methods_view_apart(tmp_path):
    # An additive game: exact Shapley = own worth; the truth is own worth < 0.75 × the mean (0.10 × 0.75 =
    # 0.075 here), so client 0 (0.02) and client 1 (0.05) are of low marginal value, in both federations.
    own = [0.02, 0.05, 0.10, 0.13, 0.15, 0.15]
    n = len(own)
    utilities = [float(sum(own[i] for i in range(n) if mask >> i & 1)) for mask in range(1 << n)]
    for federation in ("dir-1.0", "diabetes-by-age"):
        write(
            tmp_path / federation / study.GROUND_TRUTH / "fedavg-seed0.json",
            {
                "seed": 0,
                "wall_time_s": 1.0,
                "coalitions": {"num_clients": n, "utilities": {"accuracy": utilities}, "wall_s": 1.0},
            },
        )
        for method, low_weight, free_rider in (("celm", [2, 3], [5]), ("cgsv", [0], [])):
            # low marginal value: client 0 on digits (1 of 2 found), clients 0 and 4 on diabetes (1 right,
            # 1 wrong); the same for both methods (it reads the data, not the method)
            low_value = [0] if federation == "dir-1.0" else [0, 4]
            write(
                tmp_path / federation / "methods" / f"{method}-seed0.json",
                {
                    "method": method,
                    "seed": 0,
                    "values": {
                        "flags": {
                            "free-rider suspect": free_rider,
                            "low marginal value": low_value,
                            "low weight": low_weight,
                            "maverick": [],
                        },
                        "truth": {"free-rider suspect": [], "maverick": []},
                        "contributions": own,
                    },
                },
            )
    text = study.audit_table(tmp_path)
    pooled, rest = text.split("\n\n", 1)
    # 2 federations × 2 methods: low marginal value right 1 + 1 per method (4), wrong 0 + 1 (2), missed
    # client 1 in all four runs (4); free-rider suspect: CELM's client 5, wrong in both federations
    assert (
        pooled.splitlines()[0]
        == "| flag | methods | true positives | false positives | missed | precision | recall |"
    )
    assert "| low marginal value | all | 4 | 2 | 4 | 67 % | 50 % |" in pooled
    assert "| free-rider suspect | all | 0 | 2 | 0 | 0 % | — (no true case) |" in pooled
    assert "low weight" not in pooled  # the method's view is no finding
    # where the rule was chosen and checked: digits 2 right, 0 wrong, 2 missed; diabetes 2, 2, 2
    assert "| low marginal value | digits (chosen) | 2 | 0 | 2 | 100 % | 50 % |" in rest
    assert "| low marginal value | diabetes (checked) | 2 | 2 | 2 | 50 % | 50 % |" in rest
    # per method: only the free-rider flag differs between the two methods
    assert "(free-rider suspect; the others" in rest
    assert "| free-rider suspect | cgsv | 0 | 0 | 0 | — (nothing flagged) | — (no true case) |" in rest
    assert "| low marginal value | celm |" not in rest and "| maverick | celm |" not in rest
    # the methods' view: CELM's low weights (clients 2, 3) are both wrong, twice; CGSV's (client 0) right
    assert "| low weight | celm | 0 | 4 | 4 | 0 % | 0 % |" in rest
    assert "| low weight | cgsv | 2 | 0 | 2 | 100 % | 50 % |" in rest
