"""The base of every fedhet model (``FedModel``) and the helpers the model files share.

Every model splits into a backbone ``features(x) -> (B, D)`` and a Linear classifier ``head``
(methods.md §1.1: CELM keeps the head local during warm-up; §2.3: ProxyFL's proxies are the head's rows).
The model files (mlp, cnn, resnet) import this module; the registry (``registry.py``) imports them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fedhet.errors import ConfigError
from fedhet.models.masks import UnitMask

# Bounds the (masks x batch x hidden) activations one chunk of the mlp200 fast path holds (~128 MiB fp32).
_FAST_PATH_ELEMENTS = 1 << 25


def check_model_args(
    input_shape: Sequence[int], num_classes: int, *, model: str | None = None
) -> tuple[int, ...]:
    """Validate a model's ``input_shape`` — (C, H, W) of an image, or (F,) of a table row — and
    ``num_classes``; return the shape as a tuple. With ``model`` (a model that takes images only), a table's
    (F,) is refused naming the models that take it."""
    shape = tuple(input_shape) if isinstance(input_shape, Sequence) else ()
    if len(shape) not in (1, 3) or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
        raise ConfigError(
            f"input_shape must be three positive ints (channels, height, width) for images, or one "
            f"(features,) for a table, got {input_shape!r}; e.g. (1, 28, 28) for Fashion-MNIST, (13,) wine"
        )
    if model is not None and len(shape) == 1:
        raise ConfigError(
            f"model {model!r} takes images (channels, height, width), but these data are a table of "
            f"{shape[0]} features; use model.name = 'tabular-mlp' (or 'mlp', 'mlp200')"
        )
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"num_classes must be a positive int, got {num_classes!r}")
    return shape


class FedModel(nn.Module):
    """Base of every fedhet model: ``features(x)`` (B, D) then a Linear classifier named ``head``.

    Submodel masks (FedRAC/FedSAC) are 0/1 vectors of length ``maskable_units`` (K) applied at the model's
    ``UnitMask`` points in registration order; they are never part of ``state_dict``.
    """

    head: nn.Linear
    head_prefix: str = "head"
    maskable_units: int = 0

    def features(self, x: Tensor) -> Tensor:
        """Backbone output (B, D), the input of ``head``."""
        raise NotImplementedError(f"{type(self).__name__} must implement features(x)")

    def forward(self, x: Tensor) -> Tensor:
        """Logits (B, C) = head(features(x))."""
        return self.head(self.features(x))

    def mask_points(self) -> list[tuple[str, UnitMask]]:
        """The model's mask points (qualified module name, module), in K order."""
        return [(name, module) for name, module in self.named_modules() if isinstance(module, UnitMask)]

    def check_mask(self, mask: Tensor) -> Tensor:
        """Validate one mask of shape (K,) with 0/1 values (float or bool); return it as float32."""
        if self.maskable_units == 0:
            raise ConfigError(
                f"model {type(self).__name__} has no maskable units; use mlp200 or resnet18gn for submodels"
            )
        if not isinstance(mask, Tensor) or mask.shape != (self.maskable_units,):
            shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
            raise ConfigError(
                f"mask must be a tensor of shape ({self.maskable_units},) for {type(self).__name__}, "
                f"got {shape}"
            )
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ConfigError("mask values must be 0 or 1 (a unit is either in the submodel or not)")
        return mask.to(torch.float32)

    def set_mask(self, mask: Tensor | None) -> None:
        """Restrict the model to the submodel ``mask`` (K,) 0/1; ``None`` restores the full model."""
        self._assign_mask(None if mask is None else self.check_mask(mask))

    def get_mask(self) -> Tensor | None:
        """The current mask (K,) as float32, or ``None`` when the full model is active."""
        parts = [point.mask for _, point in self.mask_points()]
        if not parts or parts[0] is None:
            return None
        return torch.cat([part.to(parts[0].device) for part in parts])

    def _assign_mask(self, mask: Tensor | None) -> None:
        points = self.mask_points()
        if mask is None:
            for _, point in points:
                point.mask = None
            return
        # Keep the mask beside the weights so forward does not copy it to the device on every call.
        weight = next(self.parameters(), None)
        if weight is not None:
            mask = mask.to(device=weight.device)
        for (_, point), part in zip(points, torch.split(mask, [p.size for _, p in points]), strict=True):
            point.mask = part

    def masked_forward(self, x: Tensor, masks: Tensor) -> Tensor:
        """Logits (M, B, C) under each of the checked masks (M, K); the generic path loops over masks."""
        previous = self.get_mask()
        try:
            outputs = []
            for mask in masks:
                self._assign_mask(mask)
                outputs.append(self(x))
            return torch.stack(outputs)
        finally:
            self._assign_mask(previous)

    def head_keys(self) -> list[str]:
        """``state_dict`` keys of the classifier (those starting with ``head_prefix + '.'``)."""
        prefix = self.head_prefix + "."
        return [key for key in self.state_dict() if key.startswith(prefix)]

    def backbone_keys(self) -> list[str]:
        """``state_dict`` keys outside the classifier (everything CELM sends during warm-up)."""
        prefix = self.head_prefix + "."
        return [key for key in self.state_dict() if not key.startswith(prefix)]


def fast_path_chunk(batch: int, width: int) -> int:
    """How many masks one chunk of a batched masked forward may hold for a (batch, width) activation."""
    return max(1, _FAST_PATH_ELEMENTS // max(1, batch * width))
