"""A run that trains nothing stops with advice that fits why: clients that failed are not told to lower
the learning rate, clients whose updates were rejected are."""

from __future__ import annotations

import pytest

from fedhet.errors import TrainingDivergedError
from fedhet.experiment import make_simulation
from support import digits_config

LR_ADVICE = "Lower train.lr or train.weight_decay"


def _stop_message(faults: dict[str, str]) -> str:
    cfg = digits_config(clients=3, rounds=1, faults__clients=faults)
    with pytest.raises(TrainingDivergedError) as info:
        make_simulation(cfg).run()
    assert info.value.round == 1
    return str(info.value)


def test_every_client_failing_gets_the_failure_advice_not_the_learning_rate():
    message = _stop_message({str(c): "crash" for c in range(3)})  # each client raises in training
    assert message.startswith("every client of rounds 1..1 failed; nothing is being trained. client 0")
    assert "client 0 failed: training raised InjectedFault" in message, message  # the reason, named
    assert "Fix the error each failed client reports" in message
    assert "on Flower, check that every client's node is running and connected" in message
    assert LR_ADVICE not in message and "loosen [guards]" not in message


def test_every_update_rejected_keeps_the_learning_rate_advice():
    message = _stop_message({str(c): "nan" for c in range(3)})  # non-finite updates, refused on arrival
    assert message.startswith("every update of rounds 1..1 was rejected; nothing is being trained. client 0")
    assert f"{LR_ADVICE} if the updates are non-finite, or loosen [guards]" in message
    assert "failed" not in message


def test_a_round_with_both_names_both():
    message = _stop_message({"0": "crash", "1": "nan", "2": "nan"})
    assert "every update of rounds 1..1 was rejected or failed" in message
    assert "client 1's update was rejected" in message and LR_ADVICE in message
    assert "client 0 failed: training raised InjectedFault" in message
    assert "play no part" not in message  # a rejection may well be the learning rate's doing
