"""What the config decides of each round before any client trains: the device, the round's learning rate,
the clients sampled and those that drop out. Every draw comes from the run's seed
(``fedhet.engine.seeds``), so a round's plan depends on its number alone, not on the rounds before it.
"""

from __future__ import annotations

import math

import torch

from fedhet.config import ExperimentConfig
from fedhet.engine.seeds import derived_rng
from fedhet.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    """The torch device of ``train.device``: ``auto`` takes CUDA when present."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device='cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    return torch.device(name)


def evaluates(cfg: ExperimentConfig, rnd: int) -> bool:
    """Whether round ``rnd`` ends with an evaluation: every ``eval.every``-th round, each of the last
    ``eval.every_round_last`` rounds, and the last round."""
    rounds = cfg.train.rounds
    return rnd % cfg.eval.every == 0 or rnd == rounds or rnd > rounds - cfg.eval.every_round_last


def learning_rate(cfg: ExperimentConfig, rnd: int) -> float:
    """The round's learning rate: constant, cosine annealing to lr_min over the rounds, or exponential."""
    t, lr = cfg.train, cfg.learning_rate()
    if t.schedule == "cosine":
        return t.lr_min + 0.5 * (lr - t.lr_min) * (1 + math.cos(math.pi * (rnd - 1) / t.rounds))
    if t.schedule == "exponential":
        return lr * t.lr_decay ** (rnd - 1)
    return lr


def participants(cfg: ExperimentConfig) -> list[int]:
    """The clients that take part in the run (``train.participants``; every client by default), sorted."""
    chosen = cfg.train.participants
    return list(range(cfg.data.clients)) if chosen is None else sorted(chosen)


def sample_clients(cfg: ExperimentConfig, rnd: int) -> list[int]:
    """Seeded uniform sampling without replacement among the participants; sorted client ids."""
    if cfg.train.participants is not None:
        pool = participants(cfg)
        n = len(pool)
    else:
        pool, n = None, cfg.data.clients
    cpr = cfg.train.clients_per_round
    k = (
        n
        if (isinstance(cpr, float) and cpr >= 1.0)
        else (max(1, int(round(cpr * n))) if isinstance(cpr, float) else min(int(cpr), n))
    )
    if k >= n:
        return list(range(n)) if pool is None else pool
    drawn = derived_rng(cfg.seed, "sampling", rnd).choice(n, k, replace=False)
    return sorted(int(c) if pool is None else pool[int(c)] for c in drawn)


def dropped_clients(cfg: ExperimentConfig, rnd: int, sampled: list[int]) -> list[int]:
    """The sampled clients that drop out of round ``rnd`` (``train.client_dropout``: each independently)."""
    if cfg.train.client_dropout <= 0:
        return []
    draws = derived_rng(cfg.seed, "dropout", rnd).random(len(sampled))
    return [c for c, u in zip(sampled, draws, strict=True) if u < cfg.train.client_dropout]
