"""``label-flip``: data poisoning by label flipping y → K−1−y, the label-flipping attack of Fang et al.,
"Local Model Poisoning Attacks to Byzantine-Robust Federated Learning", USENIX Security 2020 (Sec. 5). The
client trains honestly on its own relabelled samples; its description and sample count stay true."""

from __future__ import annotations

from torch import Tensor

from fedhet.attacks.base import Attack


class LabelFlip(Attack):
    """Trains on labels y → K−1−y."""

    name = "label-flip"
    kind = "data"

    def relabel(self, labels: Tensor, num_classes: int) -> Tensor:
        return num_classes - 1 - labels
