"""Whether a finished run was still learning: its training loss still falling steeply at the last round.

The test compares the mean training loss of the run's last fifth of rounds with that of the fifth before,
as a share of the whole run's decrease (first round's loss minus the last fifth's mean). A run that has
converged made almost all its progress before its last fifth; one stopped early still makes a large share
of it there. The loss's own relative change does not separate the two: on separable data it keeps falling
geometrically long after the test accuracy has settled (measured on four tables and digits at 10 to
100 rounds). A warning only: nothing a run computes or records depends on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: A run whose last fifth of rounds made at least this share of its whole training-loss decrease is
#: still learning.
STILL_FALLING_SHARE = 0.10
#: Fewer rounds than this say nothing about the trend (a window needs two rounds).
MIN_ROUNDS = 5


def late_decrease_share(losses: Sequence[float]) -> float | None:
    """The share of the whole decrease of ``losses`` (one per round) made in the last fifth of the rounds:
    (mean of the fifth before the last − mean of the last fifth) / (first loss − mean of the last fifth).
    None when there are too few rounds or the loss did not decrease at all."""
    n = len(losses)
    if n < MIN_ROUNDS:
        return None
    window = max(2, n // 5)
    if 2 * window > n:
        window = n // 2
    last = sum(losses[n - window :]) / window
    before = sum(losses[n - 2 * window : n - window]) / window
    total = losses[0] - last
    if total <= 0:
        return None
    return (before - last) / total


def still_learning(history: Sequence[Mapping[str, Any]]) -> str | None:
    """A warning's text when the run's training loss was still falling steeply at its last round, else None.

    ``history``: the run's per-round lines (``train_loss`` where a round had replies)."""
    losses = [float(line["train_loss"]) for line in history if "train_loss" in line]
    share = late_decrease_share(losses)
    if share is None or share < STILL_FALLING_SHARE:
        return None
    return (
        f"the training loss was still falling at the last round ({100 * share:.0f} % of its decrease came in "
        f"the last fifth of the {len(losses)} rounds): the model may be under-trained; raise train.rounds "
        "(on a small table a smaller train.batch_size gives each round more steps)"
    )
