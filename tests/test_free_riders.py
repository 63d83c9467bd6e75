"""The audit's free-rider finding: the per-round alignment the engine records (against numpy), the statistic
on hand-made metrics lines, and a tiny real run with a quiet free rider that the audit names alone."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedhet.engine.alignment import update_alignment
from fedhet.engine.protocol import Instruction, Reply
from fedhet.report.informativeness import informativeness, sends_no_information


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def test_update_alignment_against_numpy():
    """cos(Δ_i, Σ_{j≠i} Δ_j) over two tensors; an integer buffer and a tensor the server did not send are not
    part of the update; a zero update points nowhere (0.0); fewer than three updates give nothing."""
    gen = np.random.default_rng(0)
    sent = {"a": torch.zeros(3, dtype=torch.float64), "b": torch.ones(2, 2, dtype=torch.float64)}
    deltas = [gen.normal(size=7) for _ in range(4)]
    deltas[2] = np.zeros(7)  # a stale client
    replies = {}
    for cid, d in enumerate(deltas):
        weights = {
            "a": sent["a"] + torch.tensor(d[:3]),
            "b": sent["b"] + torch.tensor(d[3:]).view(2, 2),
            "head": torch.tensor(gen.normal(size=5)),  # not sent: the client's own, no reference
            "count": torch.tensor(7),  # an integer buffer
        }
        replies[cid] = Reply(weights=weights, num_examples=1)
    outgoing = {cid: Instruction(weights=sent) for cid in replies}
    got, size = update_alignment(replies, outgoing)
    assert size == 7  # a and b: 3 + 4 weights
    stacked = np.stack(deltas)
    for cid, d in enumerate(deltas):
        others = stacked.sum(axis=0) - d
        expected = 0.0 if cid == 2 else d @ others / (np.linalg.norm(d) * np.linalg.norm(others))
        assert got[cid] == pytest.approx(expected, abs=1e-12)
    assert update_alignment(dict(list(replies.items())[:2]), outgoing) == ({}, 0)


def lines_by_hand() -> list[dict]:
    """Five rounds, four clients. Client 0: |cos| 0.3, 0.1, 0.2, 0.5, tiny norms changing by 10-20 % (an
    absolute tolerance would call them repeated). Client 1: noise, |cos| 0.004, 0.001,
    0.003, 0.002. Client 2: norm 0.5 in every round (a replay; its |cos| 0.2).
    Client 3: rejected in rounds 1-4 (|cos| 0.001 in round 5 only: one kept round)."""
    rows = [
        ({"0": 0.3, "1": -0.004, "2": 0.2}, {"0": 1e-6, "1": 0.9, "2": 0.5, "3": 50.0}),
        ({"0": -0.1, "1": 0.001, "2": 0.2}, {"0": 8e-7, "1": 0.91, "2": 0.5, "3": 50.0}),
        ({"0": 0.2, "1": 0.003, "2": -0.2}, {"0": 7e-7, "1": 0.9, "2": 0.5, "3": 50.0}),
        ({"0": 0.5, "1": -0.002, "2": 0.2}, {"0": 6e-7, "1": 0.89, "2": 0.5000000001, "3": 50.0}),
    ]
    lines = [
        {
            "round": r + 1,
            "clients": [0, 1, 2],
            "rejected": {"3": "update norm 50 exceeds 10 × the round's median"},
            "update_alignment": a,
            "update_alignment_size": 10_000,  # |cos| × √d = |cos| × 100
            "update_norms": n,
        }
        for r, (a, n) in enumerate(rows)
    ]
    lines.append(
        {
            "round": 5,
            "clients": [0, 1, 2, 3],
            "update_alignment": {"3": 0.001},
            "update_alignment_size": 10_000,
        }
    )
    return lines


def test_informativeness_on_hand_made_lines():
    info = informativeness(lines_by_hand())
    # |cos| × √10000: client 0's 30, 10, 20, 50 (median (20 + 30) / 2), client 1's 0.4, 0.1, 0.3, 0.2
    assert info[0]["alignment"] == pytest.approx(25.0) and info[0]["rounds"] == 4
    assert info[1]["alignment"] == pytest.approx(0.25)
    # client 2's norms: 0.5, 0.5, 0.5, 0.5000000001 (relative change 2e-10): 3 of 3 pairs repeated;
    # client 1's: 0.9 -> 0.91 -> 0.9 -> 0.89 (about 1 %): none; client 3 was kept once: no pair
    assert (info[2]["repeated"], info[2]["pairs"]) == (3, 3)
    assert (info[1]["repeated"], info[0]["repeated"]) == (0, 0)
    assert info[3]["rounds"] == 1 and info[3]["pairs"] == 0
    found = sends_no_information(lines_by_hand())
    assert sorted(found) == [1, 2]  # client 3's one kept round is too few to judge (min_rounds = 3)
    assert "in units of a random direction's (1/√d), is 0.25 over 4 kept rounds" in found[1]
    assert "re-sends one update" in found[2] and "3 of 3" in found[2]
    assert sorted(sends_no_information(lines_by_hand(), min_rounds=1)) == [1, 2, 3]
    assert sorted(sends_no_information(lines_by_hand(), no_alignment=0.25)) == [2]  # 0.25 is not < itself
    bare = lines_by_hand()  # without the size the cosines cannot be put in units of chance: unread
    for line in bare:
        line.pop("update_alignment_size")
    assert all(v["rounds"] == 0 for v in informativeness(bare).values())


def test_audit_names_the_quiet_free_rider_of_a_real_run_and_no_honest_client(tmp_path):
    """Digits, 6 clients, Dir(1), 15 rounds of CELM; client 0 sends the model it was sent plus N(0, 0.0013²)
    noise (norm ≈ 0.31 over mlp200's 55,210 weights, like an honest update: no guard refuses it)."""
    from fedhet.api import run
    from fedhet.report.audit import load_audit

    overrides = {
        "data.split": "dirichlet-per-class",
        "data.split_params": {"alpha": 1.0},
        "train.rounds": 15,
        "faults.clients": {"0": "free-rider"},
        "faults.noise_std": 0.0013,
        "method.name": "celm",
    }
    run("contributions/digits-n6", overrides=overrides, out=tmp_path / "run")
    lines = [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert not any("rejected" in ln for ln in lines)  # the guards let it through
    audit = load_audit(tmp_path / "run")
    assert audit.flagged("free-rider suspect") == [0]


def test_a_client_that_sends_nothing_is_named_for_its_empty_updates():
    lines = [
        {
            "round": r,
            "clients": [0, 1, 2],
            "update_alignment": {"0": 0.0, "1": 0.4, "2": 0.4},
            "update_alignment_size": 100,
        }
        for r in (1, 2, 3)
    ]
    found = sends_no_information(lines)
    assert list(found) == [0] and found[0].startswith("its updates are empty (norm 0")
