"""What CFFL, CGSV, ShapFed and IAFL share: clients that keep their own model and upload an update Δ.

In this family (baselines.md §2.2–2.5) there is no single model that every client trains from. Each
client i holds its *own* model w_i; in a round it trains from w_i, uploads Δ_i = trained − w_i (possibly
clipped or filtered) and keeps some part of it locally (nothing for CGSV/IAFL, which reset to w_i; all of
it for ShapFed; the clipped update for CFFL). The server turns the uploads into a server ("global") model
and into a per-client *reward* δ_i, which is added to the client's model: w_i ← w_i + kept_i + δ_i.

The pieces here:

- pure update arithmetic on state dicts: :func:`state_delta`, :func:`add_update`, :func:`weighted_sum`,
  :func:`flatten`, :func:`cosine`, :func:`normalise_update`, :func:`clip_elementwise`,
  :func:`topk_per_layer`, :func:`topk_global`;
- :class:`OwnModelTrainer`, the client: trains from its own model, uploads Δ and keeps what its
  instruction's config says (``local_update``, ``update_clip``, ``upload_fraction``, ``upload_criterion``);
- :class:`OwnModelStrategy`, the server base: mirrors every client's model (``client_models``, the reward
  model the engine evaluates), delivers rewards as ``Instruction(delta=True)`` and re-synchronises clients
  that missed a round.

Reward delivery [ours]. A reward computed in round t is added to the server's mirror at once (so the reward
model evaluated after round t is the client's model after its round-t reward, as in the reference code) and
sent to the client with its next instruction as a delta. A client that was sent an instruction but whose
reply never arrived (dropped, ``train.client_dropout``) or was rejected (``ClientUpdateError``) may or may
not have applied that delta, so its next instruction carries its full mirrored model instead
(``delta=False``), which makes client and mirror identical again. Clients that were not sampled simply
accumulate their pending rewards; a client's first instruction carries the initial model plus its pending
rewards (it holds no model yet). The clients keep their own models (``keep = "model"``); sample and class
counts are their self-reported round-0 descriptions.

Float buffers (BatchNorm statistics; mlp, mlp200 and cnn have none) travel in Δ and in the aggregates but
are never normalised, clipped or sparsified: those operations act on the model's parameters only, like the
reference code's ``model.parameters()`` loops.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedhet.algorithms.fedavg import FedAvg, SGDTrainer
from fedhet.algorithms.params import check_choice
from fedhet.algorithms.robust_aggregation import robust_average
from fedhet.engine.protocol import KEEP_KEY, FederationInfo, Instruction, LocalUpdate, Reply, Weights
from fedhet.engine.weights import clone_weights

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1

log = logging.getLogger("fedhet")

#: Reply.payload prefix of the part of Δ a client keeps locally when it differs from its upload (CFFL).
LOCAL_UPDATE_PREFIX = "local_update/"
LOCAL_UPDATE_MODES = ("reset", "keep")
UPLOAD_CRITERIA = ("all", "layer")
#: "own-model": each client keeps its own model and receives rewards (the methods' own papers);
#: "global": every client restarts from the global model each round and only the global model is
#: evaluated (the methods as contribution estimators inside a FedAvg loop, CELM's tables).
PROTOCOLS = ("own-model", "global")


# --------------------------------------------------------------------------------------------------------
# Update arithmetic (pure functions on state dicts)
# --------------------------------------------------------------------------------------------------------
def state_delta(new: Mapping[str, Tensor], old: Mapping[str, Tensor]) -> Weights:
    """Δ = new − old for every key (integer buffers included, so that old + Δ == new exactly)."""
    return {k: (new[k] - old[k]).detach().clone() for k in old}


def add_update(base: Mapping[str, Tensor], update: Mapping[str, Tensor], scale: float = 1.0) -> Weights:
    """base + scale·update as a new state dict; keys missing from ``update`` are copied from ``base``."""
    out: Weights = {}
    for k, v in base.items():
        u = update.get(k)
        if u is None:
            out[k] = v.clone()
        elif v.is_floating_point():
            out[k] = v + scale * u.to(v.device, v.dtype)
        elif scale == 1.0:
            out[k] = v + u.to(v.device, v.dtype)
        else:  # integer buffers (counters) only ever move by whole updates
            out[k] = v.clone()
    return out


def zeros_like_update(like: Mapping[str, Tensor]) -> Weights:
    """A zero update with the keys, shapes and dtypes of ``like``."""
    return {k: torch.zeros_like(v) for k, v in like.items()}


def weighted_sum(
    updates: Sequence[Mapping[str, Tensor]], weights: Iterable[float], keys: Sequence[str]
) -> Weights:
    """Σ_i w_i·u_i over ``keys`` (not normalised: the caller chooses the weights' sum)."""
    weights = [float(w) for w in weights]
    if len(weights) != len(updates):
        raise ValueError(f"{len(updates)} updates but {len(weights)} weights")
    if not updates:
        raise ValueError("weighted_sum needs at least one update")
    out: Weights = {}
    for k in keys:
        acc = torch.zeros_like(updates[0][k])
        for w, u in zip(weights, updates, strict=True):
            if w != 0.0:
                acc.add_(u[k], alpha=w)
        out[k] = acc
    return out


def flatten(update: Mapping[str, Tensor], keys: Sequence[str]) -> Tensor:
    """The update's ``keys`` concatenated into one vector (the reference code's ``flatten``)."""
    return torch.cat([update[k].reshape(-1).float() for k in keys]) if keys else torch.zeros(0)


def unflatten(vector: Tensor, like: Mapping[str, Tensor], keys: Sequence[str]) -> Weights:
    """Inverse of :func:`flatten`: cut ``vector`` back into tensors shaped like ``like[k]``."""
    out: Weights = {}
    offset = 0
    for k in keys:
        n = like[k].numel()
        out[k] = vector[offset : offset + n].reshape(like[k].shape).to(like[k].dtype)
        offset += n
    if offset != vector.numel():
        raise ValueError(f"vector has {vector.numel()} entries, the keys need {offset}")
    return out


def cosine(a: Tensor, b: Tensor, eps: float = 1e-10) -> float:
    """cos(a, b) = a·b / max(‖a‖‖b‖, eps) (torch's ``cosine_similarity`` convention; 0 for a zero vector)."""
    a, b = a.double(), b.double()
    return float(torch.dot(a, b) / max(float(a.norm() * b.norm()), eps))


def update_norm(update: Mapping[str, Tensor], keys: Sequence[str]) -> float:
    """‖flat(update)‖₂ over ``keys``."""
    return float(flatten(update, keys).norm())


def normalise_update(
    update: Mapping[str, Tensor],
    keys: Sequence[str],
    target_norm: float,
    mode: str = "scale",
    eps: float = 1e-7,
) -> Weights:
    """CGSV's Δ̃ = Γ·Δ/(‖Δ‖ + 1e-7) on ``keys`` (``mode='scale'``); ``'clip'`` rescales only when ‖Δ‖ > Γ.

    Other keys are returned unchanged.
    """
    norm = update_norm(update, keys) + eps
    out = dict(update)
    if mode == "clip" and norm <= target_norm:
        return out
    factor = target_norm / norm
    for k in keys:
        out[k] = update[k] * factor
    return out


def clip_elementwise(update: Mapping[str, Tensor], bound: float, keys: Sequence[str]) -> Weights:
    """CFFL's clipping: every entry of ``keys`` clamped to [−bound, bound]; other keys unchanged."""
    out = dict(update)
    for k in keys:
        out[k] = update[k].clamp(-bound, bound)
    return out


def topk_per_layer(update: Mapping[str, Tensor], fraction: float, keys: Sequence[str]) -> Weights:
    """Per tensor of ``keys`` keep the ⌈fraction·|tensor|⌉ largest-magnitude entries, zero the rest.

    CGSV's ``mask_grad_update_by_order(mode='layer')``; ``fraction >= 1`` keeps everything, ``<= 0``
    nothing. Exactly k entries survive (ties broken by ``torch.topk``). Other keys are unchanged.
    """
    out = dict(update)
    for k in keys:
        t = update[k]
        n = t.numel()
        count = min(n, math.ceil(n * fraction)) if fraction > 0 else 0
        out[k] = _keep_topk(t, count)
    return out


def topk_global(update: Mapping[str, Tensor], count: int, keys: Sequence[str]) -> Weights:
    """Keep the ``count`` largest-magnitude entries over all tensors of ``keys`` together, zero the rest.

    CFFL's ``largest_criterion='all'``. Exactly ``count`` entries survive; other keys are unchanged.
    """
    out = dict(update)
    if not keys:
        return out
    flat = flatten(update, keys)
    count = max(0, min(int(count), flat.numel()))
    kept = _keep_topk(flat, count)
    out.update(unflatten(kept, update, keys))
    return out


def _keep_topk(t: Tensor, count: int) -> Tensor:
    if count >= t.numel():
        return t.clone()
    out = torch.zeros_like(t).reshape(-1)
    if count > 0:
        # unsorted: the same entries (topk selects, then sorts), 1.5-4x faster on 200k entries (measured)
        idx = torch.topk(t.reshape(-1).abs(), count, sorted=False).indices
        out[idx] = t.reshape(-1)[idx]
    return out.reshape(t.shape)


def count_entries(like: Mapping[str, Tensor], keys: Sequence[str]) -> int:
    """Number of scalars in ``keys`` (|params| in CFFL's download size)."""
    return sum(like[k].numel() for k in keys)


def parameter_keys(model: nn.Module) -> list[str]:
    """State-dict keys of the model's parameters (what the reference code's ``model.parameters()`` covers)."""
    return [name for name, _ in model.named_parameters()]


# --------------------------------------------------------------------------------------------------------
# Client
# --------------------------------------------------------------------------------------------------------
class OwnModelTrainer(SGDTrainer):
    """Client of the own-model methods: train the own model, upload Δ, keep what ``ins.config`` says.

    Config keys (all optional): ``local_update`` ('reset': the model returns to where it started, CGSV/IAFL;
    'keep': it keeps the (clipped) update, CFFL/ShapFed), ``update_clip`` (element-wise bound on Δ, CFFL),
    ``upload_fraction`` θ and ``upload_criterion`` ('all'/'layer': only the top-θ entries of Δ are uploaded,
    CFFL) and ``local_epochs`` (this round's local epochs, ShapFed's longer first round).
    """

    uploads_updates = True  # its (filtered) update, whatever the server sent

    def num_steps(self, u: LocalUpdate) -> int:
        """As the base, but an instruction's ``local_epochs`` overrides ``train.local_epochs`` this round."""
        epochs = u.config.get("local_epochs")
        train = u.context.train
        if epochs is None or train.local_steps:
            return super().num_steps(u)
        n = u.data.num_examples
        per_epoch = math.ceil(n / train.batch_size) if n else 0
        return int(round(float(epochs) * per_epoch))

    def finish(self, u: LocalUpdate, metrics: dict[str, float]) -> Reply:
        """Upload Δ (clipped / top-θ filtered as configured); remember the own model per ``local_update``."""
        params = parameter_keys(u.model)
        delta = state_delta(u.model.state_dict(), u.start)
        cfg = u.config
        clip = cfg.get("update_clip")
        if clip:
            delta = clip_elementwise(delta, float(clip), params)
        upload = delta
        fraction = float(cfg.get("upload_fraction", 1.0))
        if fraction < 1.0:
            if cfg.get("upload_criterion", "all") == "layer":
                upload = topk_per_layer(delta, fraction, params)
            else:
                upload = topk_global(delta, int(fraction * count_entries(delta, params)), params)
        payload: dict[str, Tensor] = {}
        if cfg.get("local_update", "reset") == "keep":
            u.scratch.own_model = add_update(u.start, delta)
            if upload is not delta:
                payload = {LOCAL_UPDATE_PREFIX + k: v for k, v in delta.items()}
        else:
            u.scratch.own_model = u.start
        return Reply(weights=upload, num_examples=self.num_examples(u.data), metrics=metrics, payload=payload)

    def kept_weights(self, u: LocalUpdate, reply: Reply) -> Weights:
        """The own model: where training started ('reset') or that plus the (clipped) update ('keep')."""
        return u.scratch.own_model


# --------------------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------------------
class OwnModelStrategy(FedAvg):
    """Server base of CFFL/CGSV/ShapFed/IAFL: mirrors each client's own model and delivers rewards.

    Subclasses implement :meth:`server_round` (from the round's uploads: update ``self.model`` and call
    :meth:`give_reward`) and may override :meth:`client_config`, :meth:`before_round`,
    :meth:`contributions`, :meth:`extra_state` / :meth:`load_extra_state` and :meth:`client_columns`.
    Client sample and class counts (``self.sizes``, ``self.class_counts``) are the clients' self-reported
    descriptions.
    """

    # [aggregation]'s rules replace the weighted mean inside the method's own combinations (combine)
    supports_aggregation_rules = True

    trainer_class = OwnModelTrainer
    #: Rewards are these methods' result: fairness is measured unless eval.fairness = false.
    fairness_by_default = True
    #: What a client keeps of its own update ('reset' or 'keep'), sent in every instruction.
    local_update = "reset"

    def __init__(self, protocol: str = "own-model") -> None:
        super().__init__(weighting="samples", reward="local")
        self.protocol = check_choice(
            "protocol",
            protocol,
            PROTOCOLS,
            hint="'own-model': clients keep their own models and get rewards (the method's paper); 'global': "
            "every client restarts from the global model, rewards are not used (CELM's tables)",
        )
        self.client_models: dict[int, Weights] = {}
        self.pending: dict[int, Weights] = {}
        self.resync: set[int] = set()
        self.fresh: set[int] = set()
        self._awaiting: set[int] = set()
        self.rounds_done = 0

    # -- life cycle ---------------------------------------------------------------------------------------
    def setup(self, info: FederationInfo) -> None:
        super().setup(info)
        self.initial_weights = clone_weights(self.model.state_dict())
        self.param_keys = parameter_keys(self.model)
        self.float_keys = [k for k, v in self.initial_weights.items() if v.is_floating_point()]
        self.client_models = {cid: clone_weights(self.initial_weights) for cid in range(info.num_clients)}
        # No client holds a model yet: its first instruction carries the initial one (plus pending rewards).
        self.pending, self.resync, self._awaiting, self.rounds_done = {}, set(), set(), 0
        self.fresh = set(range(info.num_clients))
        self.sizes = np.zeros(info.num_clients)
        self.class_counts = np.zeros((info.num_clients, info.num_classes))

    def receive_descriptions(self, descriptions: Mapping[int, Reply]) -> None:
        """Self-reported sample counts n_i and class counts (0 for a client that sent no description)."""
        for cid, rep in descriptions.items():
            self.sizes[cid] = rep.num_examples
            self.class_counts[cid] = rep.payload["class_counts"].double().cpu().numpy()

    def client_config(self, rnd: int, cid: int) -> dict[str, Any]:
        """Config sent to client ``cid`` in round ``rnd`` (scalars only, Flower-compatible)."""
        return {"local_update": self.local_update}

    def before_round(self, rnd: int, client_ids: list[int]) -> None:
        """Called at the start of :meth:`configure` (IAFL's stochastic recovery)."""

    def configure(self, rnd: int, client_ids: list[int]) -> dict[int, Instruction]:
        """Each sampled client gets what it starts from (:meth:`_start_instruction`), this round's
        :meth:`client_config` and the order to keep its model."""
        self.before_round(rnd, client_ids)
        global_weights = clone_weights(self.model.state_dict()) if self.protocol == "global" else None
        out: dict[int, Instruction] = {}
        for cid in client_ids:
            ins = self._start_instruction(cid, global_weights)
            ins.config.update(self.client_config(rnd, cid))
            ins.config[KEEP_KEY] = "model"
            out[cid] = ins
        self._awaiting = set(client_ids)
        self.fresh -= self._awaiting
        return out

    def _start_instruction(self, cid: int, global_weights: Weights | None) -> Instruction:
        """What client ``cid`` starts from: its pending reward as a delta, its full model when out of sync,
        the initial model plus its pending rewards the first time. With ``global_weights`` (the ``global``
        protocol) every sampled client restarts from the global model, its mirror too."""
        if global_weights is not None:
            self.client_models[cid] = global_weights
            return Instruction(weights=global_weights, delta=False)
        if cid in self.resync:
            return Instruction(weights=clone_weights(self.client_models[cid]), delta=False)
        if cid in self.fresh:
            pending = self.pending.get(cid)
            start = add_update(self.initial_weights, pending) if pending is not None else self.initial_weights
            return Instruction(weights=start, delta=False)
        if cid in self.pending:
            return Instruction(weights=self.pending[cid], delta=True)
        return Instruction(weights={})

    def aggregate(self, rnd: int, replies: Mapping[int, Reply]) -> None:
        """Book-keep deliveries, apply what clients kept to the mirrors, then run :meth:`server_round`."""
        self.aggregation_round = rnd
        accepted = {cid: rep for cid, rep in sorted(replies.items()) if self._payload_ok(cid, rep)}
        for cid in self._awaiting:
            self.pending.pop(cid, None)
            if cid in accepted:
                self.resync.discard(cid)
            else:
                self.resync.add(cid)
        self._awaiting = set()
        updates: dict[int, Weights] = {}
        starts: dict[int, Weights] = {}
        for cid, rep in accepted.items():
            starts[cid] = self.client_models[cid]
            updates[cid] = rep.weights
            if self.local_update == "keep":
                kept = self.local_part(rep)
                self.client_models[cid] = add_update(starts[cid], kept)
        self.server_round(rnd, starts, updates, accepted)
        self.rounds_done += 1

    def server_round(
        self, rnd: int, starts: dict[int, Weights], updates: dict[int, Weights], replies: dict[int, Reply]
    ) -> None:
        """The method's server step. ``updates`` may be empty (every client dropped): it must not fail."""
        raise NotImplementedError

    # -- helpers for subclasses ---------------------------------------------------------------------------
    def local_part(self, reply: Reply) -> Weights:
        """The part of Δ the client kept: the payload's ``local_update/*`` if sent, else the upload."""
        if any(k.startswith(LOCAL_UPDATE_PREFIX) for k in reply.payload):
            return {k[len(LOCAL_UPDATE_PREFIX) :]: v for k, v in reply.payload.items()}
        return reply.weights

    def give_reward(self, cid: int, delta: Mapping[str, Tensor]) -> None:
        """Add the reward δ to client ``cid``'s model (mirror now, client with its next instruction); under
        the ``global`` protocol rewards are not used (every client restarts from the global model)."""
        if self.protocol == "global":
            return
        self.client_models[cid] = add_update(self.client_models[cid], delta)
        if cid in self.resync:
            return  # its next instruction carries the full mirror anyway
        prev = self.pending.get(cid)
        self.pending[cid] = (
            add_update(prev, delta) if prev is not None else {k: v.clone() for k, v in delta.items()}
        )

    def set_client_model(self, cid: int, weights: Mapping[str, Tensor]) -> None:
        """Replace client ``cid``'s model (IAFL's recovery); it is sent in full with the next instruction."""
        self.client_models[cid] = clone_weights(weights)
        self.pending.pop(cid, None)
        self.resync.add(cid)

    def apply_to_global(self, update: Mapping[str, Tensor]) -> None:
        """w_server ← w_server + update."""
        self.model.load_state_dict(add_update(self.model.state_dict(), update))

    def zero_update(self) -> Weights:
        return zeros_like_update(self.model.state_dict())

    def combine(
        self, items: Sequence[Mapping[str, Tensor]], weights: Iterable[float], center: Weights | None = None
    ) -> Weights:
        """Σ_i w_i·x_i over the float keys (:func:`weighted_sum`, the method's own combination), or, under a
        robust ``[aggregation]`` rule, (Σ_i w_i) · rule(x; w): the rule replaces the weighted mean inside the
        sum, keeping the method's weights and their total. ``center`` is where centered clipping starts (the
        global model when ``items`` are models; the zero update by default)."""
        weights = [float(w) for w in weights]
        if self.plain_mean():
            return weighted_sum(items, weights, self.float_keys)
        total = sum(weights)
        parts = [{k: x[k] for k in self.float_keys} for x in items]
        if total <= 0:
            return {k: torch.zeros_like(v) for k, v in parts[0].items()}
        start = center if center is not None else {k: torch.zeros_like(v) for k, v in parts[0].items()}
        merged, _ = robust_average(
            parts, weights, self.aggregation_settings, center=start, rng=self.aggregation_generator()
        )
        return {k: v * total for k, v in merged.items()}

    def _payload_ok(self, cid: int, reply: Reply) -> bool:
        """Validate the optional ``local_update/*`` payload like the engine validates weights."""
        ref = self.model.state_dict()
        local = {
            k[len(LOCAL_UPDATE_PREFIX) :]: v
            for k, v in reply.payload.items()
            if k.startswith(LOCAL_UPDATE_PREFIX)
        }
        if not local:
            return True
        problem = None
        if set(local) != set(ref):
            problem = "its local_update payload does not cover exactly the model's keys"
        else:
            for k, v in local.items():
                if not isinstance(v, Tensor) or v.shape != ref[k].shape:
                    problem = f"local_update/{k} has the wrong type or shape"
                    break
                if v.is_floating_point() and not bool(torch.isfinite(v).all()):
                    problem = f"local_update/{k} holds non-finite values"
                    break
        if problem:
            log.warning("rejected the update of client %d: %s", cid, problem)
        return problem is None

    # -- rewards ------------------------------------------------------------------------------------------
    def reward_model(self, cid: int) -> nn.Module | None:
        """Client ``cid``'s own model after its latest reward (the server's mirror of it); None under the
        ``global`` protocol, where every client holds the global model."""
        if self.protocol == "global":
            return None
        model = self.scratch_model()
        model.load_state_dict(self.client_models[cid])
        return model

    def has_rewards(self) -> bool:
        return self.protocol == "own-model"

    # -- records ------------------------------------------------------------------------------------------
    def client_columns(self) -> dict[str, Sequence[float]]:
        """Per-client columns of ``<method>_clients.csv`` (override to add method-specific ones)."""
        cols: dict[str, Sequence[float]] = {"num_examples": self.sizes.tolist()}
        c = self.contributions()
        if c is not None:
            cols["contribution"] = [float(v) for v in c]
        return cols

    def run_records(self) -> dict[str, Any]:
        """One row per client with its final contribution and reward state (``<method>_clients.csv``)."""
        return {"client_table": {"file": f"{self.name}_clients.csv", "columns": self.client_columns()}}

    # -- state ----------------------------------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        """Method-specific state (tensors, numpy arrays, JSON values)."""
        return {}

    def load_extra_state(self, sd: Mapping[str, Any]) -> None:
        """Inverse of :meth:`extra_state`."""

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": clone_weights(self.model.state_dict()),
            "client_models": {str(k): v for k, v in self.client_models.items()},
            "pending": {str(k): v for k, v in self.pending.items()},
            "resync": sorted(self.resync),
            "fresh": sorted(self.fresh),
            "rounds_done": self.rounds_done,
            "extra": self.extra_state(),
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        self.model.load_state_dict(sd["model"])
        self.client_models = {int(k): dict(v) for k, v in sd["client_models"].items()}
        self.pending = {int(k): dict(v) for k, v in sd.get("pending", {}).items()}
        self.resync = {int(c) for c in sd.get("resync", [])}
        self.fresh = {int(c) for c in sd.get("fresh", [])}
        self.rounds_done = int(sd.get("rounds_done", 0))
        self.load_extra_state(sd.get("extra", {}))


def class_presence(class_counts: np.ndarray) -> np.ndarray:
    """Number of classes each client holds (rows of the (N, K) count matrix with a positive count)."""
    return (np.asarray(class_counts) > 0).sum(axis=1).astype(np.float64)
