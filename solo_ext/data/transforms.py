"""Image transforms from solo-learn's ``augmentations`` config.

The defaults are the published protocol's (MoCo v2 / DSCL / PBSD): crops resized bilinearly
(torchvision's ``RandomResizedCrop`` default) and PIL's ``GaussianBlur(radius=sigma)``, sigma
uniform in [0.1, 2.0]. solo-ext's earlier pipeline (bicubic crops, torchvision's ``GaussianBlur``
with a kernel of 10 % of the side) stays reachable through ``rrc.interpolation: bicubic`` and
``gaussian_blur.kind: torchvision``. Every operation but Cutout works on PIL images, before
``ToTensor``.

Off by default, the long-tail papers' stronger views: ``rand_augment.*`` (timm's RandAugment, as
PaCo's, GPaCo's and BCL's ImageNet-LT views build it), ``auto_augment.policy`` (torchvision's
AutoAugment), ``cutout.*`` (Cutout, on the tensor) and ``random_crop.padding`` (the padded
random crop of CIFAR); PaCo's CIFAR-100-LT view is the last three together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from PIL import Image, ImageFilter
from torchvision import transforms as T
from torchvision.transforms import functional as TF

from solo_ext.config import ConfigError, Option, check_options, select
from solo_ext.facts import facts

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
# torchvision's AutoAugment policies (``auto_augment.policy``)
AUTO_AUGMENT_POLICIES = {
    "cifar10": T.AutoAugmentPolicy.CIFAR10,
    "imagenet": T.AutoAugmentPolicy.IMAGENET,
    "svhn": T.AutoAugmentPolicy.SVHN,
}
# the keys of one ``augmentations`` entry that solo-ext's pipelines read, declared once (their
# defaults are solo-learn's; ``rrc.interpolation`` and ``gaussian_blur.kind``, solo-ext's own,
# default to the published protocol; RandAugment, AutoAugment, Cutout and the padded crop,
# solo-ext's own too, default to off)
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
    "rand_augment.n": Option(0, "int", 0),  # operations per image; 0: off
    "rand_augment.m": Option(10, "int", 0, 30),
    "rand_augment.mstd": Option(0.5, "float", 0),
    "auto_augment.policy": Option(None, "str", choices=tuple(AUTO_AUGMENT_POLICIES), nullable=True),
    "cutout.length": Option(0, "int", 0),  # side of each hole in px; 0: off
    "cutout.holes": Option(1, "int", 1),
    "random_crop.padding": Option(None, "int", 0, nullable=True),  # only with rrc.enabled: false
}


def _get(aug: DictConfig, key: str) -> Any:
    """``aug.<key>``, or its declared default."""
    return select(aug, key, AUGMENTATION_OPTIONS[key].default)


def augmentation_value(aug: DictConfig, key: str) -> Any:
    """One key of an ``augmentations`` entry as every pipeline reads it: the entry's value, or
    its declared default (``gaussian_blur.prob`` falls back to solo-learn's ``gaussian_prob``)."""
    if key == "gaussian_blur.prob":
        return select(aug, key, _get(aug, "gaussian_prob"))
    return _get(aug, key)


def _checked(aug: DictConfig, key: str) -> Any:
    """``aug.<key>`` (or its default), checked against its declaration where it is used, so a
    pipeline built without ``check_augmentations`` (solo-learn's ``main_pretrain.py``) stops on
    a typo too: one line naming the key and the value."""
    value = _get(aug, key)
    AUGMENTATION_OPTIONS[key].check(key, value)
    return value


def check_augmentations(cfg: DictConfig) -> None:
    """Every given key of every ``augmentations`` entry against its declaration, and each
    entry's crop scale range; one line naming the key and the value."""
    for i, aug in enumerate(cfg.augmentations):
        check_options(cfg, {f"augmentations.{i}.{k}": o for k, o in AUGMENTATION_OPTIONS.items()})
        low, high = crop_scale(aug)
        if low > high:
            raise ConfigError(
                f"augmentations.{i}.rrc.crop_min_scale={low}: above "
                f"augmentations.{i}.rrc.crop_max_scale={high}"
            )
        crop_padding(aug, f"augmentations.{i}.")


def normalize(dataset: str, aug: DictConfig | None = None) -> T.Normalize:
    """The dataset's statistics (the dataset table); image folders (``custom``, ``custom_lt``)
    take ``mean`` / ``std`` from the augmentation config when it gives them, as solo-learn does
    for ``custom``."""
    mean, std = facts(dataset).stats
    if aug is not None and facts(dataset).stats_from_config:
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
    if _checked(aug, "gaussian_blur.kind") == "pil":
        return PILGaussianBlur(BLUR_SIGMA)
    kernel = max(3, int(0.1 * size) // 2 * 2 + 1)
    return T.GaussianBlur(kernel, sigma=BLUR_SIGMA)


def crop_interpolation(aug: DictConfig) -> T.InterpolationMode:
    """The resampling of the entry's crop (``rrc.interpolation``; also its resize when
    ``rrc.enabled`` is false)."""
    return INTERPOLATIONS[_checked(aug, "rrc.interpolation")]


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
    blur_p = augmentation_value(aug, "gaussian_blur.prob")
    if blur_p > 0:
        ops.append(T.RandomApply([blur_op(aug, size)], p=blur_p))
    if _get(aug, "solarization.prob") > 0:
        ops.append(T.RandomSolarize(128, p=_get(aug, "solarization.prob")))
    if _get(aug, "equalization.prob") > 0:
        ops.append(T.RandomEqualize(p=_get(aug, "equalization.prob")))
    return ops


class Cutout:
    """The published Cutout (DeVries & Taylor 2017; PaCo's CIFAR-LT view): ``holes`` squares
    zeroed on every channel of a ``[C, H, W]`` tensor, after ``ToTensor`` and before
    ``Normalize`` (black holes). Each centre is a uniform pixel (y, then x); the square's rows
    are ``y - length // 2`` to ``y + length // 2`` (end excluded) clipped to the image, its
    columns alike, so a hole near a border is cut short, as published.

    The centres come from torch's generator, one ``randint`` per coordinate, as the view's
    other draws (the published code draws them with numpy's).
    """

    def __init__(self, length: int, holes: int = 1):
        self.length, self.holes = int(length), int(holes)

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        h, w = img.shape[-2:]
        half = self.length // 2
        mask = torch.ones((h, w), dtype=img.dtype, device=img.device)
        for _ in range(self.holes):
            y = int(torch.randint(h, (1,)))
            x = int(torch.randint(w, (1,)))
            mask[max(0, y - half) : min(h, y + half), max(0, x - half) : min(w, x + half)] = 0
        return img * mask

    def __repr__(self) -> str:
        return f"{type(self).__name__}(length={self.length}, holes={self.holes})"


def rand_augment(n: int, m: int, mstd: float, size: int, mean: Sequence[float]) -> Callable:
    """timm's RandAugment of ``n`` operations at magnitude ``m`` (timm clips it at 10) with
    noise ``mstd`` (above 100: uniform), built as PaCo, GPaCo and BCL build theirs: the
    translation constant 45 % of the crop (``size``), the fill the dataset's ``mean`` in 8 bits.
    On PIL images; its draws are Python's and numpy's (timm's), which the per-epoch reseeding
    covers too."""
    from timm.data.auto_augment import rand_augment_transform  # (timm's import is slow)

    hparams = {
        "translate_const": int(size * 0.45),
        "img_mean": tuple(min(255, round(255 * float(x))) for x in mean),
    }
    # written out positionally: timm splits the string at each '-' (1e-05 would break it)
    mstd_text = np.format_float_positional(float(mstd), trim="-")
    return rand_augment_transform(f"rand-n{n}-m{m}-mstd{mstd_text}", hparams)


def policy_ops(dataset: str, aug: DictConfig) -> list[Any]:
    """RandAugment and AutoAugment of one ``augmentations`` entry (each when given), on the PIL
    image after the flip, last before ``ToTensor``: where the published views put them (their
    order is crop, flip, colour jitter, the policy)."""
    n, m, mstd = (_checked(aug, f"rand_augment.{key}") for key in ("n", "m", "mstd"))
    policy = _checked(aug, "auto_augment.policy")
    ops: list[Any] = []
    if n > 0:
        ops.append(rand_augment(n, m, mstd, aug.crop_size, normalize(dataset, aug).mean))
    if policy is not None:
        ops.append(T.AutoAugment(AUTO_AUGMENT_POLICIES[policy]))
    return ops


def cutout_ops(aug: DictConfig) -> list[Any]:
    """Cutout of one ``augmentations`` entry when ``cutout.length`` > 0 (between ``ToTensor``
    and ``Normalize``)."""
    length, holes = _checked(aug, "cutout.length"), _checked(aug, "cutout.holes")
    return [Cutout(length, holes)] if length > 0 else []


def crop_padding(aug: DictConfig, prefix: str = "") -> int | None:
    """``random_crop.padding`` (None: not given), which needs ``rrc.enabled: false``: the padded
    random crop (torchvision's ``RandomCrop``) takes the place of that entry's resize. One line
    naming both keys otherwise (``prefix``: the entry's place in the config)."""
    padding = _checked(aug, "random_crop.padding")
    if padding is not None and _get(aug, "rrc.enabled"):
        raise ConfigError(
            f"{prefix}random_crop.padding={padding!r} with {prefix}rrc.enabled=true: the padded "
            f"random crop replaces the resize of rrc.enabled=false; set {prefix}rrc.enabled=false "
            "or leave the padding out"
        )
    return padding


def crop_scale(aug: DictConfig) -> tuple[float, float]:
    return _get(aug, "rrc.crop_min_scale"), _get(aug, "rrc.crop_max_scale")


def flip_prob(aug: DictConfig) -> float:
    return _get(aug, "horizontal_flip.prob")


def build_augmentation(dataset: str, aug: DictConfig) -> Callable:
    """One view's augmentation from one entry of solo-learn's ``augmentations`` list: crop
    (random resized, or without it a resize or the padded random crop), colour (jitter,
    grayscale, blur, solarization, equalization), flip, RandAugment / AutoAugment, then the
    tensor, Cutout and the normalisation."""
    size = aug.crop_size
    interpolation = crop_interpolation(aug)
    padding = crop_padding(aug)
    if _get(aug, "rrc.enabled"):
        crop: Any = T.RandomResizedCrop(size, scale=crop_scale(aug), interpolation=interpolation)
    elif padding is not None:
        crop = T.RandomCrop(size, padding=padding)
    else:
        crop = T.Resize((size, size), interpolation=interpolation)
    ops = [crop, *photometric_ops(aug, size), T.RandomHorizontalFlip(p=flip_prob(aug))]
    ops += policy_ops(dataset, aug)
    return T.Compose([*ops, T.ToTensor(), *cutout_ops(aug), normalize(dataset, aug)])


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
