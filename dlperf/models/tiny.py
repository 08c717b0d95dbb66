"""A small residual CNN for CPU demos and tests (the `tiny` recipe): trains in seconds."""

from __future__ import annotations

from torch import nn


def _norm(kind: str, channels: int) -> nn.Module:
    # GroupNorm is batch-independent: the data-parallel equivalence test uses it, because
    # BatchNorm statistics differ between one process and several (without SyncBatchNorm).
    return nn.BatchNorm2d(channels) if kind == "bn" else nn.GroupNorm(4, channels)


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, norm: str):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = _norm(norm, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = _norm(norm, cout)  # the residual block's last norm (zero-init target)
        self.relu = nn.ReLU(inplace=True)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _norm(norm, cout))

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class TinyResNet(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 16, norm: str = "bn"):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = _norm(norm, width)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = Block(width, width, 1, norm)
        self.layer2 = Block(width, 2 * width, 2, norm)
        self.layer3 = Block(2 * width, 4 * width, 2, norm)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * width, num_classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(self.pool(x).flatten(1))
