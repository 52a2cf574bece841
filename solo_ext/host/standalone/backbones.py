"""Backbones of the embedded host, with solo-learn's names and call signature ``f(method, **kw)``.

ResNets come from torchvision, ViTs from timm, so their state dicts match solo-learn's (which
wraps the same libraries) and checkpoints move between the two hosts.
"""

from __future__ import annotations

from collections.abc import Callable

import timm
import torchvision
from torch import nn

from solo_ext.modules.resnet_cifar import resnet32


def resnet18(method: str = "", **kwargs) -> nn.Module:
    return torchvision.models.resnet18(**kwargs)


def resnet50(method: str = "", **kwargs) -> nn.Module:
    return torchvision.models.resnet50(**kwargs)


def _vit(name: str) -> Callable[..., nn.Module]:
    def build(method: str = "", patch_size: int = 16, **kwargs) -> nn.Module:
        return timm.create_model(
            name, pretrained=False, num_classes=0, patch_size=patch_size, **kwargs
        )

    build.__name__ = name.split("_patch")[0]
    return build


vit_tiny = _vit("vit_tiny_patch16_224")
vit_small = _vit("vit_small_patch16_224")

BACKBONES: dict[str, Callable[..., nn.Module]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "resnet32": resnet32,
    "vit_tiny": vit_tiny,
    "vit_small": vit_small,
}


SMALL_IMAGE_DATASETS = ("cifar10", "cifar100")


def build_backbone(
    name: str,
    method: str = "",
    dataset: str = "",
    kwargs: dict | None = None,
    registry: dict[str, Callable[..., nn.Module]] = BACKBONES,
) -> nn.Module:
    """A headless backbone as solo-learn builds it: ResNets lose ``fc`` and get the small-image
    stem on 32 px datasets."""
    backbone = registry[name](method, **dict(kwargs or {}))
    if name.startswith("resnet"):
        backbone.fc = nn.Identity()
        if dataset in SMALL_IMAGE_DATASETS:
            small_image_stem(backbone)
    return backbone


def feature_dim(backbone: nn.Module) -> int:
    return backbone.inplanes if hasattr(backbone, "inplanes") else backbone.num_features


def small_image_stem(resnet: nn.Module) -> None:
    """Replaces a ResNet's 7x7/2 conv and max-pool by a 3x3/1 conv, as solo-learn does for CIFAR."""
    resnet.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=2, bias=False)
    resnet.maxpool = nn.Identity()
