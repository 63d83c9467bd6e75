"""Contribution-ordered nested submodels: the machinery FedRAC, its ablations and FedSAC share.

methods.md §3, baselines.md §1.2-1.3, §2.6-2.7. Each client's contribution c_i is its reference (standalone)
accuracy, an input of the run (``FederationInfo.reference_contributions``); the server gives client i a
submodel, a 0/1 mask over the model's K maskable units, whose validation accuracy stays below a reputation
threshold that grows with c_i. Masks are nested prefixes of a unit order (FedRAC: least-used units first,
FedSAC: most important first), the top contributor gets the full model, and each parameter is averaged
over the clients whose update is non-zero there.

Data-free options [ours, docs/data-free-fairness.md]: ``contributions = "celm"`` estimates the reputation
from CELM's evidence during the first rounds instead of reading the standalone accuracies, and
``candidate_score = "probe"`` scores candidates on inputs grown from the global model instead of the
validation set; thresholds are then in units of the full model's score.

Here: :class:`SubmodelStrategy` and its per-model defaults. The formulas of methods.md §3.4 (sharpened
contributions, thresholds, candidate sizes, allocation, masked averaging) and the batched evaluation of many
masks are in ``allocation.py``. The methods (``fedrac.py``, ``fedsac.py``) choose the unit order and the
threshold ratio.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedhet.algorithms.allocation import (
    allocate_sizes,
    candidate_sizes,
    evidence_coverage,
    masked_accuracies,
    masked_average_update,
    relative_reputation,
    relative_scores,
    reputation_thresholds,
    sharpen_contributions,
    validation_subset,
)
from fedhet.algorithms.celm import (
    EvidenceContributions,
    head_keeping_instructions,
    probe_generator,
    warmup_rounds,
)
from fedhet.algorithms.fedavg import FedAvg
from fedhet.algorithms.logit_probes import grow_class_inputs
from fedhet.algorithms.params import check_choice, check_flag, check_integer, check_number
from fedhet.engine.protocol import FederationInfo, Instruction, Reply
from fedhet.errors import ConfigError
from fedhet.models.masks import nested_prefix_masks, unit_groups

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1

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

#: Where the contributions c_i come from: the standalone pre-pass (the paper) or CELM's evidence, estimated
#: during the method's own first rounds (data-free, docs/data-free-fairness.md).
CONTRIBUTION_SOURCES = ("standalone", "celm")
#: How candidate submodels are scored: accuracy on the server validation set (the paper) or relative
#: accuracy on inputs grown from the global model (data-free).
CANDIDATE_SCORES = ("validation", "probe")
#: Which of CELM's evidence summaries is the reputation when ``contributions = "celm"``.
EVIDENCE_REPUTATIONS = ("coverage", "weights")
#: Stream of the candidate-score inputs' noise, apart from CELM's probe noise.
SCORE_STREAM = 0x5C0


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

    supports_aggregation_rules = False  # it averages masked submodels unit by unit

    name = "submodel"
    model_needs = frozenset({"masks"})
    #: Rewards are these methods' result: fairness is measured unless eval.fairness = false.
    fairness_by_default = True
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
        contributions: str = "standalone",
        candidate_score: str = "validation",
        contribution_warmup: float = 0.05,
        reputation: str = "coverage",
        score_per_class: int = 20,
        score_depths: Sequence[int] = (1, 2, 3, 4, 5, 6, 7, 8),
        score_lr: float = 0.2,
        delivery_momentum: float = 0.9,
    ) -> None:
        super().__init__(weighting="uniform", reward="none")
        #: [ours] How slowly a client's delivery record forgets (0 = off: the paper's fixed reputation).
        self.delivery_momentum = check_number(
            "delivery_momentum",
            delivery_momentum,
            0.0,
            1.0,
            high_open=True,
            hint="0 keeps the paper's reputation; 0.9 (default) lets it fall for clients whose updates are "
            "missing or rejected",
        )
        self.contribution_source = check_choice(
            "contributions",
            contributions,
            CONTRIBUTION_SOURCES,
            hint="'standalone': each client's standalone accuracy (the paper, a pre-pass); 'celm': CELM's "
            "evidence, estimated during the first rounds without data",
        )
        self.candidate_score = check_choice(
            "candidate_score",
            candidate_score,
            CANDIDATE_SCORES,
            hint="'validation': accuracy on the server validation set (the paper); 'probe': relative "
            "accuracy on inputs grown from the global model, no data",
        )
        self.contribution_warmup = check_number(
            "contribution_warmup",
            contribution_warmup,
            0.0,
            1.0,
            low_open=True,
            hint="the share of the rounds CELM's estimate runs for (its warm-up), default 0.05",
        )
        self.evidence_reputation = check_choice(
            "reputation",
            reputation,
            EVIDENCE_REPUTATIONS,
            hint="'coverage': evidence against the strongest client per class; 'weights': CELM's weights",
        )
        self.score_per_class = check_integer("score_per_class", score_per_class, 1, hint="default 20")
        if (
            isinstance(score_depths, str | bytes)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in score_depths)
            or not len(score_depths)
        ):
            raise ConfigError(
                f"method.params.score_depths = {score_depths!r}: give a list of positive ascent step counts, "
                "e.g. [1, 2, 4, 8]"
            )
        self.score_depths = tuple(sorted(set(score_depths)))
        self.score_lr = check_number("score_lr", score_lr, 0.0, low_open=True, hint="default 0.2")
        if self.contribution_source == "celm":
            self.model_needs = self.model_needs | {"head"}  # the clients keep their heads during the estimate
            self.estimator = EvidenceContributions()
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
        """The paper's inputs: a server validation set (candidate scores) and the reference accuracies
        (contributions); ``candidate_score = "probe"`` and ``contributions = "celm"`` drop one each."""
        needs = set()
        if self.candidate_score == "validation":
            needs.add("validation")
        if self.contribution_source == "standalone":
            needs.add("reference_contributions")
        return frozenset(needs)

    def config_defaults(self) -> dict[str, Any]:
        """A 10% validation split when candidates are scored on one and, for the default model, mlp200 (the
        papers' maskable MLP)."""
        return {**super().config_defaults(), "model.name": "mlp200"}

    def setup(self, info: FederationInfo) -> None:
        """Contributions from the reference accuracies, the validation (sub)set, the frequency table."""
        super().setup(info)
        #: Each client's delivery record d_i (1 = every update it was asked for arrived and was accepted).
        self.delivery = np.ones(info.num_clients)
        self._asked: list[int] = []
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
        #: The first round that allocates submodels: 2 (round 1 trains the full model), or the first after
        #: CELM's estimate, whose rounds train the full model with the clients keeping their heads.
        self.first_allocation = 2
        if self.contribution_source == "standalone":
            self.set_reputation(np.asarray(info.reference_contributions, dtype=np.float64))
        else:
            self.estimator.setup(info)
            self.estimate_rounds = warmup_rounds(self.contribution_warmup, info.rounds)
            self.first_allocation = max(2, self.estimate_rounds + 1)
            self.backbone_keys = list(info.model.backbone_keys())
            self.with_heads: set[int] = set()
            self.coverage = np.full(info.num_clients, np.nan)
            self.reputation = np.full(info.num_clients, np.nan)
            self.base_reputation = np.full(info.num_clients, np.nan)
            self.sharpened = np.full(info.num_clients, np.nan)
        if self.candidate_score == "validation":
            self.val_x, self.val_y = validation_subset(info.validation, self.validation_samples, info.rng)
        self.frequency = torch.zeros(self.units, dtype=torch.int64)
        self.masks = torch.ones(info.num_clients, self.units)
        self.snapshot_every = max(1, info.rounds // 10)
        self.snapshots: dict[str, Tensor] = {}
        self.last_round_info: dict[str, Any] = {}

    def set_reputation(self, values: np.ndarray) -> None:
        """Contributions c (accuracies, or relative evidence): sharpened c^n and the ascending rank order; the
        reputation used is c_i · d_i, the contribution times the client's delivery record."""
        self.base_reputation = np.asarray(values, dtype=np.float64)
        self.reputation = self.base_reputation * self.delivery
        self.sharpened = sharpen_contributions(self.reputation, self.sharpness)
        # Ascending contribution, ties by client id; the last is the top contributor (full model).
        self.rank_order = np.argsort(self.reputation, kind="stable")

    def record_deliveries(self, replies: Mapping[int, Reply]) -> None:
        """[ours] d_i ← m·d_i + (1 − m)·[client i's update arrived and was accepted], for the clients asked
        this round: a client that crashes, drops out, or sends what the boundary or the guards reject (NaN,
        noise, ×100) loses reputation — and with it submodel units — while it keeps doing so; honest rounds
        restore it. The paper's reputation is the standalone accuracy alone, fixed before training
        (``delivery_momentum = 0``); a run in which every update arrives is the paper's run exactly."""
        m = self.delivery_momentum
        if m == 0.0 or not self._asked:
            return
        before = self.delivery.copy()
        for cid in self._asked:  # d + (1 − m)(x − d): a record of full deliveries stays exactly 1
            self.delivery[cid] += (1.0 - m) * (float(cid in replies) - self.delivery[cid])
        if not np.array_equal(before, self.delivery) and not np.isnan(self.base_reputation).any():
            self.set_reputation(self.base_reputation)

    def estimating(self, rnd: int) -> bool:
        """Whether round ``rnd`` is one of CELM's estimation rounds (``contributions = "celm"``)."""
        return self.contribution_source == "celm" and rnd <= self.estimate_rounds

    def before_aggregate(self, rnd: int, replies: Mapping[int, Reply]) -> None:
        """In an estimation round: probe w_g^{t−1} and the client models (CELM, methods §1.1), update c and
        the coverage; after the last one, the reputation is fixed from them."""
        if not (replies and self.estimating(rnd)):
            return
        ids = sorted(replies)
        self.with_heads.update(ids)
        states = [self.model.state_dict(), *(replies[c].weights for c in ids)]
        self.estimator.update(rnd, ids, states)
        coverage = evidence_coverage(self.estimator.evidence[-1]["raw"][ids])
        previous = self.coverage[ids]
        momentum = self.estimator.ema_momentum
        # The coverage's EMA starts at its first estimate (CELM's c starts at 1/N, which has no meaning here).
        blended = momentum * previous + (1 - momentum) * coverage
        self.coverage[ids] = np.where(np.isnan(previous), coverage, blended)
        if rnd == self.estimate_rounds:
            self.fix_reputation()

    def fix_reputation(self) -> None:
        """ρ from CELM's estimate (coverage or weights, relative to the top client); a client never seen in
        the estimate gets 0, the lowest reputation."""
        evidence = self.coverage if self.evidence_reputation == "coverage" else self.estimator.contribution
        self.set_reputation(relative_reputation(np.nan_to_num(evidence, nan=0.0)))

    def candidate_scores(self, candidates: Tensor, rnd: int) -> np.ndarray:
        """A_s of every candidate: validation accuracy (the paper), or [ours] relative accuracy on inputs
        grown from the global model this round (:func:`grow_class_inputs`; the full model scores 1)."""
        if self.candidate_score == "validation":
            return masked_accuracies(self.model, self.val_x, self.val_y, candidates)
        x, y = grow_class_inputs(
            self.model,
            self.info.input_shape,
            self.info.num_classes,
            per_class=self.score_per_class,
            depths=self.score_depths,
            lr=self.score_lr,
            generator=probe_generator(self.info.seed, rnd, SCORE_STREAM),
        )
        return relative_scores(masked_accuracies(self.model, x, y, candidates))

    def threshold_base(self, full_score: float) -> np.ndarray:
        """The c_i term of r_i in the candidates' units: the standalone accuracies themselves when both are
        accuracies (the paper); otherwise ρ_i = c_i / max c, a share of the full model's score."""
        if self.contribution_source == "standalone" and self.candidate_score == "validation":
            return self.reputation
        return relative_reputation(self.reputation) * full_score

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
        accuracies = self.candidate_scores(candidates, rnd)
        self.candidate_seconds.append(time.perf_counter() - started)
        global_accuracy = float(accuracies[-1])  # the last candidate is the full model
        ratio = self.threshold_ratio(rnd)
        thresholds = reputation_thresholds(
            self.threshold_base(global_accuracy), self.sharpened, global_accuracy, ratio
        )
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
            "threshold_ratio": ratio,
            "thresholds": thresholds.tolist(),
        }
        if self.candidate_score == "validation":  # the probe's relative score of the full model is 1
            self.last_round_info["validation_accuracy"] = global_accuracy

    def configure(self, rnd: int, client_ids: list[int]) -> dict[int, Instruction]:
        """Allocate (from round 2 on, or after CELM's estimate) and send each client the global model with its
        mask; during the estimate the clients keep their heads (CELM's warm-up message)."""
        self.last_round_info = {}
        if rnd >= self.first_allocation:
            if np.isnan(self.reputation).any():  # the last estimation round had no replies
                self.fix_reputation()
            self.allocate(rnd)
            self.frequency += self.masks[client_ids].sum(0).round().long()
        if rnd % self.snapshot_every == 0 or rnd == self.info.rounds:
            self.snapshots[str(rnd)] = self.frequency.clone()
        self._asked = list(client_ids)
        weights = self.global_weights()
        if self.estimating(rnd):
            out = head_keeping_instructions(weights, self.backbone_keys, self.with_heads, client_ids)
        else:
            out = {cid: Instruction(weights=weights) for cid in client_ids}
        for cid, instruction in out.items():
            instruction.mask = self.masks[cid].clone()
        return out

    def aggregate(self, rnd: int, replies: dict[int, Reply]) -> None:
        """Average each parameter over the clients whose update is non-zero there (methods §3.4 step 4)."""
        self.record_deliveries(replies)
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
        if rnd < self.first_allocation:
            out["mask_sizes"] = [self.units] * self.info.num_clients
        if rnd == self.first_allocation - 1:
            out["sharpened_contributions"] = self.sharpened.tolist()
        out["frequency_mean"] = float(freq.mean())
        out["frequency_var"] = float(freq.var(unbiased=False))
        return out

    def contributions(self) -> np.ndarray | None:
        """ρ, the reputation estimated from CELM's evidence, once fixed (``contributions = "celm"``); None
        with standalone contributions, which are the fairness reference itself."""
        if self.contribution_source == "standalone" or np.isnan(self.reputation).any():
            return None
        return self.reputation.copy()

    # -- state ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        sd = {
            "model": dict(self.model.state_dict()),
            "frequency": self.frequency.clone(),
            "masks": self.masks.clone(),
            "snapshots": {k: v.clone() for k, v in self.snapshots.items()},
        }
        if not np.all(self.delivery == 1.0):  # written once a delivery failed (earlier checkpoints lack it)
            sd["delivery"] = torch.from_numpy(self.delivery.copy())
        if self.contribution_source == "celm":
            sd["estimate"] = {
                **self.estimator.state_dict(),
                "with_heads": sorted(self.with_heads),
                "coverage": self.coverage.copy(),
                "reputation": self.base_reputation.copy(),  # before the delivery record
            }
        return sd

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        self.model.load_state_dict(sd["model"])
        self.frequency = sd["frequency"].clone().to(torch.int64)
        self.masks = sd["masks"].clone().float()
        self.snapshots = {k: v.clone().to(torch.int64) for k, v in sd.get("snapshots", {}).items()}
        delivery = sd.get("delivery")
        self.delivery = np.ones(len(self.delivery)) if delivery is None else delivery.double().numpy().copy()
        if self.contribution_source == "standalone":
            self.set_reputation(self.base_reputation)
        if self.contribution_source == "celm":
            state = sd["estimate"]
            self.estimator.load_state_dict(state)
            self.with_heads = {int(c) for c in state["with_heads"]}
            self.coverage = np.asarray(state["coverage"], dtype=np.float64).copy()
            reputation = np.asarray(state["reputation"], dtype=np.float64)
            if np.isnan(reputation).any():
                self.reputation, self.base_reputation = reputation.copy(), reputation.copy()
            else:
                self.set_reputation(reputation)

    # -- records ----------------------------------------------------------------------------------------
    def run_records(self) -> dict[str, Any]:
        """Contributions, final mask sizes, frequency snapshots and candidate timings (docs/fedrac.md)."""
        return {
            "submodel": {
                "label": self.label,
                "contributions": self.contribution_source,
                "candidate_score": self.candidate_score,
                "reputation": self.reputation.tolist(),
                "delivery": self.delivery.tolist(),
                "sharpened": self.sharpened.tolist(),
                "mask_sizes": self.masks.sum(1).round().long().tolist(),
                "units": self.units,
                "layer_sizes": [size for _, size in unit_groups(self.model)],
                "frequency_snapshots": {k: v.tolist() for k, v in self.snapshots.items()},
                "candidate_eval_seconds_mean": (
                    float(np.mean(self.candidate_seconds)) if self.candidate_seconds else None
                ),
                **(
                    {"estimate_rounds": self.estimate_rounds, "evidence": self.estimator.evidence}
                    if self.contribution_source == "celm"
                    else {}
                ),
            }
        }
