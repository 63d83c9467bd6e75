"""``crash`` and ``drop``: the client sends nothing (a failed client of the round), raised before any
training is spent on it."""

from __future__ import annotations

from fedhet.attacks.base import Attack


class Crash(Attack):
    """Raises during training."""

    name = "crash"
    kind = "refuse"
    refusal = "the client raised during training"


class Drop(Attack):
    """Sends no reply."""

    name = "drop"
    kind = "refuse"
    refusal = "the client sent no reply"
