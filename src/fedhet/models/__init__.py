"""The model zoo (mlp, cnn, mlp200, resnet8, resnet18gn), submodel masks, and your own models (register)."""

from fedhet.models.registry import (
    MODELS,
    FedModel,
    build_model,
    check_model_contract,
    masked_logits,
    register,
)

__all__ = ["MODELS", "FedModel", "build_model", "check_model_contract", "masked_logits", "register"]
