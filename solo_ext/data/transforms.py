"""Image transforms from solo-learn's ``augmentations`` config (torchvision implementations)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from omegaconf import DictConfig
from torchvision import transforms as T

from solo_ext.config import select
from solo_ext.data.facts import facts


def normalize(dataset: str, aug: DictConfig | None = None) -> T.Normalize:
    """The dataset's statistics (the dataset table); image folders (``custom``, ``custom_lt``)
    take ``mean`` / ``std`` from the augmentation config when it gives them, as solo-learn does
    for ``custom``."""
    mean, std = facts(dataset).stats
    if aug is not None and facts(dataset).solo_name == "custom":
        mean, std = aug.get("mean", mean), aug.get("std", std)
    return T.Normalize(mean, std)


def photometric_ops(aug: DictConfig, size: int) -> list[Any]:
    """The colour part of one ``augmentations`` entry (jitter, grayscale, blur, solarization,
    equalization), for images ``size`` px wide (the blur kernel follows the size)."""
    sel = lambda key, default: select(aug, key, default)  # noqa: E731
    ops: list[Any] = []
    if sel("color_jitter.prob", 0.0) > 0:
        jitter = T.ColorJitter(
            sel("color_jitter.brightness", 0.4),
            sel("color_jitter.contrast", 0.4),
            sel("color_jitter.saturation", 0.2),
            sel("color_jitter.hue", 0.1),
        )
        ops.append(T.RandomApply([jitter], p=sel("color_jitter.prob", 0.0)))
    ops.append(T.RandomGrayscale(p=sel("grayscale.prob", 0.0)))
    blur_p = sel("gaussian_blur.prob", sel("gaussian_prob", 0.0))
    if blur_p > 0:
        kernel = max(3, int(0.1 * size) // 2 * 2 + 1)
        ops.append(T.RandomApply([T.GaussianBlur(kernel, sigma=(0.1, 2.0))], p=blur_p))
    if sel("solarization.prob", 0.0) > 0:
        ops.append(T.RandomSolarize(128, p=sel("solarization.prob", 0.0)))
    if sel("equalization.prob", 0.0) > 0:
        ops.append(T.RandomEqualize(p=sel("equalization.prob", 0.0)))
    return ops


def crop_scale(aug: DictConfig) -> tuple[float, float]:
    return (
        select(aug, "rrc.crop_min_scale", 0.08),
        select(aug, "rrc.crop_max_scale", 1.0),
    )


def flip_prob(aug: DictConfig) -> float:
    return select(aug, "horizontal_flip.prob", 0.5)


def build_augmentation(dataset: str, aug: DictConfig) -> Callable:
    """One view's augmentation from one entry of solo-learn's ``augmentations`` list."""
    size = aug.crop_size
    if select(aug, "rrc.enabled", True):
        crop: Any = T.RandomResizedCrop(
            size, scale=crop_scale(aug), interpolation=T.InterpolationMode.BICUBIC
        )
    else:
        crop = T.Resize((size, size), interpolation=T.InterpolationMode.BICUBIC)
    ops = [crop, *photometric_ops(aug, size), T.RandomHorizontalFlip(p=flip_prob(aug))]
    return T.Compose([*ops, T.ToTensor(), normalize(dataset, aug)])


def crops_of(augmentations: Sequence[DictConfig]) -> list[DictConfig]:
    """The ``augmentations`` entry of every crop, in order (large crops first)."""
    return [a for a in augmentations for _ in range(a.num_crops)]


class NCropTransform:
    """Applies each pipeline ``num_crops`` times; returns the list of views (large crops first)."""

    def __init__(self, pipelines: Sequence[tuple[Callable, int]]):
        self.pipelines = list(pipelines)

    def __call__(self, image) -> list[torch.Tensor]:
        return [t(image) for t, n in self.pipelines for _ in range(n)]

    def __repr__(self) -> str:
        return "\n".join(f"{n} x {t}" for t, n in self.pipelines)


def build_pretrain_transform(dataset: str, augmentations: Sequence[DictConfig]) -> NCropTransform:
    return NCropTransform([(build_augmentation(dataset, a), a.num_crops) for a in augmentations])


def build_eval_transform(dataset: str, crop_size: int = 224) -> Callable:
    """Deterministic transform for validation and feature extraction: datasets stored at their
    training resolution (CIFAR, synthetic_lt) as they are, photographs resized to crop / 0.875
    and centre-cropped."""
    if facts(dataset).native_size is not None:
        return T.Compose([T.ToTensor(), normalize(dataset)])
    return T.Compose(
        [
            T.Resize(int(crop_size / 0.875), interpolation=T.InterpolationMode.BICUBIC),
            T.CenterCrop(crop_size),
            T.ToTensor(),
            normalize(dataset),
        ]
    )
