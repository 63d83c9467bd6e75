"""Your own data: arrays in memory, an .npz file, or an image folder, trained on like a built-in data set.

    python examples/own_data.py          # scikit-learn's digits as "your" arrays, 4 clients, 15 rounds
    python examples/own_data.py --tiny   # the CI check: 2 rounds

From the command line the same files run with
    fedhet run --dataset npz --data-path my-data.npz ...        (x_train, y_train, x_test, y_test[, classes])
    fedhet run --dataset folder --data-path my-images/ ...      (train/<class>/*.png, test/<class>/*.png)
"""

import sys
import tempfile
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

import fedhet
from fedhet.data import from_arrays

tiny = "--tiny" in sys.argv
digits = load_digits()
images = (digits.images * (255 / 16)).round().astype(np.uint8)  # (N, 8, 8), uint8
order = np.random.default_rng(0).permutation(len(images))
train, test = order[:1400], order[1400:]
data = from_arrays(
    images[train], digits.target[train], images[test], digits.target[test],
    class_names=[f"digit {d}" for d in range(10)], name="my-digits",
)  # fmt: skip
print(data)

result = fedhet.run(
    {"data": {"clients": 4, "split": "dirichlet-per-class", "split_params": {"alpha": 0.5}},
     "model": {"name": "mlp"}},
    dataset=data,  # registers it as data.dataset = "my-digits"
    overrides={"train.rounds": 2 if tiny else 15, "train.lr": 0.05},
)  # fmt: skip
print(f"final accuracy {100 * result.accuracy:.2f}% after {result.rounds} rounds")
archive = Path(tempfile.gettempdir()) / "my-digits.npz"  # outside the repository and your working folder
np.savez(archive, x_train=images[train], y_train=digits.target[train],
         x_test=images[test], y_test=digits.target[test])  # fmt: skip
print(f"wrote {archive}: try  fedhet run --dataset npz --data-path {archive} --clients 4 --rounds 5")
