"""The model zoo: the registry of named models, ``build_model`` and the model contract methods check.

Every model splits into a backbone ``features(x) -> (B, D)`` and a Linear classifier ``head``
(methods.md §1.1: CELM keeps the head local during warm-up; §2.3: ProxyFL's proxies are the head's rows);
the base class ``FedModel`` lives in ``fedhet.models.base`` (imported here too).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from fedhet.errors import ConfigError
from fedhet.models.base import FedModel, check_model_args
from fedhet.models.cnn import CNN
from fedhet.models.mlp import MLP, MaskedMLP, tabular_mlp
from fedhet.models.resnet import ResNet8, ResNet18GN

#: The built-in models by name (``model.name``); :func:`register` adds to it.
MODELS: dict[str, Callable[..., FedModel]] = {
    "mlp": MLP,
    "cnn": CNN,
    "mlp200": MaskedMLP,
    "resnet8": ResNet8,
    "resnet18gn": ResNet18GN,
    "tabular-mlp": tabular_mlp,
}
#: Names added with :func:`register` (their output is checked when built).
USER_MODELS: set[str] = set()


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


def _check_user_model(name: str, model: object, input_shape: tuple[int, ...], num_classes: int) -> None:
    """A user model is an nn.Module with parameters whose forward maps (2, C, H, W) — or (2, F) — to
    logits (2, K)."""
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


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, **params: object) -> FedModel:
    """Build the registered model ``name`` for inputs (C, H, W) — or a table's (F,) — and ``num_classes``
    classes."""
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
