"""ResNet-32 of CIFAR-LT papers, on both hosts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from solo_ext.commands.pretrain import parse_cfg
from solo_ext.config import ConfigError
from solo_ext.host import BACKBONES, METHODS, build_backbone
from solo_ext.modules.resnet_cifar import CifarResNet


def test_architecture():
    model = CifarResNet(32)
    params = sum(p.numel() for p in model.parameters())
    assert 0.46e6 < params < 0.47e6  # He et al. report 0.46 M
    blocks = [m for m in model.modules() if type(m).__name__ == "_Block"]
    assert len(blocks) == 15  # 3 stages x 5 blocks
    assert model.forward_features(torch.randn(2, 3, 32, 32)).shape == (2, 64, 8, 8)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 64) and model.inplanes == 64


def test_registered_on_active_host_and_keeps_its_stem(make_cfg):
    """solo-learn swaps the stem of every ``resnet*`` backbone on CIFAR for a 64-channel one;
    ResNet-32 is registered under a name it does not take for one, so a method built on CIFAR
    (by the host's own BaseMethod) keeps the 16-channel stem, in both encoders."""
    assert "cifar_resnet32" in BACKBONES and "resnet32" not in BACKBONES
    backbone = build_backbone("cifar_resnet32", "scl", "cifar100")
    assert backbone(torch.randn(1, 3, 32, 32)).shape == (1, 64)
    cfg = parse_cfg(make_cfg("scl", **{"backbone.name": "cifar_resnet32"}))
    cfg.data.dataset = "cifar100"  # the name the hosts' stem swap looks at
    model = METHODS["scl"](cfg)
    for net in (model.backbone, model.momentum_backbone):
        assert net.conv1.out_channels == 16 and isinstance(net.maxpool, nn.Identity)
    assert model.features_dim == 64


def test_the_old_name_says_the_new_one(make_cfg):
    with pytest.raises(ConfigError, match="^backbone.name='resnet32': now named 'cifar_resnet32'$"):
        parse_cfg(make_cfg("scl", **{"backbone.name": "resnet32"}))
