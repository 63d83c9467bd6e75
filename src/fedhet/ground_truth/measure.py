"""``fedhet shapley``'s work: every coalition's utilities per seed, kept as records, and the exact values.

One record per seed, ``<out>/<method>-seed<k>.json`` (fedhet.reproduce.store's layout and provenance): the
coalitions' utilities and the values made of them. A record is reused while the experiment (the fingerprint
of the coalitions' config) and the results stamp (the method's, plus :data:`RESULTS_VERSION` of this
package) are those of the code at hand, so an interrupted command loses at most the seed in progress (and
resumes that one from its checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.config import ExperimentConfig
from fedhet.ground_truth.coalitions import (
    CoalitionUtilities,
    coalition_config,
    together_refusal,
    train_one_at_a_time,
    train_together,
)
from fedhet.ground_truth.values import VALUES, t_interval

#: The version of the numbers this package computes (with the method's own stamp): bump it in the commit
#: that changes them, and every ground-truth record is measured again.
RESULTS_VERSION = 1


def ground_truth_stamp(method: str) -> str | None:
    """The results stamp of a ground-truth record of ``method`` in the code at hand."""
    from fedhet.reproduce.store import method_stamp

    stamp = method_stamp(method)
    return None if stamp is None else f"{stamp} ground_truth={RESULTS_VERSION}"


@dataclass
class GroundTruth:
    """The exact values of one federation over its seeds: per value name, (seeds, N) arrays."""

    seeds: list[int]
    utility: str
    values: dict[str, np.ndarray]
    full: np.ndarray  # u(N) per seed
    empty: np.ndarray  # u(∅) per seed
    wall_s: list[float]
    reused: list[bool]
    records: list[Path]

    def interval(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Mean over seeds per client and the 95 % Student-t half-width (NaN with one seed)."""
        return t_interval(self.values[name])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seeds": self.seeds, "utility": self.utility, "clients": {}}
        for name in VALUES:
            mean, half = self.interval(name)
            out["clients"][name] = {
                "mean": mean.tolist(),
                "ci95_half_width": [None if np.isnan(h) else float(h) for h in half],
                "per_seed": self.values[name].tolist(),
            }
        out["full_federation"] = self.full.tolist()
        out["empty_coalition"] = self.empty.tolist()
        out["wall_s"] = self.wall_s
        out["reused"] = self.reused
        out["records"] = [str(p) for p in self.records]
        return out


def measure(
    cfg: ExperimentConfig,
    seeds: list[int],
    out: Path,
    *,
    one_at_a_time: bool = False,
    utility: str = "accuracy",
    progress: Callable[[int, int, int], None] | None = None,
    notify: Callable[[str], None] = print,
) -> GroundTruth:
    """Every seed's coalitions of ``cfg`` (from its record where one holds them), and the values.
    ``progress(seed, done, total)`` is told of each round (together) or coalition (one at a time)."""
    from fedhet.engine.rounds import process_commit
    from fedhet.engine.rundir import run_name
    from fedhet.report.provenance import machine_line
    from fedhet.reproduce.store import read_record, record_path, write_record

    if one_at_a_time or together_refusal(cfg):
        train = train_one_at_a_time
        if not one_at_a_time:
            notify(f"training the coalitions one at a time: {together_refusal(cfg)}")
    else:
        train = train_together
    method = cfg.method.name
    stamp = ground_truth_stamp(method)
    results: list[CoalitionUtilities] = []
    reused, paths = [], []
    for seed in seeds:
        seeded = _with_seed(cfg, seed)
        fingerprint = coalition_config(seeded).run_fingerprint()
        path = record_path(out, method, seed)
        record = read_record(path)
        if record and stamp and record.get("experiment") == fingerprint and record.get("code") == stamp:
            results.append(CoalitionUtilities.from_json(record["coalitions"]))
            reused.append(True)
        else:
            kwargs: dict[str, Any] = {}
            if train is train_together:
                kwargs["checkpoint"] = out / f"{run_name(method, seed)}.checkpoint.pt"
            tick = None if progress is None else (lambda done, total, s=seed: progress(s, done, total))
            result = train(seeded, progress=tick, **kwargs)
            results.append(result)
            reused.append(False)
            write_record(
                path,
                {
                    "experiment": fingerprint,
                    "code": stamp,
                    "method": method,
                    "seed": seed,
                    "commits": [process_commit()],
                    "wall_time_s": result.wall_s,
                    "machine": machine_line(),
                    "trained": train.__name__,
                    "coalitions": result.to_json(),
                },
            )
            if "checkpoint" in kwargs:
                kwargs["checkpoint"].unlink(missing_ok=True)
        paths.append(path)
    table = [r.utilities[utility] for r in results]
    return GroundTruth(
        seeds=list(seeds),
        utility=utility,
        values={name: np.stack([fn(u) for u in table]) for name, fn in VALUES.items()},
        full=np.array([u[-1] for u in table]),
        empty=np.array([u[0] for u in table]),
        wall_s=[r.wall_s for r in results],
        reused=reused,
        records=paths,
    )


def _with_seed(cfg: ExperimentConfig, seed: int) -> ExperimentConfig:
    import copy

    from fedhet.config import apply_overrides

    out = copy.deepcopy(cfg)
    apply_overrides(out, [("seed", str(seed))])
    return out


__all__ = ["GroundTruth", "RESULTS_VERSION", "ground_truth_stamp", "measure"]
