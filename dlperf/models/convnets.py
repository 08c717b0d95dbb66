"""ConvNets of NVIDIA's DeepLearningExamples that torchvision does not ship, built from
torchvision's ResNet parts so `dlperf analyze` costs the same network NVIDIA measured
(issue #11's validation table: benchmarks/validation/published_training.csv).

* ``resnext101_32x4d``: ResNet-101 layout (3, 4, 23, 3) with grouped 3x3 convolutions, 32 groups
  of 4 channels per 64 (torchvision ships only 32x8d and 64x4d).
* ``se_resnext101_32x4d``: the same with a squeeze-and-excitation block in every bottleneck
  (global average pool, 1x1 conv to C/16, ReLU, 1x1 conv back to C, sigmoid, scale) applied to
  the block's output before the residual addition, as in NVIDIA's and the SENet paper's design.
"""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models.resnet import Bottleneck, ResNet


class _SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduction: int = 16):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce = nn.Conv2d(channels, channels // reduction, 1)
        self.relu = nn.ReLU(inplace=True)
        self.expand = nn.Conv2d(channels // reduction, channels, 1)
        self.gate = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.expand(self.relu(self.reduce(self.pool(x)))))


class _SEBottleneck(Bottleneck):
    def __init__(self, inplanes: int, planes: int, *args, **kwargs):
        super().__init__(inplanes, planes, *args, **kwargs)
        self.se = _SqueezeExcite(planes * self.expansion)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.se(self.bn3(self.conv3(out)))
        return self.relu(out + identity)


def resnext101_32x4d(num_classes: int = 1000) -> nn.Module:
    return ResNet(Bottleneck, [3, 4, 23, 3], groups=32, width_per_group=4,
                  num_classes=num_classes)


def se_resnext101_32x4d(num_classes: int = 1000) -> nn.Module:
    return ResNet(_SEBottleneck, [3, 4, 23, 3], groups=32, width_per_group=4,
                  num_classes=num_classes)


BUILDERS = {"resnext101_32x4d": resnext101_32x4d, "se_resnext101_32x4d": se_resnext101_32x4d}
