"""Index helpers shared by the split families: class index lists, cuts at cumulative proportions."""

from __future__ import annotations

import numpy as np


def _class_indices(labels: np.ndarray, num_classes: int) -> list[np.ndarray]:
    """Indices of each class, in ascending index order."""
    order = np.argsort(labels, kind="stable")
    counts = np.bincount(labels, minlength=num_classes)
    return np.split(order, np.cumsum(counts)[:-1])


def _shuffled_class_indices(
    labels: np.ndarray, num_classes: int, rng: np.random.Generator
) -> list[np.ndarray]:
    return [rng.permutation(idx) for idx in _class_indices(labels, num_classes)]


def _cut(indices: np.ndarray, proportions: np.ndarray) -> list[np.ndarray]:
    """Cut ``indices`` at the cumulative ``proportions`` (the FedFisher/NIID-Bench ``cumsum`` cut points)."""
    points = (np.cumsum(proportions) * len(indices)).astype(int)[:-1]
    return np.split(indices, points)


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
