"""The audit's "starved class" finding, and its maverick flag read from the round-0 descriptions: the only
client that described holding a class, given a weight under 0.1 × 1/N, is named (the global model may not
learn that class); a method that gives it a fair share is not flagged. Known answers from the split (client 0
alone holds class 0) and the run's own weights."""

from __future__ import annotations

import json

import pytest

import fedhet
from fedhet.report.audit import AuditSettings, ground_truth, load_audit

MAVERICK = {
    "data.split": "maverick",
    "data.split_params": {"rare_classes": [0], "maverick_clients": [0], "rare_fraction": 1.0},
    "eval.fairness": False,
}


@pytest.mark.parametrize("method", ["cffl", "celm"])
def test_a_starved_sole_holder_is_named(tmp_path, method):
    run = tmp_path / method
    fedhet.run("contributions/digits-n6", overrides={**MAVERICK, "method.name": method}, out=run)
    summary = json.loads((run / "summary.json").read_text())
    described = summary["described_class_counts"]
    assert [cid for cid, row in described.items() if row[0] > 0] == ["0"]  # the premise: client 0 alone
    weight = summary["contributions"][0]
    audit = load_audit(run, AuditSettings())
    starved = weight < 0.1 / 6
    assert audit.flagged("starved class") == ([0] if starved else [])
    assert ground_truth(run)["starved class"] == ([0] if starved else [])
    # the maverick flag reads the same descriptions, for any method: client 0 alone holds class 0
    maverick = [f for f in audit.flags if f.kind == "maverick" and f.client == 0]
    assert maverick and "class 0: sole holder (100 % of its described samples)" in maverick[0].evidence
    if method == "cffl":  # CFFL's reputation leaves client 0 out here (seed 0); CELM keeps its share
        assert starved
        flag = next(f for f in audit.flags if f.kind == "starved class")
        assert "class 0" in flag.evidence and "may not learn it" in flag.evidence
    else:
        assert not starved
