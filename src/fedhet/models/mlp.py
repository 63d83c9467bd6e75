"""Multilayer perceptrons: CELM's Fashion-MNIST MLP and FedRAC's maskable 200-200 MLP.

``mlp`` (methods.md §1.2, spectralfuse ``MLP_Net`` with in_features = prod(input_shape)) and
``mlp200`` (methods.md §3.3, FedRAC/FedSAC: K = 2 x 200 maskable hidden units), and ``tabular-mlp``
(``mlp200``'s architecture sized from a table's feature count).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.errors import ConfigError
from fedhet.models.base import FedModel, check_model_args, fast_path_chunk
from fedhet.models.masks import UnitMask


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive int, got {value!r}")
    return value


class MLP(FedModel):
    """CELM's MLP: flatten -> Linear(d_in->128)-ReLU -> Linear(128->64)-ReLU -> head Linear(64->C).

    d_in = prod(input_shape) (784 for Fashion-MNIST, the spec's [ours] choice over padding to 32x32).
    ``hidden_sizes`` changes the hidden widths; features are the last hidden layer's activations.
    """

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, hidden_sizes: Sequence[int] = (128, 64)
    ) -> None:
        super().__init__()
        shape = check_model_args(input_shape, num_classes)
        sizes = list(hidden_sizes) if isinstance(hidden_sizes, Sequence) else []
        if not sizes:
            raise ConfigError(f"hidden_sizes must be a non-empty list of positive ints, got {hidden_sizes!r}")
        widths = [math.prod(shape)] + [_positive_int("hidden_sizes entry", size) for size in sizes]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:], strict=True))
        self.head = nn.Linear(widths[-1], num_classes)

    def features(self, x: Tensor) -> Tensor:
        """The last hidden layer's ReLU activations (B, hidden_sizes[-1])."""
        h = x.flatten(1)
        for layer in self.hidden:
            h = F.relu(layer(h))
        return h

    def relu_stack_layers(self) -> list[str]:
        """Names of the Linear layers, hidden first, head last: the forward pass is a plain ReLU stack, so
        CELM's probes may use closed-form input gradients (``fedhet.algorithms.logit_probes``). A subclass
        that changes ``features`` must drop this method."""
        return [f"hidden.{i}" for i in range(len(self.hidden))] + ["head"]


def stacked_relu_inputs(
    hidden: Sequence[tuple[Tensor, Tensor]], x: Tensor, masks: Sequence[Tensor] | None = None
) -> list[Tensor]:
    """The input of every layer of M stacked ReLU stacks (the forward of ``relu_stack_layers()`` models):
    [h_0 = x (M, B, d), h_1, …, h_L] with h_l = relu(h_{l-1} W_lᵀ + b_l), for ``hidden`` the stacked
    (weight (M, out, in), bias (M, out)) of the hidden layers; h_L is the head's input. With ``masks``
    (one 0/1 (M, out) per hidden layer, a submodel's units as ``MaskedMLP`` applies them) h_l is multiplied
    by its mask. h_l > 0 exactly where the pre-activation is and the unit is kept, so it is also the
    derivative of the (masked) ReLU as autograd takes it. ``x`` may be (1, B, d): one input of every stack."""
    inputs = [x]
    for layer, (weight, bias) in enumerate(hidden):
        below = inputs[-1]
        if below.shape[0] == 1 < weight.shape[0]:  # x (1, B, d): one input every stack reads, one product
            members, outs = weight.shape[0], weight.shape[1]
            z = (below[0] @ weight.reshape(members * outs, -1).T).view(-1, members, outs).transpose(0, 1)
            h = z.add_(bias.unsqueeze(1)).clamp_min_(0.0)
        else:
            h = torch.baddbmm(bias.unsqueeze(1), below, weight.transpose(1, 2)).clamp_min_(0.0)
        inputs.append(h if masks is None else h.mul_(masks[layer].unsqueeze(1)))
    return inputs


class MaskedMLP(FedModel):
    """FedRAC's MLP: flatten -> Linear(d_in->H)-ReLU-(x mask1) -> Linear(H->H)-ReLU-(x mask2) -> head.

    K = 2H maskable units (indices 0..H-1 layer 1, H..2H-1 layer 2; H = 200 in the paper). A masked unit
    outputs exactly 0, so its incoming and outgoing weights get exactly zero gradient (methods.md §3.3).
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden_size: int = 200) -> None:
        super().__init__()
        shape = check_model_args(input_shape, num_classes)
        width = _positive_int("hidden_size", hidden_size)
        self.fc1 = nn.Linear(math.prod(shape), width)
        self.fc1_mask = UnitMask(width)
        self.fc2 = nn.Linear(width, width)
        self.fc2_mask = UnitMask(width)
        self.head = nn.Linear(width, num_classes)
        self.maskable_units = 2 * width

    def features(self, x: Tensor) -> Tensor:
        """The masked second hidden layer (B, H)."""
        h = self.fc1_mask(F.relu(self.fc1(x.flatten(1))))
        return self.fc2_mask(F.relu(self.fc2(h)))

    def relu_stack_layers(self) -> list[str]:
        """Names of the Linear layers, hidden first, head last: without a mask the forward pass is a plain
        ReLU stack; under a mask each hidden layer's ReLU output is multiplied by its units of the mask (K
        order = the hidden layers' units in order; ``stacked_relu_inputs``'s ``masks``)."""
        return ["fc1", "fc2", "head"]

    def masked_forward(self, x: Tensor, masks: Tensor) -> Tensor:
        """Logits (M, B, C) under each mask: the first layer once, then batched over (chunks of) masks."""
        hidden = F.relu(self.fc1(x.flatten(1)))
        width = self.fc2.in_features
        masks = masks.to(device=hidden.device, dtype=hidden.dtype)
        chunk = fast_path_chunk(hidden.shape[0], width)
        outputs = []
        for start in range(0, masks.shape[0], chunk):
            block = masks[start : start + chunk]
            h = hidden.unsqueeze(0) * block[:, None, :width]
            h = F.relu(self.fc2(h)) * block[:, None, width:]
            outputs.append(self.head(h))
        return torch.cat(outputs)


def tabular_hidden_size(features: int) -> int:
    """The default width of ``tabular-mlp``'s hidden layers: 4·F clamped to [32, 256] (wine, F = 13: 52;
    breast-cancer, F = 30: 120) — wide enough for FedRAC's masks to carve submodels, small for tables."""
    return max(32, min(256, 4 * features))


def tabular_mlp(input_shape: tuple[int, ...], num_classes: int, hidden_size: int | None = None) -> MaskedMLP:
    """A table's model: ``mlp200``'s maskable ReLU MLP (two hidden layers, a Linear head) with hidden width
    ``hidden_size``, by default sized from the number of features (:func:`tabular_hidden_size`). It serves
    every method: a head (CELM, ShapFed, FSSL), maskable units (FedRAC, FedSAC) and the closed-form fast
    paths (``relu_stack_layers``)."""
    shape = check_model_args(input_shape, num_classes)
    width = tabular_hidden_size(math.prod(shape)) if hidden_size is None else hidden_size
    return MaskedMLP(shape, num_classes, hidden_size=width)
