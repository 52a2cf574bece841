"""``solo.args.pretrain`` and ``solo.args.linear``: their ``parse_cfg``.

It first checks solo-ext's keys (``data.sampler``, solo-ext's datasets and their keys, DALI
combinations; one line naming key and value, before anything is built or written), then runs
solo-learn's own, then checks a solo-ext method's ``method_kwargs`` (solo-learn would only when
building the model), then adds the long-tailed training counts (``data.train_class_counts``) and
the ResNet stem of 32 px datasets (``backbone.kwargs.small_image_stem``), and scales a generated
dataset's online-classifier lr by the batch (solo-learn does only when ``data.val_path`` is
given). The dataset lists solo-learn asserts on learn the long-tailed names.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

from solo_ext.common import announce
from solo_ext.config import run_default
from solo_ext.facts import SOLO_EXT_ONLY
from solo_ext.solo_learn import parsed
from solo_ext.solo_learn.check import attribute, function, stop_if_broken

# the names of the solo-learn module this patch needs (checked before it applies)
NEEDS = (
    function("parse_cfg", "cfg"),
    attribute("_SUPPORTED_DATASETS", list),
    attribute("_N_CLASSES_PER_DATASET", dict),
)


def _check_checkpoint(cfg: Any) -> None:
    """main_linear.py's checkpoint: given, and a file (solo-learn asserts without a message);
    a run directory stands for its newest checkpoint, which the key then names (solo-learn
    loads the file itself)."""
    from omegaconf import OmegaConf

    from solo_ext.config import ConfigError

    key = "pretrained_feature_extractor"
    value = None if OmegaConf.is_missing(cfg, key) else OmegaConf.select(cfg, key, default=None)
    if value in (None, "None"):
        raise ConfigError(f"{key} is missing: the .ckpt file of the pretraining run to evaluate")
    if os.path.isdir(str(value)):
        from solo_ext.runs.checkpoint import find_checkpoint

        try:
            OmegaConf.update(cfg, key, str(find_checkpoint(str(value), key)))
        except FileNotFoundError as err:
            raise ConfigError(str(err)) from None
    elif not os.path.isfile(str(value)):
        raise ConfigError(f"{key}={value!r}: no such file or run directory")


def _checkpoint_given(cfg: Any) -> bool:
    from omegaconf import OmegaConf

    key = "pretrained_feature_extractor"
    if OmegaConf.is_missing(cfg, key):
        return False
    return OmegaConf.select(cfg, key, default=None) not in (None, "None")


def _check_solo_ext_keys(cfg: Any, module: ModuleType) -> dict[str, Any] | None:
    """solo-ext's keys, checked before solo-learn's ``parse_cfg`` fills anything in; returns
    the sampler's arguments (None: no ``data.sampler``)."""
    from omegaconf import OmegaConf

    from solo_ext.config import check_options, declared
    from solo_ext.data.datasets import fill_data_cfg
    from solo_ext.data.options import DATA_KEYS
    from solo_ext.data.samplers import fill_sampler_cfg
    from solo_ext.eval.classifier_stage import (
        LONG_TAIL_SAMPLER,
        fill_classifier_stage,
        stage_data_long_tailed,
    )
    from solo_ext.methods.registry import SOLO_EXT_METHODS, load
    from solo_ext.runs.backbone import fill_run_backbone

    OmegaConf.set_struct(cfg, False)
    if module.__name__.endswith("linear") and _checkpoint_given(cfg):
        _check_checkpoint(cfg)
        # the run's backbone (args.json beside the checkpoint): every backbone.kwargs the config
        # does not give, before parse_cfg's {} and fill_stem_option's table default; a given
        # value that differs from the run's stops in one line naming both
        fill_run_backbone(cfg, str(cfg.pretrained_feature_extractor))
    elif module.__name__.endswith("linear") and parsed.uses_solo_ext(cfg):
        _check_checkpoint(cfg)  # (its one-line error: solo-learn asserts without a message)
    if module.__name__.endswith("linear"):
        # the classifier stage: published on a long-tailed dataset unless the config says,
        # with class-balanced sampling unless the config names a sampler
        fill_classifier_stage(cfg)
        if OmegaConf.select(cfg, "data.sampler") is None and stage_data_long_tailed(cfg):
            OmegaConf.update(cfg, "data.sampler", {"name": LONG_TAIL_SAMPLER}, force_add=True)
        _decoupled_stages(cfg)
    if parsed.uses_solo_ext(cfg):  # (a config of solo-learn's alone is left to its own checks)
        from solo_ext.config import CORE_RUN_OPTIONS
        from solo_ext.data.options import check_dali_keys

        check_options(cfg, {"devices": CORE_RUN_OPTIONS["devices"]})
        check_dali_keys(cfg)
    dataset = OmegaConf.select(cfg, "data.dataset", default=None)
    data_format = declared(cfg, "data.format", DATA_KEYS)
    sampler = fill_sampler_cfg(cfg, total_epochs=OmegaConf.select(cfg, "max_epochs"))
    method = OmegaConf.select(cfg, "method", default=None)
    if sampler is None and method in SOLO_EXT_METHODS and data_format != "dali":
        # a solo-ext method draws as in solo-ext-pretrain: a seeded permutation per (seed,
        # epoch) and rank, so that a resumed run draws what the uninterrupted one drew
        sampler = {"name": parsed.DEFAULT_SAMPLER}
    if sampler is not None:
        sampler.setdefault("seed", OmegaConf.select(cfg, "seed", default=run_default("seed")))
    if data_format == "dali" and (sampler is not None or dataset in SOLO_EXT_ONLY):
        from solo_ext.data.dali import check_dali, dali_device, run_dali_device

        check_dali(cfg)
        dali_device(run_dali_device(cfg))
        name = "instance" if sampler is None else sampler["name"]
        announce(
            f"data.format=dali: DALI reads the training images in the {name!r} sampler's order"
        )
    if method in SOLO_EXT_METHODS:  # what the method needs from this loader, said once
        load(method).adapt_to_loader(cfg, data_format)
    if dataset in SOLO_EXT_ONLY:
        fill_data_cfg(cfg)
        # solo-learn's parse_cfg reads the class count of a known name from this table
        module._N_CLASSES_PER_DATASET[dataset] = cfg.data.num_classes
    return sampler


def _stage_view(cfg: Any) -> Any:
    """main_linear.py's classifier stage with ``train_augmentation: pretrain``: the evaluated
    run's query view, from the ``args.json`` beside its checkpoint (one line when there is
    none); None for the other stages."""
    from pathlib import Path

    from solo_ext.config import ConfigError, select
    from solo_ext.eval.classifier_stage import run_query_view
    from solo_ext.runs.backbone import ARGS_JSON, read_run_config

    if select(cfg, "train_augmentation") != "pretrain" or not _checkpoint_given(cfg):
        return None  # (no checkpoint: solo-learn's parse_cfg stops on it)
    checkpoint = str(cfg.pretrained_feature_extractor)
    where = str(Path(checkpoint).parent / ARGS_JSON)
    saved = read_run_config(checkpoint)
    if saved is None:
        raise ConfigError(
            f"train_augmentation='pretrain': no {where} beside pretrained_feature_extractor="
            f"{checkpoint!r} to take the run's query view from; set train_augmentation=published "
            "(the official stage's ImageNet-LT crops) or solo-learn"
        )
    return run_query_view(saved, where)


def _decoupled_stages(cfg: Any) -> None:
    """main_linear.py's ``classifier_stage`` and ``decoupled`` keys, checked (one line naming key
    and value) and, when a decoupled stage is named, filled with solo-ext-linear's defaults: the
    model runs those stages on features extracted once before its own training
    (:mod:`solo_ext.solo_learn.linear_model`); its own linear classifier trains either way."""
    from solo_ext.common import did_you_mean
    from solo_ext.config import ConfigError, check_options, fill_options, select
    from solo_ext.eval.options import DECOUPLED_OPTIONS, DECOUPLED_STAGES, stages_of

    section = select(cfg, "decoupled")
    for key in section or {}:
        if f"decoupled.{key}" not in DECOUPLED_OPTIONS:
            known = [k.removeprefix("decoupled.") for k in DECOUPLED_OPTIONS if "." in k]
            raise ConfigError(
                f"decoupled.{key}={section[key]!r}: unknown key{did_you_mean(str(key), known)}; "
                f"valid keys: {sorted(known)}"
            )
    check_options(cfg, DECOUPLED_OPTIONS)
    if select(cfg, "classifier_stage") is None:
        return
    stages = [s for s in stages_of(cfg.classifier_stage) if s in DECOUPLED_STAGES]
    if not stages:
        return
    fill_options(cfg, DECOUPLED_OPTIONS)
    announce(
        f"classifier_stage: {', '.join(stages)} on the frozen backbone's features (extracted "
        "once, before main_linear.py trains its own linear classifier, which it reports as "
        "val_acc1); their linear_<stage>_* keys go into metrics.json beside the checkpoint"
    )


def _check_method_kwargs(cfg: Any) -> None:
    """A solo-ext method's ``method_kwargs``, checked now: solo-learn checks them only when the
    model is built, where an error is a traceback. The method fills them in again there."""
    import copy

    from omegaconf import OmegaConf

    from solo_ext.methods.registry import SOLO_EXT_METHODS, load

    method = OmegaConf.select(cfg, "method", default=None)
    if method in SOLO_EXT_METHODS:
        load(method).add_and_assert_specific_cfg(copy.deepcopy(cfg))


def _solo_learn_crops(cfg: Any) -> None:
    """main_pretrain.py takes two large crops only (wmse and mae aside): a solo-ext method with
    more crops of the one size (bcl: its classifier's crop and two views) gives the split
    solo-learn should count (``SOLO_LEARN_CROPS``: large, small); only its own step reads it."""
    from omegaconf import OmegaConf

    from solo_ext.methods.registry import SOLO_EXT_METHODS, load

    method = OmegaConf.select(cfg, "method", default=None)
    crops = load(method).SOLO_LEARN_CROPS if method in SOLO_EXT_METHODS else None
    if crops is not None:
        cfg.data.num_large_crops, cfg.data.num_small_crops = crops


def _scale_classifier_lr(cfg: Any) -> None:
    """solo-learn scales the online classifier's lr by the batch only when ``data.val_path`` is
    given (without one it validates nothing); a generated dataset validates without one, so its
    classifier lr, given per 256 images as every lr, is scaled here by solo-learn's own factor,
    as ``solo-ext-pretrain`` scales it."""
    from omegaconf import OmegaConf

    from solo_ext.facts import facts

    if cfg.data.get("val_path") is not None or facts(cfg.data.dataset).source != "generated":
        return
    lr = OmegaConf.select(cfg, "optimizer.classifier_lr", default=None)
    if lr is not None:
        scale = cfg.optimizer.batch_size * len(cfg.devices) * cfg.num_nodes / 256
        cfg.optimizer.classifier_lr = lr * scale


def apply(module: ModuleType) -> None:
    original = module.parse_cfg
    for name in SOLO_EXT_ONLY:
        if name not in module._SUPPORTED_DATASETS:
            module._SUPPORTED_DATASETS.append(name)

    @parsed.config_errors
    def parse_cfg(cfg):
        from omegaconf import OmegaConf

        from solo_ext.config import fill_stem_option
        from solo_ext.data.datasets import long_tail_counts, thresholds_of_counts_file
        from solo_ext.facts import facts

        stop_if_broken(cfg)
        thresholds = {
            k: OmegaConf.select(cfg, f"data.{k}") for k in ("many_threshold", "few_threshold")
        }
        sampler = _check_solo_ext_keys(cfg, module)
        stage_view = _stage_view(cfg) if module.__name__.endswith("linear") else None
        dali_dataset = cfg.data.get("format") == "dali" and cfg.data.dataset in SOLO_EXT_ONLY
        if dali_dataset:  # solo-learn asserts that DALI reads one of its image-folder names
            cfg.data.format = "image_folder"
        cfg = original(cfg)
        if dali_dataset:  # (the format matters to that assert only)
            cfg.data.format = "dali"
        if cfg.data.get("train_class_counts") is None:
            counts = long_tail_counts(cfg.data)
            if counts is not None:
                cfg.data.train_class_counts = counts
        if facts(cfg.data.dataset).counts_file:  # a folder of solo-ext-make-lt: its groups
            thresholds_of_counts_file(cfg.data, thresholds)
        if module.__name__.endswith("pretrain"):
            _check_method_kwargs(cfg)
            _solo_learn_crops(cfg)
            _scale_classifier_lr(cfg)
        fill_stem_option(cfg)
        parsed.RUN = parsed.Run(cfg.data, sampler, cfg, stage_view=stage_view)
        if OmegaConf.select(cfg, "data.sampler") is not None:
            announce(f"training batches are drawn by the {sampler['name']!r} sampler")
        return cfg

    parse_cfg.__wrapped__ = original
    module.parse_cfg = parse_cfg
