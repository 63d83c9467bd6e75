"""Contribution-ordered nested submodels: the formulas and the candidate evaluation FedRAC and FedSAC share.

methods.md §3.4: sharpened contributions, reputation thresholds, candidate sizes, the allocation of sizes,
masked averaging, and the data-free scores [ours, docs/data-free-fairness.md] (evidence coverage, relative
reputations and scores); then the batched evaluation of many masks at once (:func:`masked_accuracies`).
Pure functions of tensors and arrays, testable on their own;
:class:`~fedhet.algorithms.submodel.SubmodelStrategy` drives them each round.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from fedhet.errors import ConfigError

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1

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


def evidence_coverage(raw: np.ndarray) -> np.ndarray:
    """[ours] κ_i = (1/K) Σ_c max(0, q̃_{i,c}) / max_c' max(0, q̃_{i,c'}); 0 for a row with no positive entry.

    q̃ is CELM's raw evidence (N, K), each model's maximised logit per class. Each model is measured against
    its own strongest class, so its logit scale drops out (a one-class head pushes its class's logit far
    higher than a ten-class head pushes any), and κ_i ∈ [0, 1] is the share of the classes the client's
    model holds evidence for: the data-free analogue of a standalone accuracy. CELM's own weights share each
    class's de-biased evidence among its holders instead, which values rare classes (its contribution).
    """
    q = np.maximum(np.asarray(raw, dtype=np.float64), 0.0)
    top = q.max(axis=1, keepdims=True)
    ratio = np.divide(q, top, out=np.zeros_like(q), where=top > 0)
    return ratio.mean(axis=1)


def relative_reputation(values: np.ndarray) -> np.ndarray:
    """ρ_i = v_i / max_j v_j: contributions relative to the top client's (all ones if none is positive)."""
    v = np.asarray(values, dtype=np.float64)
    top = float(v.max()) if v.size else 0.0
    return v / top if top > 0 else np.ones_like(v)


def relative_scores(accuracies: np.ndarray) -> np.ndarray:
    """Candidate accuracies relative to the full model's (the last candidate), which scores 1 [ours]."""
    a = np.asarray(accuracies, dtype=np.float64)
    full = float(a[-1])
    return a / full if full > 0 else a.copy()


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
