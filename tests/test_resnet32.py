"""ResNet-32 of CIFAR-LT papers, on both hosts."""

from __future__ import annotations

import torch
from torch import nn

from solo_ext.host import BACKBONES, build_backbone
from solo_ext.modules.resnet_cifar import CifarResNet


def test_architecture():
    model = CifarResNet(32)
    params = sum(p.numel() for p in model.parameters())
    assert 0.46e6 < params < 0.47e6  # He et al. report 0.46 M
    blocks = [m for m in model.modules() if type(m).__name__ == "_Block"]
    assert len(blocks) == 15  # 3 stages x 5 blocks
    assert model.forward_features(torch.randn(2, 3, 32, 32)).shape == (2, 64, 8, 8)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 64) and model.inplanes == 64


def test_registered_on_active_host_and_keeps_its_stem():
    assert "resnet32" in BACKBONES
    backbone = build_backbone("resnet32", "scl", "cifar100")
    # solo-learn swaps the stem of ResNets on CIFAR for a 64-channel one; this one must stay
    backbone.conv1 = nn.Conv2d(3, 64, 3, 1, 2, bias=False)
    assert backbone.conv1.out_channels == 16
    assert backbone(torch.randn(1, 3, 32, 32)).shape == (1, 64)
