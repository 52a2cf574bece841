"""ResNet-32 for 32 px images (He et al., CVPR 2016, sec. 4.2), the backbone of CIFAR-LT papers.

Three stages of five basic blocks with 16 / 32 / 64 channels and parameter-free shortcuts
(option A: stride-2 subsampling plus zero channel padding), about 0.46 M parameters, as in
LDAM-DRW, BCL and the other CIFAR-10/100-LT results this project compares with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _Block(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.pad = planes - in_planes
        self.stride = stride

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1 and self.pad == 0:
            return x
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class CifarResNet(nn.Module):
    """Headless CIFAR ResNet-(6n+2): forward returns pooled features [B, 64].

    ``num_features`` (and ``inplanes``, which solo-learn's linear model reads first) is the
    feature dimension and ``fc`` the (identity) head. Its stem is already the small-image one;
    it is registered as ``cifar_resnet32``, a name solo-learn does not take for a torchvision
    ResNet (it swaps the stem of every ``resnet*`` backbone on CIFAR).
    """

    def __init__(self, depth: int = 32, zero_init_residual: bool = False):
        super().__init__()
        if (depth - 2) % 6:
            raise ValueError(f"backbone depth={depth}: must be 6n + 2")
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.maxpool = nn.Identity()
        blocks, planes = [], 16
        for stage, width in enumerate((16, 32, 64)):
            layers = []
            for i in range(n):
                layers.append(_Block(planes, width, 2 if stage > 0 and i == 0 else 1))
                planes = width
            blocks.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3 = blocks
        self.inplanes = self.num_features = planes
        self.fc = nn.Identity()
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, _Block):
                    nn.init.zeros_(m.bn2.weight)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The last feature map [B, 64, H/4, W/4]."""
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        return self.layer3(self.layer2(self.layer1(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.forward_features(x), 1), 1))


def cifar_resnet32(method: str = "", **kwargs) -> CifarResNet:
    return CifarResNet(32, **kwargs)
