"""Your own attack in one file: three colluders send −strength × the coordinate-wise median of the round's
honest updates (an IPM aimed at median-based rules), registered and run against FedAvg with the
coordinate-wise median rule, beside the clean run and the built-in min-max attack.

    python examples/own_attack.py          # Fashion-MNIST, 10 clients, 15 rounds (a few minutes)
    python examples/own_attack.py --tiny   # the CI check: digits, 3 rounds (seconds)

An attack is a class with a name, a kind (where it acts: "reply", "data", "refuse", "count" or
"coordinated") and its parameters with their defaults, read from [faults.params.<name>]. A coordinated
attack's forge() sees the round's honest updates (float64, stacked per tensor) and returns each colluder's
malicious update. See docs/writing-an-attack.md.
"""

import sys

import fedhet
from fedhet.attacks import register
from fedhet.attacks.base import Attack


class MedianFlip(Attack):
    """Every colluder sends −strength × the coordinate-wise median of the honest updates."""

    name = "median-flip"
    kind = "coordinated"
    parameters = {"strength": 2.0}

    def check(self):
        if not self.strength > 0:
            self.fail(f"strength = {self.strength} must be > 0")

    def forge(self, view):
        update = {key: -self.strength * stacked.median(dim=0).values for key, stacked in view.honest.items()}
        return self.same_for_all(view, update)


register(MedianFlip)  # at import time, so that worker processes see it too

if __name__ == "__main__":
    tiny = "--tiny" in sys.argv
    base = {"data": {"dataset": "digits" if tiny else "fashion-mnist", "clients": 10,
                     "split": "dirichlet-per-class", "split_params": {"alpha": 1.0},
                     "max_train_samples": None if tiny else 12000},
            "train": {"rounds": 3 if tiny else 15, "lr": 0.05},
            "aggregation": {"rule": "median"}}  # fmt: skip
    hostile = ("0", "1", "2")  # three of the ten clients collude
    cases = {
        "clean": {},
        "median-flip": {
            "clients": dict.fromkeys(hostile, "median-flip"),
            "params": {"median-flip": {"strength": 3.0}},  # [faults.params.median-flip] in a TOML file
        },
        "min-max": {"clients": dict.fromkeys(hostile, "min-max")},  # built in (Shejwalkar and Houmansadr)
    }
    for case, faults in cases.items():
        result = fedhet.run({**base, "faults": faults})
        print(f"{case:>11}: final accuracy {100 * result.final['accuracy']:.2f}% with the median rule")
