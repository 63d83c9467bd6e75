"""FedAvg (McMahan et al., AISTATS 2017) and the SGD trainer: the base every other method extends.

:class:`SGDTrainer` is the client: supervised cross-entropy SGD whose hooks (``prepare``,
``make_optimizer``, ``num_steps``, ``batches``, ``loss``, ``finish``, ``kept_weights``) all receive the one
:class:`~fedhet.engine.protocol.LocalUpdate`. :class:`FedAvg` is the server: the global model, one
instruction per client, the weighted average of the replies, and the hooks methods override.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedhet.algorithms.params import check_choice
from fedhet.algorithms.robust_aggregation import WEIGHTED_RULES, bucketing_generator, robust_average
from fedhet.averaging import weighted_average
from fedhet.devices import to_device
from fedhet.engine.evaluation import accuracies_of_states
from fedhet.engine.protocol import (
    KEEP_CHOICES,
    KEEP_KEY,
    LR_KEY,
    FederationInfo,
    Instruction,
    LocalUpdate,
    Reply,
    Strategy,
    Trainer,
    Weights,
)
from fedhet.engine.weights import clone_weights
from fedhet.errors import ConfigError, ProtocolError

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1


# --------------------------------------------------------------------------------------------------------
# Client: supervised SGD
# --------------------------------------------------------------------------------------------------------
class SGDTrainer(Trainer):
    """Supervised cross-entropy SGD; methods override the hooks they change.

    Hooks, in call order: :meth:`prepare`, :meth:`make_optimizer`, :meth:`batches` (sized by
    :meth:`num_steps`), :meth:`loss` per step, :meth:`finish` (the reply), :meth:`kept_weights` (what the
    client keeps, as ``Instruction.config['keep']`` says).
    """

    functional_form = "plain"  # the vectorized engine's cross-entropy SGD (engine/vectorized.py)
    finish_replies_trained_weights = True

    def prepare(self, u: LocalUpdate) -> None:
        """Called once before local training (e.g. freeze a copy of the global model into ``u.scratch``)."""

    def make_optimizer(self, u: LocalUpdate) -> torch.optim.Optimizer:
        """SGD or Adam with the round's learning rate (``config['lr']``, set by the round loop)."""
        cfg = u.context.train
        if LR_KEY not in u.config:
            raise ProtocolError(
                "the instruction carries no learning rate (config['lr']); the round loop sets it"
            )
        lr = float(u.config[LR_KEY])
        params = [p for p in u.model.parameters() if p.requires_grad]
        if cfg.optimizer == "adam":
            return torch.optim.Adam(params, lr=lr, weight_decay=cfg.weight_decay)
        return torch.optim.SGD(
            params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, nesterov=cfg.nesterov
        )

    def num_steps(self, u: LocalUpdate) -> int:
        """Local SGD steps: ``local_steps`` if set, else ``local_epochs`` passes over the data."""
        cfg = u.context.train
        if cfg.local_steps:
            return int(cfg.local_steps)
        n = u.data.num_examples
        per_epoch = math.ceil(n / cfg.batch_size) if n else 0
        steps = int(round(cfg.local_epochs * per_epoch))
        if per_epoch and not steps:
            raise ConfigError(
                f"train.local_epochs={cfg.local_epochs} gives a client with {n} samples (batch "
                f"{cfg.batch_size}) 0 local steps; use train.local_epochs >= {1 / per_epoch:.3g} (one step) "
                "or set train.local_steps"
            )
        return steps

    def batches(self, u: LocalUpdate) -> Iterator[Any]:
        """Minibatches drawn by index, reshuffled each epoch with the client's generator."""
        data, gen = u.data, u.context.generator
        n = data.num_examples
        if n == 0:
            return
        bs = u.context.train.batch_size
        steps = self.num_steps(u)
        done = 0
        while done < steps:
            perm = data.indices[to_device(torch.randperm(n, generator=gen), data.indices.device)]
            for start in range(0, n, bs):
                idx = perm[start : start + bs]
                # index_select, not inputs[idx]: 2-3x faster on the CPU for a batch of rows (measured)
                x = data.inputs.index_select(0, idx)
                if data.normalize is not None:
                    x = data.normalize(x)
                yield x, data.labels.index_select(0, idx)
                done += 1
                if done >= steps:
                    return

    def loss(self, u: LocalUpdate, batch: Any) -> Tensor:
        """Cross-entropy on the batch; override to add terms (FedProx) or change the logits (FedRS)."""
        x, y = batch
        return nn.functional.cross_entropy(u.model(x), y)

    def finish(self, u: LocalUpdate, metrics: dict[str, float]) -> Reply:
        """The reply: the trained weights, the sample count and the training metrics."""
        return Reply(
            weights=clone_weights(u.model.state_dict()),
            num_examples=self.num_examples(u.data),
            metrics=metrics,
        )

    def kept_weights(self, u: LocalUpdate, reply: Reply) -> Weights | None:
        """What the client keeps for its next round: nothing, its head or its whole trained model."""
        keep = u.config.get(KEEP_KEY, "none")
        if keep not in KEEP_CHOICES:
            raise ProtocolError(
                f"instruction config keep={keep!r}; a client keeps one of {list(KEEP_CHOICES)}"
            )
        if keep == "none":
            return None
        trained = u.model.state_dict()
        keys = u.model.head_keys() if keep == "head" else list(trained)
        return {k: trained[k].detach().clone() for k in keys}

    def fit(self, u: LocalUpdate) -> Reply:
        """Load the start weights (and mask), run the local steps, build the reply, keep what is asked."""
        model = u.model
        model.load_state_dict(u.start)
        if hasattr(model, "set_mask"):
            model.set_mask(u.instruction.mask)
        try:
            self.prepare(u)
            model.train()
            opt = self.make_optimizer(u)
            clip = u.context.train.grad_clip
            # The loss is summed on the device (in float64, as a Python float sum would): a float() per step
            # would make every step wait for the device (a host sync); one at the end is enough.
            total, steps = torch.zeros((), dtype=torch.float64, device=u.context.device), 0
            for batch in self.batches(u):
                opt.zero_grad(set_to_none=True)
                loss = self.loss(u, batch)
                loss.backward()
                if clip:
                    nn.utils.clip_grad_norm_(model.parameters(), clip)
                opt.step()
                total += loss.detach()
                steps += 1
            metrics = {"train_loss": float(total) / steps if steps else float("nan"), "steps": float(steps)}
            reply = self.finish(u, metrics)
            u.state.weights = self.kept_weights(u, reply)
            return reply
        finally:
            if hasattr(model, "set_mask"):
                model.set_mask(None)


# --------------------------------------------------------------------------------------------------------
# Server: FedAvg
# --------------------------------------------------------------------------------------------------------
class FedAvg(Strategy):
    """FedAvg: w_g ← Σ_i p_i w_i, p_i = n_i/Σ_j n_j (``weighting='samples'``, n_i self-reported in the
    replies) or 1/N (``'uniform'``).

    The reward of client i is its locally trained model of its last round (``reward='local'``, FedRAC's
    FedAvg-baseline convention; the server then holds one model per client), the global model
    (``'global'``) or none (``'none'``). Subclasses override :meth:`configure`, :meth:`aggregation_weights`,
    the aggregation hooks, :meth:`reward_model` and :meth:`contributions`.
    """

    name = "fedavg"
    trainer_class: type[Trainer] = SGDTrainer
    supports_aggregation_rules = True

    def __init__(self, weighting: str = "samples", reward: str = "local") -> None:
        self.weighting = check_choice("weighting", weighting, ("samples", "uniform"))
        self.reward = check_choice("reward", reward, ("local", "global", "none"))
        self.info: FederationInfo | None = None
        self.model: nn.Module | None = None
        #: The last weights each client sent (the local-model rewards); filled when ``reward='local'``.
        self.local_weights: dict[int, Weights] = {}
        #: Each replying client's share of the last average (``aggregation_weights`` in metrics.jsonl).
        self.round_weights: dict[int, float] = {}

    # -- life cycle ---------------------------------------------------------------------------------------
    def setup(self, info: FederationInfo) -> None:
        """Keep the federation's facts and the initial global model."""
        self.info = info
        self.model = info.model
        self.aggregation_settings = dict(info.aggregation or {"rule": "mean"})
        #: The round being aggregated: with the run's seed, it draws bucketing's order (aggregation.pre).
        self.aggregation_round = 0

    def global_weights(self) -> Weights:
        return self.model.state_dict()

    def configure(self, rnd: int, client_ids: list[int]) -> dict[int, Instruction]:
        """One instruction per sampled client: the full global model."""
        weights = self.global_weights()
        return {cid: Instruction(weights=weights) for cid in client_ids}

    def aggregation_weights(self, rnd: int, replies: Mapping[int, Reply]) -> np.ndarray:
        """p_i for the replies, in client-id order."""
        if self.weighting == "uniform":
            return np.ones(len(replies))
        return np.array([replies[cid].num_examples for cid in sorted(replies)], dtype=np.float64)

    def aggregate(self, rnd: int, replies: Mapping[int, Reply]) -> None:
        """Replace the global model by the weighted average of the replies (client-id order)."""
        if self.reward == "local":
            for cid, rep in replies.items():
                self.local_weights[cid] = rep.weights
        if not replies:
            return
        ids = sorted(replies)
        self.aggregation_round = rnd
        p = self.aggregation_weights(rnd, replies)
        if float(np.sum(p)) <= 0:
            p = self.all_zero_weights(rnd, ids)
        merged, shares = self.combine([replies[c].weights for c in ids], np.asarray(p, dtype=np.float64))
        self.model.load_state_dict(merged)
        # What each client weighed in this round's average (reported in metrics.jsonl).
        self.round_weights = dict(zip(ids, shares.tolist(), strict=True))

    def combine(self, states: list[Weights], p: np.ndarray) -> tuple[Weights, np.ndarray]:
        """The new global model from the client models and the method's weights ``p``, by the rule of
        ``[aggregation]`` (the weighted mean by default; a robust rule keeps the method's weights where it is
        weighted: Krum's and centered clipping's), and each model's share in it (0 for one a rule left out;
        1/n each under the unweighted median and trimmed mean)."""
        settings = self.aggregation_settings
        rule = settings.get("rule", "mean")
        if self.plain_mean():
            return weighted_average(states, p), p / float(np.sum(p))
        merged, kept = robust_average(
            states, p, settings, center=self.model.state_dict(), rng=self.aggregation_generator()
        )
        shares = np.zeros(len(states))
        if rule in WEIGHTED_RULES:
            shares[kept] = p[kept] / float(np.sum(p[kept])) if float(np.sum(p[kept])) > 0 else 1.0 / len(kept)
        else:
            shares[kept] = 1.0 / len(kept)
        return merged, shares

    def plain_mean(self) -> bool:
        """Whether ``[aggregation]`` asks for the method's own weighted mean: rule mean, no pre-aggregation
        step, fedhet's implementation."""
        settings = self.aggregation_settings
        return (
            settings.get("rule", "mean") == "mean"
            and not settings.get("pre")
            and settings.get("implementation", "fedhet") == "fedhet"
        )

    def aggregation_generator(self) -> np.random.Generator:
        """The generator of this round's bucketing order: a function of the run's seed and the round."""
        return bucketing_generator(self.info.seed, self.aggregation_round)

    def all_zero_weights(self, rnd: int, ids: list[int]) -> np.ndarray:
        """The weights used when every replying client's p_i is 0: uniform."""
        return np.ones(len(ids))

    def global_model(self) -> nn.Module | None:
        return self.model

    # -- rewards ------------------------------------------------------------------------------------------
    def has_rewards(self) -> bool:
        return self.reward == "local"

    def reward_model(self, cid: int) -> nn.Module | None:
        """The client's last local model (``reward='local'``), the global model (``'global'``) or None."""
        if self.reward == "none":
            return None
        if self.reward == "global":
            return self.model
        weights = self.local_weights.get(cid)
        if weights is None:
            return None
        model = self.scratch_model()
        model.load_state_dict(weights)
        return model

    def evaluate_rewards(self, x: Tensor, y: Tensor, batch_size: int) -> list[float] | None:
        """Test accuracy of every client's reward model. A reward whose weights equal an earlier client's this
        round takes its accuracy without a second evaluation (IAFL gives every client the same model: a tenth
        of the evaluation); the distinct ones go to :func:`accuracies_of_states` together (one batched pass
        on an accelerator)."""
        slots: list[int | None] = []  # per client: its reward's index in `distinct`, None without a reward
        distinct: list[dict[str, Tensor]] = []
        template: nn.Module | None = None
        # weights kept this call, bucketed by their tensors' sums (compared in full only within a bucket, so
        # a thousand distinct rewards cost a thousand sums, not a million comparisons)
        seen: dict[tuple[float, ...], list[int]] = {}
        for cid in range(self.info.num_clients):
            m = self.reward_model(cid)
            if m is None:
                slots.append(None)
                continue
            template = m
            state = m.state_dict()
            sums = torch.stack([v.float().sum() for v in state.values()])  # integer buffers too (BatchNorm)
            bucket = seen.setdefault(tuple(sums.tolist()), [])
            same = (j for j in bucket if all(torch.equal(distinct[j][k], state[k]) for k in state))
            index = next(same, None)
            if index is None:
                index = len(distinct)
                distinct.append({k: v.detach().clone() for k, v in state.items()})
                bucket.append(index)
            slots.append(index)
        if template is None:
            return None
        accs = accuracies_of_states(template, distinct, x, y, batch_size)
        out = [float("nan") if j is None else accs[j] for j in slots]
        return out if any(math.isfinite(a) for a in out) else None

    def round_metrics(self, rnd: int) -> dict[str, Any]:
        """The contribution weights, when the method estimates them, and each replying client's share of
        this round's average (``aggregation_weights``, client id → weight)."""
        c = self.contributions()
        out: dict[str, Any] = {"contributions": [float(v) for v in c]} if c is not None else {}
        if getattr(self, "round_weights", None):
            out["aggregation_weights"] = {str(k): v for k, v in self.round_weights.items()}
            self.round_weights = {}
        return out

    # -- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "model": dict(self.model.state_dict()),
            "local_weights": {str(k): v for k, v in self.local_weights.items()},
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        self.model.load_state_dict(sd["model"])
        self.local_weights = {int(k): dict(v) for k, v in sd.get("local_weights", {}).items()}

    # -- utilities for subclasses -------------------------------------------------------------------------
    def scratch_model(self) -> nn.Module:
        """A reusable extra model instance (for evaluating rewards) on the server's device."""
        if getattr(self, "_scratch", None) is None:
            self._scratch = copy.deepcopy(self.model)
        return self._scratch
