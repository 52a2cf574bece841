"""The last feature map of a backbone and its pooled features, from one forward pass.

Works for torchvision ResNets (the embedded host's and solo-learn's, which wraps the same class),
the CIFAR ResNet (``resnet_cifar``) and timm ViTs (patch tokens laid out as a grid). PBSD's
teacher and DenseCL read the map; the pooled features are exactly ``backbone(x)``.
"""

from __future__ import annotations

import torch
from torch import nn


def feature_map(backbone: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (map [B, C, h, w], pooled features [B, C]) of images x [B, 3, H, W].

    The map's spatial scale is ``h / H`` (1/32 or 1/8 for ResNets, 1/4 for the CIFAR ResNet,
    1/patch for ViTs).
    """
    if hasattr(backbone, "patch_embed") and hasattr(backbone, "forward_head"):  # timm ViT
        tokens = backbone.forward_features(x)
        grid = tokens[:, getattr(backbone, "num_prefix_tokens", 1) :]
        patch_h, patch_w = backbone.patch_embed.patch_size
        h, w = x.shape[-2] // patch_h, x.shape[-1] // patch_w
        fmap = grid.transpose(1, 2).reshape(grid.size(0), grid.size(2), h, w)
        return fmap, backbone.forward_head(tokens, pre_logits=True)
    if hasattr(backbone, "forward_features"):  # CIFAR ResNet
        fmap = backbone.forward_features(x)
    elif hasattr(backbone, "layer4"):  # torchvision ResNet
        b = backbone
        fmap = b.maxpool(b.relu(b.bn1(b.conv1(x))))
        fmap = b.layer4(b.layer3(b.layer2(b.layer1(fmap))))
    else:
        raise ValueError(
            f"backbone {type(backbone).__name__}: no feature-map access (ResNets "
            "and timm ViTs are supported)"
        )
    return fmap, torch.flatten(fmap.mean(dim=(2, 3)), 1)
