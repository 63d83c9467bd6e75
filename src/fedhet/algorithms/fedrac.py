"""FedRAC (CVPR 2026): collaborative fairness by dynamic reputation and rolling submodel allocation.

methods.md §3, baselines.md §1.2-1.3, §2.6-2.7. Each client's contribution c_i is its standalone test
accuracy (computed by the engine, never hard-coded); the server gives client i a submodel, a 0/1 mask over
the model's K maskable units, whose validation accuracy stays below a reputation threshold that grows with
c_i. Masks are nested prefixes of the least-used units (frequency table), the top contributor gets the full
model, and each parameter is averaged over the clients whose update is non-zero there.

:class:`SubmodelStrategy` holds the machinery FedRAC, its two ablations and FedSAC (``fedsac.py``) share:
sharpened contributions, candidate evaluation, allocation, masked aggregation, batched reward evaluation,
the frequency table and the reports. ``python -m fedhet.algorithms.fedrac RUN_DIR...`` prints fairness and
BCF rates (best / final / mean of the last 100 rounds) of any run directories, FedAvg's included.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedhet.engine.protocol import Instruction, Reply, ServerContext, Strategy
from fedhet.errors import ConfigError
from fedhet.models.masks import nested_prefix_masks, random_mask

#: Per-model defaults of methods.md §3.4 (keyed by model class): β, λ before/after the switch round, the
#: switch round, the candidate step before/after it.
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "MaskedMLP": {
        "sharpness": 80.0,
        "reputation_ratio": 0.2,
        "reputation_ratio_late": 0.8,
        "switch_round": 100,
        "candidate_step": 8,
        "candidate_step_late": 8,
    },
    "ResNet18GN": {
        "sharpness": 10.0,
        "reputation_ratio": 0.95,
        "reputation_ratio_late": 0.95,
        "switch_round": 200,
        "candidate_step": 32,
        "candidate_step_late": 8,
    },
}

#: Rows of the nested-prefix fast path per chunk (an (H, B) activation; 8192 x 200 floats = 6.5 MB).
_FAST_BATCH = 8192


# --------------------------------------------------------------------------------------------------------
# Pure functions (the formulas of methods.md §3.4, testable on their own)
# --------------------------------------------------------------------------------------------------------
def sharpen_contributions(standalone: Sequence[float] | np.ndarray, sharpness: float) -> np.ndarray:
    """c_i^n = 100·exp(β c_i) / max_j exp(β c_j) (methods §3.4 step 1), computed without overflow."""
    c = np.asarray(standalone, dtype=np.float64)
    if c.ndim != 1 or c.size == 0 or not np.all(np.isfinite(c)):
        raise ConfigError(f"standalone accuracies must be a non-empty finite vector, got {c.tolist()}")
    return 100.0 * np.exp(sharpness * (c - c.max()))


def dynamic_ratio(rnd: int, ratio: float, time_scale: float = 0.3, time_offset: float = 3.0) -> float:
    """FedRAC's schedule λ·(1 − 1/ln(ζ·t + κ)) of the share of Acc_g taken off the threshold (§3.4 step 4)."""
    return ratio * (1.0 - 1.0 / math.log(time_scale * rnd + time_offset))


def reputation_thresholds(
    standalone: np.ndarray, sharpened: np.ndarray, global_accuracy: float, ratio: float
) -> np.ndarray:
    """r_i = c_i + (Acc_g − tmp)·c_i^n/100 with tmp = ratio·Acc_g (methods §3.4 step 4, accuracy units)."""
    tmp = ratio * global_accuracy
    return np.asarray(standalone, dtype=np.float64) + (global_accuracy - tmp) * np.asarray(sharpened) / 100.0


def candidate_sizes(total: int, step: int) -> list[int]:
    """Candidate submodel sizes s·step for s = 1..⌈K/step⌉, the last clipped to K (methods §3.4 step 3)."""
    return [min(s * step, total) for s in range(1, math.ceil(total / step) + 1)]


def allocate_sizes(
    thresholds: Sequence[float],
    sizes: Sequence[int],
    accuracies: Sequence[float],
    *,
    off_by_one: bool = False,
    strict: bool = True,
) -> list[int]:
    """Submodel sizes of the non-top clients, given in ascending contribution order (§3.4 step 5).

    Each client takes the largest candidate above the previous client's whose validation accuracy is <= its
    threshold (the previous index + 1 if none is). Paper: that candidate's size, chosen among the proper
    submodels (the full model is the top contributor's). ``off_by_one`` (the code): the candidate tested
    with (s+1)·step units assigns s·step. ``strict`` [ours]: each client's scan leaves one index per later
    client, so sizes strictly increase; without it a client after one that reached the top candidate gets
    the same size (the code's leftover loop variable).
    """
    count, n_cand = len(thresholds), len(sizes)
    if len(accuracies) != n_cand:
        raise ConfigError(f"got {len(accuracies)} candidate accuracies for {n_cand} candidates")
    if count and n_cand < count + 1:
        raise ConfigError(
            f"{n_cand} candidate submodels cannot give {count + 1} clients strictly increasing sizes; "
            "use a smaller candidate step (method.params.candidate_step)"
        )
    out: list[int] = []
    previous = 0  # 1-based candidate index of the previous client (paper) / 0-based tested index (code)
    for rank, threshold in enumerate(thresholds):
        # Highest index this client may take: the code tests up to the full model (0-based n_cand - 1); the
        # paper assigns at most the largest proper submodel (1-based n_cand - 1). Same number either way.
        highest = n_cand - 1 - (count - 1 - rank) if strict else n_cand - 1
        if previous + 1 > highest:
            chosen = previous
        else:
            chosen = previous + 1
            for index in range(highest, previous, -1):
                tested = index if off_by_one else index - 1  # position in the 0-based lists
                if accuracies[tested] <= threshold:
                    chosen = index
                    break
        out.append(int(sizes[chosen - 1]))
        previous = chosen
    return out


def masked_average_update(
    global_weights: Mapping[str, Tensor], client_weights: Sequence[Mapping[str, Tensor]]
) -> dict[str, Tensor]:
    """w_g + Σ_i Δ_i / cnt with cnt = Σ_i 1[Δ_i ≠ 0] per element, 0 where cnt = 0 (methods §3.4 step 4).

    Unweighted, as in the code; an entry no client changed keeps its value exactly.
    """
    out: dict[str, Tensor] = {}
    for key, current in global_weights.items():
        if not current.is_floating_point() or not client_weights:
            out[key] = current.clone()
            continue
        total = torch.zeros_like(current)
        count = torch.zeros_like(current)
        for weights in client_weights:
            delta = weights[key].to(current.device) - current
            total += delta
            count += (delta != 0).to(current.dtype)
        out[key] = torch.where(count > 0, current + total / count.clamp_min(1), current)
    return out


# --------------------------------------------------------------------------------------------------------
# Batched evaluation of many masks
# --------------------------------------------------------------------------------------------------------
def _nesting_order(masks: Tensor) -> Tensor | None:
    """Indices sorting the masks by size when every one contains the previous, else None."""
    order = torch.argsort(masks.sum(dim=1), stable=True)
    ordered = masks[order]
    if ordered.shape[0] > 1 and not bool((ordered[:-1] <= ordered[1:]).all()):
        return None
    return order


@torch.no_grad()
def _nested_mlp_correct(model: nn.Module, x: Tensor, y: Tensor, masks: Tensor) -> Tensor:
    """Correct counts of mlp200 under nested masks (sorted by inclusion), sharing work across them.

    With units of each layer permuted into the order they join the masks, candidate k's layer-1 units are
    the first n1_k rows of h1ᵀ and its layer-2 units the first n2_k rows of the layer-2 pre-activation, so
    that pre-activation grows by one small matrix product per candidate (computed once in total).
    """
    width = model.fc2.in_features
    count = masks.shape[0]
    first, second = masks[:, :width], masks[:, width:]
    join1 = torch.where(first.bool().any(0), first.argmax(0), count)
    join2 = torch.where(second.bool().any(0), second.argmax(0), count)
    perm1, perm2 = torch.argsort(join1, stable=True), torch.argsort(join2, stable=True)
    n1 = first.sum(1).long().tolist()
    n2 = second.sum(1).long().tolist()
    w1, b1 = model.fc1.weight[perm1], model.fc1.bias[perm1]
    w2t = model.fc2.weight[perm2][:, perm1].t().contiguous()  # (layer-1 in join order, layer-2 in join order)
    b2 = model.fc2.bias[perm2]
    wh, bh = model.head.weight[:, perm2].contiguous(), model.head.bias
    correct = torch.zeros(count, dtype=torch.long, device=x.device)
    for start in range(0, len(x), _FAST_BATCH):
        xb, yb = x[start : start + _FAST_BATCH].flatten(1), y[start : start + _FAST_BATCH]
        h1t = torch.relu(torch.addmm(b1[:, None], w1, xb.t()))
        pre = b2[:, None].expand(width, len(xb)).clone()
        done = 0
        for k in range(count):
            if n1[k] > done:
                pre.addmm_(w2t[done : n1[k]].t(), h1t[done : n1[k]])
                done = n1[k]
            if n2[k]:
                # (C, B) logits, transposed to (B, C) so argmax breaks ties like the unbatched forward.
                logits = torch.addmm(bh[:, None], wh[:, : n2[k]], torch.relu(pre[: n2[k]])).t().contiguous()
            else:
                logits = bh.expand(len(xb), -1)
            correct[k] += (logits.argmax(1) == yb).sum()
    return correct


@torch.no_grad()
def masked_accuracies(
    model: nn.Module, x: Tensor, y: Tensor, masks: Tensor, batch_size: int = 2048
) -> np.ndarray:
    """Accuracy of ``model`` on (x, y) under each mask (M, K) in one batched pass (eval mode).

    Nested masks on mlp200 take the shared-prefix fast path; anything else goes through ``masked_logits``
    batch by batch. Equals :func:`masked_accuracies_loop` (tested).
    """
    from fedhet.models import masked_logits
    from fedhet.models.mlp import MaskedMLP

    if len(y) == 0:
        return np.full(masks.shape[0], np.nan)
    was_training = model.training
    model.eval()
    try:
        masks = masks.to(device=x.device, dtype=torch.float32)
        order = _nesting_order(masks) if isinstance(model, MaskedMLP) else None
        if order is not None:
            correct = torch.empty_like(order)
            correct[order] = _nested_mlp_correct(model, x, y, masks[order])
        else:
            correct = torch.zeros(masks.shape[0], dtype=torch.long, device=x.device)
            for start in range(0, len(x), batch_size):
                logits = masked_logits(model, x[start : start + batch_size], masks)
                correct += (logits.argmax(-1) == y[start : start + batch_size]).sum(1)
    finally:
        model.train(was_training)
    # float32 division, as accuracy_of does, so equal counts give identical numbers for every method (a
    # reward equal to the standalone accuracy must compare equal in the BCF test, not by rounding luck).
    return (correct.to(torch.float32) / len(y)).cpu().double().numpy()


def masked_accuracies_loop(
    model: nn.Module, x: Tensor, y: Tensor, masks: Tensor, batch_size: int = 2048
) -> np.ndarray:
    """The per-mask reference: set each mask and evaluate the model on (x, y) (the code's loop)."""
    from fedhet.engine.evaluation import accuracy_of

    previous = model.get_mask()
    try:
        out = []
        for mask in masks:
            model.set_mask(mask)
            out.append(accuracy_of(model, x, y, batch_size))
    finally:
        model.set_mask(previous)
    return np.array(out, dtype=np.float64)


# --------------------------------------------------------------------------------------------------------
# The shared strategy
# --------------------------------------------------------------------------------------------------------
def _check_number(
    name: str, value: Any, low: float, high: float = math.inf, *, integer: bool = False
) -> None:
    kind = "an integer" if integer else "a number"
    ok = not isinstance(value, bool) and isinstance(value, int | float)
    if ok and integer:
        ok = float(value).is_integer()
    if not ok or not (low <= value <= high) or (isinstance(value, float) and not math.isfinite(value)):
        bounds = f">= {low}" if high == math.inf else f"in [{low}, {high}]"
        raise ConfigError(f"method.params.{name}={value!r} must be {kind} {bounds}")


class SubmodelStrategy(Strategy):
    """Contribution-ordered nested submodels (FedRAC, its ablations, FedSAC; methods §3.4, baselines §2.6).

    Each round t ≥ 2 (round 1 trains everyone on the full model): evaluate the candidates (nested prefixes
    of :meth:`unit_order`) on the validation set, allocate sizes by the thresholds r_i of
    :meth:`threshold_ratio`, build the masks (:meth:`build_masks`), add them to the frequency table, send
    each client the global model with its mask; aggregate by non-zero-update averaging. Client i's reward
    is the global model under its mask.
    """

    name = "submodel"
    #: Short label in figure titles.
    label = "submodel"

    def __init__(
        self,
        *,
        sharpness: float | None = None,
        candidate_step: int | None = None,
        candidate_step_late: int | None = None,
        switch_round: int | None = None,
        validation_samples: int | None = None,
        mask_off_by_one: bool = False,
        strict_sizes: bool = True,
    ) -> None:
        super().__init__(weighting="uniform", reward="none")
        if sharpness is not None:
            _check_number("sharpness", sharpness, 0.0)
        for key, value in (("candidate_step", candidate_step), ("candidate_step_late", candidate_step_late)):
            if value is not None:
                _check_number(key, value, 1, integer=True)
        if switch_round is not None:
            _check_number("switch_round", switch_round, 1, integer=True)
        if validation_samples is not None:
            _check_number("validation_samples", validation_samples, 1, integer=True)
        for key, value in (("mask_off_by_one", mask_off_by_one), ("strict_sizes", strict_sizes)):
            if not isinstance(value, bool):
                raise ConfigError(f"method.params.{key}={value!r} must be true or false")
        self._requested = {
            "sharpness": sharpness,
            "candidate_step": candidate_step,
            "candidate_step_late": candidate_step_late,
            "switch_round": switch_round,
        }
        self.validation_samples = validation_samples
        self.mask_off_by_one = mask_off_by_one
        self.strict_sizes = strict_sizes
        self.candidate_seconds: list[float] = []

    # -- set-up ---------------------------------------------------------------------------------------
    def model_defaults(self) -> dict[str, Any]:
        """The §3.4 defaults of the run's model (ConfigError for a model without defaults)."""
        model = self.ctx.model
        defaults = MODEL_DEFAULTS.get(type(model).__name__)
        if defaults is None:
            missing = [k for k, v in self._requested.items() if v is None]
            raise ConfigError(
                f"method {self.name!r} has no defaults for model {type(model).__name__}; "
                f"set method.params {missing} explicitly"
            )
        return defaults

    def resolve(self, key: str) -> Any:
        """A parameter's value: the one configured, else the model's default."""
        value = self._requested.get(key)
        return self.model_defaults()[key] if value is None else value

    def setup(self, ctx: ServerContext) -> None:
        """Contributions from the cached standalone run, the validation (sub)set, the frequency table."""
        super().setup(ctx)
        if ctx.validation is None:
            raise ConfigError(
                f"method {self.name!r} evaluates candidate submodels on a server validation set, but the run "
                "holds none; set data.validation_fraction=0.1 (--set data.validation_fraction=0.1), as the "
                "configs in configs/fedrac/ do"
            )
        if ctx.standalone_accuracies is None:
            raise ConfigError(
                f"method {self.name!r} needs the engine's standalone accuracies (contributions)"
            )
        self.units = int(getattr(ctx.model, "maskable_units", 0))
        if not self.units:
            raise ConfigError(
                f"method {self.name!r} needs a model with submodel masks, got {type(ctx.model).__name__}; "
                "use --model mlp200 or --model resnet18gn"
            )
        self.sharpness = float(self.resolve("sharpness"))
        self.switch_round = int(self.resolve("switch_round"))
        self.steps = (int(self.resolve("candidate_step")), int(self.resolve("candidate_step_late")))
        for step in self.steps:
            n_cand = len(candidate_sizes(self.units, step))
            if n_cand < ctx.num_clients:
                raise ConfigError(
                    f"candidate step {step} gives {n_cand} candidate submodels of the {self.units} units, "
                    f"fewer than the {ctx.num_clients} clients need for strictly increasing sizes; use "
                    f"method.params.candidate_step <= {self.units // ctx.num_clients}"
                )
        standalone = np.asarray(ctx.standalone_accuracies(), dtype=np.float64)
        if standalone.shape != (ctx.num_clients,) or not np.all(np.isfinite(standalone)):
            raise ConfigError(
                f"standalone accuracies {standalone.tolist()} must hold one finite value per client "
                f"({ctx.num_clients}); delete the standalone cache (FEDHET_CACHE) and rerun"
            )
        self.standalone = standalone
        self.sharpened = sharpen_contributions(standalone, self.sharpness)
        # Ascending contribution, ties by client id; the last is the top contributor (full model).
        self.rank_order = np.argsort(standalone, kind="stable")
        val_x, val_y = ctx.validation
        if self.validation_samples is not None and self.validation_samples < len(val_y):
            pick = np.sort(ctx.rng.choice(len(val_y), self.validation_samples, replace=False))
            index = torch.as_tensor(pick, device=val_y.device)
            val_x, val_y = val_x[index], val_y[index]
        self.val_x, self.val_y = val_x, val_y
        self.frequency = torch.zeros(self.units, dtype=torch.int64)
        self.masks = torch.ones(ctx.num_clients, self.units)
        self.snapshot_every = max(1, ctx.rounds // 10)
        self.snapshots: dict[str, Tensor] = {}
        self.last_round_info: dict[str, Any] = {}

    # -- hooks subclasses override ----------------------------------------------------------------------
    def unit_order(self, rnd: int) -> Tensor:
        """π, the order the candidates are prefixes of: least-used units first (FedRAC's rolling)."""
        return torch.argsort(self.frequency, stable=True)

    def threshold_ratio(self, rnd: int) -> float:
        """tmp/Acc_g of the reputation threshold in round ``rnd``."""
        raise NotImplementedError

    def build_masks(self, order: Tensor, sizes: np.ndarray, rnd: int) -> Tensor:
        """(N, K) masks: client i gets the first ``sizes[i]`` units of π (nested prefixes)."""
        masks = nested_prefix_masks(order, [int(s) for s in sizes], self.units)
        return masks

    def candidate_step(self, rnd: int) -> int:
        """Units between consecutive candidates (the §3.4 step, switching after ``switch_round``)."""
        return self.steps[0] if rnd <= self.switch_round else self.steps[1]

    # -- one round --------------------------------------------------------------------------------------
    def allocate(self, rnd: int) -> None:
        """Steps 1-6 of methods §3.4: candidates, thresholds, sizes, masks, frequency table."""
        n = self.ctx.num_clients
        order = self.unit_order(rnd).cpu()
        sizes = candidate_sizes(self.units, self.candidate_step(rnd))
        started = time.perf_counter()
        candidates = nested_prefix_masks(order, sizes, self.units)
        accuracies = masked_accuracies(self.model, self.val_x, self.val_y, candidates)
        self.candidate_seconds.append(time.perf_counter() - started)
        global_accuracy = float(accuracies[-1])  # the last candidate is the full model
        ratio = self.threshold_ratio(rnd)
        thresholds = reputation_thresholds(self.standalone, self.sharpened, global_accuracy, ratio)
        ranked = self.rank_order
        low_sizes = allocate_sizes(
            thresholds[ranked[:-1]],
            sizes,
            accuracies,
            off_by_one=self.mask_off_by_one,
            strict=self.strict_sizes,
        )
        client_sizes = np.zeros(n, dtype=np.int64)
        client_sizes[ranked[:-1]] = low_sizes
        client_sizes[ranked[-1]] = self.units
        self.masks = self.build_masks(order, client_sizes, rnd).cpu()
        self.last_round_info = {
            "mask_sizes": client_sizes.tolist(),
            "validation_accuracy": global_accuracy,
            "threshold_ratio": ratio,
            "thresholds": thresholds.tolist(),
        }

    def configure(self, rnd: int, client_ids: list[int]) -> dict[int, Instruction]:
        """Allocate (from round 2 on) and send each client the global model with its mask."""
        self.last_round_info = {}
        if rnd >= 2:
            self.allocate(rnd)
            self.frequency += self.masks[client_ids].sum(0).round().long()
        if rnd % self.snapshot_every == 0 or rnd == self.ctx.rounds:
            self.snapshots[str(rnd)] = self.frequency.clone()
        weights = self.global_weights()
        return {cid: Instruction(weights=weights, mask=self.masks[cid].clone()) for cid in client_ids}

    def aggregate(self, rnd: int, replies: dict[int, Reply]) -> None:
        """Average each parameter over the clients whose update is non-zero there (methods §3.4 step 4)."""
        if not replies:
            return
        ids = sorted(replies)
        current = self.model.state_dict()
        self.model.load_state_dict(masked_average_update(current, [replies[c].weights for c in ids]))

    # -- rewards ----------------------------------------------------------------------------------------
    def has_rewards(self) -> bool:
        return True

    def reward_model(self, cid: int) -> nn.Module:
        """The global model restricted to client ``cid``'s current mask (its reward, methods §3.5)."""
        model = self._scratch_model()
        model.load_state_dict(self.model.state_dict())
        model.set_mask(self.masks[cid])
        return model

    def evaluate_rewards(self, x: Tensor, y: Tensor, batch_size: int) -> list[float]:
        """Every client's reward accuracy in one batched pass over (x, y) (global model under each mask)."""
        return masked_accuracies(self.model, x, y, self.masks, batch_size).tolist()

    def _scratch_model(self) -> nn.Module:
        if getattr(self, "_scratch", None) is None:
            self._scratch = copy.deepcopy(self.model)
            self._scratch.set_mask(None)
        return self._scratch

    def round_metrics(self, rnd: int) -> dict[str, Any]:
        """Mask sizes, validation accuracy, thresholds and frequency-table moments of the round."""
        freq = self.frequency.double()
        out: dict[str, Any] = dict(self.last_round_info)
        if rnd == 1:
            out["mask_sizes"] = [self.units] * self.ctx.num_clients
            out["sharpened_contributions"] = self.sharpened.tolist()
        out["frequency_mean"] = float(freq.mean())
        out["frequency_var"] = float(freq.var(unbiased=False))
        return out

    # -- state ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "model": dict(self.model.state_dict()),
            "frequency": self.frequency.clone(),
            "masks": self.masks.clone(),
            "snapshots": {k: v.clone() for k, v in self.snapshots.items()},
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        self.model.load_state_dict(sd["model"])
        self.frequency = sd["frequency"].clone().to(torch.int64)
        self.masks = sd["masks"].clone().float()
        self.snapshots = {k: v.clone().to(torch.int64) for k, v in sd.get("snapshots", {}).items()}

    # -- reports ----------------------------------------------------------------------------------------
    def write_artifacts(self, run_dir: Any) -> None:
        """clients.csv, unit_frequency.csv, fairness_summary.json and four figures (see docs/fedrac.md)."""
        run_dir = Path(run_dir)
        lines = _read_metrics(run_dir)
        summary = (
            json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
        )
        alpha = _bcf_alpha(run_dir)
        rewards = summary.get("rewards") or [math.nan] * self.ctx.num_clients
        sizes = self.masks.sum(1).round().long().tolist()
        rows = ["client,standalone,sharpened_contribution,mask_size,reward"]
        for cid in range(self.ctx.num_clients):
            reward = rewards[cid] if rewards[cid] is not None else math.nan
            rows.append(
                f"{cid},{self.standalone[cid]:.6f},{self.sharpened[cid]:.6f},{sizes[cid]},{reward:.6f}"
            )
        (run_dir / "clients.csv").write_text("\n".join(rows) + "\n")
        snap_rounds = sorted(int(k) for k in self.snapshots)
        freq_rows = ["round," + ",".join(f"unit_{u}" for u in range(self.units))]
        for r in snap_rounds:
            freq_rows.append(f"{r}," + ",".join(str(int(v)) for v in self.snapshots[str(r)].tolist()))
        (run_dir / "unit_frequency.csv").write_text("\n".join(freq_rows) + "\n")
        report = fairness_summary(lines, rounds=self.ctx.rounds)
        report["candidate_eval_seconds_mean"] = (
            float(np.mean(self.candidate_seconds)) if self.candidate_seconds else None
        )
        (run_dir / "fairness_summary.json").write_text(json.dumps(report, indent=2))
        figures = run_dir / "figures"
        figures.mkdir(parents=True, exist_ok=True)
        title = self.label
        plot_rewards_scatter(self.standalone, rewards, alpha, figures / "rewards_vs_standalone.png", title)
        plot_unit_frequency(
            {r: self.snapshots[str(r)].numpy() for r in snap_rounds},
            self.ctx.num_clients,
            figures / "unit_frequency.png",
            title,
            split=self._layer_sizes(),
        )
        plot_fairness_rounds(lines, report, figures / "fairness_rate.png", title)
        plot_mask_sizes(lines, self.standalone, figures / "mask_sizes.png", title)

    def _layer_sizes(self) -> list[int]:
        from fedhet.models.masks import unit_groups

        return [size for _, size in unit_groups(self.model)]


class FedRAC(SubmodelStrategy):
    """FedRAC (CVPR'26): dynamic reputation λ·(1−1/ln(ζt+κ)) and rolling (least-used-first) submodels.

    Defaults per model (methods §3.4): mlp200 β=80, λ 0.2 → 0.8 after round 100, step 8; resnet18gn β=10,
    λ=0.95, step 32 → 8 after round 200. ``mask_off_by_one`` reproduces the code's mask-size quirk.
    """

    name = "fedrac"
    label = "FedRAC"

    def __init__(
        self,
        sharpness: float | None = None,
        reputation_ratio: float | None = None,
        reputation_ratio_late: float | None = None,
        switch_round: int | None = None,
        time_scale: float = 0.3,
        time_offset: float = 3.0,
        candidate_step: int | None = None,
        candidate_step_late: int | None = None,
        validation_samples: int | None = None,
        mask_off_by_one: bool = False,
        strict_sizes: bool = True,
    ) -> None:
        super().__init__(
            sharpness=sharpness,
            candidate_step=candidate_step,
            candidate_step_late=candidate_step_late,
            switch_round=switch_round,
            validation_samples=validation_samples,
            mask_off_by_one=mask_off_by_one,
            strict_sizes=strict_sizes,
        )
        for key, value in (
            ("reputation_ratio", reputation_ratio),
            ("reputation_ratio_late", reputation_ratio_late),
        ):
            if value is not None:
                _check_number(key, value, 0.0, 1.0)
        _check_number("time_scale", time_scale, 1e-12)
        # ln(ζ·t + κ) must stay above 0 from t = 2 on, or the schedule's 1/ln blows up.
        _check_number("time_offset", time_offset, 1.0 + 1e-9)
        self._requested["reputation_ratio"] = reputation_ratio
        self._requested["reputation_ratio_late"] = reputation_ratio_late
        self.time_scale = float(time_scale)
        self.time_offset = float(time_offset)

    def threshold_ratio(self, rnd: int) -> float:
        """λ_t·(1 − 1/ln(ζ·t + κ)), λ_t = ``reputation_ratio`` up to ``switch_round``, then ``_late``."""
        key = "reputation_ratio" if rnd <= self.switch_round else "reputation_ratio_late"
        return dynamic_ratio(rnd, float(self.resolve(key)), self.time_scale, self.time_offset)


class FedRACFixedRatio(SubmodelStrategy):
    """FedRAC without dynamic reputation (paper's ablation): tmp = ``fixed_ratio``·Acc_g every round.

    ``fixed_ratio`` = 0.4 [ours]: the code's declared but unused ``alpha`` (its commented-out ``al = alpha``).
    """

    name = "fedrac-fixed-ratio"
    label = "FedRAC w/o dynamic reputation"

    def __init__(
        self,
        fixed_ratio: float = 0.4,
        sharpness: float | None = None,
        switch_round: int | None = None,
        candidate_step: int | None = None,
        candidate_step_late: int | None = None,
        validation_samples: int | None = None,
        mask_off_by_one: bool = False,
        strict_sizes: bool = True,
    ) -> None:
        super().__init__(
            sharpness=sharpness,
            candidate_step=candidate_step,
            candidate_step_late=candidate_step_late,
            switch_round=switch_round,
            validation_samples=validation_samples,
            mask_off_by_one=mask_off_by_one,
            strict_sizes=strict_sizes,
        )
        _check_number("fixed_ratio", fixed_ratio, 0.0, 1.0)
        self.fixed_ratio = float(fixed_ratio)

    def threshold_ratio(self, rnd: int) -> float:
        return self.fixed_ratio


class FedRACRandomMasks(FedRAC):
    """FedRAC without rolling allocation (paper's ablation): random submodels of the allocated sizes.

    [ours] Candidates are prefixes of a fresh random unit order each round (sizes still follow the
    thresholds); each non-top client then gets an independent uniformly random mask of its size.
    """

    name = "fedrac-random-masks"
    label = "FedRAC w/o rolling allocation"

    def _round_generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(int(self.ctx.rng.integers(0, 2**63 - 1)))

    def unit_order(self, rnd: int) -> Tensor:
        return torch.randperm(self.units, generator=self._round_generator())

    def build_masks(self, order: Tensor, sizes: np.ndarray, rnd: int) -> Tensor:
        generator = self._round_generator()
        return torch.stack([random_mask(self.units, int(s), generator) for s in sizes])


# --------------------------------------------------------------------------------------------------------
# Fairness summaries and figures
# --------------------------------------------------------------------------------------------------------
SUMMARY_KEYS = ("fairness_pearson", "bcf_rate", "bcf_rate_code", "accuracy")


def _read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(s) for s in path.read_text().splitlines() if s.strip()]


def _bcf_alpha(run_dir: Path) -> float:
    path = run_dir / "config.toml"
    if path.is_file():
        from fedhet.config import load_config

        return float(load_config(path).eval.bcf_alpha)
    return 0.5


def fairness_summary(lines: Sequence[Mapping[str, Any]], rounds: int | None = None, last: int = 100) -> dict:
    """Best over evaluated rounds, final, and mean over the last ``last`` rounds of fairness, rates, accuracy.

    "Last 100 rounds" = evaluated rounds r > R − 100 (R = ``rounds`` or the last round logged).
    """
    final_round = rounds if rounds is not None else max((int(ln["round"]) for ln in lines), default=0)
    out: dict[str, Any] = {"rounds": final_round, "last_rounds": last}
    for key in SUMMARY_KEYS:
        series = [
            (int(ln["round"]), float(ln[key]))
            for ln in lines
            if isinstance(ln.get(key), int | float) and math.isfinite(float(ln[key]))
        ]
        if not series:
            out[key] = None
            continue
        values = np.array([v for _, v in series])
        tail = np.array([v for r, v in series if r > final_round - last])
        out[key] = {
            "best": float(values.max()),
            "best_round": int(series[int(values.argmax())][0]),
            "final": float(values[-1]) if series[-1][0] == final_round else None,
            f"last{last}_mean": float(tail.mean()) if tail.size else None,
        }
    return out


def _figure(width: float = 6.5, height: float = 4.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def plot_rewards_scatter(
    standalone: Sequence[float], rewards: Sequence[float | None], alpha: float, path: Path, title: str
) -> bool:
    """Reward vs standalone accuracy per client, with the α-BCF bounds s < a ≤ ((1−α)s/max s + α)·max a."""
    s = np.asarray(standalone, dtype=float)
    a = np.array([math.nan if v is None else v for v in rewards], dtype=float)
    if not np.all(np.isfinite(a)):
        return False
    fig = _figure(5.6, 5.0)
    ax = fig.add_subplot(1, 1, 1)
    grid = np.linspace(min(s.min(), a.min()) - 0.02, max(s.max(), a.max()) + 0.02, 100)
    upper = ((1 - alpha) * grid / s.max() + alpha) * a.max()
    ax.plot(100 * grid, 100 * grid, color="gray", lw=1, label="lower bound: reward = standalone")
    ax.plot(100 * grid, 100 * upper, color="tab:red", lw=1, ls="--", label=f"upper bound (α = {alpha:g})")
    passed = (s < a) & (a <= ((1 - alpha) * s / s.max() + alpha) * a.max())
    ax.scatter(100 * s[passed], 100 * a[passed], color="tab:green", s=30, label="within BCF bounds")
    ax.scatter(100 * s[~passed], 100 * a[~passed], color="tab:orange", marker="x", s=36, label="outside")
    for cid, (x, y) in enumerate(zip(s, a, strict=True)):
        ax.annotate(str(cid), (100 * x, 100 * y), textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.set_xlabel("standalone accuracy (%)")
    ax.set_ylabel("reward accuracy, final round (%)")
    ax.set_title(f"{title}: rewards vs standalone ({int(passed.sum())}/{len(s)} within BCF)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return True


def plot_unit_frequency(
    snapshots: Mapping[int, np.ndarray], clients: int, path: Path, title: str, split: Sequence[int] = ()
) -> bool:
    """Left: per-unit share of allocated masks at each snapshot round; right: histograms of those shares."""
    usable = {r: f for r, f in snapshots.items() if r >= 2}
    if not usable:
        return False
    fig = _figure(10.0, 4.0)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for r, freq in sorted(usable.items()):
        share = freq / (clients * (r - 1))
        left.plot(np.arange(len(share)), share, lw=0.8, label=f"round {r}")
        right.hist(share, bins=30, range=(0, 1), histtype="step", lw=1.2, label=f"round {r}")
    edge = 0
    for size in list(split)[:-1]:
        edge += size
        left.axvline(edge, color="gray", lw=0.6, ls=":")
    left.set_xlabel("unit index (dotted: mask-point boundaries)")
    left.set_ylabel("share of client masks holding the unit")
    left.set_ylim(0, 1.02)
    right.set_xlabel("share of client masks holding the unit")
    right.set_ylabel("units")
    left.set_title(f"{title}: unit frequency over rounds", fontsize=9)
    right.set_title("histogram per snapshot round", fontsize=9)
    right.legend(fontsize=6)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return True


def plot_fairness_rounds(
    lines: Sequence[Mapping[str, Any]], report: Mapping[str, Any], path: Path, title: str
) -> bool:
    """Fairness (ρ×100) and the BCF rates (clean and code variant) per evaluated round."""
    rounds = [ln["round"] for ln in lines if isinstance(ln.get("fairness_pearson"), int | float)]
    if not rounds:
        return False
    fig = _figure(10.0, 4.0)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    fair = [ln["fairness_pearson"] for ln in lines if isinstance(ln.get("fairness_pearson"), int | float)]
    left.plot(rounds, fair, lw=1, color="tab:blue")
    info = report.get("fairness_pearson") or {}
    if info:
        text = f"best {info['best']:.2f} (round {info['best_round']})"
        if info.get("final") is not None:
            text += f", final {info['final']:.2f}"
        tail = info.get(f"last{report.get('last_rounds', 100)}_mean")
        if tail is not None:
            text += f", last-{report.get('last_rounds', 100)} mean {tail:.2f}"
        left.set_title(f"{title}: fairness\n{text}", fontsize=8)
    left.set_xlabel("round")
    left.set_ylabel("fairness (100·Pearson)")
    for key, label in (("bcf_rate", "BCF rate (clean)"), ("bcf_rate_code", "BCF rate (code variant)")):
        xs = [ln["round"] for ln in lines if isinstance(ln.get(key), int | float)]
        ys = [ln[key] for ln in lines if isinstance(ln.get(key), int | float)]
        if xs:
            right.plot(xs, ys, lw=1, label=label)
    right.set_xlabel("round")
    right.set_ylabel("rate")
    right.set_title("α-BCF rate per round (code variant: −10/N penalty)", fontsize=8)
    right.legend(fontsize=7)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return True


def plot_mask_sizes(
    lines: Sequence[Mapping[str, Any]], standalone: np.ndarray, path: Path, title: str
) -> bool:
    """Each client's mask size per round, clients coloured by standalone accuracy."""
    rows = [(ln["round"], ln["mask_sizes"]) for ln in lines if ln.get("mask_sizes")]
    if not rows:
        return False
    rounds = [r for r, _ in rows]
    sizes = np.array([s for _, s in rows], dtype=float)
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    import matplotlib

    cmap = matplotlib.colormaps["viridis"]
    span = max(float(np.ptp(standalone)), 1e-12)
    for cid in range(sizes.shape[1]):
        colour = cmap((standalone[cid] - standalone.min()) / span)
        ax.plot(rounds, sizes[:, cid], color=colour, lw=0.9, label=f"{cid} ({100 * standalone[cid]:.1f}%)")
    ax.set_xlabel("round")
    ax.set_ylabel("mask size (units)")
    ax.set_title(f"{title}: submodel size per client (legend: standalone acc.)", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return True


def main(argv: list[str] | None = None) -> int:
    """Print fairness/rate/accuracy best, final and last-K mean of run directories (a row per run), then
    per method the mean ± std over its runs (seeds) as a Markdown table."""
    args = list(sys.argv[1:] if argv is None else argv)
    last = 100
    if args[:1] == ["--last"]:
        last, args = int(args[1]), args[2:]
    if not args:
        print("usage: python -m fedhet.algorithms.fedrac [--last K] RUN_OR_COMPARE_DIR...", file=sys.stderr)
        return 2
    from fedhet.report import find_runs

    fields = ("best", "final", f"last{last}_mean")
    header = ["run", "method", "seed"] + [f"{k}:{f.split('_')[0]}" for k in SUMMARY_KEYS for f in fields]
    print("\t".join(header))
    by_method: dict[str, list[list[float]]] = {}
    for run in find_runs([Path(a) for a in args]):
        summary = json.loads((run / "summary.json").read_text())
        report = fairness_summary(_read_metrics(run), rounds=summary.get("rounds"), last=last)
        values = []
        for key in SUMMARY_KEYS:
            info = report.get(key) or {}
            values += [math.nan if info.get(f) is None else float(info[f]) for f in fields]
        by_method.setdefault(str(summary.get("method")), []).append(values)
        cells = [run.name, str(summary.get("method")), str(summary.get("seed"))]
        print("\t".join(cells + ["—" if math.isnan(v) else f"{v:.4f}" for v in values]))
    print()
    names = {
        "fairness_pearson": "fairness",
        "bcf_rate": "rate",
        "bcf_rate_code": "rate (code)",
        "accuracy": "acc %",
    }
    cols = [f"{names[k]} {f.split('_')[0]}" for k in SUMMARY_KEYS for f in fields]
    print("| method | runs | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for method, rows in by_method.items():
        table = np.array(rows, dtype=float)
        cells = []
        for j, col in enumerate(cols):
            column = table[:, j][~np.isnan(table[:, j])]
            scale = 100.0 if col.startswith("acc") else 1.0
            digits = 2 if col.startswith(("acc", "fairness")) else 3
            if column.size == 0:
                cells.append("—")
            elif column.size == 1:
                cells.append(f"{scale * column[0]:.{digits}f}")
            else:
                cells.append(f"{scale * column.mean():.{digits}f} ± {scale * column.std():.{digits}f}")
        print(f"| {method} | {len(rows)} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
