"""The model zoo (mlp, cnn, mlp200, resnet8, resnet18gn) and submodel masks."""

from fedhet.models.registry import MODELS, FedModel, build_model, masked_logits

__all__ = ["MODELS", "FedModel", "build_model", "masked_logits"]
