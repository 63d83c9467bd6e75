"""Residual networks: ProxyFL's ResNet-8 (BatchNorm) and FedRAC's maskable ResNet-18 (GroupNorm).

``resnet8``: methods.md §2.3, FSSLlib ``ResNet_PC(resnet_size=8, scaling=4)``; ``width`` = 16 x scaling.
``resnet18gn``: methods.md §3.3, FedRAC's ResNet-18 with GroupNorm(2) and five channel-mask points.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.errors import ConfigError
from fedhet.models.base import FedModel, check_model_args
from fedhet.models.masks import UnitMask

NormFactory = Callable[[int], nn.Module]


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """He et al. basic block: conv3x3-norm-ReLU-conv3x3-norm, plus (projected) shortcut, then ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, norm: NormFactory) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_channels, out_channels, stride)
        self.norm1 = norm(out_channels)
        self.conv2 = _conv3x3(out_channels, out_channels)
        self.norm2 = norm(out_channels)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
                norm(out_channels),
            )

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        # Out-of-place ops throughout so torch.func.vmap/functional_call can trace the block.
        return F.relu(out + shortcut)


def _stage(in_channels: int, out_channels: int, blocks: int, stride: int, norm: NormFactory) -> nn.Sequential:
    layers = [BasicBlock(in_channels, out_channels, stride, norm)]
    layers += [BasicBlock(out_channels, out_channels, 1, norm) for _ in range(blocks - 1)]
    return nn.Sequential(*layers)


def _check_width(width: object, multiple: int = 1) -> int:
    if isinstance(width, bool) or not isinstance(width, int) or width < 1 or width % multiple:
        extra = f" divisible by {multiple}" if multiple > 1 else ""
        raise ConfigError(f"width must be a positive int{extra}, got {width!r}; the paper value is 64")
    return width


class ResNet8(FedModel):
    """ProxyFL's CIFAR ResNet-8: stem conv3x3-BN-ReLU, three one-block stages (w, 2w, 4w; strides 1, 2, 2),
    global average pooling -> 4w features, ``head`` = Linear(4w->C) (the spec's ``classifier``, its rows are
    the class proxies), plus ``feat_proj`` Linear(4w->4w) and ``proxy_proj`` Linear(4w->4w, no bias).

    ``width`` = 16 x scaling (64 in the paper). Pooling is adaptive, which equals AvgPool(8) on 32x32 inputs
    and also admits e.g. 28x28 grayscale. Init (FSSLlib): conv ~ N(0, 2/(k*k*out_channels)), BN 1/0,
    Linear layers PyTorch's default. ``feat_proj``/``proxy_proj`` are not used by ``forward``; they fall in
    ``backbone_keys`` (only ``head.*`` is the classifier).
    """

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int, width: int = 64) -> None:
        super().__init__()
        channels, _, _ = check_model_args(input_shape, num_classes, model=type(self).__name__.lower())
        width = _check_width(width)
        self.conv1 = _conv3x3(channels, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.layer1 = _stage(width, width, 1, 1, nn.BatchNorm2d)
        self.layer2 = _stage(width, 2 * width, 1, 2, nn.BatchNorm2d)
        self.layer3 = _stage(2 * width, 4 * width, 1, 2, nn.BatchNorm2d)
        dim = 4 * width
        self.head = nn.Linear(dim, num_classes)
        self.feat_proj = nn.Linear(dim, dim)
        self.proxy_proj = nn.Linear(dim, dim, bias=False)
        self.feature_dim = dim
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels
                nn.init.normal_(module.weight, 0.0, math.sqrt(2.0 / fan_out))
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def features(self, x: Tensor) -> Tensor:
        """The pooled layer3 output f (B, 4w), 256-d at the paper's width."""
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.layer3(self.layer2(self.layer1(h)))
        return F.adaptive_avg_pool2d(h, 1).flatten(1)


STEMS = ("imagenet", "cifar")


class ResNet18GN(FedModel):
    """FedRAC's ResNet-18 with GroupNorm(2) and channel masks at five points (methods.md §3.3).

    ``stem="imagenet"`` (FedRAC's CIFAR-10 model, torchvision layout): conv7x7/2-GN-ReLU then maxpool3x3/2,
    torchvision's init (kaiming-normal fan_out convs). ``stem="cifar"`` (FedRAC's Tiny-ImageNet model):
    conv3x3/1, no maxpool, PyTorch's default init, as in that code. Masks: after the stem (w), layer1 (w),
    layer2 (2w), layer3 (4w) and on the pooled layer4 output (8w): K = 16w = 1024 at width 64.
    ``stem_maxpool=False`` reproduces FedRAC's CIFAR-10 forward, which never calls torchvision's maxpool.
    """

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        num_classes: int,
        stem: str = "imagenet",
        width: int = 64,
        norm_groups: int = 2,
        stem_maxpool: bool | None = None,
    ) -> None:
        super().__init__()
        channels, _, _ = check_model_args(input_shape, num_classes, model=type(self).__name__.lower())
        if stem not in STEMS:
            raise ConfigError(f"stem must be one of {STEMS}, got {stem!r}")
        if isinstance(norm_groups, bool) or not isinstance(norm_groups, int) or norm_groups < 1:
            raise ConfigError(f"norm_groups must be a positive int, got {norm_groups!r}; the paper uses 2")
        width = _check_width(width, norm_groups)
        if stem_maxpool is None:
            stem_maxpool = stem == "imagenet"
        if not isinstance(stem_maxpool, bool):
            raise ConfigError(f"stem_maxpool must be true, false or unset, got {stem_maxpool!r}")

        def norm(planes: int) -> nn.Module:
            return nn.GroupNorm(norm_groups, planes)

        if stem == "imagenet":
            self.conv1 = nn.Conv2d(channels, width, kernel_size=7, stride=2, padding=3, bias=False)
        else:
            self.conv1 = _conv3x3(channels, width)
        self.norm1 = norm(width)
        self.stem_maxpool = stem_maxpool
        self.stem_mask = UnitMask(width)
        self.layer1 = _stage(width, width, 2, 1, norm)
        self.layer1_mask = UnitMask(width)
        self.layer2 = _stage(width, 2 * width, 2, 2, norm)
        self.layer2_mask = UnitMask(2 * width)
        self.layer3 = _stage(2 * width, 4 * width, 2, 2, norm)
        self.layer3_mask = UnitMask(4 * width)
        self.layer4 = _stage(4 * width, 8 * width, 2, 2, norm)
        self.pool_mask = UnitMask(8 * width)
        self.head = nn.Linear(8 * width, num_classes)
        self.maskable_units = 16 * width
        self.feature_dim = 8 * width
        if stem == "imagenet":
            for module in self.modules():
                if isinstance(module, nn.Conv2d):
                    nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def features(self, x: Tensor) -> Tensor:
        """The masked, pooled layer4 output (B, 8w), 512-d at the paper's width."""
        h = F.relu(self.norm1(self.conv1(x)))
        if self.stem_maxpool:
            # A 0/1 channel mask commutes with max pooling, so masking after the pool is the same.
            h = F.max_pool2d(h, kernel_size=3, stride=2, padding=1)
        h = self.stem_mask(h)
        h = self.layer1_mask(self.layer1(h))
        h = self.layer2_mask(self.layer2(h))
        h = self.layer3_mask(self.layer3(h))
        h = F.adaptive_avg_pool2d(self.layer4(h), 1).flatten(1)
        return self.pool_mask(h)
