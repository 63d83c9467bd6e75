"""``lie-num-examples``: ``faults.factor`` × its sample count, in its round-0 description and every reply."""

from __future__ import annotations

from fedhet.attacks.base import Attack


class LieNumExamples(Attack):
    """Claims factor × its true sample count (a finite int however large)."""

    name = "lie-num-examples"
    kind = "count"
    flat_parameters = ("factor",)
    factor: float

    def claim(self, num_examples: int) -> int:
        return int(round(min(num_examples * self.factor, float(2**62))))
