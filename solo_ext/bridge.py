"""solo-learn's own, unmodified scripts with the whole plugin: samplers, long-tailed datasets and
the Many / Medium / Few online kNN.

solo-learn has a registry for methods only. Everything else reaches ``main_pretrain.py``,
``main_linear.py`` and ``main_knn.py`` through the start-up hook (``solo_ext._autoload``), which
calls :func:`patch` right after each module below has been executed, before the scripts bind its
names:

- ``solo.args.pretrain`` / ``solo.args.linear``: ``parse_cfg`` first checks solo-ext's keys
  (``data.sampler``, solo-ext's datasets and their keys, DALI combinations; one line naming key
  and value, before anything is built or written), then runs solo-learn's own, then checks a
  solo-ext method's ``method_kwargs`` (solo-learn would only when building the model), then
  adds the long-tailed training counts (``data.train_class_counts``) and the ResNet stem of
  32 px datasets (``backbone.kwargs.small_image_stem``), and scales a generated dataset's
  online-classifier lr by the batch (solo-learn does only when ``data.val_path`` is given). The
  dataset lists solo-learn asserts on learn the long-tailed names.
- ``solo.args.dataset`` / ``solo.args.knn``: ``main_knn.py --dataset`` takes them too; their
  keys (imbalance factor, split files, ...) come from the run's ``args.json``.
- ``solo.data.pretrain_dataloader`` and ``solo.data.classification_dataloader``: the dataset
  builders build solo-ext's datasets, the transforms use the dataset table, and the training
  loaders draw with the configured sampler (a ``DistributedSampler``, so Lightning does not
  re-shard it under DDP).
- ``solo.data.dali_dataloader``: with ``data.format=dali`` and a sampler (or a solo-ext dataset),
  the DALI data modules of ``main_pretrain.py`` / ``main_linear.py`` read the training images in
  the sampler's order (``solo_ext.data.dali``), through solo-learn's own decode and augmentation
  graph; ``build_transform_pipeline_dali`` gets a solo-ext dataset's statistics.
- ``solo.methods.linear``: on a long-tailed dataset, ``main_linear.py``'s model also logs the
  validation top-1 of the Many / Medium / Few classes (``val_acc1_many``, ...).

solo-learn calls its loaders without the config, so the parsed run (:data:`RUN`) is kept here.
``SOLO_EXT_AUTOLOAD=0`` switches all of it off, with the method registration.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from solo_ext.bridge_check import missing, record_broken, stop_if_broken
from solo_ext.common import announce
from solo_ext.config import run_default
from solo_ext.data.facts import FEW_THRESHOLD, MANY_THRESHOLD, SOLO_EXT_ONLY, facts


@dataclass
class Run:
    """The parts of the parsed config that solo-learn's loaders are called without."""

    data: Any  # the checked ``data`` section (DictConfig)
    sampler: dict[str, Any] | None  # build_sampler arguments, None: solo-learn's shuffle
    cfg: Any = None  # the whole config (main_pretrain.py's; the method fills its keys in)
    loader: Any = None  # main_pretrain.py's training loader, when the bridge built it


# a solo-ext method's draw in main_pretrain.py without data.sampler (solo-ext-pretrain's too)
DEFAULT_SAMPLER = "instance"


RUN: Run | None = None


def _prog() -> str:
    return os.path.basename(sys.argv[0]) or "solo-learn"


# solo-learn's scripts, where a config error of solo-ext's checks is one line and exit status 2
SOLO_LEARN_SCRIPTS = ("main_pretrain.py", "main_linear.py", "main_knn.py", "main_umap.py")


def _config_errors(fn):
    """Config errors of solo-ext's checks: in solo-learn's scripts one line on stderr and exit
    status 2; called as a library function (solo-learn's own tests, a user's code), the
    exception itself, as solo-learn's own checks raise theirs."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        from solo_ext.cli import one_line_errors

        if _prog() not in SOLO_LEARN_SCRIPTS:
            return fn(*args, **kwargs)
        with one_line_errors(_prog()):
            return fn(*args, **kwargs)

    return wrapped


# --- parse_cfg of main_pretrain.py and main_linear.py ---------------------------------------


def _check_checkpoint(cfg: Any) -> None:
    """main_linear.py's checkpoint: given, and a file (solo-learn asserts without a message)."""
    from omegaconf import OmegaConf

    from solo_ext.config import ConfigError

    key = "pretrained_feature_extractor"
    value = None if OmegaConf.is_missing(cfg, key) else OmegaConf.select(cfg, key, default=None)
    if value in (None, "None"):
        raise ConfigError(f"{key} is missing: the .ckpt file of the pretraining run to evaluate")
    if not os.path.isfile(str(value)):
        raise ConfigError(f"{key}={value!r}: no such file")


def _checkpoint_given(cfg: Any) -> bool:
    from omegaconf import OmegaConf

    key = "pretrained_feature_extractor"
    if OmegaConf.is_missing(cfg, key):
        return False
    return OmegaConf.select(cfg, key, default=None) not in (None, "None")


def _uses_solo_ext(cfg: Any) -> bool:
    """Whether a config names anything of solo-ext's: a method, a dataset, a sampler or a
    classifier-stage key. One that does not is left to solo-learn's own checks."""
    from omegaconf import OmegaConf

    from solo_ext.eval.classifier_stage import CLASSIFIER_STAGE_OPTIONS
    from solo_ext.registry import SOLO_EXT_METHODS

    def given(key: str) -> bool:
        return OmegaConf.select(cfg, key, default=None) is not None

    return (
        OmegaConf.select(cfg, "method", default=None) in SOLO_EXT_METHODS
        or OmegaConf.select(cfg, "pretrain_method", default=None) in SOLO_EXT_METHODS
        or OmegaConf.select(cfg, "data.dataset", default=None) in SOLO_EXT_ONLY
        or given("data.sampler")
        or any(given(key) for key in CLASSIFIER_STAGE_OPTIONS)
    )


def _check_solo_ext_keys(cfg: Any, module: ModuleType) -> dict[str, Any] | None:
    """solo-ext's keys, checked before solo-learn's ``parse_cfg`` fills anything in; returns
    the sampler's arguments (None: no ``data.sampler``)."""
    from omegaconf import OmegaConf

    from solo_ext.config import check_given, declared
    from solo_ext.data.datasets import DATA_KEYS, fill_data_cfg
    from solo_ext.data.samplers import fill_sampler_cfg
    from solo_ext.eval.classifier_stage import (
        LONG_TAIL_SAMPLER,
        fill_classifier_stage,
        stage_data_long_tailed,
    )
    from solo_ext.registry import SOLO_EXT_METHODS, load
    from solo_ext.run_backbone import fill_run_backbone

    OmegaConf.set_struct(cfg, False)
    if module.__name__.endswith("linear") and _checkpoint_given(cfg):
        _check_checkpoint(cfg)
        # the run's backbone (args.json beside the checkpoint): every backbone.kwargs the config
        # does not give, before parse_cfg's {} and fill_stem_option's table default; a given
        # value that differs from the run's stops in one line naming both
        fill_run_backbone(cfg, str(cfg.pretrained_feature_extractor))
    elif module.__name__.endswith("linear") and _uses_solo_ext(cfg):
        _check_checkpoint(cfg)  # (its one-line error: solo-learn asserts without a message)
    if module.__name__.endswith("linear"):
        # the classifier stage: published on a long-tailed dataset unless the config says,
        # with class-balanced sampling unless the config names a sampler
        fill_classifier_stage(cfg)
        if OmegaConf.select(cfg, "data.sampler") is None and stage_data_long_tailed(cfg):
            OmegaConf.update(cfg, "data.sampler", {"name": LONG_TAIL_SAMPLER}, force_add=True)
    if _uses_solo_ext(cfg):  # (a config of solo-learn's alone is left to its own checks)
        from solo_ext.config import CORE_RUN_OPTIONS
        from solo_ext.data.dali import check_dali_keys

        check_given(cfg, {"devices": CORE_RUN_OPTIONS["devices"]})
        check_dali_keys(cfg)
    dataset = OmegaConf.select(cfg, "data.dataset", default=None)
    data_format = declared(cfg, "data.format", DATA_KEYS)
    sampler = fill_sampler_cfg(cfg, total_epochs=OmegaConf.select(cfg, "max_epochs"))
    method = OmegaConf.select(cfg, "method", default=None)
    if sampler is None and method in SOLO_EXT_METHODS and data_format != "dali":
        # a solo-ext method draws as in solo-ext-pretrain: a seeded permutation per (seed,
        # epoch) and rank, so that a resumed run draws what the uninterrupted one drew
        sampler = {"name": DEFAULT_SAMPLER}
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


def _check_method_kwargs(cfg: Any) -> None:
    """A solo-ext method's ``method_kwargs``, checked now: solo-learn checks them only when the
    model is built, where an error is a traceback. The method fills them in again there."""
    import copy

    from omegaconf import OmegaConf

    from solo_ext.registry import SOLO_EXT_METHODS, load

    method = OmegaConf.select(cfg, "method", default=None)
    if method in SOLO_EXT_METHODS:
        load(method).add_and_assert_specific_cfg(copy.deepcopy(cfg))


def _solo_learn_crops(cfg: Any) -> None:
    """main_pretrain.py takes two large crops only (wmse and mae aside): a solo-ext method with
    more crops of the one size (bcl: its classifier's crop and two views) gives the split
    solo-learn should count (``SOLO_LEARN_CROPS``: large, small); only its own step reads it."""
    from omegaconf import OmegaConf

    from solo_ext.registry import SOLO_EXT_METHODS, load

    method = OmegaConf.select(cfg, "method", default=None)
    crops = getattr(load(method), "SOLO_LEARN_CROPS", None) if method in SOLO_EXT_METHODS else None
    if crops is not None:
        cfg.data.num_large_crops, cfg.data.num_small_crops = crops


def _scale_classifier_lr(cfg: Any) -> None:
    """solo-learn scales the online classifier's lr by the batch only when ``data.val_path`` is
    given (without one it validates nothing); a generated dataset validates without one, so its
    classifier lr, given per 256 images as every lr, is scaled here by solo-learn's own factor,
    as ``solo-ext-pretrain`` scales it."""
    from omegaconf import OmegaConf

    from solo_ext.data.facts import facts

    if cfg.data.get("val_path") is not None or facts(cfg.data.dataset).source != "generated":
        return
    lr = OmegaConf.select(cfg, "optimizer.classifier_lr", default=None)
    if lr is not None:
        scale = cfg.optimizer.batch_size * len(cfg.devices) * cfg.num_nodes / 256
        cfg.optimizer.classifier_lr = lr * scale


def _wrap_parse_cfg(module: ModuleType) -> None:
    original = module.parse_cfg
    for name in SOLO_EXT_ONLY:
        if name not in module._SUPPORTED_DATASETS:
            module._SUPPORTED_DATASETS.append(name)

    @_config_errors
    def parse_cfg(cfg):
        global RUN
        from omegaconf import OmegaConf

        from solo_ext.config import fill_stem_option
        from solo_ext.data.datasets import long_tail_counts, thresholds_of_counts_file
        from solo_ext.data.facts import facts

        stop_if_broken(cfg)
        thresholds = {
            k: OmegaConf.select(cfg, f"data.{k}") for k in ("many_threshold", "few_threshold")
        }
        sampler = _check_solo_ext_keys(cfg, module)
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
        RUN = Run(cfg.data, sampler, cfg)
        if OmegaConf.select(cfg, "data.sampler") is not None:
            announce(f"training batches are drawn by the {sampler['name']!r} sampler")
        return cfg

    parse_cfg.__wrapped__ = original
    module.parse_cfg = parse_cfg


# --- main_knn.py --------------------------------------------------------------------------


def _wrap_dataset_args(module: ModuleType) -> None:
    original = module.dataset_args

    @functools.wraps(original)
    def dataset_args(parser):
        original(parser)
        action = parser._option_string_actions["--dataset"]
        action.choices = [*action.choices, *(n for n in SOLO_EXT_ONLY if n not in action.choices)]

    module.dataset_args = dataset_args


def _knn_data(args: Any) -> Any:
    """The ``data`` section for ``main_knn.py --dataset <solo-ext dataset>``: the run's own
    (``args.json``) when it was trained on that dataset, with the paths given on the command
    line."""
    import json

    from omegaconf import OmegaConf

    from solo_ext.data.datasets import fill_data_cfg

    data: dict[str, Any] = {}
    args_json = os.path.join(str(args.pretrained_checkpoint_dir or ""), "args.json")
    if os.path.isfile(args_json):
        with open(args_json) as f:
            trained = json.load(f).get("data") or {}
        if trained.get("dataset") == args.dataset:
            data = {k: v for k, v in trained.items() if k != "train_class_counts"}
    data.update(dataset=args.dataset, format="image_folder", num_workers=args.num_workers)
    for key, value in (("train_path", args.train_data_path), ("val_path", args.val_data_path)):
        if value is not None:
            data[key] = str(value)
    cfg = OmegaConf.create({"data": data})
    fill_data_cfg(cfg)
    return cfg.data


def _knn_guarded(parse_args_knn):
    """``parse_args_knn`` that first stops, in one line, a ``main_knn.py`` command using
    solo-ext (a solo-ext dataset, or the run of a solo-ext method) while the bridge is broken:
    looked for in the command line, before argparse rejects a dataset it was not taught."""

    @functools.wraps(parse_args_knn)
    @_config_errors
    def guarded():
        import argparse
        import json

        from solo_ext.bridge_check import BROKEN

        if BROKEN:
            pre = argparse.ArgumentParser(add_help=False)
            pre.add_argument("--dataset")
            pre.add_argument("--pretrained_checkpoint_dir")
            known, _ = pre.parse_known_args()
            cfg: dict[str, Any] = {"data": {"dataset": known.dataset}}
            args_json = os.path.join(str(known.pretrained_checkpoint_dir or ""), "args.json")
            if os.path.isfile(args_json):
                with open(args_json) as f:
                    cfg["method"] = json.load(f).get("method")
            stop_if_broken(cfg)
        return parse_args_knn()

    return guarded


def _wrap_parse_args_knn(module: ModuleType) -> None:
    original = _knn_guarded(module.parse_args_knn)

    @functools.wraps(original)
    @_config_errors
    def parse_args_knn():
        global RUN
        args = original()
        if args.dataset in SOLO_EXT_ONLY:
            RUN = Run(_knn_data(args), None)
        return args

    module.parse_args_knn = parse_args_knn


# --- the loaders ----------------------------------------------------------------------------


def _run_data(dataset: str) -> Any:
    if RUN is None or RUN.data.dataset != dataset:
        raise RuntimeError(
            f"solo-ext: data.dataset={dataset!r} reached solo-learn's loaders without solo-ext's "
            "parse_cfg (is the start-up hook off? SOLO_EXT_AUTOLOAD=0)"
        )
    return RUN.data


def _train_loader(dataset: Any, batch_size: int, num_workers: int) -> Any:
    """solo-learn's training loader (batch, workers, pinned memory, drop_last), drawing with the
    run's sampler."""
    import torch
    from torch.utils.data import DataLoader

    from solo_ext.data.datasets import targets_of
    from solo_ext.data.samplers import build_sampler

    assert RUN is not None and RUN.sampler is not None
    args = dict(RUN.sampler)
    labels = targets_of(dataset)
    if labels is None and args["name"] == DEFAULT_SAMPLER:  # (uniform over images)
        labels = [0] * len(dataset)
    if labels is None:
        raise RuntimeError(f"solo-ext: {type(dataset).__name__} has no labels to sample by")
    sampler = build_sampler(args.pop("name"), labels, **args)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=True,
        drop_last=True,
        # the workers' base seed comes from here (reseeded per epoch by EpochSeed), not from
        # the global RNG, as in solo-ext-pretrain
        generator=torch.Generator().manual_seed(args["seed"]),
    )


def _method_transform() -> Any:
    """The loader transform the run's method asks for (PBSD's views of the published
    pipeline), built from the config its class has filled in; None for solo-learn's crops."""
    if RUN is None or RUN.cfg is None:
        return None
    from solo_ext.pretrain import method_transform

    transform = method_transform(RUN.cfg)
    if transform is not None:
        announce(f"{RUN.cfg.get('method')}: the loader makes its views: {transform!r}")
    return transform


def _solo_ext_views(dataset: str) -> bool:
    """A solo-ext method's run on a dataset of the table gets solo-ext's views (bilinear crops,
    PIL's blur, as the published code; ``rrc.interpolation`` and ``gaussian_blur.kind`` apply),
    the same as with ``solo-ext-pretrain``; solo-learn's methods keep solo-learn's."""
    from solo_ext.data.facts import DATASETS
    from solo_ext.registry import SOLO_EXT_METHODS

    method = None if RUN is None or RUN.cfg is None else RUN.cfg.get("method")
    return method in SOLO_EXT_METHODS and dataset in DATASETS


def _with_stats(dataset: str, cfg: Any) -> Any:
    """An ``augmentations`` entry for solo-learn's builders (which know the statistics of
    their own datasets only) carrying a solo-ext dataset's (a ``custom`` one keeps the entry's
    ``mean`` / ``std`` when it gives them, as solo-learn does)."""
    if dataset not in SOLO_EXT_ONLY:
        return cfg
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(OmegaConf.to_container(cfg))
    mean, std = facts(dataset).stats
    if facts(dataset).stats_from_config:
        mean, std = cfg.get("mean", mean), cfg.get("std", std)
    cfg.mean, cfg.std = list(mean), list(std)
    return cfg


def _epoch_seed(model: Any) -> list[Any]:
    """solo-ext-pretrain's per-epoch seeding (``EpochSeed``: the global RNGs from (seed,
    epoch, rank), the sampler's epoch set when a checkpoint is loaded), which makes a resumed run
    the uninterrupted one, brought by a solo-ext method into main_pretrain.py's Trainer; nothing
    where the door has its own or the bridge did not build the loader."""
    from solo_ext.resume import EpochSeed

    if RUN is None or RUN.loader is None:
        return []
    if any(isinstance(cb, EpochSeed) for cb in getattr(model.trainer, "callbacks", [])):
        return []
    return [EpochSeed(RUN.cfg.seed, RUN.loader.sampler, RUN.loader.generator)]


def _patch_pretrain_loader(module: ModuleType) -> None:
    build_transform, prepare_datasets = module.build_transform_pipeline, module.prepare_datasets
    prepare_dataloader = module.prepare_dataloader

    @functools.wraps(build_transform)
    def build_transform_pipeline(dataset, cfg):
        if _solo_ext_views(dataset):  # the published resampling and blur (solo-ext's views)
            from solo_ext.data.transforms import build_augmentation

            return build_augmentation(dataset, cfg)
        return build_transform(dataset, _with_stats(dataset, cfg))

    @functools.wraps(prepare_datasets)
    def prepare_datasets_(dataset, transform, *args, **kwargs):
        transform = _method_transform() or transform
        if dataset not in SOLO_EXT_ONLY:
            return prepare_datasets(dataset, transform, *args, **kwargs)
        from solo_ext.data.datasets import IndexedNCrop, build_dataset

        data = _run_data(dataset)
        return IndexedNCrop(build_dataset(data, "train", transform), no_labels=data.no_labels)

    @functools.wraps(prepare_dataloader)
    def prepare_dataloader_(train_dataset, batch_size=64, num_workers=4):
        if RUN is None or RUN.sampler is None:
            return prepare_dataloader(train_dataset, batch_size, num_workers)
        from solo_ext.methods.base import DOOR_CALLBACKS

        if _epoch_seed not in DOOR_CALLBACKS:
            DOOR_CALLBACKS.append(_epoch_seed)
        RUN.loader = _train_loader(train_dataset, batch_size, num_workers)
        return RUN.loader

    module.build_transform_pipeline = build_transform_pipeline
    module.prepare_datasets = prepare_datasets_
    module.prepare_dataloader = prepare_dataloader_


def _eval_transforms(dataset: str) -> tuple[Any, Any]:
    """Train / val transforms of a dataset solo-learn has no pipeline for (``synthetic_lt``):
    those of solo-learn's CIFAR at the dataset's own size and statistics."""
    from torchvision import transforms as T

    f = facts(dataset)
    norm = T.Normalize(*f.stats)
    train = T.Compose(
        [
            T.RandomResizedCrop(size=f.native_size, scale=(0.08, 1.0)),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            norm,
        ]
    )
    return train, T.Compose([T.ToTensor(), norm])


def _patch_classification_loader(module: ModuleType) -> None:
    # prepare_data calls these three through the module's globals, so it follows the patches
    prepare_transforms = module.prepare_transforms
    prepare_datasets, prepare_dataloaders = module.prepare_datasets, module.prepare_dataloaders

    @functools.wraps(prepare_transforms)
    def prepare_transforms_(dataset):
        if dataset not in SOLO_EXT_ONLY:
            train, val = prepare_transforms(dataset)
        else:
            solo_name = facts(dataset).solo_name
            train, val = prepare_transforms(solo_name) if solo_name else _eval_transforms(dataset)
        if _stage("train_augmentation") == "published":  # main_linear.py's classifier stage
            from solo_ext.eval.classifier_stage import published_train_transform

            train = published_train_transform(dataset)
        return train, val

    @functools.wraps(prepare_datasets)
    def prepare_datasets_(dataset, T_train, T_val, *args, **kwargs):
        if dataset not in SOLO_EXT_ONLY:
            return prepare_datasets(dataset, T_train, T_val, *args, **kwargs)
        from solo_ext.data.datasets import build_dataset

        data = _run_data(dataset)
        has_val = data.val_path is not None or facts(data.dataset).source != "image_folder"
        val = build_dataset(data, "val", T_val) if has_val else None
        return build_dataset(data, "train", T_train), val

    @functools.wraps(prepare_dataloaders)
    def prepare_dataloaders_(train_dataset, val_dataset, batch_size=64, num_workers=4):
        if (RUN is None or RUN.sampler is None) and val_dataset is not None:
            return prepare_dataloaders(train_dataset, val_dataset, batch_size, num_workers)
        from torch.utils.data import DataLoader

        if RUN is not None and RUN.sampler is not None:
            train = _train_loader(train_dataset, batch_size, num_workers)
        else:
            train = DataLoader(
                train_dataset, batch_size, shuffle=True, num_workers=num_workers, drop_last=True
            )
        val = None
        if val_dataset is not None:
            val = DataLoader(val_dataset, batch_size, num_workers=num_workers, pin_memory=True)
        return train, val

    module.prepare_transforms = prepare_transforms_
    module.prepare_datasets = prepare_datasets_
    module.prepare_dataloaders = prepare_dataloaders_


# --- solo-learn's DALI loaders ---------------------------------------------------------------


def _dali_sampled() -> bool:
    """Whether the run's DALI training loader reads in a solo-ext sampler's order: a sampler is
    configured, or the dataset is one of solo-ext's (DALI's file reader cannot read it)."""
    if RUN is None or RUN.cfg is None or RUN.data.get("format") != "dali":
        return False
    return RUN.sampler is not None or RUN.data.dataset in SOLO_EXT_ONLY


def _dali_train_loader(datamodule: Any, transforms: Any, kind: str) -> Any:
    """solo-ext's sampled DALI loader for a solo-learn DALI data module: the run's training set
    (a solo-ext dataset, or the class folders solo-learn's reader lists), the run's sampler
    (``instance`` when none: a seeded uniform order), solo-learn's decode-and-augment graph."""
    from torchvision.datasets import ImageFolder

    from solo_ext.data.dali import dali_loader
    from solo_ext.data.datasets import build_dataset, targets_of
    from solo_ext.data.samplers import build_sampler

    assert RUN is not None
    data = RUN.data
    if data.dataset in SOLO_EXT_ONLY:
        train_set = build_dataset(data, "train", None)
    else:  # the class folders, sorted, as solo-learn's DALI pipelines list them
        train_set = ImageFolder(str(data.train_path))
    seed = RUN.cfg.get("seed", run_default("seed"))
    args = dict(RUN.sampler or {"name": "instance", "seed": seed})
    sampler = build_sampler(args.pop("name"), targets_of(train_set), **args)
    return dali_loader(
        train_set,
        sampler,
        transforms,
        kind=kind,
        batch_size=datamodule.batch_size,
        device=datamodule.dali_device,  # (checked by parse_cfg)
        num_workers=datamodule.num_workers,
        seed=seed,
    )


def _linear_dali_augmentation(dataset: str) -> Any:
    """main_linear.py's DALI training crops as an ``augmentations`` entry for solo-learn's
    ``build_transform_pipeline_dali``: the published stage's, or solo-learn's own linear
    pipeline's (random resized crop 0.08-1 and flip), at the dataset's size."""
    from solo_ext.eval.classifier_stage import train_augmentation_entry

    entry = train_augmentation_entry(dataset, _stage("train_augmentation") or "solo-learn")
    return _with_stats(dataset, entry)


def _patch_dali_loaders(module: ModuleType) -> None:
    pretrain_base, classification_base = (
        module.PretrainDALIDataModule,
        module.ClassificationDALIDataModule,
    )
    build_transform_dali = module.build_transform_pipeline_dali

    @functools.wraps(build_transform_dali)
    def build_transform_pipeline_dali(dataset, cfg, dali_device):
        return build_transform_dali(dataset, _with_stats(dataset, cfg), dali_device)

    class PretrainDALIDataModule(pretrain_base):
        """solo-learn's; its reader follows the run's sampler when the run has one, or trains
        on a solo-ext dataset (decode and augmentations unchanged)."""

        def __init__(self, *args, train_data_path=None, **kwargs):
            # a dataset without files (synthetic_lt) has no path for solo-learn's Path()
            super().__init__(*args, train_data_path=train_data_path or "", **kwargs)

        def setup(self, stage=None):
            if not _dali_sampled():
                return super().setup(stage)
            self.train_loader = _dali_train_loader(self, self.transforms, "pretrain")

    class ClassificationDALIDataModule(classification_base):
        """solo-learn's; main_linear.py's training loader follows the run's sampler when the
        run has one, or trains on a solo-ext dataset (validation stays main_linear.py's
        torchvision loader)."""

        def __init__(self, dataset, *args, train_data_path=None, val_data_path=None, **kwargs):
            # solo-learn's accepts its own names only; a solo-ext dataset reads as 'custom'
            super().__init__(
                "custom" if dataset in SOLO_EXT_ONLY else dataset,
                *args,
                train_data_path=train_data_path or "",
                val_data_path=val_data_path or "",
                **kwargs,
            )
            self.dataset = dataset

        def setup(self, stage=None):
            if not _dali_sampled():
                return super().setup(stage)
            aug = _linear_dali_augmentation(self.dataset)
            transforms = build_transform_dali(self.dataset, aug, self.dali_device)
            self.train_loader = _dali_train_loader(self, transforms, "classification")

    for cls, base in (
        (PretrainDALIDataModule, pretrain_base),
        (ClassificationDALIDataModule, classification_base),
    ):
        cls.__name__, cls.__qualname__, cls.__module__ = (
            base.__name__,
            base.__name__,
            module.__name__,
        )
    module.PretrainDALIDataModule = PretrainDALIDataModule
    module.ClassificationDALIDataModule = ClassificationDALIDataModule
    module.build_transform_pipeline_dali = build_transform_pipeline_dali


# --- main_linear.py's model -----------------------------------------------------------------


def _stage(key: str) -> Any:
    """A classifier-stage key of main_linear.py's run (None outside it)."""
    if RUN is None or RUN.cfg is None:
        return None
    return RUN.cfg.get(key) if "backbone_bn" in RUN.cfg else None


def _patch_linear_model(module: ModuleType) -> None:
    base = module.LinearModel

    class LinearModel(base):
        """solo-learn's linear model; on a long-tailed dataset (the run knows its training
        counts) it also logs the validation top-1 of the Many / Medium / Few classes."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            from solo_ext.eval.classifier_stage import init_classifier

            init_classifier(self.classifier, _stage("classifier_init") or "default")
            self.backbone_bn = _stage("backbone_bn") or "eval"
            counts = None if RUN is None else RUN.data.get("train_class_counts")
            self.shot_accuracy = None
            if counts:
                from solo_ext.eval.shot_accuracy import ShotGroupAccuracy

                data = RUN.data
                self.shot_accuracy = ShotGroupAccuracy(
                    counts,
                    data.get("many_threshold", MANY_THRESHOLD),
                    data.get("few_threshold", FEW_THRESHOLD),
                )
                self._last_logits = None
                self.classifier.register_forward_hook(self._keep_logits)

        def _keep_logits(self, _module, _inputs, logits) -> None:
            self._last_logits = logits

        def training_step(self, batch, batch_idx):
            """``backbone_bn: train`` (the published stage): the frozen backbone runs in train
            mode, so its BatchNorm statistics follow the stage's images (solo-learn's step puts
            it in eval mode first, which is skipped for this step; validation is in eval)."""
            if self.backbone_bn != "train" or getattr(self, "finetune", False):
                return super().training_step(batch, batch_idx)
            backbone = self.backbone
            backbone.train()
            backbone.eval = lambda: backbone  # (an instance attribute, for this step only)
            try:
                return super().training_step(batch, batch_idx)
            finally:
                del backbone.eval

        def validation_step(self, batch, batch_idx):
            out = super().validation_step(batch, batch_idx)
            if self.shot_accuracy is not None and not self.trainer.sanity_checking:
                self.shot_accuracy.update(self._last_logits.detach().float(), batch[1])
            return out

        def on_validation_epoch_end(self):
            super().on_validation_epoch_end()
            if self.shot_accuracy is not None:
                if not self.trainer.sanity_checking:
                    self.log_dict(self.shot_accuracy.compute())  # synced by the metric
                self.shot_accuracy.reset()

    LinearModel.__name__ = LinearModel.__qualname__ = base.__name__
    module.LinearModel = LinearModel


# --- solo-learn's checkpoints and auto-resume ------------------------------------------------


def _resumed_dir(checkpointer: Any, trainer: Any) -> Any:
    """The run directory that a solo-ext run resumed from one of this checkpointer's
    checkpoints (``<dir>/<method>/<id>/``) continues in; None for another checkpoint or a
    config of solo-learn's alone. (solo-learn names the directory after the logger's version:
    with wandb the resumed run's id, so it continues there itself; with Lightning's default
    logger a new version, so a new directory.)"""
    from pathlib import Path

    ckpt = getattr(trainer, "ckpt_path", None)
    if not ckpt or not _uses_solo_ext(checkpointer.cfg):
        return None
    run_dir = Path(ckpt).resolve().parent
    return run_dir if run_dir.parent == checkpointer.logdir.resolve() else None


def _patch_checkpointer(module: ModuleType) -> None:
    base = module.Checkpointer
    setup = base.initial_setup

    @functools.wraps(setup)
    def initial_setup(self, trainer):
        """solo-learn's run directory, with two additions: every checkpoint write of the run
        is atomic (a temporary file, fsync, rename: a killed write leaves the previous file
        whole), and a solo-ext run resumed from one of its checkpoints continues in that run's
        directory, as solo-ext-pretrain's do (the temporary files of killed writes there are
        removed first)."""
        from pathlib import Path

        from lightning.pytorch.plugins.io import TorchCheckpointIO

        from solo_ext.resume import AtomicSaveIO, remove_stale_temporaries

        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # (not a user's own)
            trainer.strategy.checkpoint_io = AtomicSaveIO()
        setup(self, trainer)
        resumed = _resumed_dir(self, trainer)
        if resumed is not None and resumed != self.path.resolve():
            if trainer.is_global_zero and self.path.is_dir() and not any(self.path.iterdir()):
                self.path.rmdir()  # (the new version's directory, made just now)
            self.path = resumed
            self.ckpt_placeholder = f"{self.cfg.name}-{resumed.name}" + "-ep={}.ckpt"
        if resumed is not None:
            # the checkpoint resumed from is the run's last: replaced by the next one, as in
            # the uninterrupted run (unless checkpoint.keep_prev)
            self.last_ckpt = Path(trainer.ckpt_path)
        if trainer.is_global_zero and getattr(trainer, "ckpt_path", None):
            remove_stale_temporaries(Path(trainer.ckpt_path).parent)

    @functools.wraps(base.save_args)
    def save_args(self, trainer):
        """solo-learn's ``args.json``, written atomically, with the run's environment
        (``environment``: versions, device, precision, processes), as ``solo-ext-pretrain``
        writes it."""
        if not trainer.is_global_zero:
            return
        import json

        from omegaconf import OmegaConf

        from solo_ext.common import atomic_write_text
        from solo_ext.environment import of_trainer

        args = OmegaConf.to_container(self.cfg)  # solo-learn's content, its keys in its order
        args["wandb_run_id"] = getattr(self, "wandb_run_id", None)
        data_format = RUN.data.get("format") if RUN is not None else None
        args["environment"] = of_trainer(trainer, data_format)
        text = json.dumps(args, default=lambda o: "<not serializable>")
        atomic_write_text(self.path / "args.json", text)

    base.initial_setup = initial_setup
    base.save_args = save_args


def _patch_auto_resumer(module: ModuleType) -> None:
    base = module.AutoResumer
    find = base.find_checkpoint

    @functools.wraps(find)
    def find_checkpoint(self, cfg):
        """solo-learn's choice of run; of its checkpoints the newest readable one: an
        unreadable file (truncated by a kill before writes were atomic, foreign) is passed
        over in one line, and a run without a readable checkpoint starts anew. solo-learn's
        pick comes first for a config of solo-learn's alone (it takes the first file it
        lists), the newest for a solo-ext one."""
        from pathlib import Path

        from solo_ext.resume import by_age, newest_readable

        found, run_id = find(self, cfg)
        if found is None:
            return found, run_id
        found = Path(found)
        others = by_age(p for p in found.parent.glob("*.ckpt") if p != found)
        order = by_age([found, *others]) if _uses_solo_ext(cfg) else [found, *others]
        chosen = newest_readable(order)
        if chosen is None:
            announce(f"auto_resume: no readable checkpoint in {str(found.parent)!r}: starting anew")
            return None, None
        return chosen, run_id

    base.find_checkpoint = find_checkpoint


PATCHES = {
    "solo.args.pretrain": _wrap_parse_cfg,
    "solo.args.linear": _wrap_parse_cfg,
    "solo.args.dataset": _wrap_dataset_args,
    "solo.args.knn": _wrap_parse_args_knn,
    "solo.data.pretrain_dataloader": _patch_pretrain_loader,
    "solo.data.classification_dataloader": _patch_classification_loader,
    "solo.data.dali_dataloader": _patch_dali_loaders,
    "solo.methods.linear": _patch_linear_model,
    "solo.utils.checkpointer": _patch_checkpointer,
    "solo.utils.auto_resumer": _patch_auto_resumer,
}


def _guard_only(module: ModuleType) -> None:
    """A module that lacks a need is not patched; its entry points only stop a config that uses
    solo-ext (``parse_cfg``; ``main_knn.py``'s ``parse_args_knn``), with the missing name."""
    if callable(getattr(module, "parse_cfg", None)):
        original = module.parse_cfg

        @functools.wraps(original)
        @_config_errors
        def parse_cfg(cfg):
            stop_if_broken(cfg)
            return original(cfg)

        module.parse_cfg = parse_cfg
    if callable(getattr(module, "parse_args_knn", None)):
        module.parse_args_knn = _knn_guarded(module.parse_args_knn)


def patch(module: ModuleType) -> None:
    """Applies this module's patch to a freshly executed solo-learn module (once), after
    checking that the module has every name the patch needs (``bridge_check.NEEDS``); when one
    is missing, records it and leaves the module as it is (:func:`_guard_only`)."""
    if getattr(module, "_solo_ext_patched", False):
        return
    lacking = missing(module)
    if lacking is not None:
        record_broken(module.__name__, f"{module.__name__} has no {lacking}")
        _guard_only(module)
    else:
        PATCHES[module.__name__](module)
    module._solo_ext_patched = True
