"""One contribution record: summary.json, the Python API, contributions.csv and the audit give a run's
contributions as its last aggregated round's metrics line reports them (fedhet.engine.records.
run_contributions): 0 for a client rejected or failed in that round, not the weight the method still holds
for it (CELM's 1/N prior). The known answers come from the metrics lines, which the round loop writes."""

from __future__ import annotations

import csv
import json
import math

import pytest

import fedhet
from fedhet.engine.records import run_contributions
from fedhet.report.audit import load_audit
from support import digits_config, lines_of


def celm_run(out, rounds: int, **faults):
    """CELM on digits, 6 clients, Dir(1.0) per class, seed 1, client 2 sending random weights (``noise``,
    which the update-norm guard rejects) in the rounds ``faults`` allows."""
    cfg = digits_config(clients=6, rounds=rounds, faults__clients={"2": "noise"}, **faults)
    cfg.data.split, cfg.data.split_params, cfg.seed = "dirichlet-per-class", {"alpha": 1.0}, 1
    # warm-up over the first half: CELM estimates from round 2's evidence too, where client 2 is honest
    cfg.method.name, cfg.method.params = "celm", {"probe_steps": 5, "warmup_fraction": 0.5}
    return fedhet.run(cfg, out=out)


def last_csv_row(run_dir) -> list[float]:
    """The last round's contributions in contributions.csv (a row per round and client)."""
    with open(run_dir / "contributions.csv") as fh:
        rows = list(csv.DictReader(fh))
    last = [r for r in rows if r["round"] == rows[-1]["round"]]
    assert [int(r["client"]) for r in last] == list(range(6))
    return [float(r["contribution"]) for r in last]


def test_a_client_rejected_in_every_round_is_credited_nothing(tmp_path):
    result = celm_run(tmp_path / "run", rounds=3)
    lines = lines_of(tmp_path / "run")
    assert all("2" in line["rejected"] for line in lines)  # the premise: the guard rejects it every round
    expected = lines[-1]["contributions"]
    assert expected[2] == 0.0 and sum(expected) == pytest.approx(1.0)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["contributions"] == expected  # not CELM's 1/6 prior, nor the others × 5/6
    assert result.contributions == expected
    assert last_csv_row(tmp_path / "run") == pytest.approx(expected, abs=1e-9)
    audit = load_audit(tmp_path / "run")
    assert audit.weights.tolist() == pytest.approx(expected, abs=1e-12)
    # its 0 is the server's refusal, which the audit names; it is no free rider (it sent an update)
    assert 2 in audit.flagged("rejected updates") and 2 not in audit.flagged("free-rider suspect")


@pytest.mark.parametrize("rounds", [3, 4])
def test_a_client_rejected_in_some_rounds_gets_its_last_rounds_weight(tmp_path, rounds):
    """Noise in rounds 1 and 3 only: a run of 3 rounds ends on a rejection (0), one of 4 on an honest
    round (the weight CELM gave it, estimated from its round-2 evidence)."""
    result = celm_run(tmp_path / "run", rounds=rounds, faults__every=2)
    lines = lines_of(tmp_path / "run")
    assert ["2" in line.get("rejected", {}) for line in lines] == [r % 2 == 1 for r in range(1, rounds + 1)]
    expected = lines[-1]["contributions"]
    assert (expected[2] == 0.0) == (rounds == 3)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["contributions"] == expected == result.contributions
    assert load_audit(tmp_path / "run").weights.tolist() == pytest.approx(expected, abs=1e-12)


def test_the_record_is_the_last_aggregated_rounds_line():
    estimate = [0.25, 0.25, 0.5]
    line = {"round": 1, "clients": [0, 1, 2], "contributions": [0.2, 0.3, 0.5]}
    zeroed = {"round": 2, "clients": [0, 2], "rejected": {"1": "r"}, "contributions": [0.4, 0.0, 0.6]}
    nothing_used = {"round": 3, "clients": [], "rejected": {"0": "r", "1": "r", "2": "r"}}
    rolled_back = {"round": 3, "clients": [0, 1, 2], "rolled_back": "not finite", "contributions": [1, 0, 0]}
    stop = {"round": 4, "accuracy": 0.5}  # the evaluation a diverged run ends with: no round trained
    assert run_contributions(estimate, [line, zeroed]) == [0.4, 0.0, 0.6]
    # a last round that used nothing, or was undone, credits no one: the last aggregated round stands
    all_rejected = {**nothing_used, "contributions": [0, 0, 0]}
    assert run_contributions(estimate, [line, zeroed, all_rejected, stop]) == [0.4, 0.0, 0.6]
    assert run_contributions(estimate, [line, rolled_back]) == [0.2, 0.3, 0.5]
    # with no aggregated round at all, the last round as reported
    assert run_contributions(estimate, [all_rejected]) == [0, 0, 0]
    # lines without contributions (FedRAC's ρ): the estimate, less that round's rejected and failed
    failed = {"round": 1, "clients": [1, 2], "failed": {"0": "f"}}
    assert run_contributions(estimate, [failed]) == [0, 1 / 3, 2 / 3]
    assert run_contributions(None, [line | {"contributions": None}]) is None
    assert run_contributions(estimate, []) == estimate  # no rounds (nothing to read it from)
    # a resumed run reads its lines back from JSON, where NaN is null
    assert math.isnan(run_contributions(None, [{**line, "contributions": [None, 0.5, 0.5]}])[0])
