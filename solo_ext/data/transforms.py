"""Image transforms from solo-learn's ``augmentations`` config (torchvision implementations)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from omegaconf import DictConfig
from torchvision import transforms as T

from solo_ext.config import ConfigError, Option, check_given, select
from solo_ext.data.facts import facts

_PROB = {"kind": "float", "low": 0, "high": 1}
# the keys of one ``augmentations`` entry that solo-ext's pipelines read, declared once (their
# defaults are solo-learn's)
AUGMENTATION_OPTIONS: dict[str, Option] = {
    "crop_size": Option(None, "int", 1),
    "num_crops": Option(None, "int", 1),
    "rrc.enabled": Option(True, "bool"),
    "rrc.crop_min_scale": Option(0.08, "float", 0, 1, low_open=True),
    "rrc.crop_max_scale": Option(1.0, "float", 0, 1, low_open=True),
    "color_jitter.prob": Option(0.0, **_PROB),
    "color_jitter.brightness": Option(0.4, "float", 0),
    "color_jitter.contrast": Option(0.4, "float", 0),
    "color_jitter.saturation": Option(0.2, "float", 0),
    "color_jitter.hue": Option(0.1, "float", 0, 0.5),
    "grayscale.prob": Option(0.0, **_PROB),
    "gaussian_blur.prob": Option(None, nullable=True, **_PROB),  # None: gaussian_prob
    "gaussian_prob": Option(0.0, **_PROB),
    "solarization.prob": Option(0.0, **_PROB),
    "equalization.prob": Option(0.0, **_PROB),
    "horizontal_flip.prob": Option(0.5, **_PROB),
}


def _get(aug: DictConfig, key: str) -> Any:
    """``aug.<key>``, or its declared default."""
    return select(aug, key, AUGMENTATION_OPTIONS[key].default)


def check_augmentations(cfg: DictConfig) -> None:
    """Every given key of every ``augmentations`` entry against its declaration, and each
    entry's crop scale range; one line naming the key and the value."""
    for i, aug in enumerate(cfg.augmentations):
        check_given(cfg, {f"augmentations.{i}.{k}": o for k, o in AUGMENTATION_OPTIONS.items()})
        low, high = crop_scale(aug)
        if low > high:
            raise ConfigError(
                f"augmentations.{i}.rrc.crop_min_scale={low}: above "
                f"augmentations.{i}.rrc.crop_max_scale={high}"
            )


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
    ops: list[Any] = []
    if _get(aug, "color_jitter.prob") > 0:
        jitter = T.ColorJitter(
            _get(aug, "color_jitter.brightness"),
            _get(aug, "color_jitter.contrast"),
            _get(aug, "color_jitter.saturation"),
            _get(aug, "color_jitter.hue"),
        )
        ops.append(T.RandomApply([jitter], p=_get(aug, "color_jitter.prob")))
    ops.append(T.RandomGrayscale(p=_get(aug, "grayscale.prob")))
    blur_p = select(aug, "gaussian_blur.prob", _get(aug, "gaussian_prob"))
    if blur_p > 0:
        kernel = max(3, int(0.1 * size) // 2 * 2 + 1)
        ops.append(T.RandomApply([T.GaussianBlur(kernel, sigma=(0.1, 2.0))], p=blur_p))
    if _get(aug, "solarization.prob") > 0:
        ops.append(T.RandomSolarize(128, p=_get(aug, "solarization.prob")))
    if _get(aug, "equalization.prob") > 0:
        ops.append(T.RandomEqualize(p=_get(aug, "equalization.prob")))
    return ops


def crop_scale(aug: DictConfig) -> tuple[float, float]:
    return _get(aug, "rrc.crop_min_scale"), _get(aug, "rrc.crop_max_scale")


def flip_prob(aug: DictConfig) -> float:
    return _get(aug, "horizontal_flip.prob")


def build_augmentation(dataset: str, aug: DictConfig) -> Callable:
    """One view's augmentation from one entry of solo-learn's ``augmentations`` list."""
    size = aug.crop_size
    if _get(aug, "rrc.enabled"):
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
