"""The model zoo: the ``FedModel`` base class, the registry of named models and ``build_model``.

Every model splits into a backbone ``features(x) -> (B, D)`` and a Linear classifier ``head``
(methods.md §1.1: CELM keeps the head local during warm-up; §2.3: ProxyFL's proxies are the head's rows).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from fedhet.errors import ConfigError
from fedhet.models.masks import UnitMask

# Bounds the (masks x batch x hidden) activations one chunk of the mlp200 fast path holds (~128 MiB fp32).
_FAST_PATH_ELEMENTS = 1 << 25


def check_model_args(input_shape: Sequence[int], num_classes: int) -> tuple[int, int, int]:
    """Validate a model's ``input_shape`` (C, H, W) and ``num_classes``; return the shape as a tuple."""
    shape = tuple(input_shape) if isinstance(input_shape, Sequence) else ()
    if len(shape) != 3 or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
        raise ConfigError(
            f"input_shape must be three positive ints (channels, height, width), got {input_shape!r}; "
            "e.g. (1, 28, 28) for Fashion-MNIST or (3, 32, 32) for CIFAR-10"
        )
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"num_classes must be a positive int, got {num_classes!r}")
    return shape  # type: ignore[return-value]


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


def masked_logits(model: FedModel, x: Tensor, masks: Tensor) -> Tensor:
    """The model evaluated under each submodel mask: masks (M, K) -> logits (M, B, C).

    Equals looping ``set_mask``; mlp200 computes its first layer once. The model's own mask is restored.
    Runs in the model's current mode and grad state; wrap in ``torch.no_grad()`` for evaluation.
    """
    if model.maskable_units == 0:
        raise ConfigError(
            f"model {type(model).__name__} has no maskable units; masked_logits needs a mask model"
        )
    if not isinstance(masks, Tensor) or masks.dim() != 2 or masks.shape[1] != model.maskable_units:
        shape = tuple(masks.shape) if isinstance(masks, Tensor) else type(masks).__name__
        raise ConfigError(f"masks must have shape (M, {model.maskable_units}), got {shape}")
    if not bool(((masks == 0) | (masks == 1)).all()):
        raise ConfigError("mask values must be 0 or 1")
    return model.masked_forward(x, masks.to(torch.float32))


def fast_path_chunk(batch: int, width: int) -> int:
    """How many masks one chunk of a batched masked forward may hold for a (batch, width) activation."""
    return max(1, _FAST_PATH_ELEMENTS // max(1, batch * width))


def _accepted_params(builder: Callable[..., FedModel]) -> list[str]:
    signature = inspect.signature(builder)
    return [name for name in signature.parameters if name not in ("input_shape", "num_classes")]


def register(name: str, factory: Callable[..., nn.Module], *, overwrite: bool = False) -> str:
    """Make ``model.name = name`` build ``factory(input_shape, num_classes, **model.params)``.

    The factory returns any ``nn.Module`` whose forward gives logits (B, num_classes). Methods that split the
    model (CELM, ShapFed, ProxyFL and the semi-supervised ones) need a :class:`FedModel` (``features`` +
    a Linear ``head``); FedRAC and FedSAC need maskable units. Registration lives in this process (for
    ``compare --jobs N`` register at import time, or through the ``fedhet.models`` entry-point group).
    """
    if not isinstance(name, str) or not name.strip() or "/" in name:
        raise ConfigError(f"models.register: the name {name!r} must be a non-empty string without '/'")
    if not callable(factory):
        raise ConfigError(
            f"models.register({name!r}): the factory must be callable, got {type(factory).__name__}"
        )
    if name in MODELS and MODELS[name] is not factory and not overwrite:
        raise ConfigError(f"a model named {name!r} is already registered; pass overwrite=True to replace it")
    MODELS[name] = factory
    USER_MODELS.add(name)
    return name


def _entry_point_model(name: str) -> bool:
    """Register the model an installed package advertises under ``name`` (group ``fedhet.models``)."""
    from importlib.metadata import entry_points

    for point in entry_points(group="fedhet.models"):
        if point.name == name:
            register(name, point.load())
            return True
    return False


def _check_user_model(name: str, model: object, input_shape: tuple[int, int, int], num_classes: int) -> None:
    """A user model is an nn.Module with parameters whose forward maps (2, C, H, W) to logits (2, K)."""
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model {name!r}: the registered factory returned {type(model).__name__}, not an nn.Module"
        )
    if next(model.parameters(), None) is None:
        raise ConfigError(f"model {name!r} has no parameters to train")
    with torch.no_grad():
        try:
            out = model(torch.zeros(2, *input_shape))
        except Exception as exc:  # noqa: BLE001 (a user's forward may raise anything: name it)
            raise ConfigError(
                f"model {name!r} cannot take a batch of inputs (2, {', '.join(map(str, input_shape))}): "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from exc
    if not isinstance(out, Tensor) or tuple(out.shape) != (2, num_classes):
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ConfigError(
            f"model {name!r} returns {got} for a batch of 2; expected logits (2, {num_classes})"
        )


#: What a method may need of its model (``Strategy.model_needs``) -> the check and how to provide it.
MODEL_NEEDS: dict[str, str] = {
    "head": "a backbone features(x) and a Linear classifier 'head': subclass fedhet.models.FedModel",
    "masks": "maskable units (fedhet.models.masks.UnitMask), as mlp200 and resnet18gn have",
}


def check_model_contract(model: nn.Module, needs: frozenset[str] | set[str], method: str, name: str) -> None:
    """Refuse a model that lacks what ``method`` needs (``needs`` ⊆ MODEL_NEEDS), naming the missing part."""
    unknown = set(needs) - MODEL_NEEDS.keys()
    if unknown:
        raise ConfigError(f"method {method!r} declares unknown model needs {sorted(unknown)}")
    has_head = isinstance(model, FedModel) and isinstance(getattr(model, "head", None), nn.Linear)
    if "head" in needs and not has_head:
        raise ConfigError(
            f"method {method!r} needs {MODEL_NEEDS['head']}; model {name!r} ({type(model).__name__}) has "
            "none. "
            "FedAvg, FedProx, CGSV, CFFL and the other whole-model methods take any nn.Module"
        )
    if "masks" in needs and getattr(model, "maskable_units", 0) == 0:
        raise ConfigError(f"method {method!r} needs {MODEL_NEEDS['masks']}; model {name!r} has none")


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int, **params: object) -> FedModel:
    """Build the registered model ``name`` for inputs (C, H, W) and ``num_classes`` classes."""
    if name not in MODELS and not _entry_point_model(name):
        raise ConfigError(
            f"unknown model {name!r}; accepted names: {', '.join(sorted(MODELS))}, or one registered with "
            "fedhet.models.register"
        )
    builder = MODELS[name]
    accepted = _accepted_params(builder)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ConfigError(
            f"model {name!r} does not take parameter(s) {unknown}; accepted: {accepted or 'none'}"
        )
    check_model_args(input_shape, num_classes)
    try:
        model = builder(tuple(input_shape), num_classes, **params)
        if name in USER_MODELS:
            _check_user_model(name, model, tuple(input_shape), num_classes)
        return model
    except ConfigError:
        raise
    except (TypeError, ValueError, RuntimeError, OverflowError, MemoryError) as exc:
        # e.g. hidden_sizes=[10**20] (beyond int64) or sizes too large to allocate
        raise ConfigError(
            f"model {name!r} cannot be built with parameters {params}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}; check model.params"
        ) from exc


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars (the parameter count papers report)."""
    return sum(math.prod(p.shape) for p in model.parameters() if p.requires_grad)


# The model modules import FedModel from this module, so they can only be imported once it is defined.
from fedhet.models.cnn import CNN  # noqa: E402
from fedhet.models.mlp import MLP, MaskedMLP  # noqa: E402
from fedhet.models.resnet import ResNet8, ResNet18GN  # noqa: E402

MODELS: dict[str, Callable[..., FedModel]] = {
    "mlp": MLP,
    "cnn": CNN,
    "mlp200": MaskedMLP,
    "resnet8": ResNet8,
    "resnet18gn": ResNet18GN,
}
#: Names added with :func:`register` (their output is checked when built).
USER_MODELS: set[str] = set()
