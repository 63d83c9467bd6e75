"""Your own method in one file: coordinate-wise median aggregation (Yin et al., ICML 2018), registered and
run against FedAvg with one hostile client that scales its update by 100.

    python examples/own_method.py          # Fashion-MNIST, 10 clients, 15 rounds (about 3 minutes)
    python examples/own_method.py --tiny   # the CI check: digits, 2 rounds

A method is a Strategy (server side): subclass FedAvg and override the hooks your method changes
(configure, aggregate, aggregation_weights, contributions, ...). A client-side change is a Trainer
subclass named in trainer_class. See docs/writing-a-method.md.
"""

import sys

import torch

import fedhet
from fedhet.algorithms import register
from fedhet.algorithms.fedavg import FedAvg


class FedMedian(FedAvg):
    """FedMedian: w_g ← the coordinate-wise median of the client models (robust to a minority of outliers)."""

    name = "fedmedian"

    def aggregate(self, rnd, replies):
        if self.reward == "local":  # a client's reward is its own last model (FedAvg's default)
            self.local_weights.update({cid: reply.weights for cid, reply in replies.items()})
        if not replies:
            return
        ids = sorted(replies)  # client-id order: results never depend on arrival order
        merged = {}
        for key, first in replies[ids[0]].weights.items():
            if first.is_floating_point():
                merged[key] = torch.stack([replies[c].weights[key] for c in ids]).median(dim=0).values
            else:
                merged[key] = first  # integer buffers (e.g. BatchNorm counters) are not averaged
        self.model.load_state_dict(merged)


register(FedMedian)  # at import time, so that compare's worker processes see it too

if __name__ == "__main__":
    tiny = "--tiny" in sys.argv
    base = {"data": {"dataset": "digits" if tiny else "fashion-mnist", "clients": 5 if tiny else 10,
                     "split": "dirichlet-per-class", "split_params": {"alpha": 1.0}},
            "faults": {"clients": {"0": "scale"}},  # client 0 sends 100 × its update
            "train": {"rounds": 2 if tiny else 15, "lr": 0.05}}  # fmt: skip
    table = fedhet.compare(base, methods=["fedavg", "fedmedian"], overrides={"data.max_train_samples": 12000})
    for row in table.rows:
        accuracy = 100 * row["mean"]["accuracy"]
        print(f"{row['method']:>9}: final accuracy {accuracy:.2f}% with one hostile client")
