"""FedAvg against CELM on Fashion-MNIST's maverick split, from Python (about 4 minutes on 2 cores).

python examples/quickstart.py          # 20 rounds, 2 seeds
python examples/quickstart.py --tiny   # the CI check: 2 rounds on a data subset
"""

import sys

import fedhet

tiny = "--tiny" in sys.argv
table = fedhet.compare(
    "celm/fmnist-maverick",  # a shipped experiment (`fedhet experiments` lists them), or a .toml path
    methods=["fedavg", "celm"],
    seeds=[0] if tiny else [0, 1],
    overrides={"train.rounds": 2 if tiny else 20, "data.max_train_samples": 3000 if tiny else None},
)
for row in table.rows:
    recall = table.runs[row["method"]][0].final["per_class_recall"][0]  # class 0: the maverick's class
    mean, std = 100 * row["mean"]["accuracy"], 100 * row["std"]["accuracy"]
    print(f"{row['method']:>7}: accuracy {mean:.2f} ± {std:.2f}   class-0 recall (seed 0) {recall:.2f}")
print("CELM's weights (seed 0):", [round(w, 3) for w in table.runs["celm"][0].contributions])
print("runs in", table.out_dir)
