"""``solo-ext-linear``: a linear classifier on a pretrained backbone, frozen.

    solo-ext-linear pretrained_checkpoint_dir=trained_models/scl/offline-ab12cd34 \\
        data.sampler.name=class_balanced max_epochs=40

Two paths, chosen by the classifier-stage keys (:mod:`solo_ext.eval.classifier_stage`; unset,
they follow the dataset):

- the published stage (DSCL's ``equal_lincls.py``; the default on long-tailed datasets): the
  linear layer is trained on images through the frozen backbone, on augmented crops
  (``train_augmentation``: ``pretrain``, the run's own query view; ``published``, the official
  stage's ImageNet-LT crops; or solo-learn's random resized crop and flip), with the
  backbone in train mode when ``backbone_bn: train`` (its BatchNorm running statistics follow the
  stage's images and are then used at test, in eval mode), the layer initialised as
  ``classifier_init`` says (``feature_norm`` is not used);
- the features path (``backbone_bn: eval`` with ``train_augmentation: solo-learn``; the default
  on balanced datasets): features extracted once, without augmentation, and a linear classifier
  (after a non-affine BatchNorm when ``feature_norm``, as in MAE's probe) trained on them.

``classifier_stage`` runs either of them (``balanced_linear``, the default), the decoupled stages
on features extracted once (``crt``, ``tau_norm``, ``lws``, ``logit_adjust``: see
:mod:`solo_ext.eval.decoupled`; keys under ``decoupled``, reported as ``linear_<stage>_*``), or
several in one command (a list, or ``all``).

Both train with Lightning, optionally with a long-tail sampler (``data.sampler``; DSCL trains its
classifier with ``class_balanced``), by SGD (``optimizer.kwargs.momentum``, default 0.9) under
solo-learn's ``scheduler.name``: ``step`` (lr x0.1 at each of ``scheduler.lr_decay_steps``) or a
cosine decay (``warmup_cosine``, ``cosine``; ``warmup_epochs`` not used), stepped per epoch; or
``none``. Both run where ``accelerator`` says (``auto``, the default: the GPU when torch sees
one; ``gpu`` or ``cpu`` force either; ``devices``: Lightning's), the features extracted there
``features.batch_size`` images a batch, loaded by ``features.num_workers`` processes (null: the
run's ``data.num_workers``), and brought back to the CPU. Both test on the validation split
under the deterministic transform (photographs resized and centre-cropped, to 224 in the
published stage and to the run's crop size on the features path; stored-size datasets as they
are). Overall and Many / Medium / Few accuracy go into ``metrics.json`` beside the
checkpoint, with the stage as run (``linear_epochs``, ``linear_sampler``, ``linear_batch`` over
all processes, ``linear_lr`` after the batch scaling, ``linear_schedule``,
``linear_lr_decay_epochs`` and the stage keys; the leaderboard compares them with the published
stage), per-class accuracy into ``linear_per_class.csv`` and ``linear_per_class.png``. Keys:
``solo_ext/conf/linear.yaml``.

It also takes solo-learn's linear configs (``scripts/linear``, the ones ``main_linear.py``
reads): ``pretrained_feature_extractor`` names the checkpoint (or the run directory), or
``pretrained_checkpoint_dir`` the run directory (its newest checkpoint), one of the two;
``optimizer.lr`` is given per 256 images and scaled by the batch as solo-learn does, and the
keys in :data:`SOLO_LINEAR_KEYS` are accepted without being used (nor are the ``scheduler``
keys other than ``name`` and ``lr_decay_steps``). The backbone is the run's (``args.json``): a
``backbone.name`` or ``backbone.kwargs`` value given here that differs from the run's stops in
one line naming both.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from solo_ext.commands import mains
from solo_ext.commands.devices import eval_device
from solo_ext.commands.linear_stage import (
    STAGE_SCHEDULE_NAMES,
    FrozenBackboneClassifier,
    LinearProbe,
    SGDSchedule,
    train_transform,
)
from solo_ext.commands.options import LINEAR_OPTIONS, check_linear_early
from solo_ext.common import first_process
from solo_ext.config import (
    Option,
    declared,
    fill_options,
    select,
    world_size,
)
from solo_ext.data.datasets import build_dataset
from solo_ext.data.options import DATA_KEYS
from solo_ext.data.samplers import build_sampler, fill_sampler_cfg, targets_of
from solo_ext.data.transforms import build_eval_transform
from solo_ext.eval.classifier_stage import (
    CLASSIFIER_STAGE_OPTIONS,
    LONG_TAIL_SAMPLER,
    STAGE_SCHEDULES,
    fill_classifier_stage,
    published_stage,
    run_query_view,
    stage_data_long_tailed,
    train_augmentation_entry,
)
from solo_ext.eval.common import extract_features, report, split_features
from solo_ext.eval.decoupled import report_stages
from solo_ext.eval.options import stages_of
from solo_ext.runs.environment import environment
from solo_ext.runs.load import load_for_eval

# top-level keys of solo-learn's linear configs that this command accepts and does not use
SOLO_LINEAR_KEYS = (
    "name", "backbone", "pretrain_method", "checkpoint", "auto_resume", "wandb",
    "strategy", "precision", "sync_batchnorm", "hydra", "defaults", "auto_augment",
    "label_smoothing", "mixup", "cutmix", "finetune", "performance", "num_nodes",
)  # fmt: skip

Callbacks = Sequence[pl.Callback]
Result = tuple[torch.Tensor, torch.Tensor, Dataset]  # validation scores and labels, training set

# every key solo-ext-linear reads, all checked before the training stack is imported
OPTIONS: dict[str, Option] = LINEAR_OPTIONS


def fill_stage(cfg: DictConfig, data: DictConfig) -> None:
    """Fills ``cfg``'s classifier-stage keys for the evaluated ``data`` (the run's, with this
    command's ``data`` over it); on long-tailed data (or a folder made by solo-ext-make-lt) also
    the published stage's schedule (:data:`STAGE_SCHEDULES`), for the keys not given."""
    stage = OmegaConf.create({"data": OmegaConf.to_container(data)})
    for key in CLASSIFIER_STAGE_OPTIONS:
        stage[key] = select(cfg, key)
    fill_classifier_stage(stage)
    for key in CLASSIFIER_STAGE_OPTIONS:
        cfg[key] = stage[key]
    for key, value in STAGE_SCHEDULES[stage_data_long_tailed(stage)].items():
        if select(cfg, key) is None and value is not None:
            OmegaConf.update(cfg, key, value, force_add=True)


def stage_sampler(cfg: DictConfig, data: DictConfig) -> str | None:
    """The stage's sampler: this command's ``data.sampler.name``, else class-balanced on
    long-tailed data, else None (shuffled); the pretraining run's own sampler is not the
    stage's."""
    given = select(cfg, "data.sampler")
    if given is not None:
        return given if isinstance(given, str) else given.name
    stage = OmegaConf.create({"data": OmegaConf.to_container(data)})
    return LONG_TAIL_SAMPLER if stage_data_long_tailed(stage) else None


def resolve(cfg: DictConfig, data: DictConfig, pre_cfg: DictConfig | None = None) -> DictConfig:
    """``cfg`` with every default of the stage filled for the evaluated ``data``, checked (with
    the run's config ``pre_cfg``, also that it has the view ``train_augmentation`` takes)."""
    fill_stage(cfg, data)
    fill_options(cfg, OPTIONS)  # (a whole config given with --config-name may leave keys out)
    SGDSchedule.from_cfg(cfg)  # a step schedule without its epochs stops here
    if pre_cfg is not None:
        stage_view(cfg, pre_cfg)
    return cfg


def stage_view(cfg: DictConfig, pre_cfg: DictConfig) -> DictConfig | None:
    """The run's query view when the stage trains on it (``train_augmentation: pretrain``)."""
    if cfg.train_augmentation != "pretrain":
        return None
    return run_query_view(pre_cfg, "the run's args.json")


def _loader(
    cfg: DictConfig, dataset: Dataset, labels: Sequence[int], sampler_args: dict | None, **kw
) -> DataLoader:
    """Batches of ``optimizer.batch_size`` drawn by the configured sampler (seeded), or
    shuffled; the last short batch dropped when there is a full one."""
    sampler = None
    if sampler_args is not None:
        args = {"seed": cfg.seed, **sampler_args}
        sampler = build_sampler(args.pop("name"), labels, **args)
    batch_size = cfg.optimizer.batch_size
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=sampler is None,
        sampler=sampler,
        drop_last=len(dataset) > batch_size,
        **kw,
    )


def _dali_loader(
    cfg: DictConfig, pre_cfg: DictConfig, train_set: Dataset, sampler_args: dict | None
) -> Any:
    """The stage's DALI loader (``data.format=dali``): the configured sampler's order (a seeded
    uniform one when none), the stage's crops as a DALI graph, on ``dali.device``."""
    from solo_ext.data.dali import DALIAugmentation, dali_device, dali_loader, run_dali_device

    args = {"seed": cfg.seed, **(sampler_args or {"name": "instance"})}
    sampler = build_sampler(args.pop("name"), targets_of(train_set), **args)
    dataset = pre_cfg.data.dataset
    entry = train_augmentation_entry(dataset, cfg.train_augmentation, stage_view(cfg, pre_cfg))
    device = select(cfg, "dali.device") or run_dali_device(pre_cfg)
    return dali_loader(
        train_set,
        sampler,
        DALIAugmentation(dataset, entry),
        kind="classification",
        batch_size=cfg.optimizer.batch_size,
        device=dali_device(device),
        num_workers=declared(pre_cfg, "data.num_workers", DATA_KEYS),
        seed=cfg.seed,
    )


def _fit(
    cfg: DictConfig,
    module: pl.LightningModule,
    train: DataLoader,
    callbacks: Callbacks,
    epochs: int | None = None,
) -> pl.Trainer:
    """Trains ``module`` on ``train`` for ``epochs`` (default ``max_epochs``; the long-tail
    sampler, a ``DistributedSampler``, shards itself under DDP)."""
    trainer = pl.Trainer(
        max_epochs=cfg.max_epochs if epochs is None else epochs,
        accelerator=cfg.accelerator,
        devices=cfg.devices,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=declared(cfg, "enable_progress_bar", OPTIONS),
        use_distributed_sampler=not isinstance(train.sampler, DistributedSampler),
        callbacks=list(callbacks),
    )
    trainer.fit(module, train)
    return trainer


def _on_features(
    cfg: DictConfig,
    feats: dict,
    pre_cfg: DictConfig,
    sampler_args: Any,
    callbacks: Callbacks,
) -> tuple[Result, torch.device]:
    """The features path: the probe trained on features extracted once (``feats``); with the
    device it trained on."""
    train_x, train_y = feats["train_x"], feats["train_y"]
    train = _loader(cfg, TensorDataset(train_x, train_y), train_y, sampler_args)
    probe = LinearProbe(
        train_x.size(1),
        pre_cfg.data.num_classes,
        SGDSchedule.from_cfg(cfg),
        cfg.feature_norm,
        cfg.classifier_init,
    )
    trainer = _fit(cfg, probe, train, callbacks)
    probe.eval()
    with torch.no_grad():
        scores = probe(feats["val_x"].to(probe.device)).cpu()
    return (scores, feats["val_y"], feats["train"]), trainer.strategy.root_device


def extraction_workers(cfg: DictConfig, pre_cfg: DictConfig) -> int:
    """The feature extraction's loading processes: ``features.num_workers``, else the run's
    ``data.num_workers`` (this command's ``data`` over it)."""
    given = select(cfg, "features.num_workers")
    return declared(pre_cfg, "data.num_workers", DATA_KEYS) if given is None else given


def _on_images(
    cfg: DictConfig,
    backbone: nn.Module,
    pre_cfg: DictConfig,
    sampler_args: Any,
    callbacks: Callbacks,
) -> tuple[Result, torch.device]:
    """The published stage: the classifier trained on augmented images through the frozen
    backbone, then tested once with the backbone (and its statistics) in eval mode; with the
    device it ran on."""
    data, workers = pre_cfg.data, declared(pre_cfg, "data.num_workers", DATA_KEYS)
    if data.format == "dali":
        train_set = build_dataset(data, "train", None)
        train: Any = _dali_loader(cfg, pre_cfg, train_set, sampler_args)
    else:
        transform = train_transform(data.dataset, cfg.train_augmentation, stage_view(cfg, pre_cfg))
        train_set = build_dataset(data, "train", transform)
        train = _loader(
            cfg,
            train_set,
            targets_of(train_set),
            sampler_args,
            num_workers=workers,
            persistent_workers=workers > 0,
            pin_memory=cfg.accelerator != "cpu" and torch.cuda.is_available(),
        )
    stage = FrozenBackboneClassifier(
        backbone, data.num_classes, SGDSchedule.from_cfg(cfg), cfg.backbone_bn, cfg.classifier_init
    )
    trainer = _fit(cfg, stage, train, callbacks)
    device = trainer.strategy.root_device  # Lightning hands the module back on the CPU
    stage.to(device).eval()
    val = build_dataset(data, "val", build_eval_transform(data.dataset, 224))
    val_x, val_y = extract_features(
        stage.backbone,
        val,
        cfg.features.batch_size,
        extraction_workers(cfg, pre_cfg),
        device=device,
    )
    with torch.no_grad():
        scores = stage.fc(val_x.to(device)).float().cpu()
    return (scores, val_y, train_set), device


def stage_device(cfg: DictConfig) -> torch.device:
    """Where this process extracts the features and trains the decoupled stages: as the
    ``accelerator`` says, the GPU of its local rank among ``devices`` (Lightning's)."""
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    return eval_device(cfg.accelerator, cfg.devices, rank)


def _report(
    found: Result, data: DictConfig, prefix: str, out_dir: Any, extra: dict, label: str
) -> dict[str, Any]:
    """:func:`report` on the first process; the others say and write nothing and return no
    keys (every process of a distributed stage has the same numbers)."""
    if not first_process():
        return {}
    scores, val_y, train_set = found
    return report(scores, val_y, train_set, data, prefix, out_dir, extra, label)


def run(cfg: DictConfig, callbacks: Callbacks = ()) -> dict[str, Any]:
    """Checks ``cfg`` (see the module docstring), trains the classifier (``callbacks`` go to
    the Lightning trainer), tests it and returns the metrics."""
    OmegaConf.set_struct(cfg, False)
    check_linear_early(cfg)  # (again: run() is also called directly)
    if select(cfg, "data.sampler") is not None:  # a sampler given here: checked before the run
        fill_sampler_cfg(cfg.copy(), total_epochs=1)
    backbone, pre_cfg, out_dir = load_for_eval(cfg)
    resolve(cfg, pre_cfg.data, pre_cfg)
    sampler = stage_sampler(cfg, pre_cfg.data)
    given = select(cfg, "data.sampler")
    keys = {} if given is None or isinstance(given, str) else OmegaConf.to_container(given)
    pre_cfg.data.sampler = None if sampler is None else {**keys, "name": sampler}
    sampler_args = fill_sampler_cfg(pre_cfg, total_epochs=cfg.max_epochs)

    pl.seed_everything(cfg.seed, workers=True)
    stages = stages_of(cfg.classifier_stage)
    decoupled = [stage for stage in stages if stage != "balanced_linear"]
    # extracted once for every stage on features, before the published stage (its backbone in
    # train mode) moves the BatchNorm statistics
    on_features = "balanced_linear" in stages and not published_stage(cfg)
    device, feats = stage_device(cfg), None
    if decoupled or on_features:
        feats = split_features(
            backbone,
            pre_cfg,
            cfg.features.batch_size,
            device,
            num_workers=extraction_workers(cfg, pre_cfg),
        )
    metrics: dict[str, Any] = {}
    if "balanced_linear" in stages:
        if on_features:
            found, ran_on = _on_features(cfg, feats, pre_cfg, sampler_args, callbacks)
        else:
            found, ran_on = _on_images(cfg, backbone, pre_cfg, sampler_args, callbacks)
        metrics.update(_balanced_report(cfg, found, sampler, pre_cfg, out_dir, ran_on))
    if decoupled:
        options = OmegaConf.to_container(cfg.decoupled)
        first = first_process()
        metrics.update(
            report_stages(decoupled, options, feats, pre_cfg.data, cfg.seed, device, out_dir, first)
        )
    return metrics


def _balanced_report(
    cfg: DictConfig,
    found: Result,
    sampler: str | None,
    pre_cfg: DictConfig,
    out_dir: Any,
    device: torch.device,
) -> dict[str, Any]:
    """The ``balanced_linear`` stage's metrics under ``linear_``, with the stage as run (on
    ``device``)."""
    schedule = SGDSchedule.from_cfg(cfg)
    extra = {
        "linear_epochs": cfg.max_epochs,
        "linear_sampler": sampler or "shuffle",
        # the schedule as run: the total batch, its lr (scaled from the lr per 256 images)
        "linear_batch": cfg.optimizer.batch_size * world_size(cfg),
        "linear_lr": schedule.lr,
        "linear_schedule": STAGE_SCHEDULE_NAMES.get(schedule.scheduler, schedule.scheduler),
        "linear_lr_decay_epochs": list(schedule.lr_decay_steps)
        if schedule.scheduler == "step"
        else [],
        **{f"linear_{key}": cfg[key] for key in CLASSIFIER_STAGE_OPTIONS},  # the stage run
        "linear_environment": environment(
            precision=select(cfg, "precision", None),
            accelerator=device.type,
            world_size=world_size(cfg),  # the stage's processes
        ),
    }
    return _report(found, pre_cfg.data, "linear_", out_dir, extra, "linear probe")


main = mains.linear  # (its console script: the same, imported without this module)

if __name__ == "__main__":
    main()
