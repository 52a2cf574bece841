"""``solo-ext-pretrain``: drop-in for solo-learn's ``main_pretrain.py`` (same configs, overrides).

    solo-ext-pretrain --config-path scripts/pretrain/synthetic-lt --config-name pbsd.yaml

Works on either host and on CPU (``accelerator=cpu devices=1``). Every config error is reported
in one line before any data is built or anything is written.
"""

from __future__ import annotations

import functools
import inspect
import os
import typing
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.connector import _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS
from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.callbacks import LambdaCallback
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import StrategyRegistry
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader

from solo_ext.commands import mains
from solo_ext.commands.options import PRETRAIN_OPTIONS, PRETRAIN_REQUIRED
from solo_ext.common import did_you_mean
from solo_ext.config import (
    BACKBONE_OPTIONS,
    CORE_RUN_OPTIONS,
    HOST_OPTIONS,
    ConfigError,
    Option,
    check_choice,
    check_options,
    declared,
    fill_options,
    fill_stem_option,
    require,
    world_size,
)
from solo_ext.data.dali import (
    dali_crops,
    dali_device,
    dali_loader,
    run_dali_device,
)
from solo_ext.data.datasets import (
    IndexedNCrop,
    build_dataset,
    fill_data_cfg,
    train_class_counts,
)
from solo_ext.data.options import check_dali_keys
from solo_ext.data.samplers import build_sampler, fill_sampler_cfg
from solo_ext.data.transforms import (
    build_eval_transform,
    build_pretrain_transform,
    check_augmentations,
)
from solo_ext.eval.metrics_file import update_validation
from solo_ext.facts import facts
from solo_ext.host import BACKBONES, METHODS, build_backbone, omegaconf_select
from solo_ext.methods.registry import method_transform, register
from solo_ext.runs.checkpoint import check_fits, checkpoint_callbacks, new_run_id, read_checkpoint
from solo_ext.runs.environment import of_trainer
from solo_ext.runs.resume import (
    AtomicCheckpointIO,
    EpochSeed,
    find_auto_resume,
    remove_stale_temporaries,
)

# top-level keys of solo-learn's pretraining configs (Lightning's Trainer arguments also pass)
KNOWN_KEYS = {
    "name", "method", "backbone", "method_kwargs", "momentum", "data", "augmentations",
    "optimizer", "scheduler", "checkpoint", "auto_resume", "auto_umap", "knn_eval", "wandb",
    "performance", "dali", "seed", "resume_from_checkpoint", "debug_augmentations", "hydra",
    "pretrained_feature_extractor", "num_crops", "defaults",
}  # fmt: skip


# the numbers of solo-learn's keys that solo-ext passes on to torch, Lightning and the host,
# declared once: each given value is checked before anything is built (null: the default)
RUN_OPTIONS: dict[str, Option] = {
    **CORE_RUN_OPTIONS,
    **PRETRAIN_OPTIONS,
    # Lightning's Trainer arguments of solo-learn's configs and the README, with the choices
    # Lightning itself registers
    "precision": Option(
        "32-true",
        "str",
        choices=typing.get_args(_PRECISION_INPUT_STR) + typing.get_args(_PRECISION_INPUT_STR_ALIAS),
    ),
    "accelerator": Option(
        "auto", "str", choices=("auto", "gpu", *AcceleratorRegistry.available_accelerators())
    ),
    "strategy": Option("auto", "str", choices=("auto", *StrategyRegistry.available_strategies())),
}


def warn_unknown_keys(cfg: DictConfig) -> None:
    """Unknown top-level keys warn (unknown ``method_kwargs`` / ``data.sampler`` keys fail)."""
    trainer_args = set(inspect.signature(pl.Trainer.__init__).parameters)
    for key in cfg:
        if key not in KNOWN_KEYS and key not in trainer_args:
            close = did_you_mean(str(key), sorted(KNOWN_KEYS | trainer_args))
            warnings.warn(f"config key {key!r} is not used by solo-ext{close}", stacklevel=2)


def _try_constructor(section: str, name: str, given: dict, build: Any) -> None:
    """Calls ``build()``; a keyword the constructor does not take, or a value it refuses, is a
    one-line error naming ``<section>.kwargs`` and ``<section>.name``."""
    try:
        build()
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"{section}.kwargs={given!r}: not taken by {section}.name={name!r} ({err})"
        ) from None


def check_backbone_kwargs(cfg: DictConfig) -> None:
    """``backbone.kwargs`` reach the backbone's constructor (torchvision's, timm's): the backbone
    is built once on the meta device (no memory, no weights), so a keyword it does not take is
    one line now, not a traceback from inside the method."""
    kwargs = omegaconf_select(cfg, "backbone.kwargs", None)
    kwargs = {} if kwargs is None else OmegaConf.to_container(kwargs)
    # (solo-ext's own keys are declared and checked before; the message shows the others)
    given = {k: v for k, v in kwargs.items() if f"backbone.kwargs.{k}" not in BACKBONE_OPTIONS}
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _try_constructor(
            "backbone",
            cfg.backbone.name,
            given,
            lambda: build_backbone(cfg.backbone.name, cfg.method, cfg.data.dataset, kwargs),
        )


def check_optimizer_kwargs(cfg: DictConfig, optimizers: dict[str, Any]) -> None:
    """``optimizer.kwargs`` go to the optimizer's constructor (torch's, LARS) as the host builds
    it: it is tried once on a single parameter, so a keyword it does not take, or a value it
    refuses, is one line now instead of a traceback when training starts."""
    kwargs = OmegaConf.to_container(cfg.optimizer.kwargs)
    opt = cfg.optimizer
    _try_constructor(
        "optimizer",
        opt.name,
        kwargs,
        lambda: optimizers[opt.name](
            [torch.nn.Parameter(torch.zeros(1))], lr=opt.lr, weight_decay=opt.weight_decay, **kwargs
        ),
    )


def parse_cfg(cfg: DictConfig) -> DictConfig:
    """Fills solo-learn's pretraining defaults and checks everything a run needs."""
    OmegaConf.set_struct(cfg, False)
    register()
    warn_unknown_keys(cfg)
    require(cfg, *PRETRAIN_REQUIRED)
    check_choice("method", cfg.method, [m for m in METHODS if m not in ("base", "linear")])
    if cfg.backbone.name == "resnet32":  # its name before it stopped starting with "resnet"
        raise ConfigError("backbone.name='resnet32': now named 'cifar_resnet32'")
    check_choice("backbone.name", cfg.backbone.name, BACKBONES)
    method_cls = METHODS[cfg.method]
    check_choice("optimizer.name", cfg.optimizer.name, method_cls._OPTIMIZERS)
    check_choice("scheduler.name", omegaconf_select(cfg, "scheduler.name"), method_cls._SCHEDULERS)
    check_options(cfg, RUN_OPTIONS)
    check_options(cfg, BACKBONE_OPTIONS)
    check_dali_keys(cfg)
    fill_data_cfg(cfg)
    fill_stem_option(cfg)
    check_backbone_kwargs(cfg)
    fill_sampler_cfg(cfg, total_epochs=cfg.max_epochs)
    cfg.name = omegaconf_select(cfg, "name", cfg.method)
    cfg.resume_from_checkpoint = omegaconf_select(cfg, "resume_from_checkpoint", None)
    if cfg.resume_from_checkpoint is not None and not Path(cfg.resume_from_checkpoint).is_file():
        raise ConfigError(f"resume_from_checkpoint={cfg.resume_from_checkpoint!r}: no such file")
    # the declared defaults of the run's keys (seed, checkpoint, auto_resume, wandb, ...)
    # (the host's own keys are the host's to fill: HOST_OPTIONS)
    run_keys = {k: o for k, o in CORE_RUN_OPTIONS.items() if k not in HOST_OPTIONS}
    fill_options(cfg, {k: o for k, o in run_keys.items() if not k.startswith("optim")})
    fill_options(
        cfg, {k: RUN_OPTIONS[k] for k in ("optimizer.classifier_lr", "optimizer.weight_decay")}
    )
    cfg.wandb.entity = omegaconf_select(cfg, "wandb.entity", None)
    for key in ("strategy", "accelerator"):
        cfg[key] = omegaconf_select(cfg, key, RUN_OPTIONS[key].default)

    augs = cfg.augmentations
    for i in range(len(augs)):
        require(cfg, f"augmentations.{i}.crop_size", f"augmentations.{i}.num_crops")
    check_augmentations(cfg)
    if cfg.backbone.name.startswith("vit"):  # a crop must hold at least one patch
        patch = declared(cfg, "backbone.kwargs.patch_size", BACKBONE_OPTIONS)
        for i, aug in enumerate(augs):
            if aug.crop_size < patch:
                raise ConfigError(
                    f"augmentations.{i}.crop_size={aug.crop_size}: smaller than the ViT's "
                    f"patch size {patch} (backbone.kwargs.patch_size)"
                )
    big = augs[0].crop_size
    cfg.data.num_large_crops = sum(a.num_crops for a in augs if a.crop_size == big)
    cfg.data.num_small_crops = sum(a.num_crops for a in augs if a.crop_size != big)

    # solo-learn's linear scaling rule: lr given for a total batch of 256
    scale = cfg.optimizer.batch_size * world_size(cfg) / 256
    cfg.optimizer.lr = cfg.optimizer.lr * scale
    cfg.optimizer.classifier_lr = cfg.optimizer.classifier_lr * scale
    cfg.optimizer.kwargs = omegaconf_select(cfg, "optimizer.kwargs", {})
    if cfg.optimizer.name in ("sgd", "lars"):  # (the others take no momentum)
        fill_options(cfg, {"optimizer.kwargs.momentum": RUN_OPTIONS["optimizer.kwargs.momentum"]})
    check_optimizer_kwargs(cfg, method_cls._OPTIMIZERS)

    # what the method needs from this loader (PBSD under DALI: its patches on the device)
    if hasattr(method_cls, "adapt_to_loader"):  # (solo-learn's own methods need nothing)
        method_cls.adapt_to_loader(cfg, cfg.data.format)
    # the method's own defaults and checks, still before any work
    try:
        method_cls.add_and_assert_specific_cfg(cfg)
    except (ValueError, AssertionError) as err:
        raise ConfigError(str(err) or f"method={cfg.method!r}: invalid config") from err
    return cfg


def build_loaders(cfg: DictConfig) -> tuple[DataLoader, DataLoader | None]:
    data = cfg.data
    dali = data.format == "dali"
    if dali:
        transform = dali_crops(data.dataset, cfg.augmentations)
    else:
        transform = method_transform(cfg) or build_pretrain_transform(
            data.dataset, cfg.augmentations
        )
    if cfg.debug_augmentations:
        print("Transforms:\n", transform)
    train_set = build_dataset(data, "train", None if dali else transform)
    train = IndexedNCrop(train_set, no_labels=data.no_labels)
    workers = data.num_workers
    # always one of solo-ext's samplers (``instance``, a seeded permutation, by default): the
    # order is a function of (seed, epoch) and the rank, so resumed and distributed runs draw
    # exactly what an uninterrupted single run would
    sampler_cfg = omegaconf_select(cfg, "data.sampler")
    sampler_args = {} if sampler_cfg is None else OmegaConf.to_container(sampler_cfg)
    sampler_args.setdefault("seed", cfg.seed)
    sampler = build_sampler(sampler_args.pop("name", "instance"), train_set.targets, **sampler_args)
    if dali:  # the same sampler drives DALI's reader; solo-ext's DALI graph of the crops
        train_loader: Any = dali_loader(
            train_set,
            sampler,
            transform,
            kind="pretrain",
            batch_size=cfg.optimizer.batch_size,
            device=dali_device(run_dali_device(cfg)),
            num_workers=workers,
            seed=cfg.seed,
        )
    else:
        train_loader = DataLoader(
            train,
            batch_size=cfg.optimizer.batch_size,
            sampler=sampler,
            # the workers' base seed comes from here, not from the global RNG (reseeded per epoch
            # by EpochSeed), so creating an iterator never shifts the augmentations' random stream
            generator=torch.Generator().manual_seed(cfg.seed),
            num_workers=workers,
            pin_memory=torch.cuda.is_available(),
            drop_last=True,
            persistent_workers=workers > 0,
        )
    if facts(data.dataset).source != "generated" and data.val_path is None:
        return train_loader, None
    val = build_dataset(
        data, "val", build_eval_transform(data.dataset, cfg.augmentations[0].crop_size)
    )
    val_loader = DataLoader(
        val,
        batch_size=cfg.optimizer.batch_size,
        shuffle=False,
        num_workers=workers,
        persistent_workers=workers > 0,
        generator=torch.Generator().manual_seed(cfg.seed),  # leaves the global RNG alone
    )
    return train_loader, val_loader


# the run id the first process drew, for the processes Lightning's DDP launcher starts from it
RUN_ID_ENV = "SOLO_EXT_RUN_ID"


def shared_run_id(logdir: Path) -> str:
    """A new run id on the first process; the same id on the processes that Lightning's DDP
    launcher starts from it (they inherit its environment), so every process names one run."""
    if os.environ.get("LOCAL_RANK", "0") != "0" and os.environ.get(RUN_ID_ENV):
        return os.environ[RUN_ID_ENV]
    run_id = new_run_id(logdir)
    if os.environ.get("LOCAL_RANK", "0") == "0":
        os.environ[RUN_ID_ENV] = run_id
    return run_id


def run(cfg: DictConfig) -> dict[str, Any]:
    """Pretrains; returns the run directory, the final metrics and the trained model."""
    cfg = parse_cfg(cfg)
    pl.seed_everything(cfg.seed, workers=True)
    train_loader, val_loader = build_loaders(cfg)
    # the online kNN reports the Many / Medium / Few split from these counts
    train_set = getattr(train_loader.dataset, "dataset", train_loader.dataset)  # IndexedNCrop
    cfg.data.train_class_counts = train_class_counts(train_set)
    model = METHODS[cfg.method](cfg)
    if not cfg.performance.disable_channel_last:
        model = model.to(memory_format=torch.channels_last)

    logdir = Path(cfg.checkpoint.dir) / cfg.method
    ckpt_path = cfg.resume_from_checkpoint
    found = find_auto_resume(cfg) if ckpt_path is None and cfg.auto_resume.enabled else None
    if found is not None:
        # like solo-learn: the run continues under its id, in its directory
        print(f"Resuming from {found} (auto_resume)")
        ckpt_path = str(found)
        run_id, run_dir = found.parent.name, found.parent
    else:
        run_id = shared_run_id(logdir)
        run_dir = logdir / run_id
    if ckpt_path is not None:  # before anything is written: a bad file stops here
        key = "resume_from_checkpoint" if found is None else "auto_resume"
        ckpt = read_checkpoint(key, ckpt_path, training=True)
        check_fits(key, ckpt_path, ckpt, model, f"method={cfg.method!r}")
        del ckpt
        if found is not None and os.environ.get("LOCAL_RANK", "0") == "0":
            remove_stale_temporaries(run_dir)  # (the killed writes of the run it continues)
    callbacks: list[Any] = [EpochSeed(cfg.seed, train_loader.sampler, train_loader.generator)]
    if cfg.checkpoint.enabled:
        callbacks += checkpoint_callbacks(cfg, run_dir, run_id)
        # the last validation values in metrics.json, whichever logger (the leaderboard's source)
        keep = functools.partial(update_validation, out_dir=run_dir)
        callbacks.append(LambdaCallback(on_validation_end=lambda trainer, _: keep(trainer)))
    if cfg.wandb.enabled:
        from lightning.pytorch.loggers import WandbLogger

        logger: Any = WandbLogger(
            name=cfg.name,
            project=cfg.wandb.project,
            entity=cfg.wandb.entity,
            offline=cfg.wandb.offline,
            id=run_id,
            save_dir=str(run_dir),
        )
        logger.log_hyperparams(OmegaConf.to_container(cfg))
    else:
        # a run resumed into its directory logs into logs-1, logs-2, ... beside the first logs
        version, n = "logs", 0
        while (run_dir / version / "metrics.csv").exists():
            n += 1
            version = f"logs-{n}"
        logger = CSVLogger(save_dir=str(run_dir), name="", version=version)

    trainer_kwargs = {
        k: v
        for k, v in OmegaConf.to_container(cfg).items()
        if k in inspect.signature(pl.Trainer.__init__).parameters
    }
    trainer_kwargs.update(
        logger=logger,
        callbacks=callbacks,
        enable_checkpointing=cfg.checkpoint.enabled,
        plugins=[AtomicCheckpointIO()],
        # solo-ext's samplers shard by rank themselves; Lightning must not wrap them
        use_distributed_sampler=False,
    )
    trainer = pl.Trainer(**trainer_kwargs)
    try:
        with warnings.catch_warnings():  # (the filter stays inside this run)
            # the run directory already holds args.json and the logs when the checkpointer looks
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not")
            trainer.fit(model, train_loader, val_loader, ckpt_path=ckpt_path)

        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        result: dict[str, Any] = {"run_dir": str(run_dir), "metrics": metrics, "model": model}
        if cfg.knn_eval.enabled and trainer.is_global_zero:
            from solo_ext.commands.knn import evaluate_model

            out_dir = run_dir if cfg.checkpoint.enabled else None
            # on the trainer's device (Lightning hands the module back on the CPU after fit)
            device = trainer.strategy.root_device
            result["knn"] = evaluate_model(
                model.backbone, cfg, k=cfg.knn_eval.k, out_dir=out_dir, device=device
            )
        if getattr(model, "JOINT_HEAD", False) and trainer.is_global_zero:
            # a one-stage method's reported classifier: its head, on the val split
            from solo_ext.eval.head import evaluate_head

            out_dir = run_dir if cfg.checkpoint.enabled else None
            env = {"head_environment": of_trainer(trainer, cfg.data.format)}
            device = trainer.strategy.root_device  # (as the kNN: the trainer's device)
            result["head"] = evaluate_head(model, cfg, out_dir=out_dir, extra=env, device=device)
    finally:
        if cfg.wandb.enabled:
            # one wandb run per run: the next run in this process (a Hydra multirun) would
            # otherwise log into this one (Lightning's WandbLogger reuses a live wandb run)
            logger.experiment.finish()
    return result


main = mains.pretrain  # (its console script: the same, imported without this module)

if __name__ == "__main__":
    main()
