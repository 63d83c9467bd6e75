"""Record ByzFL's outputs on fixed inputs, the anchor of fedhet's pre-aggregation steps and geometric median.

    pip install --no-deps --target /tmp/byzfl byzfl==0.0.11
    PYTHONPATH=/tmp/byzfl python tools/byzfl_vectors.py tests/data/byzfl_vectors.json

ByzFL (EPFL / INRIA, https://byzfl.epfl.ch) is not a dependency of fedhet: its wheel requires torchvision,
whose PyPI build does not import beside the CPU torch fedhet uses, and its package ``__init__`` imports its
training framework (which imports torchvision). Only ``byzfl.aggregators`` is read here, loaded under an
empty parent package, so ``--no-deps`` suffices (it needs numpy, scipy and torch, which fedhet's environment
has). tests/test_robust_preagg.py compares fedhet with the recorded outputs, so the suite needs no ByzFL.

Every input is a float64 numpy matrix (ByzFL's numpy path keeps float64; its torch path casts to float32).
Recorded per case: NNM(f), ARC(f), Bucketing(s) with the permutation it drew, GeometricMedian with ByzFL's
defaults (ν = 0.1, T = 3, from 0) and run to convergence (ν = 1e-6, T = 5000), and TrMean(f).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

SEED = 20261207


def load_byzfl_aggregators() -> tuple[types.ModuleType, types.ModuleType, str]:
    """ByzFL's aggregators and pre-aggregators modules and its version, without its package ``__init__``."""
    spec = importlib.util.find_spec("byzfl")
    if spec is None:
        sys.exit("byzfl is not importable: pip install --no-deps --target DIR byzfl==0.0.11; PYTHONPATH=DIR")
    parent = types.ModuleType("byzfl")
    parent.__path__ = list(spec.submodule_search_locations)
    sys.modules["byzfl"] = parent
    from byzfl.aggregators import aggregators, preaggregators

    try:
        found = version("byzfl")
    except PackageNotFoundError:
        found = "unknown"
    return aggregators, preaggregators, found


def cases(rng: np.random.Generator) -> list[dict]:
    """Random matrices: n = 10 with f = 3 and an outlier row, n = 7 with f = 2, n = 9 with f = 4 and two
    outliers, n = 10 with f = 1 in 50 dimensions."""
    out = []
    x = rng.normal(size=(10, 6))
    x[4] = 100.0 * rng.normal(size=6)
    out.append({"name": "n10-f3-outlier", "x": x, "f": 3, "bucket_size": 2})
    out.append({"name": "n7-f2", "x": rng.normal(size=(7, 4)), "f": 2, "bucket_size": 3})
    x = rng.normal(loc=1.0, size=(9, 5))
    x[[0, 7]] = -30.0 + rng.normal(size=(2, 5))
    out.append({"name": "n9-f4-two-outliers", "x": x, "f": 4, "bucket_size": 2})
    out.append({"name": "n10-f1-d50", "x": rng.normal(size=(10, 50)), "f": 1, "bucket_size": 4})
    return out


def bucket_means_numpy(x: np.ndarray, s: int) -> np.ndarray:
    """Consecutive buckets of s rows (the last smaller), each one's mean: the permutation check below."""
    return np.stack([x[i : i + s].mean(0) for i in range(0, len(x), s)])


def main(out_path: str) -> None:
    aggregators, preaggregators, found = load_byzfl_aggregators()
    rng = np.random.default_rng(SEED)
    records = []
    for k, case in enumerate(cases(rng)):
        x, f, s = case["x"], case["f"], case["bucket_size"]
        np.random.seed(SEED + k)
        permutation = np.random.permutation(len(x))
        np.random.seed(SEED + k)
        bucketed = preaggregators.Bucketing(s)(x.copy())
        # ByzFL shuffles the rows with numpy's global generator: the same draws as permutation(n) above
        assert np.allclose(bucketed, bucket_means_numpy(x[permutation], s), rtol=0, atol=1e-12)
        records.append(
            {
                "name": case["name"],
                "x": x.tolist(),
                "f": f,
                "bucket_size": s,
                "nnm": preaggregators.NNM(f)(x.copy()).tolist(),
                "arc": preaggregators.ARC(f)(x.copy()).tolist(),
                "bucketing_permutation": permutation.tolist(),
                "bucketing": bucketed.tolist(),
                "geometric_median_byzfl_defaults": aggregators.GeometricMedian()(x.copy()).tolist(),
                "geometric_median_converged": aggregators.GeometricMedian(nu=1e-6, T=5000)(x.copy()).tolist(),
                "trmean": aggregators.TrMean(f)(x.copy()).tolist(),
            }
        )
    document = {
        "source": f"byzfl {found}, recorded by tools/byzfl_vectors.py (seed {SEED})",
        "geometric_median_byzfl_defaults": {"nu": 0.1, "iterations": 3, "start": "zero"},
        "geometric_median_converged": {"nu": 1e-6, "iterations": 5000, "start": "zero"},
        "cases": records,
    }
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {len(records)} cases from byzfl {found} to {out_path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/byzfl_vectors.json")
