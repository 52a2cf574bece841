"""The last feature map of a backbone, recorded during its own forward pass.

The map is the one the backbone pools into its features, after the final norm / activation where
the backbone applies it to the map before pooling. It is found by the backbone's module layout,
one explicit rule per family (the first that matches), so this module needs neither solo-learn
nor a forward of its own:

- torchvision ResNet (``layer4``): the last stage's output; the CIFAR ResNet (``resnet_cifar``,
  ``layer3``, no ``layer4``): the same.
- WideResNet (solo-learn's: ``block3``, then ``bn1`` and ``relu`` before the average pool): the
  final ``relu``'s output (after the final BN + LeakyReLU).
- timm ConvNeXt (``stages``, ``norm_pre``): ``norm_pre``'s output, the last stage's map (its
  head pools, then applies its LayerNorm: the pooled features are the LayerNorm of the map's
  mean).
- timm Swin (``layers``, ``norm``, ``output_fmt == "NHWC"``): the final ``norm``'s output, the
  last stage's tokens [B, h, w, C], permuted to [B, C, h, w].
- timm ViT (``patch_embed``, ``blocks``, ``norm``): the final ``norm``'s patch tokens (prefix
  tokens dropped) laid out as the patch grid of the input (the features are the class token).
- PoolFormer (solo-learn's: ``network``, then ``norm``, a GroupNorm over the map, and the mean):
  the final ``norm``'s output.

Any other backbone stops in one line (``ValueError`` naming its class). PBSD's teacher and
DenseCL read the map while the host's ``forward`` computes the pooled features, so a method
extends that forward (``super().forward``) instead of re-implementing it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn


class MapTap:
    """The map [B, C, h, w] of the last pass of a backbone inside :func:`last_feature_map`."""

    def __init__(self) -> None:
        self.map: torch.Tensor | None = None


def _has(backbone: nn.Module, *names: str) -> bool:
    return all(isinstance(getattr(backbone, name, None), nn.Module) for name in names)


def _nhwc_to_nchw(output: torch.Tensor) -> torch.Tensor:
    return output.permute(0, 3, 1, 2)


def _map_rule(backbone: nn.Module) -> tuple[str, Callable[[torch.Tensor], torch.Tensor] | None]:
    """(the module whose output is the map, how its output becomes [B, C, h, w]; None: as is),
    or ``("vit", None)`` for a ViT's tokens, which also need the patch grid."""
    if _has(backbone, "layer4"):  # torchvision's ResNets
        return "layer4", None
    if _has(backbone, "layer3"):  # the CIFAR ResNet: three stages, no final norm
        return "layer3", None
    if _has(backbone, "block3", "bn1", "relu"):  # WideResNet: relu(bn1(block3(...))), pooled
        return "relu", None
    if _has(backbone, "stages", "norm_pre"):  # timm ConvNeXt: stem, stages, norm_pre, head
        return "norm_pre", None
    if _has(backbone, "layers", "norm") and getattr(backbone, "output_fmt", None) == "NHWC":
        return "norm", _nhwc_to_nchw  # timm Swin: NHWC stages, the final norm, avg pool
    if _has(backbone, "patch_embed", "blocks", "norm"):  # timm ViT: tokens after the final norm
        return "vit", None
    if _has(backbone, "network", "norm"):  # PoolFormer: network, norm (GroupNorm), mean
        return "norm", None
    raise ValueError(
        f"backbone {type(backbone).__name__}: no feature-map access (ResNet, WideResNet, "
        "ConvNeXt, Swin, ViT and PoolFormer layouts are supported)"
    )


def _vit_hooks(backbone: nn.Module, tap: MapTap) -> list:
    grid: list[int] = []
    prefix = getattr(backbone, "num_prefix_tokens", 1)
    patch_embed = backbone.patch_embed

    def patch_grid(_module, args, output):
        if output.ndim == 4:  # NHWC (dynamic_img_size): the grid as it is
            grid[:] = output.shape[1:3]
        else:  # [B, N, C]: the grid of the input size
            size = tuple(args[0].shape[-2:])
            if hasattr(patch_embed, "dynamic_feat_size"):
                grid[:] = patch_embed.dynamic_feat_size(size)
            else:
                patch_h, patch_w = patch_embed.patch_size
                grid[:] = size[0] // patch_h, size[1] // patch_w

    def tokens(_module, _args, output):
        patches = output[:, prefix:]
        h, w = grid
        tap.map = patches.transpose(1, 2).reshape(patches.size(0), patches.size(2), h, w)

    return [
        patch_embed.register_forward_hook(patch_grid),
        backbone.norm.register_forward_hook(tokens),
    ]


@contextlib.contextmanager
def last_feature_map(backbone: nn.Module) -> Iterator[MapTap]:
    """Records ``backbone``'s last feature map during the passes in the block (forward hooks,
    removed on exit), by the rules of the module's docstring. The map's spatial scale is
    ``h / H`` (1/32 for ResNets at 224 px, ConvNeXt, Swin and PoolFormer; 1/4 for WideResNet and
    the CIFAR ResNet; 1/patch for ViTs; about 5/32 for a ResNet with the small-image stem at
    32 px, whose first convolution pads to 34 px). Raises ``ValueError`` (one line, naming the
    class) for a backbone without a known map, before any pass."""
    name, convert = _map_rule(backbone)
    tap = MapTap()
    if name == "vit":
        handles = _vit_hooks(backbone, tap)
    else:

        def record(_module, _args, output):
            tap.map = output if convert is None else convert(output)

        handles = [getattr(backbone, name).register_forward_hook(record)]
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
