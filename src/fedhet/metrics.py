"""Metrics of the three papers: accuracy, balanced accuracy, per-class / rare-class recall (CELM),
collaborative fairness and the BCF rate (FedRAC/FedSAC), IPR (IAFL), free-rider reports, and the
best / final / last-k summaries over rounds and seeds
(spec: baselines.md §1, §5 item 6; methods.md §1.3, §3.5).

Conventions:
- Accuracies and recalls are fractions in [0, 1]; fairness is a correlation times 100 (range -100..100).
- Every array argument may be a numpy array, a list or a torch tensor (moved to the CPU; half-precision
  tensors are widened). A 2-D prediction argument is treated as logits and arg-maxed along axis 1.
- Undefined values (the recall of a class with no test samples, a correlation of a constant series) are NaN,
  never an exception; malformed arguments (lengths, ranges, unknown names) raise ``ConfigError``
  (a ``ValueError``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedhet.errors import ConfigError

ArrayLike = Any  # np.ndarray | torch.Tensor | Sequence[float]; kept loose so torch need not be imported

FAIRNESS_KINDS = ("pearson", "spearman")
SERIES_MODES = ("max", "min")


# --------------------------------------------------------------------------------------------------
# conversion and validation helpers


def _to_numpy(values: ArrayLike, name: str) -> np.ndarray:
    """Convert a list, numpy array or torch tensor to a numpy array without importing torch."""
    if hasattr(values, "detach") and hasattr(values, "cpu"):
        tensor = values.detach().cpu()
        # bfloat16/float16 have no numpy counterpart that .numpy() accepts (bfloat16) or keeps exact enough.
        if getattr(tensor.dtype, "is_floating_point", False) and tensor.element_size() < 4:
            tensor = tensor.float()
        return tensor.numpy()
    try:
        return np.asarray(values)
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"{name} must be array-like (list, numpy array or torch tensor), "
            f"got {type(values).__name__}: {error}"
        ) from error


def _labels(values: ArrayLike, name: str) -> np.ndarray:
    """Integer class labels from labels (1-D) or logits (2-D, arg-maxed over classes)."""
    array = _to_numpy(values, name)
    if array.ndim == 2:
        if array.shape[1] == 0:
            raise ConfigError(f"{name} has shape {array.shape}: logits need at least one class column")
        return np.argmax(array, axis=1).astype(np.int64)
    if array.ndim != 1:
        raise ConfigError(
            f"{name} must be 1-D labels or 2-D logits (samples x classes), got shape {array.shape}"
        )
    if array.dtype == bool or np.issubdtype(array.dtype, np.integer):
        return array.astype(np.int64)
    if np.issubdtype(array.dtype, np.floating):
        if not np.all(np.isfinite(array)) or not np.all(array == np.round(array)):
            raise ConfigError(
                f"{name} is a 1-D float array with non-integer or non-finite values; pass integer class "
                "labels, or 2-D logits to be arg-maxed"
            )
        return array.astype(np.int64)
    raise ConfigError(f"{name} must hold integer class labels, got dtype {array.dtype}")


def _pair(pred: ArrayLike, target: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Predicted and true labels as equal-length, non-empty int64 arrays."""
    pred_labels = _labels(pred, "pred")
    target_labels = _labels(target, "target")
    _check_paired(
        ("pred", pred_labels),
        ("target", target_labels),
        "samples",
        mismatch_fix="pass one prediction per target",
        empty_fix="metrics need at least one sample",
    )
    return pred_labels, target_labels


def _check_paired(
    named_a: tuple[str, np.ndarray],
    named_b: tuple[str, np.ndarray],
    unit: str,
    *,
    mismatch_fix: str,
    empty_fix: str,
) -> None:
    """Raise a ConfigError unless the two named 1-D arrays have the same length, and it is not zero."""
    (first, a), (second, b) = named_a, named_b
    if a.shape != b.shape:
        raise ConfigError(f"{first} has {a.shape[0]} {unit} but {second} has {b.shape[0]}; {mismatch_fix}")
    if a.size == 0:
        raise ConfigError(f"{first} and {second} are empty; {empty_fix}")


def _check_num_classes(num_classes: int, *label_arrays: np.ndarray) -> int:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int | np.integer) or num_classes < 1:
        raise ConfigError(f"num_classes must be a positive integer, got {num_classes!r}")
    for array in label_arrays:
        if array.size and (array.min() < 0 or array.max() >= num_classes):
            raise ConfigError(
                f"labels must lie in [0, {num_classes - 1}] for num_classes={num_classes}, found values in "
                f"[{array.min()}, {array.max()}]; raise num_classes or fix the labels"
            )
    return int(num_classes)


def _vector(values: ArrayLike, name: str) -> np.ndarray:
    """A 1-D float64 vector (one value per client)."""
    array = _to_numpy(values, name)
    if array.ndim != 1:
        raise ConfigError(f"{name} must be 1-D (one value per client), got shape {array.shape}")
    try:
        return array.astype(np.float64)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{name} must be numeric, got dtype {array.dtype}") from error


def _client_pair(standalone: ArrayLike, rewards: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Standalone and reward accuracies as equal-length, non-empty, finite vectors."""
    s = _vector(standalone, "standalone")
    a = _vector(rewards, "rewards")
    one_each = "pass one value per client"
    _check_paired(("standalone", s), ("rewards", a), "clients", mismatch_fix=one_each, empty_fix=one_each)
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(a))):
        raise ConfigError("standalone and rewards must be finite; found NaN or inf")
    return s, a


# --------------------------------------------------------------------------------------------------
# classification metrics (CELM §1.3 / baselines §1.5, ProxyFL §2.7)


def confusion_matrix(pred: ArrayLike, target: ArrayLike, num_classes: int) -> np.ndarray:
    """(K, K) int64 counts with rows = true class, columns = predicted class."""
    pred_labels, target_labels = _pair(pred, target)
    k = _check_num_classes(num_classes, pred_labels, target_labels)
    counts = np.bincount(target_labels * k + pred_labels, minlength=k * k)
    return counts.reshape(k, k).astype(np.int64)


def accuracy(pred: ArrayLike, target: ArrayLike) -> float:
    """Top-1 accuracy: fraction of samples with pred == target."""
    pred_labels, target_labels = _pair(pred, target)
    return float(np.mean(pred_labels == target_labels))


def per_class_recall(pred: ArrayLike, target: ArrayLike, num_classes: int) -> np.ndarray:
    """(K,) recall TP_c / n_c per true class c; NaN for classes with no sample in target."""
    matrix = confusion_matrix(pred, target, num_classes)
    support = matrix.sum(axis=1)
    recall = np.full(matrix.shape[0], np.nan, dtype=np.float64)
    present = support > 0
    recall[present] = np.diag(matrix)[present] / support[present]
    return recall


def balanced_accuracy(pred: ArrayLike, target: ArrayLike, num_classes: int | None = None) -> float:
    """Mean recall over the classes present in target (= sklearn ``balanced_accuracy_score``).

    ``num_classes`` only bounds the label range; when None it is inferred as max label + 1.
    """
    pred_labels, target_labels = _pair(pred, target)
    if num_classes is None:
        num_classes = int(max(pred_labels.max(), target_labels.max(), 0)) + 1
    recall = per_class_recall(pred_labels, target_labels, num_classes)
    return float(np.mean(recall[~np.isnan(recall)]))


def rare_class_recall(pred: ArrayLike, target: ArrayLike, rare_classes: Sequence[int]) -> float:
    """Recall over the union of rare-class test samples: correct rare samples / all rare samples (CELM).

    This pools the samples (it is not the mean of per-class recalls); NaN if target holds no rare sample.
    """
    pred_labels, target_labels = _pair(pred, target)
    rare = _to_numpy(rare_classes, "rare_classes").reshape(-1)
    if rare.size == 0:
        raise ConfigError("rare_classes is empty; name at least one rare class index")
    if not np.issubdtype(rare.dtype, np.integer):
        raise ConfigError(f"rare_classes must be integer class indices, got {rare.tolist()!r}")
    is_rare = np.isin(target_labels, rare)
    if not np.any(is_rare):
        return math.nan
    return float(np.mean(pred_labels[is_rare] == target_labels[is_rare]))


def classification_metrics(
    logits_or_pred: ArrayLike,
    target: ArrayLike,
    num_classes: int,
    rare_classes: Sequence[int] | None = None,
) -> dict[str, float | list[float | None]]:
    """Accuracy, balanced accuracy, per-class recall (NaN -> None, JSON-ready), optional rare-class recall."""
    pred_labels, target_labels = _pair(logits_or_pred, target)
    recall = per_class_recall(pred_labels, target_labels, num_classes)
    result: dict[str, float | list[float | None]] = {
        "accuracy": float(np.mean(pred_labels == target_labels)),
        "balanced_accuracy": float(np.mean(recall[~np.isnan(recall)])),
        "per_class_recall": [None if np.isnan(value) else float(value) for value in recall],
    }
    if rare_classes is not None:
        result["rare_class_recall"] = rare_class_recall(pred_labels, target_labels, rare_classes)
    return result


# --------------------------------------------------------------------------------------------------
# collaborative fairness (baselines §1.2-1.3, methods §3.5)


def fairness(contribution: ArrayLike, reward: ArrayLike, kind: str = "pearson") -> float:
    """Collaborative fairness rho = 100 * corr(contribution, reward), Pearson or Spearman (FedRAC gamma).

    Pairs where either side is non-finite are dropped; NaN if fewer than 2 pairs remain or a side is constant.
    """
    if kind not in FAIRNESS_KINDS:
        raise ConfigError(f"unknown fairness kind {kind!r}; accepted kinds: {', '.join(FAIRNESS_KINDS)}")
    x = _vector(contribution, "contribution")
    y = _vector(reward, "reward")
    if x.shape != y.shape:
        raise ConfigError(
            f"contribution has {x.shape[0]} clients but reward has {y.shape[0]}; pass one value per client"
        )
    finite = np.isfinite(x) & np.isfinite(y)
    x, y = x[finite], y[finite]
    # Constant inputs make the correlation 0/0; scipy would warn and return NaN, we return NaN quietly.
    if x.size < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return math.nan
    from scipy import stats  # here, not at import: scipy.stats costs ~1 s of every process's start-up

    if kind == "pearson":
        correlation = stats.pearsonr(x, y).statistic
    else:
        correlation = stats.spearmanr(x, y).statistic
    return float(100.0 * correlation)


def bcf_bounds(
    standalone: ArrayLike, rewards: ArrayLike, alpha: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """alpha-BCF interval per client: lower_i = s_i, upper_i = ((1-alpha)*s_i/max_j s_j + alpha)*max_j a_j.

    The FedRAC ``main.py`` form of FedSAC's bound c_i < theta_i <= (c_i + max theta)/2 (baselines §1.3).
    """
    s, a = _client_pair(standalone, rewards)
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"alpha must lie in [0, 1], got {alpha!r} (FedRAC uses 0.5)")
    max_standalone = s.max()
    if max_standalone <= 0:
        raise ConfigError(f"the largest standalone accuracy must be positive, got {float(max_standalone):g}")
    # Same operation order as FedRAC's main.py so boundary cases (a_i == upper_i) compare identically.
    upper = ((1 - alpha) * (s / max_standalone) + alpha) * a.max()
    return s.copy(), upper


def bcf_rate(standalone: ArrayLike, rewards: ArrayLike, alpha: float = 0.5) -> float:
    """Clean alpha-BCF rate: fraction of clients with s_i < a_i <= upper_i (methods §3.5, [ours])."""
    lower, upper = bcf_bounds(standalone, rewards, alpha)
    a = _vector(rewards, "rewards")
    return float(np.mean((lower < a) & (a <= upper)))


def bcf_rate_fedrac_code(standalone: ArrayLike, rewards: ArrayLike, alpha: float = 0.5) -> float:
    """The FedRAC ``main.py`` rate loop, quirk included: a pass adds 1, a_i <= s_i ASSIGNS -10, then / N.

    Later clients still add to the -10; a client above its upper bound changes nothing (for parity only).
    """
    lower, upper = bcf_bounds(standalone, rewards, alpha)
    a = _vector(rewards, "rewards")
    total = 0.0
    for s_i, a_i, upper_i in zip(lower, a, upper, strict=True):
        if s_i < a_i <= upper_i:
            total += 1
        elif a_i <= s_i:
            total = -10.0
    return total / len(a)


def any_worse_than_standalone(standalone: ArrayLike, rewards: ArrayLike) -> bool:
    """True if some client's reward does not beat its standalone accuracy (a_i <= s_i, FedRAC's -10 test)."""
    s, a = _client_pair(standalone, rewards)
    return bool(np.any(a <= s))


def incentivized_participation_rate(standalone: ArrayLike, rewards: ArrayLike) -> float:
    """IAFL's IPR: fraction of clients whose reward model strictly beats standalone (a_i > s_i)."""
    s, a = _client_pair(standalone, rewards)
    return float(np.mean(a > s))


# --------------------------------------------------------------------------------------------------
# free-rider detection (baselines §1.4, methods §1.3 [ours])


def free_rider_report(weights: ArrayLike, free_rider: int, threshold_coef: float = 1 / 3) -> dict:
    """Free-rider's normalized weight, rank (0 = lowest), ratio to 1/N, detection (weight < tau/N, CFFL).

    Weights must be non-negative and are normalized to sum 1. Ties: rank counts clients with a strictly
    smaller weight (tied clients share the lower rank), ``lowest`` needs a strict minimum, ``num_tied`` counts
    the other clients with exactly the same weight.
    """
    w = _vector(weights, "weights")
    n = w.size
    if n == 0:
        raise ConfigError("weights is empty; pass one contribution weight per client")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ConfigError(
            f"weights must be finite, non-negative and not all zero, got {w.tolist()!r}; "
            "clip or softmax signed scores first"
        )
    if (
        isinstance(free_rider, bool)
        or not isinstance(free_rider, int | np.integer)
        or not 0 <= free_rider < n
    ):
        raise ConfigError(f"free_rider must be a client index in [0, {n - 1}], got {free_rider!r}")
    if not threshold_coef > 0:
        raise ConfigError(f"threshold_coef must be positive (CFFL uses 1/3), got {threshold_coef!r}")
    normalized = w / w.sum()
    own = normalized[free_rider]
    others = np.delete(normalized, free_rider)
    return {
        "weight": float(own),
        "rank": int(np.sum(others < own)),
        "lowest": bool(np.all(others > own)),
        "num_tied": int(np.sum(others == own)),
        "ratio_to_uniform": float(own * n),
        "detected": bool(own < threshold_coef / n),
    }


# --------------------------------------------------------------------------------------------------
# summaries over seeds and rounds (baselines §5 item 6)


def summarize_over_seeds(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population std (ddof=0) over seeds, ignoring NaNs; (nan, nan) if every value is NaN."""
    array = _vector(values, "values")
    if array.size == 0:
        raise ConfigError("values is empty; pass one value per seed")
    finite = array[~np.isnan(array)]
    if finite.size == 0:
        return math.nan, math.nan
    return float(np.mean(finite)), float(np.std(finite, ddof=0))


def best_final_lastk(series: Sequence[float], k: int = 10, mode: str = "max") -> dict:
    """Best (max or min) over rounds, final value, and mean of the last k rounds (all rounds if fewer).

    NaNs are ignored by ``best`` and ``last_k_mean`` (NaN if none is left); ``final`` is the last entry as is.
    """
    if mode not in SERIES_MODES:
        raise ConfigError(f"unknown mode {mode!r}; accepted modes: {', '.join(SERIES_MODES)}")
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ConfigError(f"k must be a positive integer, got {k!r}")
    array = _vector(series, "series")
    if array.size == 0:
        raise ConfigError("series is empty; pass one value per round")
    finite = array[~np.isnan(array)]
    tail = array[-k:]
    tail = tail[~np.isnan(tail)]
    if finite.size == 0:
        best = math.nan
    else:
        best = float(finite.max() if mode == "max" else finite.min())
    return {
        "best": best,
        "final": float(array[-1]),
        "last_k_mean": float(tail.mean()) if tail.size else math.nan,
    }
