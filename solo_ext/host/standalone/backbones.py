"""Backbones of the embedded host, with solo-learn's names and call signature ``f(method, **kw)``.

ResNets come from torchvision, ViTs from timm, so their state dicts match solo-learn's (which
wraps the same libraries) and checkpoints move between the two hosts.
"""

from __future__ import annotations

from collections.abc import Callable

import timm
import torchvision
from torch import nn

from solo_ext.facts import facts
from solo_ext.modules.resnet_cifar import cifar_resnet32
from solo_ext.modules.stem import OPTION, set_small_image_stem


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
    "cifar_resnet32": cifar_resnet32,
    "vit_tiny": vit_tiny,
    "vit_small": vit_small,
}


def build_backbone(
    name: str,
    method: str = "",
    dataset: str = "",
    kwargs: dict | None = None,
    registry: dict[str, Callable[..., nn.Module]] = BACKBONES,
) -> nn.Module:
    """A headless backbone as solo-learn builds it: ResNets lose ``fc``, and get the small-image
    stem when ``kwargs`` says ``small_image_stem`` (by default: when the dataset table says so
    for ``dataset``)."""
    kwargs = dict(kwargs or {})
    small = bool(kwargs.pop(OPTION, facts(dataset).small_image_stem))
    backbone = registry[name](method, **kwargs)
    if name.startswith("resnet"):
        backbone.fc = nn.Identity()
        if small:
            set_small_image_stem(backbone)
    return backbone


def feature_dim(backbone: nn.Module) -> int:
    return backbone.inplanes if hasattr(backbone, "inplanes") else backbone.num_features
