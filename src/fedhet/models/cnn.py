"""CELM's 5-layer CIFAR CNN (methods.md §1.2: spectralfuse ``CNNCifar_TF``, the TensorFlow tutorial CNN)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.errors import ConfigError
from fedhet.models.base import FedModel, check_model_args


def _flat_side(side: int) -> int:
    # conv3x3 (no padding) -> pool2 -> conv3x3 -> pool2 -> conv3x3: 32 -> 30 -> 15 -> 13 -> 6 -> 4.
    return ((side - 2) // 2 - 2) // 2 - 2


class CNN(FedModel):
    """conv3x3(C_in->32)-ReLU-maxpool2 -> conv3x3(32->64)-ReLU-maxpool2 -> conv3x3(64->64)-ReLU -> flatten
    -> Linear(64*h*w->64)-ReLU -> head Linear(64->C). No BatchNorm, padding 0; h = w = 4 for 32x32 inputs.
    """

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        channels, height, width = check_model_args(input_shape, num_classes, model="cnn")
        flat_h, flat_w = _flat_side(height), _flat_side(width)
        if flat_h < 1 or flat_w < 1:
            raise ConfigError(
                f"cnn needs inputs of at least 18x18 pixels (three unpadded 3x3 convs, two 2x2 pools), "
                f"got {height}x{width}; use mlp for smaller inputs"
            )
        self.conv1 = nn.Conv2d(channels, 32, kernel_size=3)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3)
        self.conv3 = nn.Conv2d(64, 64, kernel_size=3)
        self.fc1 = nn.Linear(64 * flat_h * flat_w, 64)
        self.head = nn.Linear(64, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """The ReLU output of the 64-unit fully connected layer (B, 64)."""
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        h = F.relu(self.conv3(h))
        return F.relu(self.fc1(h.flatten(1)))
