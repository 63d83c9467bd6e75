"""The messages and base classes every federated method is built from.

An algorithm is a server-side :class:`Strategy` and, where it changes local training, a client-side
:class:`Trainer`. They exchange plain dataclasses (:class:`Instruction` server -> client,
:class:`Reply` client -> server) holding tensors and small config values, and know nothing of how the
messages travel: the embedded simulation (``fedhet.engine.simulation``) runs them in one process.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedhet.errors import ClientUpdateError

Weights = dict[str, Tensor]
ConfigValue = float | int | str | bool


# --------------------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------------------
@dataclass
class Instruction:
    """Server -> one client, one round.

    ``weights`` may be a full or partial state dict; entries missing from it come from the client's own
    model (:attr:`ClientState.weights`) or, before a client has one, from the shared initial model. With
    ``delta=True`` the tensors are added to the client's own model instead of replacing it (reward
    downloads of CGSV/CFFL/IAFL).
    """

    weights: Weights
    mask: Tensor | None = None
    config: dict[str, ConfigValue] = field(default_factory=dict)
    delta: bool = False


@dataclass
class Reply:
    """One client -> server: trained weights (or an update), sample count, metrics and extra tensors."""

    weights: Weights
    num_examples: int
    metrics: dict[str, float] = field(default_factory=dict)
    payload: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class ClientState:
    """What a client keeps between rounds (maps to Flower's ``context.state``).

    ``weights`` is the client's own model for methods that keep one (Standalone, CGSV, CFFL, IAFL, CELM's
    local heads); ``extra`` holds any other persistent tensors or values (e.g. optimizer state).
    """

    cid: int
    weights: Weights | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClientData:
    """A client's local data, as indices into tensors shared by all clients (no per-client copies).

    ``inputs`` are normalized float tensors for supervised trainers, or raw floats in [0, 1] when the
    trainer augments first (then ``normalize`` maps a batch to model inputs).
    """

    cid: int
    inputs: Tensor
    labels: Tensor
    indices: Tensor
    num_classes: int
    unlabeled_indices: Tensor | None = None
    normalize: Callable[[Tensor], Tensor] | None = None

    @property
    def num_examples(self) -> int:
        return int(self.indices.numel())

    def class_counts(self) -> Tensor:
        """Per-class sample counts of the labeled data (FedRS, ProxyFL, CFFL's class weighting)."""
        return torch.bincount(self.labels[self.indices], minlength=self.num_classes)


@dataclass
class TrainContext:
    """Everything a trainer may use besides the data: seeded generator, device, training settings."""

    round: int
    generator: torch.Generator
    device: torch.device
    train: Any  # fedhet.config.TrainConfig
    initial_weights: Weights


# --------------------------------------------------------------------------------------------------------
# Helpers shared by trainers and strategies
# --------------------------------------------------------------------------------------------------------
def clone_weights(weights: Mapping[str, Tensor]) -> Weights:
    """A detached copy of a state dict."""
    return {k: v.detach().clone() for k, v in weights.items()}


def is_float_tensor(t: Tensor) -> bool:
    return t.is_floating_point()


def weighted_average(states: list[Mapping[str, Tensor]], weights: list[float] | np.ndarray) -> Weights:
    """Convex combination Σ_i p_i w_i of state dicts (integer buffers, e.g. BN counters: the first's)."""
    total = float(np.sum(weights))
    if total <= 0:
        raise ValueError(f"aggregation weights must sum to a positive number, got {list(weights)}")
    probs = [float(w) / total for w in weights]
    out: Weights = {}
    for key, first in states[0].items():
        if not first.is_floating_point():
            out[key] = first.clone()
            continue
        acc = torch.zeros_like(first)
        for p, sd in zip(probs, states, strict=True):
            if p != 0.0:
                acc.add_(sd[key], alpha=p)
        out[key] = acc
    return out


def check_reply(cid: int, reply: Reply, reference: Mapping[str, Tensor], *, partial_ok: bool = False) -> None:
    """Validate a client's reply at the boundary: known keys, matching shapes, finite values.

    Raises :class:`ClientUpdateError` naming the client, the key and what was wrong.
    """
    if not isinstance(reply, Reply):
        raise ClientUpdateError(f"client {cid} returned {type(reply).__name__}, expected a Reply")
    if reply.num_examples < 0:
        raise ClientUpdateError(f"client {cid} reported num_examples={reply.num_examples}; it must be >= 0")
    unknown = set(reply.weights) - set(reference)
    if unknown:
        raise ClientUpdateError(
            f"client {cid} sent unknown parameters {sorted(unknown)[:5]}; the model has {len(reference)} keys"
        )
    if not partial_ok:
        missing = set(reference) - set(reply.weights)
        if missing:
            raise ClientUpdateError(f"client {cid} omitted parameters {sorted(missing)[:5]}")
    for key, value in reply.weights.items():
        ref = reference[key]
        if not isinstance(value, Tensor):
            raise ClientUpdateError(f"client {cid} sent {key} as {type(value).__name__}, expected a tensor")
        if value.shape != ref.shape:
            raise ClientUpdateError(
                f"client {cid} sent {key} with shape {tuple(value.shape)}, expected {tuple(ref.shape)}"
            )
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise ClientUpdateError(f"client {cid} sent non-finite values (NaN/inf) in {key}")


# --------------------------------------------------------------------------------------------------------
# Trainer: client-side local update (supervised SGD is the base)
# --------------------------------------------------------------------------------------------------------
class Trainer:
    """Client-side local training: supervised cross-entropy SGD; methods override the hooks they change.

    Hooks, in call order: :meth:`start_weights`, :meth:`prepare`, :meth:`make_optimizer`,
    :meth:`batches`, :meth:`loss` (per step), :meth:`finish`.
    """

    #: True when the trainer wants raw [0, 1] inputs and a ``normalize`` function (augmenting trainers).
    needs_raw_inputs: bool = False

    def __init__(self, **params: Any) -> None:
        self.params = params

    # -- model state ------------------------------------------------------------------------------------
    def start_weights(self, ins: Instruction, state: ClientState, ctx: TrainContext) -> Weights:
        """The weights local training starts from: the client's own model (or the shared initial model)
        overlaid with, or incremented by, the instruction's weights."""
        base = state.weights if state.weights is not None else ctx.initial_weights
        if ins.delta:
            out = dict(base)
            for k, v in ins.weights.items():
                out[k] = base[k] + v.to(base[k].device)
            return out
        if len(ins.weights) == len(base):
            return ins.weights
        return {**base, **ins.weights}

    def prepare(
        self, model: nn.Module, data: ClientData, ins: Instruction, state: ClientState, ctx: TrainContext
    ) -> None:
        """Called once before local training (e.g. freeze a copy of the global model)."""

    def make_optimizer(self, model: nn.Module, ins: Instruction, ctx: TrainContext) -> torch.optim.Optimizer:
        """SGD or Adam with the round's learning rate (``ins.config['lr']``)."""
        cfg = ctx.train
        lr = float(ins.config.get("lr", cfg.lr))
        params = [p for p in model.parameters() if p.requires_grad]
        if cfg.optimizer == "adam":
            return torch.optim.Adam(params, lr=lr, weight_decay=cfg.weight_decay)
        return torch.optim.SGD(
            params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, nesterov=cfg.nesterov
        )

    def num_steps(self, data: ClientData, ctx: TrainContext) -> int:
        """Local SGD steps: ``local_steps`` if set, else ``local_epochs`` passes over the data."""
        cfg = ctx.train
        if cfg.local_steps:
            return int(cfg.local_steps)
        per_epoch = math.ceil(data.num_examples / cfg.batch_size) if data.num_examples else 0
        return int(round(cfg.local_epochs * per_epoch))

    def batches(self, data: ClientData, ctx: TrainContext) -> Iterator[tuple[Tensor, Tensor]]:
        """Minibatches drawn by index from the shared tensors, reshuffled each epoch (client generator)."""
        n = data.num_examples
        if n == 0:
            return
        bs = ctx.train.batch_size
        steps = self.num_steps(data, ctx)
        done = 0
        while done < steps:
            perm = data.indices[torch.randperm(n, generator=ctx.generator).to(data.indices.device)]
            for start in range(0, n, bs):
                idx = perm[start : start + bs]
                x = data.inputs[idx]
                if data.normalize is not None:
                    x = data.normalize(x)
                yield x, data.labels[idx]
                done += 1
                if done >= steps:
                    return

    def loss(
        self, model: nn.Module, batch: tuple[Tensor, Tensor], ins: Instruction, state: ClientState
    ) -> Tensor:
        """Cross-entropy on the batch; override to add terms (FedProx) or change the logits (FedRS)."""
        x, y = batch
        return nn.functional.cross_entropy(model(x), y)

    def finish(
        self,
        model: nn.Module,
        data: ClientData,
        ins: Instruction,
        state: ClientState,
        ctx: TrainContext,
        metrics: dict[str, float],
    ) -> Reply:
        """Build the reply: the trained weights, the number of examples and the training metrics."""
        return Reply(
            weights=clone_weights(model.state_dict()), num_examples=data.num_examples, metrics=metrics
        )

    # -- the local update --------------------------------------------------------------------------------
    def fit(
        self, model: nn.Module, data: ClientData, ins: Instruction, state: ClientState, ctx: TrainContext
    ) -> Reply:
        """Run the local update on ``model`` (a work model the engine lends) and return the reply."""
        model.load_state_dict(self.start_weights(ins, state, ctx))
        if hasattr(model, "set_mask"):
            model.set_mask(ins.mask)
        try:
            self.prepare(model, data, ins, state, ctx)
            model.train()
            opt = self.make_optimizer(model, ins, ctx)
            clip = ctx.train.grad_clip
            total, steps = 0.0, 0
            for batch in self.batches(data, ctx):
                opt.zero_grad(set_to_none=True)
                loss = self.loss(model, batch, ins, state)
                loss.backward()
                if clip:
                    nn.utils.clip_grad_norm_(model.parameters(), clip)
                opt.step()
                total += float(loss.detach())
                steps += 1
            metrics = {"train_loss": total / steps if steps else float("nan"), "steps": float(steps)}
            return self.finish(model, data, ins, state, ctx, metrics)
        finally:
            if hasattr(model, "set_mask"):
                model.set_mask(None)


# --------------------------------------------------------------------------------------------------------
# Strategy: server side (FedAvg behaviour is the base)
# --------------------------------------------------------------------------------------------------------
@dataclass
class ServerContext:
    """What the engine gives a strategy at set-up: the initial model and facts about the federation."""

    model: nn.Module
    model_factory: Callable[[], nn.Module]
    num_clients: int
    num_classes: int
    client_sizes: list[int]
    client_class_counts: np.ndarray
    rounds: int
    train: Any  # TrainConfig
    device: torch.device
    seed: int
    rng: np.random.Generator
    validation: tuple[Tensor, Tensor] | None = None
    #: Lazily computed standalone test accuracies per client (FedRAC's contributions), or None.
    standalone_accuracies: Callable[[], np.ndarray] | None = None
    #: Evaluate a model on (x, y) -> accuracy; provided by the engine.
    evaluate: Callable[[nn.Module, Tensor, Tensor], float] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    #: Shape (C, H, W) of one model input (CELM's probes start from noise of this shape), or None.
    input_shape: tuple[int, ...] | None = None


class Strategy:
    """FedAvg (McMahan et al., 2017): w ← Σ_i p_i w_i with p_i = n_i/Σn (``weighting='samples'``) or 1/N.

    Methods subclass it and override the hooks they change: :meth:`configure` (what each client receives),
    :meth:`aggregation_weights` / :meth:`aggregate` (how replies are combined), :meth:`reward_model`
    (what client i ends with), :meth:`contributions` (estimated contribution weights).
    """

    name = "fedavg"
    #: Client-side trainer class used with this strategy.
    trainer_class: type[Trainer] = Trainer
    #: If True the engine keeps each client's trained weights in its ClientState between rounds.
    keeps_client_models: bool = False
    #: Reply weights may hold only some keys (e.g. a head-less update).
    partial_replies: bool = False

    def __init__(self, weighting: str = "samples", reward: str = "local") -> None:
        if weighting not in ("samples", "uniform"):
            from fedhet.errors import ConfigError

            raise ConfigError(f"method.params.weighting={weighting!r}; accepted: 'samples', 'uniform'")
        if reward not in ("local", "global", "none"):
            from fedhet.errors import ConfigError

            raise ConfigError(f"method.params.reward={reward!r}; accepted: 'local', 'global', 'none'")
        self.weighting = weighting
        self.reward = reward
        self.ctx: ServerContext | None = None
        self.model: nn.Module | None = None
        #: The last weights each client sent (for local-model rewards); filled when ``track_local_models``.
        self.local_weights: dict[int, Weights] = {}

    # -- life cycle ---------------------------------------------------------------------------------------
    @property
    def track_local_models(self) -> bool:
        return self.reward == "local"

    def setup(self, ctx: ServerContext) -> None:
        """Receive the initial global model and the federation's facts."""
        self.ctx = ctx
        self.model = ctx.model

    def global_weights(self) -> Weights:
        return self.model.state_dict()

    def configure(self, rnd: int, client_ids: list[int]) -> dict[int, Instruction]:
        """One instruction per sampled client: the full global model."""
        weights = self.global_weights()
        return {cid: Instruction(weights=weights) for cid in client_ids}

    def aggregation_weights(self, rnd: int, replies: dict[int, Reply]) -> np.ndarray:
        """p_i for the replies, in client-id order."""
        if self.weighting == "uniform":
            return np.ones(len(replies))
        return np.array([replies[cid].num_examples for cid in sorted(replies)], dtype=np.float64)

    def aggregate(self, rnd: int, replies: dict[int, Reply]) -> None:
        """Replace the global model by the weighted average of the replies (client-id order)."""
        if self.track_local_models:
            for cid, rep in replies.items():
                self.local_weights[cid] = rep.weights
        if not replies:
            return
        ids = sorted(replies)
        p = self.aggregation_weights(rnd, replies)
        if float(np.sum(p)) <= 0:
            p = np.ones(len(ids))
        self.model.load_state_dict(weighted_average([replies[c].weights for c in ids], p))

    def global_model(self) -> nn.Module | None:
        """The model evaluated as the federation's result (None if there is none, e.g. Standalone)."""
        return self.model

    def reward_model(self, cid: int) -> nn.Module | None:
        """What client ``cid`` ends with (its reward); None when the method defines none.

        FedAvg's reward is the client's locally trained model of its last round (the convention of FedRAC's
        FedAvg baseline); with ``reward='global'`` every client gets the global model.
        """
        if self.reward == "none":
            return None
        if self.reward == "global":
            return self.model
        weights = self.local_weights.get(cid)
        if weights is None:
            return None
        model = self._scratch_model()
        model.load_state_dict(weights)
        return model

    def has_rewards(self) -> bool:
        """Whether per-client reward models exist (used to decide on fairness metrics)."""
        return self.reward == "local"

    def make_trainer(self) -> Trainer:
        """The client-side trainer paired with this strategy."""
        return self.trainer_class()

    def evaluate_rewards(self, x: Tensor, y: Tensor, batch_size: int) -> list[float] | None:
        """Test accuracy of every client's reward model (NaN where a client has none yet); None if no rewards.

        Override to batch the evaluation (FedRAC evaluates all masks in one pass).
        """
        from fedhet.engine.evaluation import accuracy_of

        accs = []
        for cid in range(self.ctx.num_clients):
            m = self.reward_model(cid)
            accs.append(accuracy_of(m, x, y, batch_size) if m is not None else float("nan"))
        return accs if any(math.isfinite(a) for a in accs) else None

    def contributions(self) -> np.ndarray | None:
        """Estimated per-client contribution weights (CELM, ShapFed, CGSV, ...), or None."""
        return None

    def round_metrics(self, rnd: int) -> dict[str, Any]:
        """Extra per-round numbers for metrics.jsonl (e.g. contribution weights)."""
        c = self.contributions()
        return {"contributions": [float(v) for v in c]} if c is not None else {}

    def write_artifacts(self, run_dir: Any) -> None:
        """Write method-specific CSVs/figures into the run directory at the end of a run."""

    # -- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: tensors and JSON-able values (nested dicts allowed)."""
        return {
            "model": dict(self.model.state_dict()),
            "local_weights": {str(k): v for k, v in self.local_weights.items()},
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        self.model.load_state_dict(sd["model"])
        self.local_weights = {int(k): dict(v) for k, v in sd.get("local_weights", {}).items()}

    # -- utilities for subclasses -------------------------------------------------------------------------
    def _scratch_model(self) -> nn.Module:
        """A reusable extra model instance (for evaluating rewards) on the server's device."""
        if getattr(self, "_scratch", None) is None:
            self._scratch = copy.deepcopy(self.model)
        return self._scratch
