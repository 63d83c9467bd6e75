"""A table, federated: three hospitals, one CSV file each, and who contributed what.

    python examples/tabular.py          # scikit-learn's breast-cancer table as three hospitals' files
    python examples/tabular.py --tiny   # the CI check: 3 rounds

Each hospital's rows go to its own file (train/<hospital>.csv), as they would lie at three sites, plus a
shared test.csv. fedhet reads the folder, standardises the features with statistics aggregated from what
each hospital reports (counts, sums, sums of squares — never rows), gives each hospital its own rows
(data.split = "sites") and runs FedAvg and CELM on them. One hospital holds the only malignant cases of a
rare kind here: every malignant row with a mean radius above 20 sits at hospital-c.

From the command line the same folder runs with
    fedhet run --dataset csv --data-path DIR --model tabular-mlp --set data.label_column=diagnosis \\
               --set data.split=sites --set data.clients=3
Everything is written under a temporary folder, removed at the end.
"""

import csv
import sys
import tempfile
from pathlib import Path

import numpy as np
from sklearn.datasets import load_breast_cancer

import fedhet

tiny = "--tiny" in sys.argv
table = load_breast_cancer()
x, y = table.data, table.target  # 569 rows, 30 numeric features; target 0 = malignant, 1 = benign
names = [str(n) for n in table.feature_names]
order = np.random.default_rng(0).permutation(len(y))
test, train = order[:120], order[120:]

# Three hospitals: the large malignant tumours (mean radius > 20) only at hospital-c; the rest dealt out.
rare = train[(y[train] == 0) & (x[train, 0] > 20)]
rest = np.setdiff1d(train, rare)
sites = {"hospital-a": rest[0::3], "hospital-b": rest[1::3], "hospital-c": np.concatenate([rest[2::3], rare])}

with tempfile.TemporaryDirectory(prefix="fedhet-tabular-") as tmp:
    folder = Path(tmp) / "hospitals"
    (folder / "train").mkdir(parents=True)
    for file, rows in [*((f"train/{site}.csv", idx) for site, idx in sites.items()), ("test.csv", test)]:
        with open(folder / file, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow([*names, "diagnosis"])
            writer.writerows([*x[i], table.target_names[y[i]]] for i in rows)
    print(f"wrote {', '.join(f'{s}: {len(i)} rows' for s, i in sites.items())}; test.csv: {len(test)} rows")
    print(f"hospital-c alone holds the {len(rare)} malignant rows with mean radius > 20")

    config = {
        "data": {"dataset": "csv", "path": str(folder), "label_column": "diagnosis", "split": "sites",
                 "clients": 3},
        "model": {"name": "tabular-mlp"},
        "train": {"rounds": 3 if tiny else 30, "lr": 0.05, "batch_size": 16},
    }  # fmt: skip
    for method in ("fedavg", "celm"):
        result = fedhet.run({**config, "method": {"name": method}})
        line = f"{method:7s} accuracy {100 * result.accuracy:.1f}%"
        if result.contributions is not None:
            shares = ", ".join(f"{s} {w:.2f}" for s, w in zip(sites, result.contributions, strict=True))
            line += f"; CELM's weights: {shares}"
        print(line)
