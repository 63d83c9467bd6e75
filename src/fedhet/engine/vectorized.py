"""Many small clients trained at once (``engine.mode = "vectorized"``): one ``torch.func`` program.

The clients' start weights are stacked on a group axis and every step is one ``vmap`` over
``grad`` of a functional loss, followed by a functional SGD step (momentum, weight decay, Nesterov and
gradient clipping with ``torch.optim.SGD`` and ``clip_grad_norm_``'s semantics). Each client still takes
exactly its own steps on exactly its own batches: the index sequence of every client is drawn first, from
the same seeded generator and in the same order as ``SGDTrainer.batches``; a client's last, smaller batch of
an epoch is padded and masked out of its mean loss, and a client that has taken all its steps is masked out
of the update. Results equal the sequential engine's up to float reassociation (a tested tolerance).

Only what the functional path can honour runs here (:func:`why_not_vectorized` names the reason otherwise):
a trainer whose class declares a functional form (``Trainer.functional_form``: FedAvg's "plain", FedProx's
"proximal", FedRS's "restricted") and keeps the training hooks of the class that declared it
(``TRAINING_HOOKS``; the own-model trainer of CFFL, IAFL, CGSV and ShapFed changes only its step count and
its reply), SGD without Adam, models without BatchNorm, no injected training faults. Submodel masks (FedRAC,
FedSAC: each client trains its own submodel of ``mlp200``) are honoured on the closed-form ReLU-stack path:
each member's mask multiplies its hidden activations, as ``MaskedMLP``'s mask points do.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from fedhet.devices import to_device
from fedhet.engine.client import start_weights
from fedhet.engine.protocol import (
    ACTION_KEY,
    FUNCTIONAL_FORMS,
    KEEP_KEY,
    LR_KEY,
    TRAINING_HOOKS,
    ClientData,
    ClientState,
    Instruction,
    LocalUpdate,
    Reply,
    TrainContext,
    Trainer,
)
from fedhet.engine.weights import clone_weights
from fedhet.models.mlp import stacked_relu_inputs

#: Clients trained in one stacked program (larger rounds run in chunks of this many).
GROUP_SIZE = int(os.environ.get("FEDHET_VECTOR_GROUP", "64"))

#: How a group's gradients are computed: "auto" takes the closed form for a model that declares itself a
#: plain ReLU stack (``relu_stack_layers()``, as fedhet's ``mlp`` does) and ``vmap`` over ``grad`` for any
#: other; "vmap" always takes the latter (the tests run both; benchmarks/vectorized.py measures both).
GRADIENTS = os.environ.get("FEDHET_VECTOR_GRADIENTS", "auto")


def declaring_class(cls: type, attribute: str) -> type | None:
    """The class in ``cls``'s MRO whose own body sets ``attribute``: the declaration ``cls`` inherits."""
    return next((klass for klass in cls.__mro__ if attribute in vars(klass)), None)


def _form(trainer: Trainer) -> tuple[str | None, str | None]:
    """(the trainer's functional form, None) when its declaration holds, else (None, why not)."""
    cls = type(trainer)
    owner = declaring_class(cls, "functional_form")
    form = None if owner is None else owner.functional_form
    if form is None:
        return None, (
            f"its trainer {cls.__name__} declares no functional form (Trainer.functional_form, one of "
            f"{', '.join(map(repr, FUNCTIONAL_FORMS))})"
        )
    if form not in FUNCTIONAL_FORMS:
        return None, (
            f"its trainer {cls.__name__} declares the functional form {form!r}; the vectorized path computes "
            f"{', '.join(map(repr, FUNCTIONAL_FORMS))}"
        )
    overridden = [hook for hook in TRAINING_HOOKS if getattr(cls, hook) is not getattr(owner, hook)]
    if overridden:
        return None, (
            f"its trainer {cls.__name__} has hooks the vectorized path cannot honour: it overrides "
            f"{', '.join(f'`{hook}`' for hook in overridden)} below {owner.__name__}'s declared {form!r} form"
        )
    return form, None


def trainer_kind(trainer: Trainer) -> str | None:
    """The trainer's declared functional form ("plain", "proximal" or "restricted") when its class keeps
    every training hook (``TRAINING_HOOKS``) of the class that declared it, else None."""
    return _form(trainer)[0]


def replies_trained_weights(trainer: Trainer) -> bool:
    """Whether the trainer's ``finish`` is that of a class declaring ``finish_replies_trained_weights``
    (its reply: exactly the trained weights, ``num_examples`` and the metrics)."""
    owner = declaring_class(type(trainer), "finish_replies_trained_weights")
    return (
        owner is not None
        and bool(owner.finish_replies_trained_weights)
        and type(trainer).finish is owner.finish
    )


def why_not_vectorized(trainer: Trainer, model: nn.Module, train: Any, faults: bool = False) -> str | None:
    """None when this run's local training can be vectorized, else the reason (for the user)."""
    kind, refusal = _form(trainer)
    if kind is None:
        return refusal
    if train.optimizer != "sgd":
        return f"train.optimizer = {train.optimizer!r} (the vectorized path implements SGD)"
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return "the model has BatchNorm layers (running statistics are per-client state vmap does not update)"
    if getattr(model, "maskable_units", 0) and mask_widths(model, kind) is None:
        return (
            "the model has submodel masks, which the vectorized path applies only to a masked plain ReLU "
            "stack (mlp200) trained by FedAvg's or FedRS's loop with engine gradients 'auto'"
        )
    if faults:
        return "[faults] are injected (they act per client on the sequential path)"
    return None


@dataclass
class Member:
    """One client of the group: its ids, its update context and its batches as index tensors."""

    cid: int
    update: LocalUpdate
    batches: Tensor  # (steps, batch_size) positions in data.indices (CPU), -1 = padding
    scale: Tensor | None  # FedRS logit scales (C,), or None
    mu: float  # FedProx μ (0 without the proximal term)
    mask: Tensor | None  # the client's submodel mask (K,) (FedRAC, FedSAC), or None for the whole model


def index_batches(trainer: Trainer, u: LocalUpdate) -> Tensor:
    """Every local step's positions in ``data.indices`` as a (steps, batch_size) CPU tensor, -1 where a
    step's batch is shorter (an epoch's last batch), drawn as ``SGDTrainer.batches`` draws them (the same
    generator calls). Positions, not indices: they stay on the CPU where the generator draws them, and
    :func:`_train_stacked` maps them to indices on the device after one copy (no host sync per epoch)."""
    data, gen = u.data, u.context.generator
    n, bs = data.num_examples, u.context.train.batch_size
    if n == 0:
        return torch.empty(0, bs, dtype=torch.long)
    steps = trainer.num_steps(u)
    per_epoch = math.ceil(n / bs)
    epochs = []
    for _ in range(math.ceil(steps / per_epoch)):
        perm = torch.randperm(n, generator=gen)
        padded = torch.full((per_epoch * bs,), -1, dtype=torch.long)
        padded[:n] = perm
        epochs.append(padded.view(per_epoch, bs))
    return torch.cat(epochs)[:steps]


def relu_stack_names(model: nn.Module, trainable: Sequence[str]) -> list[str] | None:
    """The Linear layers of a model whose forward pass is exactly ``head(relu(⋯ relu(hidden_1(flatten(x)))))``
    (it declares them, hidden first, in ``relu_stack_layers()``) and whose trainable parameters are exactly
    their weights and biases; None for any other model, or when :data:`GRADIENTS` is "vmap"."""
    declared = getattr(model, "relu_stack_layers", None)
    if GRADIENTS == "vmap" or declared is None:
        return None
    layers = list(declared())
    expected = {f"{layer}.{part}" for layer in layers for part in ("weight", "bias")}
    return layers if expected == set(trainable) else None


def mask_widths(model: nn.Module, kind: str = "plain") -> list[int] | None:
    """The widths of a maskable model's hidden layers when its submodel masks can be trained here: a ReLU
    stack (:func:`relu_stack_names`) with one mask point after each hidden layer, in K order (``mlp200``),
    trained with the closed form (``kind`` "plain" or FedRS's "restricted"; FedProx's term takes ``vmap``,
    which has no masks); else None."""
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    layers = relu_stack_names(model, trainable) if kind != "proximal" else None
    points = model.mask_points() if hasattr(model, "mask_points") else []
    if layers is None or len(points) != len(layers) - 1:
        return None
    widths = [getattr(model, name).out_features for name in layers[:-1]]
    return widths if [point.size for _, point in points] == widths else None


def relu_stack_step(
    layers: Sequence[tuple[Tensor, Tensor]],
    x: Tensor,
    y: Tensor,
    w: Tensor,
    scales: Tensor | None,
    lr: float | None,
    masks: Sequence[Tensor] | None = None,
) -> tuple[Tensor, list[tuple[Tensor, Tensor]] | None]:
    """One step of every member of a plain ReLU stack, its gradients in closed form (no autograd, no vmap).

    ``layers``: per Linear layer the stacked (weight (G, out, in), bias (G, out)), hidden first; x (G, B, …),
    y (G, B) labels, w (G, B) sample weights (0 = padding), ``scales`` (G, C) FedRS's logit scales or None.
    Forward z_l = h_{l-1} W_lᵀ + b_l, h_l = relu(z_l), logits z = z_L (× s). With the member's loss the mean
    cross-entropy over its real samples, L = Σ_b w_b CE_b / max(Σ_b w_b, 1):
    δ_L = ∂L/∂z_L = s ⊙ (softmax(z) − onehot(y)) · w_b / max(Σ w, 1); ∂L/∂W_l = δ_lᵀ h_{l-1},
    ∂L/∂b_l = Σ_b δ_l; δ_{l-1} = (δ_l W_l) ⊙ [h_{l-1} > 0] (ReLU's derivative as autograd takes it).
    ``masks`` (one 0/1 (G, width) per hidden layer): h_l = m_l ⊙ relu(z_l), so [h_l > 0] = m_l ⊙ [z_l > 0]
    carries the mask into δ and a masked unit's weights get exactly zero gradient (methods.md §3.3).

    With ``lr`` the plain SGD step W_l ← W_l − lr·∂L/∂W_l is taken in place inside the product
    (``baddbmm_``), after δ_{l-1} has used the old W_l, so no gradient is ever materialised; returns
    (losses (G,), None). Without ``lr``: (losses, [(∂L/∂W_l, ∂L/∂b_l) per layer]).
    """
    # h_0 … h_{L-1}; x (1, B, …) is one batch every member trains on (shared_batches)
    inputs = stacked_relu_inputs(layers[:-1], x.reshape(x.shape[0], x.shape[1], -1), masks)
    head_w, head_b = layers[-1]
    logits = torch.baddbmm(head_b.unsqueeze(1), inputs[-1], head_w.transpose(1, 2))
    if scales is not None:
        logits = logits * scales.unsqueeze(1)
    log_p = torch.log_softmax(logits, dim=-1)
    share = w / w.sum(dim=1, keepdim=True).clamp_min(1.0)  # w_b / max(Σ w, 1)
    losses = -(log_p.gather(-1, y.unsqueeze(-1)).squeeze(-1) * share).sum(dim=1)
    delta = log_p.exp_()
    delta.scatter_add_(-1, y.unsqueeze(-1), torch.full_like(delta[..., :1], -1.0))
    delta.mul_(share.unsqueeze(-1))
    if scales is not None:
        delta.mul_(scales.unsqueeze(1))
    grads: list[tuple[Tensor, Tensor]] = []
    for index in range(len(layers) - 1, -1, -1):
        (weight, bias), h_in = layers[index], inputs[index]
        below = torch.bmm(delta, weight).mul_(h_in > 0) if index else None  # with W_l before its step
        if h_in.shape[0] == 1 < weight.shape[0]:  # one input shared by every member: one product for all
            members, outs = weight.shape[0], weight.shape[1]
            delta_rows = delta.transpose(1, 2).reshape(members * outs, -1)  # (G·out, B)
            if lr is None:
                grads.append(((delta_rows @ h_in[0]).view_as(weight), delta.sum(dim=1)))
            else:
                weight.view(members * outs, -1).addmm_(delta_rows, h_in[0], alpha=-lr)
                bias.sub_(delta.sum(dim=1), alpha=lr)
        elif lr is None:
            grads.append((torch.bmm(delta.transpose(1, 2), h_in), delta.sum(dim=1)))
        else:
            weight.baddbmm_(delta.transpose(1, 2), h_in, alpha=-lr)
            bias.sub_(delta.sum(dim=1), alpha=lr)
        delta = below
    return losses, (grads[::-1] if lr is None else None)


def train_group(
    trainer: Trainer,
    instructions: Mapping[int, Instruction],
    states: Mapping[int, ClientState],
    datas: Mapping[int, ClientData],
    contexts: Mapping[int, TrainContext],
) -> dict[int, tuple[Reply, ClientState]]:
    """Train the instructed clients at once; per client the (reply, new state) ``run_client`` would return.

    Every client's context shares one work model (the transport's); the caller has checked
    :func:`why_not_vectorized`. A client with no data or no steps replies as the sequential trainer does.
    """
    kind = trainer_kind(trainer)
    plain_reply = replies_trained_weights(trainer)
    ids = sorted(instructions)
    model = contexts[ids[0]].model
    keys = list(model.state_dict().keys())
    members: list[Member] = []
    for cid in ids:
        ins, ctx = instructions[cid], contexts[cid]
        if ins.config.get(ACTION_KEY):
            raise ValueError("train_group trains; the describe exchange goes through run_client")
        start = start_weights(ins, states[cid].weights, keys)
        state = ClientState(weights=states[cid].weights, values=dict(states[cid].values))
        u = LocalUpdate(model=model, data=datas[cid], instruction=ins, state=state, context=ctx, start=start)
        u.scratch = SimpleNamespace()
        if kind != "plain":  # FedRS: the client's logit scales; FedProx: μ (plain: prepare does nothing)
            model.load_state_dict(start)
            trainer.prepare(u)
        scale = getattr(u.scratch, "fedrs_scales", None) if kind == "restricted" else None
        mu = float(getattr(u.scratch, "proximal_mu", 0.0)) if kind == "proximal" else 0.0
        members.append(Member(cid, u, index_batches(trainer, u), scale, mu, ins.mask))

    # Chunks of GROUP_SIZE clients: the stacked weights of a chunk stay in cache (at 1,000 clients of a
    # 50k-parameter MLP one stack would be 200 MB per tensor pass; measured in benchmarks/vectorized.py).
    train = contexts[ids[0]].train
    trained = [
        result
        for start in range(0, len(members), GROUP_SIZE)
        for result in _train_stacked(model, members[start : start + GROUP_SIZE], train)
    ]
    out: dict[int, tuple[Reply, ClientState]] = {}
    for member, (weights, loss_sum, steps) in zip(members, trained, strict=True):
        u = member.update
        metrics = {"train_loss": loss_sum / steps if steps else float("nan"), "steps": float(steps)}
        if u.config.get(KEEP_KEY, "none") == "none" and plain_reply:
            # the declared finish's reply, without loading each client's weights into the work model first
            reply = Reply(
                weights=clone_weights(weights), num_examples=trainer.num_examples(u.data), metrics=metrics
            )
            u.state.weights = None
        else:
            model.load_state_dict(weights)  # the trainer's own finish/kept_weights hooks build the reply
            reply = trainer.finish(u, metrics)
            u.state.weights = trainer.kept_weights(u, reply)
        out[member.cid] = (reply, u.state)
    return out


def _train_stacked(
    model: nn.Module, members: Sequence[Member], train: Any
) -> list[tuple[dict[str, Tensor], float, int]]:
    """The SGD loop of every member at once; per member its trained state dict, summed loss and step count."""
    device = next(model.parameters()).device
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    # Each member's start weights, stacked on a leading group axis (what stack_module_state does to modules);
    # torch.stack writes new storage, so the in-place steps never touch the members' start weights.
    params = {n: torch.stack([m.update.start[n].to(device) for m in members]).detach() for n in names}
    loss_sums, steps = train_stacked_params(model, members, train, params)
    results = []
    sums = loss_sums.tolist()
    for i, m in enumerate(members):  # views: the caller copies them (a reply's clone, load_state_dict)
        state = {k: params[k][i] if k in params else v for k, v in m.update.start.items()}
        results.append((state, sums[i], steps[i]))
    return results


def train_stacked_params(
    model: nn.Module,
    members: Sequence[Member],
    train: Any,
    params: dict[str, Tensor],
    *,
    shared_batches: bool = False,
) -> tuple[Tensor, list[int]]:
    """Train ``params`` in place: the trainable weights of every member stacked on a leading axis (one row
    per member, in ``members`` order; ``m.update.start`` is not read). Returns each member's summed loss
    (float64, on the device) and step count. The coalition trainer (fedhet.ground_truth) calls it with
    weights it stacked itself, and with ``shared_batches`` where every member trains one client's batches
    (the same ``batches`` tensor): each step's rows are then gathered once, and on the closed-form path the
    first layer of every member is one matrix product over the shared rows."""
    device = next(model.parameters()).device
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    buffers = {n: b for n, b in model.named_buffers()}
    mus = torch.tensor([m.mu for m in members], device=device)
    proximal = bool((mus != 0).any())
    reference = {n: params[n].clone() for n in names} if proximal else None  # FedProx: w_g, the start
    template = copy.deepcopy(model).to("meta")
    group = len(members)
    data = members[0].update.data  # every client's view of the one training tensor of the run
    assert all(m.update.data.inputs is data.inputs for m in members)
    shared_batches = shared_batches and group > 1
    if shared_batches and any(m.batches is not members[0].batches for m in members):
        raise ValueError("shared_batches: every member must train the same batches tensor")
    num_classes = data.num_classes
    restricted = any(m.scale is not None for m in members)
    scales = (
        torch.stack(
            [
                m.scale.to(device) if m.scale is not None else torch.ones(num_classes, device=device)
                for m in members
            ]
        )
        if restricted
        else None
    )
    lrs = torch.tensor([float(m.update.config[LR_KEY]) for m in members], device=device)
    momentum, wd, nesterov, clip = train.momentum, train.weight_decay, train.nesterov, train.grad_clip
    same_lr, lr0 = bool((lrs == lrs[0]).all()), float(lrs[0])
    bufs: dict[str, Tensor] | None = None
    steps = [len(m.batches) for m in members]
    most, fewest = max(steps, default=0), min(steps, default=0)
    batch_size = members[0].update.context.train.batch_size
    # Every member's batches at once: (steps, members, batch) indices, -1 where a member has no sample.
    positions = torch.full((most, group, batch_size), -1, dtype=torch.long)
    for i, m in enumerate(members):
        positions[: steps[i], i] = m.batches
    positions = to_device(positions, device)
    sample_weights = (positions >= 0).to(torch.float32)
    actives = torch.tensor([[t < s for s in steps] for t in range(most)], device=device).reshape(most, group)
    positions = positions.clamp_min(0)
    schedule = torch.zeros_like(positions)
    for i, m in enumerate(members):  # positions -> indices into data.inputs, on the device
        indices = m.update.data.indices
        if indices.numel():
            schedule[:, i] = indices.to(device)[positions[:, i]]
    loss_sums = torch.zeros(group, dtype=torch.float64, device=device)

    def member_loss(p, x, y, w, scale, mu, ref):
        """One member's mean cross-entropy over its real samples (w = 1), + μ/2‖w − w_g‖² (FedProx)."""
        logits = functional_call(template, (p, buffers), (x,))
        if restricted:  # FedRS's logit scales
            logits = logits * scale
        per_sample = nn.functional.cross_entropy(logits, y, reduction="none")
        loss = (per_sample * w).sum() / w.sum().clamp_min(1.0)
        if proximal:
            loss = loss + 0.5 * mu * sum(((p[n] - ref[n]) ** 2).sum() for n in p)
        return loss, loss

    # Terms no member has are not vmapped at all (None, in_dims None): each costs a batched pass per step.
    extras = (0 if restricted else None, 0 if proximal else None, 0 if proximal else None)
    step_fn = vmap(grad(member_loss, has_aux=True), in_dims=(0, 0, 0, 0, *extras))
    # A plain ReLU stack without FedProx's term takes the closed form (relu_stack_step); with plain SGD (no
    # momentum, weight decay or clipping, one lr) its step is fused into the gradient products.
    stack = None if proximal else relu_stack_names(model, names)
    fused = stack is not None and not (momentum or wd or clip) and same_lr
    hidden_masks = None
    if any(m.mask is not None for m in members):  # each member's submodel: its units of every hidden layer
        if stack is None:
            raise ValueError("submodel masks train on the closed-form path only (see why_not_vectorized)")
        widths = [params[f"{layer}.weight"].shape[1] for layer in stack[:-1]]
        full = torch.ones(sum(widths), device=device)
        stacked = torch.stack([full if m.mask is None else m.mask.to(device, torch.float32) for m in members])
        hidden_masks = list(stacked.split(widths, dim=1))
    inputs, labels = data.inputs, data.labels
    normalize = data.normalize
    # Every step's batch rows land in one buffer: a fresh (group × batch) allocation per step cost about a
    # third of the gather (index_select, itself 2-3x faster than inputs[idx] on the CPU; measured).
    rows = batch_size if shared_batches else group * batch_size
    batch_buffer = inputs.new_empty((rows, *inputs.shape[1:]))
    for t in range(most):
        active, idx, weight = actives[t], schedule[t], sample_weights[t]
        x = torch.index_select(inputs, 0, (idx[0] if shared_batches else idx).reshape(-1), out=batch_buffer)
        if normalize is not None:
            x = normalize(x)
        x = x.reshape(1 if shared_batches else group, batch_size, *x.shape[1:])
        if shared_batches and stack is None:  # vmap maps over the group axis: one view per member
            x = x.expand(group, *x.shape[1:])
        y = labels[idx]
        if stack is None:
            grads, losses = step_fn(params, x, y, weight, scales, mus if proximal else None, reference)
        else:
            # a member past its last step has only padding (w = 0): zero gradient, so the fused step holds it
            layers = [(params[f"{layer}.weight"], params[f"{layer}.bias"]) for layer in stack]
            lr = lr0 if fused else None
            losses, per_layer = relu_stack_step(layers, x, y, weight, scales, lr, hidden_masks)
            if fused:
                loss_sums += torch.where(active, losses.double(), torch.zeros_like(loss_sums))
                continue
            grads = {
                f"{layer}.{part}": g
                for layer, pair in zip(stack, per_layer, strict=True)
                for part, g in zip(("weight", "bias"), pair, strict=True)
            }
        loss_sums += torch.where(active, losses.detach().double(), torch.zeros_like(loss_sums))
        if clip:  # clip_grad_norm_: one norm over all of a client's parameters, coefficient capped at 1
            norms = torch.sqrt(sum(g.reshape(group, -1).pow(2).sum(dim=1) for g in grads.values()))
            coef = torch.clamp(clip / (norms + 1e-6), max=1.0)
            grads = {n: g * coef.view(-1, *([1] * (g.dim() - 1))) for n, g in grads.items()}
        # The SGD step in place. A member past its last step is held still: its gradient is masked out and
        # its momentum buffer kept (every member is active at step 0, so the first buffers are the grads).
        all_active = t < fewest  # from the CPU step counts: no host sync per step on a GPU
        for n in names:
            p, g = params[n], grads[n]
            shape = (-1, *([1] * (p.dim() - 1)))
            gate = active.view(shape).to(p.dtype)
            if wd:
                g.add_(p, alpha=wd)
            if momentum:
                if bufs is None:
                    bufs = {}
                if n not in bufs:
                    bufs[n] = g.clone()
                elif all_active:
                    bufs[n].mul_(momentum).add_(g)
                else:
                    bufs[n].mul_(1 + gate * (momentum - 1)).add_(g * gate)
                g = g.add_(bufs[n], alpha=momentum) if nesterov else bufs[n]
            step = g if all_active else g * gate
            if same_lr:
                p.sub_(step, alpha=lr0)
            else:
                p.sub_(step * lrs.view(shape))
    return loss_sums, steps


def auto_threshold() -> int:
    """The smallest number of clients in a round for which ``engine.mode = "auto"`` vectorizes (the
    benchmark ``benchmarks/vectorized.py`` measures where the gain begins)."""
    return 8


__all__ = ["auto_threshold", "train_group", "why_not_vectorized"]
