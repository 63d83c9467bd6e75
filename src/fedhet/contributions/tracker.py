"""The estimators of ``eval.contribution_estimators``, run by the round loop after each aggregation.

:class:`RoundEstimates` takes the round's start weights and the replies the strategy aggregated, rebuilds the
model of every subset it needs (:func:`~fedhet.contributions.reconstruction.reconstruct`, FedAvg's
sample-weighted mean), measures each one's accuracy on the server's validation set, and returns the part of
the round's ``metrics.jsonl`` line that holds the values::

    "estimates": {"gtg_shapley": [φ_0, ..., φ_{N−1}], "or_shapley": [...],
                  "utility": {"start": U(w_t), "all": U(M_N)},
                  "evaluations": {"gtg_shapley": k, "or_shapley": 2^m}, "permutations": {"gtg_shapley": p}}

one value per client of the federation (0 for a client not aggregated in the round). ``summary["estimates"]``
holds their sums over the rounds (:meth:`RoundEstimates.sums`). The engine passes in what it owns (the
evaluation function, the seeded generators), so this package imports nothing of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import Tensor, nn

from fedhet.config_sections import CONTRIBUTION_ESTIMATORS
from fedhet.contributions.reconstruction import (
    GTGSettings,
    exact_round_shapley,
    gtg_shapley_round,
    members_of,
    reconstruct,
)
from fedhet.errors import ConfigError

if TYPE_CHECKING:
    from fedhet.config import ExperimentConfig

#: What each estimator is called in ``metrics.jsonl`` and ``summary["estimates"]``.
KEYS = {name: name.replace("-", "_") for name in CONTRIBUTION_ESTIMATORS}
#: ``or-shapley`` evaluates 2^m models per round of m replies: refused above this many replies a round.
OR_SHAPLEY_MAX_REPLIES = 12
#: Reconstructed models evaluated in one call of the evaluation function (bounds the memory they hold).
EVALUATION_CHUNK = 32

#: ``evaluate(model, states, x, y, batch_size)``: the accuracy on (x, y) of ``model``'s architecture under
#: each state (``fedhet.engine.evaluation.accuracies_of_states``).
Evaluate = Callable[[nn.Module, Sequence[Mapping[str, Tensor]], Tensor, Tensor, int], list[float]]


class RoundEstimates:
    """Runs the named estimators on every aggregated round (:meth:`for_run` builds it)."""

    def __init__(
        self,
        names: Sequence[str],
        num_clients: int,
        validation: tuple[Tensor, Tensor],
        model: nn.Module,
        evaluate: Evaluate,
        rng: Callable[[int], np.random.Generator],
        batch_size: int = 2048,
        gtg: GTGSettings | None = None,
    ) -> None:
        unknown = [n for n in names if n not in KEYS]
        if unknown:
            raise ConfigError(
                f"eval.contribution_estimators names {unknown}; choose among {list(CONTRIBUTION_ESTIMATORS)}"
            )
        self.names = list(dict.fromkeys(names))
        self.num_clients = num_clients
        self.val_x, self.val_y = validation
        self.model = model
        self.evaluate = evaluate
        self.rng = rng
        self.batch_size = batch_size
        self.gtg = gtg or GTGSettings()
        #: Wall seconds the last round's estimates took (timings.jsonl, not metrics.jsonl).
        self.seconds = 0.0

    @classmethod
    def for_run(
        cls,
        cfg: ExperimentConfig,
        strategy: Any,  # the run's fedhet.engine.protocol.Strategy (the engine calls this package)
        validation: tuple[Tensor, Tensor] | None,
        model: nn.Module,
        replies_per_round: int,
        *,
        evaluate: Evaluate,
        rng: Callable[[int], np.random.Generator],
    ) -> RoundEstimates | None:
        """The estimators ``cfg.eval.contribution_estimators`` names for this run, or None when it names none.

        Refused (:class:`ConfigError`, before any round) where they would measure nothing sound: a run with no
        server validation set (the utility is accuracy on it), a method whose server step is no average of
        client models or whose replies are updates rather than models (no subset's model is then a FedAvg
        average of its replies), and ``or-shapley`` with more replies a round than it can enumerate."""
        names = list(cfg.eval.contribution_estimators)
        if not names:
            return None
        if validation is None:
            raise ConfigError(
                f"eval.contribution_estimators={names} measure each subset's model on the server's "
                "validation set and the run holds none; set data.validation_fraction (e.g. --set "
                "data.validation_fraction=0.1)"
            )
        if not strategy.supports_aggregation_rules or strategy.trainer_class.uploads_updates:
            what = (
                "its clients upload updates to models they keep"
                if strategy.trainer_class.uploads_updates
                else "its server step is not an average of client models"
            )
            raise ConfigError(
                f"eval.contribution_estimators={names} rebuild each subset's model as FedAvg's average of "
                f"its replies, which method {strategy.name!r} does not compute ({what}); use them with a "
                "FedAvg-family method (fedavg, fedprox, fedrs, ...), or leave "
                "eval.contribution_estimators empty"
            )
        if "or-shapley" in names and replies_per_round > OR_SHAPLEY_MAX_REPLIES:
            raise ConfigError(
                f"or-shapley evaluates 2^m models per round of m replies, and this run aggregates up to "
                f"{replies_per_round} a round (more than {OR_SHAPLEY_MAX_REPLIES}); use gtg-shapley alone, "
                "or lower train.clients_per_round"
            )
        return cls(
            names,
            cfg.data.clients,
            validation,
            model,
            evaluate,
            rng,
            batch_size=cfg.eval.batch_size,
        )

    @staticmethod
    def start_weights(strategy: Any) -> dict[str, Tensor]:
        """A copy of the global model the round starts from, w_t (taken before the aggregation)."""
        return {k: v.detach().clone() for k, v in strategy.global_model().state_dict().items()}

    def round(self, rnd: int, start: Mapping[str, Tensor], replies: Mapping[int, Any]) -> dict[str, Any]:
        """The ``estimates`` entry of round ``rnd``'s metrics line from ``start`` (w_t) and the ``replies``
        the strategy aggregated (none for a round that aggregated none or was undone: every value 0)."""
        t0 = time.perf_counter()
        ids = sorted(replies)
        models = [replies[c].weights for c in ids]
        counts = [float(replies[c].num_examples) for c in ids]
        m = len(ids)
        memo: dict[int, float] = {}

        def utilities(masks: Sequence[int]) -> list[float]:
            todo = [s for s in dict.fromkeys(masks) if s not in memo]
            for i in range(0, len(todo), EVALUATION_CHUNK):
                chunk = todo[i : i + EVALUATION_CHUNK]
                states = [reconstruct(start, models, counts, members_of(s)) for s in chunk]
                accuracies = self.evaluate(self.model, states, self.val_x, self.val_y, self.batch_size)
                memo.update(zip(chunk, map(float, accuracies), strict=True))
            return [memo[s] for s in masks]

        full = (1 << m) - 1
        u_start, u_all = utilities([0, full])
        out: dict[str, Any] = {"utility": {"start": u_start, "all": u_all}, "evaluations": {}}
        for name in self.names:
            if name == "or-shapley":
                phi = exact_round_shapley(utilities, m)
                out["evaluations"][KEYS[name]] = 1 << m
            else:  # gtg-shapley
                result = gtg_shapley_round(lambda s: utilities([s])[0], m, self.rng(rnd), self.gtg)
                phi = result.values
                out["evaluations"][KEYS[name]] = result.evaluations
                out["permutations"] = {KEYS[name]: result.permutations}
            values = np.zeros(self.num_clients)
            values[ids] = phi
            out[KEYS[name]] = values.tolist()
        self.seconds = time.perf_counter() - t0
        return {"estimates": out}

    def sums(self, history: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
        """``summary["estimates"]``: each estimator's values summed over the rounds of ``history`` (the run's
        metrics lines; a resumed run's read back from ``metrics.jsonl``)."""
        totals = {KEYS[name]: np.zeros(self.num_clients) for name in self.names}
        for line in history:
            estimates = line.get("estimates") or {}
            for key, total in totals.items():
                if key in estimates:
                    total += np.array([np.nan if v is None else v for v in estimates[key]], dtype=np.float64)
        return {key: total.tolist() for key, total in totals.items()}


__all__ = ["KEYS", "OR_SHAPLEY_MAX_REPLIES", "RoundEstimates"]
