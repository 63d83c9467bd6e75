"""Contribution-ordered nested submodels: the machinery FedRAC, its ablations and FedSAC share.

methods.md §3, baselines.md §1.2-1.3, §2.6-2.7. Each client's contribution c_i is its reference (standalone)
accuracy, an input of the run (``FederationInfo.reference_contributions``); the server gives client i a
submodel, a 0/1 mask over the model's K maskable units, whose validation accuracy stays below a reputation
threshold that grows with c_i. Masks are nested prefixes of a unit order (FedRAC: least-used units first,
FedSAC: most important first), the top contributor gets the full model, and each parameter is averaged
over the clients whose update is non-zero there.

Here: the formulas of methods.md §3.4 (sharpened contributions, thresholds, candidate sizes, allocation,
masked averaging), the batched evaluation of many masks, and :class:`SubmodelStrategy`. The methods
(``fedrac.py``, ``fedsac.py``) choose the unit order and the threshold ratio.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedhet.algorithms.fedavg import FedAvg
from fedhet.algorithms.params import check_flag, check_integer, check_number
from fedhet.engine.protocol import FederationInfo, Instruction, Reply
from fedhet.errors import ConfigError
from fedhet.models.masks import nested_prefix_masks, unit_groups

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
    strict: bool = False,
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


def validation_subset(
    validation: tuple[Tensor, Tensor], count: int | None, rng: np.random.Generator
) -> tuple[Tensor, Tensor]:
    """A fixed random subset of ``count`` validation samples drawn with the server's generator (all of them
    when ``count`` is None or not smaller), in index order."""
    x, y = validation
    if count is None or count >= len(y):
        return x, y
    index = torch.as_tensor(np.sort(rng.choice(len(y), count, replace=False)), device=y.device)
    return x[index], y[index]


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
class SubmodelStrategy(FedAvg):
    """Contribution-ordered nested submodels (FedRAC, its ablations, FedSAC; methods §3.4, baselines §2.6).

    Each round t ≥ 2 (round 1 trains everyone on the full model): evaluate the candidates (nested prefixes
    of :meth:`unit_order`) on the validation set, allocate sizes by the thresholds r_i of
    :meth:`threshold_ratio`, build the masks (:meth:`build_masks`), add them to the frequency table, send
    each client the global model with its mask; aggregate by non-zero-update averaging. Client i's reward
    is the global model under its mask.
    """

    name = "submodel"
    model_needs = frozenset({"masks"})
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
        strict_sizes: bool = False,
    ) -> None:
        super().__init__(weighting="uniform", reward="none")
        if sharpness is not None:
            check_number("sharpness", sharpness, 0.0)
        for key, value in (("candidate_step", candidate_step), ("candidate_step_late", candidate_step_late)):
            if value is not None:
                check_integer(key, value, 1)
        if switch_round is not None:
            check_integer("switch_round", switch_round, 1)
        if validation_samples is not None:
            check_integer("validation_samples", validation_samples, 1)
        check_flag("mask_off_by_one", mask_off_by_one)
        check_flag("strict_sizes", strict_sizes)
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
        model = self.model
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

    def requirements(self) -> frozenset[str]:
        """Candidates are scored on a server validation set; contributions are the reference accuracies."""
        return frozenset({"validation", "reference_contributions"})

    def config_defaults(self) -> dict[str, Any]:
        """A 10% validation split and, for the default model, mlp200 (the papers' maskable MLP)."""
        return {**super().config_defaults(), "model.name": "mlp200"}

    def setup(self, info: FederationInfo) -> None:
        """Contributions from the reference accuracies, the validation (sub)set, the frequency table."""
        super().setup(info)
        self.units = int(getattr(info.model, "maskable_units", 0))
        if not self.units:
            raise ConfigError(
                f"method {self.name!r} needs a model with submodel masks, got {type(info.model).__name__}; "
                "use --model mlp200 or --model resnet18gn"
            )
        self.sharpness = float(self.resolve("sharpness"))
        self.switch_round = int(self.resolve("switch_round"))
        self.steps = (int(self.resolve("candidate_step")), int(self.resolve("candidate_step_late")))
        for step in self.steps:
            n_cand = len(candidate_sizes(self.units, step))
            if n_cand < info.num_clients:
                raise ConfigError(
                    f"candidate step {step} gives {n_cand} candidate submodels of the {self.units} units, "
                    f"fewer than the {info.num_clients} clients need for strictly increasing sizes; use "
                    f"method.params.candidate_step <= {self.units // info.num_clients}"
                )
        self.standalone = np.asarray(info.reference_contributions, dtype=np.float64)
        self.sharpened = sharpen_contributions(self.standalone, self.sharpness)
        # Ascending contribution, ties by client id; the last is the top contributor (full model).
        self.rank_order = np.argsort(self.standalone, kind="stable")
        self.val_x, self.val_y = validation_subset(info.validation, self.validation_samples, info.rng)
        self.frequency = torch.zeros(self.units, dtype=torch.int64)
        self.masks = torch.ones(info.num_clients, self.units)
        self.snapshot_every = max(1, info.rounds // 10)
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
        n = self.info.num_clients
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
        if rnd % self.snapshot_every == 0 or rnd == self.info.rounds:
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
        model = self.scratch_model()
        model.load_state_dict(self.model.state_dict())
        model.set_mask(self.masks[cid])
        return model

    def evaluate_rewards(self, x: Tensor, y: Tensor, batch_size: int) -> list[float]:
        """Every client's reward accuracy in one batched pass over (x, y) (global model under each mask)."""
        return masked_accuracies(self.model, x, y, self.masks, batch_size).tolist()

    def scratch_model(self) -> nn.Module:
        if getattr(self, "_scratch", None) is None:
            self._scratch = copy.deepcopy(self.model)
            self._scratch.set_mask(None)
        return self._scratch

    def round_metrics(self, rnd: int) -> dict[str, Any]:
        """Mask sizes, validation accuracy, thresholds and frequency-table moments of the round."""
        freq = self.frequency.double()
        out: dict[str, Any] = dict(self.last_round_info)
        if rnd == 1:
            out["mask_sizes"] = [self.units] * self.info.num_clients
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

    # -- records ----------------------------------------------------------------------------------------
    def run_records(self) -> dict[str, Any]:
        """Contributions, final mask sizes, frequency snapshots and candidate timings (docs/fedrac.md)."""
        return {
            "submodel": {
                "label": self.label,
                "standalone": self.standalone.tolist(),
                "sharpened": self.sharpened.tolist(),
                "mask_sizes": self.masks.sum(1).round().long().tolist(),
                "units": self.units,
                "layer_sizes": [size for _, size in unit_groups(self.model)],
                "frequency_snapshots": {k: v.tolist() for k, v in self.snapshots.items()},
                "candidate_eval_seconds_mean": (
                    float(np.mean(self.candidate_seconds)) if self.candidate_seconds else None
                ),
            }
        }
