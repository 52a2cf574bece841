"""The classifier stage of a two-stage long-tail method (DSCL's reported number), declared once
for both entry points (solo-learn's ``main_linear.py`` through the plugin's patches, and
``solo-ext-linear``).

The published stage (DSCL's ``equal_lincls.py``): the pretrained backbone frozen but in
``train()`` mode (its BatchNorm running statistics follow the classifier stage's images, and are
then used at test), the linear layer initialised N(0, 0.01) with a zero bias, trained on
augmented crops made as its pretraining's query view (on ImageNet-LT: random resized crop,
colour jitter (0.4, 0.4, 0.4, 0.1) p 0.8, grayscale p 0.2, Gaussian blur p 0.5, flip), with
class-balanced sampling and SGD stepped down x0.1 at epochs 20 and 30 of 40 (the configs carry
the sampler and the schedule). Each part is a key:

- ``backbone_bn``: ``train`` (published) or ``eval`` (the usual frozen-BN linear probe);
- ``classifier_init``: ``normal`` (N(0, 0.01), zero bias; published) or ``default`` (PyTorch's);
- ``train_augmentation``: ``pretrain`` (the evaluated run's own query view: the first entry of
  its ``augmentations``, from its ``args.json``; published), ``published`` (the official stage's
  ImageNet-LT crops above, whatever the data, at the dataset's size) or ``solo-learn`` (the
  loader's own: solo-learn's random resized crop and flip in ``main_linear.py``; extracted
  features without augmentation in ``solo-ext-linear``).

Unset, each follows the dataset: the published stage on long-tailed datasets (where the number
is compared with the long-tail papers'), solo-learn's linear protocol on balanced ones (where it
is compared with solo-learn's tables).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from solo_ext.config import ConfigError, check_options, select
from solo_ext.eval.options import CLASSIFIER_STAGE_OPTIONS
from solo_ext.facts import facts

# each key's value for (long-tailed, balanced) datasets when the config does not give it
_BY_DATASET = {
    "backbone_bn": ("train", "eval"),
    "classifier_init": ("normal", "default"),
    "train_augmentation": ("pretrain", "solo-learn"),
}
PUBLISHED_STAGE = {key: values[0] for key, values in _BY_DATASET.items()}
SOLO_LEARN_STAGE = {key: values[1] for key, values in _BY_DATASET.items()}


# solo-ext-linear's schedule by the evaluated data, for the keys its command line and config
# leave out (conf/linear.yaml leaves them null). Long-tailed: the published stage (DSCL's
# train_cls.sh: SGD at lr 10 for the batch of 2048, 1.25 per 256 images as both entry points scale
# it, no weight decay, lr x 0.1 at epochs 20 and 30 of 40) with class-balanced sampling; balanced:
# a cosine decay over 100 epochs at lr 0.1 per 256 images, shuffled.
LONG_TAIL_STAGE: dict[str, Any] = {
    "max_epochs": 40,
    "optimizer.batch_size": 2048,
    "optimizer.lr": 1.25,
    "optimizer.weight_decay": 0.0,
    "scheduler.name": "step",
    "scheduler.lr_decay_steps": [20, 30],
}
BALANCED_STAGE: dict[str, Any] = {
    "max_epochs": 100,
    "optimizer.batch_size": 256,
    "optimizer.lr": 0.1,
    "optimizer.weight_decay": 0.0,
    "scheduler.name": "warmup_cosine",
    "scheduler.lr_decay_steps": None,
}
STAGE_SCHEDULES = {True: LONG_TAIL_STAGE, False: BALANCED_STAGE}
LONG_TAIL_SAMPLER = "class_balanced"


def stage_data_long_tailed(cfg: DictConfig) -> bool:
    """Whether the evaluated data (``cfg.data``) is long-tailed: a long-tailed dataset, or an
    image folder made by solo-ext-make-lt (its ``counts.json``)."""
    from solo_ext.data.datasets import is_long_tailed

    data = select(cfg, "data")
    if data is None or select(data, "dataset") is None:
        return facts("custom").long_tailed
    return is_long_tailed(data)


def fill_classifier_stage(cfg: DictConfig) -> DictConfig:
    """Checks the given keys, then fills each missing one from the data (``cfg.data``): the
    published stage on a long-tailed dataset (or a folder made by solo-ext-make-lt), solo-learn's
    linear protocol otherwise."""
    check_options(cfg, CLASSIFIER_STAGE_OPTIONS)
    long_tailed = stage_data_long_tailed(cfg)
    for key, (published, usual) in _BY_DATASET.items():
        if select(cfg, key) is None:
            OmegaConf.update(cfg, key, published if long_tailed else usual, force_add=True)
    return cfg


def published_stage(cfg: DictConfig) -> bool:
    """Whether the classifier trains on images through the backbone (not on features once)."""
    return cfg.backbone_bn == "train" or cfg.train_augmentation != "solo-learn"


def init_classifier(layer: nn.Linear, how: str) -> None:
    """``normal``: weights N(0, 0.01), zero bias (the published fc); ``default``: as built."""
    if how == "normal":
        with torch.no_grad():
            layer.weight.normal_(0.0, 0.01)
            layer.bias.zero_()


def published_train_augmentation(dataset: str, crop_size: int | None = None) -> DictConfig:
    """The published stage's training crops as an ``augmentations`` entry: random resized crop
    (scale 0.08-1, at 224 px, or the stored size of 32 px datasets), colour jitter (0.4, 0.4,
    0.4, 0.1) p 0.8, grayscale p 0.2, Gaussian blur p 0.5, flip p 0.5; bilinear, PIL's blur."""
    size = crop_size or facts(dataset).native_size or 224
    return OmegaConf.create(
        {
            "crop_size": size,
            "num_crops": 1,
            "rrc": {"enabled": True, "crop_min_scale": 0.08, "crop_max_scale": 1.0},
            "color_jitter": {
                "prob": 0.8,
                "brightness": 0.4,
                "contrast": 0.4,
                "saturation": 0.4,
                "hue": 0.1,
            },
            "grayscale": {"prob": 0.2},
            "gaussian_blur": {"prob": 0.5},
            "solarization": {"prob": 0.0},
            "equalization": {"prob": 0.0},
            "horizontal_flip": {"prob": 0.5},
        }
    )


def run_query_view(run_cfg: Any, where: str) -> DictConfig:
    """The evaluated run's pretraining query view, as one crop: the first entry of its
    ``augmentations`` (the first large crop's), from its config (``where``: its ``args.json``,
    named in the one-line error when it has none)."""
    augmentations = select(run_cfg, "augmentations") if OmegaConf.is_config(run_cfg) else None
    if augmentations is None and isinstance(run_cfg, dict):
        augmentations = run_cfg.get("augmentations")
    if not augmentations or not isinstance(augmentations[0], (dict, DictConfig)):
        raise ConfigError(
            f"train_augmentation='pretrain': {where} has no augmentations to take the run's query "
            "view from; set train_augmentation=published (the official stage's ImageNet-LT "
            "crops) or solo-learn"
        )
    first = augmentations[0]
    entry = OmegaConf.create(OmegaConf.to_container(first) if OmegaConf.is_config(first) else first)
    entry.num_crops = 1
    return entry


def train_augmentation_entry(
    dataset: str, augmentation: str, run_view: DictConfig | None = None
) -> DictConfig:
    """The stage's training crops as an ``augmentations`` entry: ``pretrain`` (``run_view``,
    the run's query view: :func:`run_query_view`), ``published``
    (:func:`published_train_augmentation`), or ``solo-learn`` (random resized crop 0.08-1 and
    flip, no colour), at 224 px or the stored size of 32 px datasets."""
    if augmentation == "pretrain":
        if run_view is None:
            raise ValueError("train_augmentation=pretrain needs the run's query view")
        return run_view
    entry = published_train_augmentation(dataset)
    if augmentation != "published":
        off = {"prob": 0.0}
        colour = ("color_jitter", "grayscale", "gaussian_blur", "solarization")
        entry = OmegaConf.merge(entry, {key: off for key in colour})
    return entry


def stage_train_transform(
    dataset: str, augmentation: str, run_view: DictConfig | None = None
) -> Callable[[Any], Any]:
    """The stage's training transform (PIL image -> normalised tensor) for ``pretrain`` (the
    run's query view) or ``published``, built as pretraining builds a crop."""
    from solo_ext.data.transforms import build_augmentation

    if augmentation == "published":
        return build_augmentation(dataset, published_train_augmentation(dataset))
    return build_augmentation(dataset, train_augmentation_entry(dataset, augmentation, run_view))
