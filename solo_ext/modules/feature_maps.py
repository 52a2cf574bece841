"""The last feature map of a backbone, recorded during its own forward pass.

Works for torchvision ResNets (the embedded host's and solo-learn's, which wraps the same class),
the CIFAR ResNet (``resnet_cifar``) and timm ViTs (patch tokens laid out as a grid). PBSD's
teacher and DenseCL read the map while the host's ``forward`` computes the pooled features, so
a method extends that forward (``super().forward``) instead of re-implementing it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


class MapTap:
    """The map [B, C, h, w] of the last pass of a backbone inside :func:`last_feature_map`."""

    def __init__(self) -> None:
        self.map: torch.Tensor | None = None


def _last_stage(backbone: nn.Module) -> nn.Module:
    for name in ("layer4", "layer3"):  # torchvision's ResNets, then the CIFAR ResNet
        if isinstance(getattr(backbone, name, None), nn.Module):
            return getattr(backbone, name)
    raise ValueError(
        f"backbone {type(backbone).__name__}: no feature-map access (ResNets and timm ViTs are "
        "supported)"
    )


@contextlib.contextmanager
def last_feature_map(backbone: nn.Module) -> Iterator[MapTap]:
    """Records ``backbone``'s last feature map during the passes in the block (forward hooks,
    removed on exit): a ResNet's last stage output; a timm ViT's normalised patch tokens laid
    out as the patch grid of its input. The map's spatial scale is ``h / H`` (1/32 or 1/8 for
    ResNets, 1/4 for the CIFAR ResNet, 1/patch for ViTs)."""
    tap = MapTap()
    handles = []
    if hasattr(backbone, "patch_embed") and hasattr(backbone, "forward_head"):  # timm ViT
        size: list[int] = []
        patch_h, patch_w = backbone.patch_embed.patch_size
        prefix = getattr(backbone, "num_prefix_tokens", 1)

        def input_size(_module, args):
            size[:] = args[0].shape[-2:]

        def tokens(_module, _args, output):
            grid = output[:, prefix:]
            h, w = size[0] // patch_h, size[1] // patch_w
            tap.map = grid.transpose(1, 2).reshape(grid.size(0), grid.size(2), h, w)

        handles.append(backbone.register_forward_pre_hook(input_size))
        handles.append(backbone.norm.register_forward_hook(tokens))
    else:

        def stage(_module, _args, output):
            tap.map = output

        handles.append(_last_stage(backbone).register_forward_hook(stage))
    try:
        yield tap
    finally:
        for handle in handles:
            handle.remove()


def feature_map(backbone: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(map [B, C, h, w], pooled features [B, C]) of images x [B, 3, H, W], from one pass: the
    pooled features are ``backbone(x)``."""
    with last_feature_map(backbone) as tap:
        feats = backbone(x)
    return tap.map, feats
