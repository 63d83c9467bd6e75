"""The contribution audit (``fedhet audit``): flags computed by hand on a synthetic run, and a tiny real run
through the CLI (a maverick split with a stale client)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedhet.cli import main as cli_main
from fedhet.report.audit import Audit, AuditSettings, flag_clients, ground_truth, load_audit


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def synthetic_audit() -> tuple[Audit, list[dict]]:
    """Four clients, four classes. By construction: client 0 has a low weight and evidence on one class
    (low weight, the method's view: its evidence moved as the others' did, so it is no free rider; no
    standalone accuracies, so no claim of low marginal value); client 1 holds
    60 % of class 2's evidence (a maverick, 'dominant'); client
    3's updates vanish in rounds 2 and 3 (stale); client 2 was rejected in round 1 and failed in round 3;
    client 1's updates were clipped in rounds 2 and 3 (to 0.8 and 0.5 of their norms)."""
    debiased = [
        [1.0, 0.0, 0.0, 0.0],  # client 0: one class
        [1.0, 2.0, 6.0, 2.0],  # client 1: 6 / (6 + 2 + 2) = 60 % of class 2
        [1.0, 4.0, 2.0, 4.0],
        [1.0, 4.0, 2.0, 4.0],
    ]
    raw = [[v + 1.0 for v in row] for row in debiased]
    evidence = [
        {"round": 1, "raw": raw, "debiased": debiased},
        {"round": 2, "raw": raw, "debiased": debiased},
    ]
    shares = np.array(debiased) / np.array(debiased).sum(axis=0)
    audit = Audit(
        run_dir=Path("synthetic"),
        method="celm",
        seed=0,
        weights=np.array([0.1, 0.3, 0.3, 0.3]),
        weight_source="contribution",
        history=[(1, [0.1, 0.3, 0.3, 0.3])],
        sample_share=np.full(4, 0.25),
        class_shares=shares,
        evidence_rounds=evidence,
    )
    lines = [
        {"round": 1, "rejected": {"2": "update norm 9 exceeds 10 × the round's median"},
         "update_norms": {"0": 1.0, "1": 1.2, "2": 90.0, "3": 0.9}},
        {"round": 2, "update_norms": {"0": 1.0, "1": 1.1, "2": 1.0, "3": 0.0}, "clipped": {"1": 0.8}},
        {"round": 3, "failed": {"2": "crash"}, "update_norms": {"0": 1.0, "1": 1.0, "3": 0.005},
         "clipped": {"1": 0.5}},
    ]  # fmt: skip
    return audit, lines


def test_flags_on_a_hand_built_run():
    audit, lines = synthetic_audit()
    flags = flag_clients(audit, lines, AuditSettings())
    # By hand: class shares (column sums 4, 10, 10, 10): client 0 = [0.25, 0, 0, 0], client 1 = [0.25, 0.2,
    # 0.6, 0.2]. Client 0: 0.1 < 0.75 × 1/4 and one class with share >= 1/(2N) = 0.125 (1 < 4/2). Client 1:
    # 0.6 >= 0.5 on class 2. Stale: round 2 median 1.0, client 3 sends 0.0; round 3 median 1.0, 0.005 < 0.01;
    # round 1 median 1.1, nobody below 0.011. Evidence did not move for anyone: median change 0, no flatness.
    assert [(f.client, f.kind, f.evidence) for f in flags] == [
        (0, "low weight",
         "celm's view: weight 0.100 = 0.40 × 1/N; evidence on 1 of 4 classes (share ≥ 1/(2N))"),
        (1, "maverick", "class 2: dominant holder (60 % of its evidence); weight 0.300 = 1.20 × 1/N"),
        (2, "rejected updates", "1 round(s) (1); round 1: update norm 9 exceeds 10 × the round's median"),
        (1, "clipped updates", "2 round(s) (2, 3); smallest scale 0.5 (round 3)"),
        (2, "failed rounds", "1 round(s) (3); round 3: crash"),
        (3, "stale uploads", "2 round(s) (2, 3) with an update norm below 0.01 × the round's median; "
         "round 2: 0 vs 1"),
    ]  # fmt: skip


def test_a_silent_client_is_a_free_rider_suspect_and_a_lasting_low_weight_the_methods_view():
    audit, _ = synthetic_audit()
    audit.class_shares = np.full((4, 4), 0.25)  # every client covers every class
    # client 0 (weight 0.1): its kept updates are orthogonal to the others' (|cos| 0.004 = 0.4 / √10000: as
    # a random direction) in rounds 1-3; client 3's (weight 0.3) too: free-rider suspects whatever their
    # weights, never low weight
    lines = [
        {"round": r, "clients": [0, 1, 2, 3],
         "update_alignment": {"0": 0.004 * (-1) ** r, "1": 0.3, "2": -0.2, "3": 0.004},
         "update_alignment_size": 10_000}
        for r in (1, 2, 3)
    ]  # fmt: skip
    flags = flag_clients(audit, lines, AuditSettings())
    assert [(f.client, f.kind) for f in flags] == [(0, "free-rider suspect"), (3, "free-rider suspect")]
    # two rounds of |cos| 0.3 in three lift client 0's median of |cos| × 100 to 30 (≥ 2): its updates
    # carried information, and its low weight is the method's view of it
    lines[0]["update_alignment"]["0"] = lines[1]["update_alignment"]["0"] = 0.3
    assert [(f.client, f.kind) for f in flag_clients(audit, lines, AuditSettings())] == [
        (3, "free-rider suspect"),
        (0, "low weight"),
    ]
    # a method without class evidence: low in >= 80 % of its rounds (4 of 5 here), not in 3 of 5
    audit.class_shares, audit.evidence_rounds = None, []
    audit.history = [(r, [0.1 if r <= 4 else 0.3, 0.3, 0.3, 0.3]) for r in range(1, 6)]
    flags = flag_clients(audit, [], AuditSettings())
    assert [(f.client, f.kind, f.evidence.split("; ")[1]) for f in flags] == [
        (0, "low weight", "below 0.75 × 1/N in 4 of 5 rounds")
    ]
    audit.history = [(r, [0.1 if r <= 3 else 0.3, 0.3, 0.3, 0.3]) for r in range(1, 6)]
    assert flag_clients(audit, [], AuditSettings()) == []


def test_audit_of_a_real_run_names_the_stale_client_and_writes_its_report(tmp_path, capsys):
    """A 4-round CELM run on the maverick split in which client 3 sends back what it was sent (faults). One
    warm-up round (T_w = 1): in later warm-up rounds the server sends no head, so every update norm holds the
    client's own head (engine.guards.update_norm) and a stale one is not 0."""
    run = tmp_path / "celm"
    args = ["run", "celm/fmnist-maverick", "--rounds", "4", "--out", str(run)]
    for s in ("data.max_train_samples=3000", "data.max_test_samples=500", "faults.clients.3=stale",
              "faults.clients.5=nan",  # its evidence rows are NaN (null in records.json): the heatmap copes
              "faults.clients.6=free-rider",  # N(0, 1) noise: refused by the update-norm guard every round
              "faults.clients.7=adaptive-scale",  # under the rejecting bound: the clipping guard shortens it
              "method.params.warmup_fraction=0.25", "eval.every=2"):  # fmt: skip
        args += ["--set", s]
    assert cli_main(args) == 0
    lines = [json.loads(s) for s in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(ln["update_norms"]["3"] == 0.0 and ln["update_norms"]["0"] > 0 for ln in lines)
    truth = ground_truth(run)
    assert truth["stale uploads"] == [3] and 0 in truth["maverick"]  # the rare class's sole holder
    # the stale client sends nothing: a free rider too; the refused free rider is what the server saw of it
    assert truth["free-rider suspect"] == [3]
    assert truth["rejected updates"] == [5, 6] and truth["clipped updates"] == [7]
    audit = load_audit(run)
    assert audit.flagged("stale uploads") == [3] and audit.flagged("rejected updates") == [5, 6]
    assert audit.flagged("free-rider suspect") == [3]
    assert 7 in audit.flagged("clipped updates")
    assert audit.class_shares.shape == (10, 10) and audit.num_clients == 10
    out = tmp_path / "report" / "audit.md"
    assert cli_main(["audit", str(run), "--out", str(out), "--html"]) == 0
    text = out.read_text()
    assert text.count("\n| ") == 1 + 10  # header + one row per client (the separator starts with |-)
    assert "**stale uploads**: 4 round(s) (1, 2, 3, 4)" in text
    for fig in ("weights", "evidence", "share"):
        assert (out.parent / "audit_figures" / f"00-celm-seed0-{fig}.png").stat().st_size > 1000
    html = out.with_suffix(".html").read_text()
    assert html.count("<img") == 3 and "data:image/png;base64," in html
    assert "stale uploads [3]" in capsys.readouterr().out
    assert "**rejected updates**: 4 round(s) (1, 2, 3, 4); round 1:" in text


def test_audit_refuses_runs_without_contributions_and_says_which(tmp_path, capsys):
    run = tmp_path / "fedavg"
    assert cli_main(["run", "robustness/fmnist-n10", "--rounds", "1", "--out", str(run),
                     "--set", "data.max_train_samples=1000", "--set", "data.max_test_samples=200",
                     "--set", "eval.rewards=false", "--set", "eval.fairness=false"]) == 0  # fmt: skip
    capsys.readouterr()
    assert cli_main(["audit", str(run), "--out", str(tmp_path / "a.md")]) == 2
    err = capsys.readouterr().err
    assert "nothing to audit" in err and f"{run}" in err and "records no contributions or rewards" in err
    assert not (tmp_path / "a.md").exists()
    from fedhet.errors import ConfigError

    with pytest.raises(ConfigError, match="records no contributions or rewards; the audit reads runs of"):
        load_audit(run)
