"""The small-image ResNet stem, and the ``small_image_stem`` backbone option that asks for it.

solo-learn swaps a ResNet's 7x7 stride-2 convolution and max-pool for a 3x3 stride-1 convolution
on CIFAR, by dataset name. solo-ext asks for the same stem through a backbone keyword,
``backbone.kwargs.small_image_stem``, filled in from the dataset table for every 32 px dataset,
so that it travels with the run's ``args.json`` into every script that rebuilds the backbone
(solo-learn's linear and kNN scripts included).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from torch import nn

OPTION = "small_image_stem"


def set_small_image_stem(resnet: nn.Module) -> None:
    """Replaces a torchvision ResNet's 7x7/2 conv and max-pool by solo-learn's CIFAR stem (a 3x3/1
    conv with padding 2). A ResNet whose first convolution is not 7x7 (the CIFAR ResNet-32)
    already has a small-image stem and is left as it is."""
    conv = getattr(resnet, "conv1", None)
    if not isinstance(conv, nn.Conv2d) or conv.kernel_size != (7, 7):
        return
    resnet.conv1 = nn.Conv2d(3, conv.out_channels, kernel_size=3, stride=1, padding=2, bias=False)
    resnet.maxpool = nn.Identity()


def with_stem_option(builder: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """``builder(method, **kwargs)`` that also takes ``small_image_stem`` (default False)."""
    if getattr(builder, "_takes_small_image_stem", False):
        return builder

    @functools.wraps(builder)
    def build(method: str = "", *args, small_image_stem: bool = False, **kwargs) -> nn.Module:
        net = builder(method, *args, **kwargs)
        if small_image_stem:
            set_small_image_stem(net)
        return net

    build._takes_small_image_stem = True  # type: ignore[attr-defined]
    return build


def add_stem_option(registry: dict[str, Callable[..., nn.Module]]) -> None:
    """Gives every builder of a backbone registry the ``small_image_stem`` keyword (a backbone
    without a 7x7 first convolution, a ViT say, has no stem to swap and ignores it), as the
    embedded host's ``build_backbone`` does."""
    for name, builder in list(registry.items()):
        registry[name] = with_stem_option(builder)
