"""Class-wise logit maximization: the probe behind CELM's evidence (methods.md §1.1 step 2).

For every model state m and class c, Adam gradient ascent on the input maximises s_c(x; w_m) − λ‖x‖² from
N(0, σ²) noise; the final logit s_c(x*) is the evidence q̃_{m,c}. Three implementations of the same maths,
agreeing within float tolerance (tested): ``"batched"`` takes the fastest batched path for the model
(closed-form input gradients for a plain ReLU MLP, the vmap path otherwise), ``"vmap"`` stacks the states
and vmaps ``functional_call`` over them (any model), ``"loop"`` is the per-(model, class) reference.

A model takes the closed-form path by declaring ``relu_stack_layers()``: the names of its Linear layers,
hidden layers first and the classifier last, such that its forward pass is exactly
``head(relu(... relu(hidden_1(flatten(x)))))`` (fedhet's ``MLP`` does).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from fedhet.errors import ConfigError
from fedhet.models.mlp import stacked_relu_inputs

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1

#: "batched": the fastest batched path for the model; "vmap": the generic vmap path; "loop": the reference.
PROBE_IMPLS = ("batched", "vmap", "loop")
#: The weights of M models of one architecture (their state dicts).
ModelStates = Sequence[Mapping[str, Tensor]]


def probe_noise(
    num_models: int,
    num_classes: int,
    input_shape: Sequence[int],
    init_scale: float,
    generator: torch.Generator,
) -> Tensor:
    """Start points x⁰ ~ N(0, init_scale²) of shape (M, K, *input_shape), drawn on the CPU."""
    return init_scale * torch.randn((num_models, num_classes, *input_shape), generator=generator)


def _ascent_gradient(grad: Tensor, x: Tensor, l2: float) -> Tensor:
    # ∇_x [s_c(x) − λ‖x‖²] = ∇_x s_c(x) − 2λx; the penalty's gradient is exact, not autograd's.
    return grad.sub_(x.detach(), alpha=2.0 * l2)


class AdamAscent:
    """Adam ascent on one tensor with ``torch.optim.Adam``'s defaults (β = 0.9/0.999, ε = 1e-8,
    ``maximize=True``), the same update in place without the optimizer's per-step bookkeeping.

    The probe runs hundreds of tiny steps, where ``torch.optim.Adam.step`` costs about a fifth of the time.
    """

    def __init__(self, x: Tensor, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.x, self.lr, self.betas, self.eps = x, lr, betas, eps
        self.exp_avg = torch.zeros_like(x)
        self.exp_avg_sq = torch.zeros_like(x)
        self.denom = torch.empty_like(x)
        self.t = 0

    @torch.no_grad()
    def step(self, grad: Tensor) -> None:
        """x ← x + lr/(1−β₁ᵗ) · m / (√v/√(1−β₂ᵗ) + ε), with m, v the moment EMAs of ``grad``."""
        b1, b2 = self.betas
        self.t += 1
        self.exp_avg.lerp_(grad, 1 - b1)
        self.exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        torch.sqrt(self.exp_avg_sq, out=self.denom).div_(math.sqrt(1 - b2**self.t)).add_(self.eps)
        self.x.addcdiv_(self.exp_avg, self.denom, value=self.lr / (1 - b1**self.t))


def maximize_logits_batched(
    template: nn.Module, states: ModelStates, noise: Tensor, *, steps: int, lr: float, l2: float
) -> Tensor:
    """All M models × K classes at once: vmap of ``functional_call`` over the stacked states; each model's
    K probes are one batch. Returns the final logits s_c(x*_{m,c}; w_m) as an (M, K) tensor."""
    meta = copy.deepcopy(template).to("meta").eval()
    device = next(iter(states[0].values())).device
    stacked = {k: torch.stack([s[k].detach().to(device) for s in states]) for k in states[0]}
    forward = vmap(lambda w, x: functional_call(meta, w, (x,)))
    num_classes = noise.shape[1]
    cls = torch.arange(num_classes, device=device)
    x = noise.to(device).clone().requires_grad_(True)
    opt = AdamAscent(x, lr)
    for _ in range(steps):
        logits = forward(stacked, x)  # (M, K inputs, K classes)
        (grad,) = torch.autograd.grad(logits[:, cls, cls].sum(), x)
        opt.step(_ascent_gradient(grad, x, l2))
    with torch.no_grad():
        return forward(stacked, x)[:, cls, cls].detach()


def stacked_relu_layers(template: nn.Module, states: ModelStates) -> list[tuple[Tensor, Tensor]] | None:
    """(weights (M, out, in), biases (M, out)) of every Linear layer of a model that declares itself a plain
    ReLU stack (``relu_stack_layers()``), hidden layers first and the head last, stacked over ``states``;
    None for any other model."""
    declared = getattr(template, "relu_stack_layers", None)
    if declared is None:
        return None
    names = declared()
    device = next(iter(states[0].values())).device
    return [
        tuple(
            torch.stack([s[f"{name}.{part}"].detach().to(device) for s in states])
            for part in ("weight", "bias")
        )
        for name in names
    ]


def maximize_logits_mlp(
    layers: list[tuple[Tensor, Tensor]], noise: Tensor, *, steps: int, lr: float, l2: float
) -> Tensor:
    """:func:`maximize_logits_batched` for the MLP without autograd: the input gradient in closed form,
    ∇_x s_c = W_1ᵀ D_1 W_2ᵀ D_2 ⋯ W_Lᵀ D_L w_c (D_l the ReLU derivatives, 1 where z_l > 0, as autograd's),
    so a step costs two batched products per layer and nothing else. Same start points and Adam."""
    *hidden, (head_w, head_b) = layers
    num_models, num_classes = noise.shape[:2]
    x = noise.reshape(num_models, num_classes, -1).to(head_w.device).clone()
    opt = AdamAscent(x, lr)

    for _ in range(steps):
        outputs = stacked_relu_inputs(hidden, x)[1:]  # h_1 … h_L; h_l > 0 is ReLU's derivative
        grad = head_w  # (M, K, H): the probe of class c starts from the head's row w_c
        for (w, _), h in zip(reversed(hidden), reversed(outputs), strict=True):
            grad = torch.bmm(grad * (h > 0), w)
        if grad is head_w:  # no hidden layer: the ascent gradient below works in place, keep the weights
            grad = head_w.clone()
        opt.step(_ascent_gradient(grad, x, l2))
    h = stacked_relu_inputs(hidden, x)[-1]
    logits = torch.baddbmm(head_b.unsqueeze(1), h, head_w.transpose(1, 2))  # (M, K probes, K classes)
    cls = torch.arange(num_classes, device=logits.device)
    return logits[:, cls, cls]


def maximize_logits_loop(
    template: nn.Module, states: ModelStates, noise: Tensor, *, steps: int, lr: float, l2: float
) -> Tensor:
    """Reference implementation: one probe at a time, a Python loop over (model, class). Same maths,
    same start points and optimiser as :func:`maximize_logits_batched`."""
    model = copy.deepcopy(template).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    num_models, num_classes = noise.shape[:2]
    device = next(iter(states[0].values())).device
    out = torch.empty(num_models, num_classes, device=device)
    for m, state in enumerate(states):
        model.load_state_dict(state)
        for c in range(num_classes):
            x = noise[m, c : c + 1].to(device).clone().requires_grad_(True)
            opt = torch.optim.Adam([x], lr=lr, maximize=True)
            for _ in range(steps):
                (grad,) = torch.autograd.grad(model(x)[0, c], x)
                x.grad = _ascent_gradient(grad, x, l2)
                opt.step()
            with torch.no_grad():
                out[m, c] = model(x)[0, c]
    return out


def maximize_class_logits(
    template: nn.Module,
    states: ModelStates,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    steps: int = 200,
    lr: float = 0.05,
    l2: float = 1e-3,
    init_scale: float = 1.0,
    generator: torch.Generator | None = None,
    impl: str = "batched",
) -> Tensor:
    """Raw evidence q̃_{m,c} = s_c(x*) after Adam ascent on s_c(x; w_m) − λ‖x‖² from N(0, init_scale²)
    noise, for every state m and class c (eval mode, no gradients into the weights). Returns (M, K)."""
    if impl not in PROBE_IMPLS:
        raise ConfigError(f"probe_impl={impl!r}; accepted: {list(PROBE_IMPLS)}")
    if not states:
        return torch.empty(0, num_classes)
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    noise = probe_noise(len(states), num_classes, input_shape, init_scale, gen)
    if impl == "loop":
        return maximize_logits_loop(template, states, noise, steps=steps, lr=lr, l2=l2)
    layers = stacked_relu_layers(template, states) if impl == "batched" else None
    if layers is not None:
        return maximize_logits_mlp(layers, noise, steps=steps, lr=lr, l2=l2)
    return maximize_logits_batched(template, states, noise, steps=steps, lr=lr, l2=l2)


def grow_class_inputs(
    model: nn.Module,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    per_class: int,
    depths: Sequence[int],
    lr: float = 0.05,
    l2: float = 1e-3,
    init_scale: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Synthetic labelled inputs grown from the model alone [ours, docs/data-free-fairness.md]: ``per_class``
    start points x⁰ ~ N(0, init_scale²) per class, Adam ascent on s_c(x) − λ‖x‖² (the probe's objective),
    each kept after every step count in ``depths``. Shallow copies are barely moved from noise (hard), deep
    ones are class prototypes (easy), so accuracy on them falls smoothly as a model loses capacity.

    Returns x (len(depths)·per_class·K, *input_shape) and the class each was grown for, depth-major.
    """
    depths = sorted({int(d) for d in depths})
    if not depths or depths[0] < 1:
        raise ConfigError(f"depths must be positive step counts, got {list(depths)}")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    device = next(model.parameters()).device
    start = init_scale * torch.randn((per_class * num_classes, *input_shape), generator=gen)
    labels = torch.arange(num_classes, device=device).repeat(per_class)
    rows = torch.arange(len(labels), device=device)
    x = start.to(device).requires_grad_(True)
    opt = AdamAscent(x, lr)
    kept = []
    was_training = model.training
    model.eval()
    try:
        for step in range(1, depths[-1] + 1):
            (grad,) = torch.autograd.grad(model(x)[rows, labels].sum(), x)
            opt.step(_ascent_gradient(grad, x, l2))
            if step in depths:
                kept.append(x.detach().clone())
    finally:
        model.train(was_training)
    return torch.cat(kept), labels.repeat(len(depths))
