"""Your own model: register a factory, then name it in a config (model.name) like a built-in one.

    python examples/own_model.py          # a small CNN under FedAvg and CELM on Fashion-MNIST, 10 rounds
    python examples/own_model.py --tiny   # the CI check: 2 rounds on digits

Any nn.Module whose forward gives logits (B, classes) runs with the whole-model methods (FedAvg, FedProx,
CGSV, CFFL, ...). CELM, ShapFed, ProxyFL and the semi-supervised methods need the model split into a
backbone and a Linear head: subclass fedhet.models.FedModel, define features(x) and self.head, as below.
"""

import sys

from torch import nn

import fedhet
from fedhet.models import FedModel, register


class SmallCNN(FedModel):
    """Two conv layers, then a Linear head (the split CELM probes)."""

    def __init__(self, input_shape, num_classes, width=16):
        super().__init__()
        channels, height, width_px = input_shape
        self.body = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )  # fmt: skip
        self.head = nn.Linear(2 * width, num_classes)

    def features(self, x):
        return self.body(x)


register("small-cnn", SmallCNN)  # at import time, so that compare's worker processes see it too

if __name__ == "__main__":
    tiny = "--tiny" in sys.argv
    table = fedhet.compare(
        {"data": {"dataset": "digits" if tiny else "fashion-mnist", "clients": 5,
                  "split": "dirichlet-per-class", "split_params": {"alpha": 0.3}},
         "model": {"name": "small-cnn", "params": {"width": 8 if tiny else 16}}},
        methods=["fedavg", "celm"],
        overrides={"train.rounds": 2 if tiny else 10, "data.max_train_samples": None if tiny else 20000,
                   "data.max_test_samples": None if tiny else 2000},
    )  # fmt: skip
    for row in table.rows:
        print(f"{row['method']:>7}: final accuracy {100 * row['mean']['accuracy']:.2f}%")
