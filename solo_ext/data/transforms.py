"""Image transforms from solo-learn's ``augmentations`` config.

The defaults are the published protocol's (MoCo v2 / DSCL / PBSD): crops resized bilinearly
(torchvision's ``RandomResizedCrop`` default) and PIL's ``GaussianBlur(radius=sigma)``, sigma
uniform in [0.1, 2.0]. solo-ext's earlier pipeline (bicubic crops, torchvision's ``GaussianBlur``
with a kernel of 10 % of the side) stays reachable through ``rrc.interpolation: bicubic`` and
``gaussian_blur.kind: torchvision``. Every operation works on PIL images, before ``ToTensor``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from omegaconf import DictConfig
from PIL import Image, ImageFilter
from torchvision import transforms as T
from torchvision.transforms import functional as TF

from solo_ext.config import ConfigError, Option, check_given, select
from solo_ext.data.facts import facts

_PROB = {"kind": "float", "low": 0, "high": 1}
# the crops' resampling (``rrc.interpolation``): bilinear is the published one (torchvision's
# default), bicubic solo-learn's and solo-ext's earlier one
INTERPOLATIONS = {
    "bilinear": T.InterpolationMode.BILINEAR,
    "bicubic": T.InterpolationMode.BICUBIC,
}
# the blur (``gaussian_blur.kind``): ``pil`` is the published one (and solo-learn's), PIL's
# Gaussian of radius sigma; ``torchvision`` solo-ext's earlier one, torchvision's kernel of 10 %
# of the side (23 px at 224, 7 px at 64), which cuts the strong blurs short at small sizes
BLUR_KINDS = ("pil", "torchvision")
BLUR_SIGMA = (0.1, 2.0)
# the keys of one ``augmentations`` entry that solo-ext's pipelines read, declared once (their
# defaults are solo-learn's; ``rrc.interpolation`` and ``gaussian_blur.kind``, solo-ext's own,
# default to the published protocol)
AUGMENTATION_OPTIONS: dict[str, Option] = {
    "crop_size": Option(None, "int", 1),
    "num_crops": Option(None, "int", 1),
    "rrc.enabled": Option(True, "bool"),
    "rrc.crop_min_scale": Option(0.08, "float", 0, 1, low_open=True),
    "rrc.crop_max_scale": Option(1.0, "float", 0, 1, low_open=True),
    "rrc.interpolation": Option("bilinear", "str", choices=tuple(INTERPOLATIONS)),
    "color_jitter.prob": Option(0.0, **_PROB),
    "color_jitter.brightness": Option(0.4, "float", 0),
    "color_jitter.contrast": Option(0.4, "float", 0),
    "color_jitter.saturation": Option(0.2, "float", 0),
    "color_jitter.hue": Option(0.1, "float", 0, 0.5),
    "grayscale.prob": Option(0.0, **_PROB),
    "gaussian_blur.prob": Option(None, nullable=True, **_PROB),  # None: gaussian_prob
    "gaussian_blur.kind": Option("pil", "str", choices=BLUR_KINDS),
    "gaussian_prob": Option(0.0, **_PROB),
    "solarization.prob": Option(0.0, **_PROB),
    "equalization.prob": Option(0.0, **_PROB),
    "horizontal_flip.prob": Option(0.5, **_PROB),
}


def _get(aug: DictConfig, key: str) -> Any:
    """``aug.<key>``, or its declared default."""
    return select(aug, key, AUGMENTATION_OPTIONS[key].default)


def _choice(aug: DictConfig, key: str) -> str:
    """``aug.<key>`` (or its default), checked against its choices where it is used, so a
    pipeline built without ``check_augmentations`` (solo-learn's ``main_pretrain.py``) stops on
    a typo too: one line naming the key and the value."""
    value = _get(aug, key)
    AUGMENTATION_OPTIONS[key].check(key, value)
    return value


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


class PILGaussianBlur:
    """PIL's ``ImageFilter.GaussianBlur(radius=sigma)``, sigma uniform in ``sigma``: the
    published blur (MoCo v2's, DSCL's) and solo-learn's. No kernel size: a strong blur stays
    strong on a small image (a 64 px patch).

    sigma is drawn from torch's generator, as torchvision's ``GaussianBlur`` draws it (one
    ``uniform_`` per call), so both kinds of blur take the same random numbers and the
    per-epoch reseeding covers it. Takes a PIL image, or a uint8 ``[C, H, W]`` tensor (blurred
    as the PIL image it is, exactly); a float tensor is refused, since its conversion to 8 bits
    would round it: put the blur before ``ToTensor``.
    """

    def __init__(self, sigma: Sequence[float] = BLUR_SIGMA):
        self.sigma = (float(sigma[0]), float(sigma[1]))

    @staticmethod
    def get_params(sigma_min: float, sigma_max: float) -> float:
        """The radius of one call (torchvision's ``GaussianBlur.get_params``)."""
        return torch.empty(1).uniform_(sigma_min, sigma_max).item()

    def __call__(self, img: Image.Image | torch.Tensor) -> Image.Image | torch.Tensor:
        blur = ImageFilter.GaussianBlur(radius=self.get_params(*self.sigma))
        if isinstance(img, Image.Image):
            return img.filter(blur)
        if isinstance(img, torch.Tensor) and img.dtype == torch.uint8 and img.dim() == 3:
            return TF.pil_to_tensor(TF.to_pil_image(img).filter(blur))
        kind = f"{img.dtype} tensor" if isinstance(img, torch.Tensor) else type(img).__name__
        raise TypeError(
            f"PILGaussianBlur takes a PIL image or a uint8 [C, H, W] tensor, not a {kind}"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sigma={self.sigma})"


def blur_op(aug: DictConfig, size: int) -> Callable:
    """The blur of one ``augmentations`` entry (``gaussian_blur.kind``) for images ``size`` px
    wide (torchvision's kernel follows the size; PIL's radius does not need to)."""
    if _choice(aug, "gaussian_blur.kind") == "pil":
        return PILGaussianBlur(BLUR_SIGMA)
    kernel = max(3, int(0.1 * size) // 2 * 2 + 1)
    return T.GaussianBlur(kernel, sigma=BLUR_SIGMA)


def crop_interpolation(aug: DictConfig) -> T.InterpolationMode:
    """The resampling of the entry's crop (``rrc.interpolation``; also its resize when
    ``rrc.enabled`` is false)."""
    return INTERPOLATIONS[_choice(aug, "rrc.interpolation")]


def photometric_ops(aug: DictConfig, size: int) -> list[Any]:
    """The colour part of one ``augmentations`` entry (jitter, grayscale, blur, solarization,
    equalization, in the published order), for PIL images ``size`` px wide."""
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
        ops.append(T.RandomApply([blur_op(aug, size)], p=blur_p))
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
    """One view's augmentation from one entry of solo-learn's ``augmentations`` list: crop,
    colour (jitter, grayscale, blur, solarization, equalization), flip, then the tensor."""
    size = aug.crop_size
    interpolation = crop_interpolation(aug)
    if _get(aug, "rrc.enabled"):
        crop: Any = T.RandomResizedCrop(size, scale=crop_scale(aug), interpolation=interpolation)
    else:
        crop = T.Resize((size, size), interpolation=interpolation)
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
    training resolution (CIFAR, synthetic_lt) as they are, photographs resized (bilinear) to
    crop / 0.875 and centre-cropped."""
    if facts(dataset).native_size is not None:
        return T.Compose([T.ToTensor(), normalize(dataset)])
    return T.Compose(
        [
            # bilinear, torchvision's default: the published test transform (resize 256, centre
            # crop 224) and solo-learn's ImageNet validation
            T.Resize(int(crop_size / 0.875), interpolation=T.InterpolationMode.BILINEAR),
            T.CenterCrop(crop_size),
            T.ToTensor(),
            normalize(dataset),
        ]
    )
