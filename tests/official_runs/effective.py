"""A resolved recipe's effective values, in the vocabulary of ``runs.yaml``.

The values are those the run trains with, not those the file writes: the lr after the batch
scaling both entry points apply (``optimizer.lr`` x total batch / 256), the lr of given epochs as
the method's own ``configure_optimizers`` steps it (per iteration or per epoch, as the run would),
the crops' augmentation values with their declared defaults filled in.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from solo_ext.config import select, world_size
from solo_ext.data.transforms import AUGMENTATION_OPTIONS, augmentation_value

OFFICIAL_RUNS = Path(__file__).with_name("runs.yaml")
# the header block of a recipe that names its differences (one "#   key[, key]: why" a line)
DIFFERS = "Differs from the official run"

# run-level keys read from the resolved config (the rest are method_kwargs of the same name)
_PRECISION = {"32": "32", "32-true": "32", "16": "16-mixed", "16-mixed": "16-mixed"}
_PRECISION.update({"bf16": "bf16-mixed", "bf16-mixed": "bf16-mixed"})


def official_runs() -> dict[str, dict[str, Any]]:
    """The table: run id -> {title, repository, commit, command, recipes, values}."""
    return yaml.safe_load(OFFICIAL_RUNS.read_text())


def stated_differences(recipe: Path) -> dict[str, str]:
    """The keys a recipe's header names as differing from its official run, with the reason."""
    stated: dict[str, str] = {}
    inside = False
    for line in recipe.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line[1:].strip()
        if text.startswith(DIFFERS):
            inside = True
            continue
        if inside:
            if line.startswith("#     "):  # the reason's next line
                continue
            match = re.match(r"^([\w.*\[\], -]+?):\s+(.*)$", text)
            if match is None or not line.startswith("#   "):
                inside = False
                continue
            for key in match.group(1).split(","):
                stated[key.strip()] = match.group(2)
    return stated


def _schedule(cfg: DictConfig) -> tuple[str, float]:
    name, warmup = str(cfg.scheduler.name), float(cfg.scheduler.warmup_epochs)
    if name == "warmup_cosine":
        return ("warmup_cosine" if warmup > 0 else "cosine"), warmup
    if name == "warmup_step":
        return ("warmup_step" if warmup > 0 else "step"), warmup
    return {"none": "constant"}.get(name, name), 0.0


def build_model(cfg: DictConfig) -> Any:
    """The method of ``cfg``, built as the run builds it (its optimizer and projector are read)."""
    from solo_ext.host import METHODS

    try:  # shapes only, no arithmetic: the recipes' ResNet-50s in no time
        with torch.device("meta"):
            return METHODS[cfg.method](cfg.copy())
    except Exception:  # a method that reads a value when built (a real error raises again)
        return METHODS[cfg.method](cfg.copy())


def lr_by_epoch(
    model: Any, epochs: Iterable[int], steps_per_epoch: int
) -> tuple[dict[str, dict[int, float]], dict[str, float]]:
    """The lr of every parameter group (by name) at the first iteration of each of ``epochs``,
    from the method's own ``configure_optimizers``, and each group's peak lr; a per-iteration
    schedule is stepped the official run's ``steps_per_epoch`` for each earlier epoch."""
    cfg = model.cfg
    wanted = sorted(set(int(e) for e in epochs))
    model._trainer = SimpleNamespace(  # what configure_optimizers reads of its trainer
        estimated_stepping_batches=cfg.max_epochs * steps_per_epoch, max_epochs=cfg.max_epochs
    )
    answer = model.configure_optimizers()
    if isinstance(answer, torch.optim.Optimizer):
        optimizer, schedule, interval = answer, None, "epoch"
    else:
        (optimizer,), (entry,) = answer
        if isinstance(entry, Mapping):
            schedule, interval = entry["scheduler"], entry.get("interval", "epoch")
        else:  # a bare scheduler: Lightning steps it per epoch
            schedule, interval = entry, "epoch"
    names = [str(g.get("name", i)) for i, g in enumerate(optimizer.param_groups)]
    peak = {n: float(g.get("initial_lr", g["lr"])) for n, g in zip(names, optimizer.param_groups)}
    out: dict[str, dict[int, float]] = {name: {} for name in names}
    per_epoch = steps_per_epoch if interval == "step" else 1
    for epoch in wanted:
        if schedule is not None and epoch > 0:
            with warnings.catch_warnings():  # (torch deprecates step(epoch): the closed form)
                warnings.simplefilter("ignore")
                schedule.step(epoch * per_epoch)
        for name, group in zip(names, optimizer.param_groups):
            out[name][epoch] = float(group["lr"])
    return out, peak


def _views(cfg: DictConfig) -> dict[str, Any]:
    """One view per crop (an entry of ``num_crops: 2`` is two views), in the crops' order."""
    out: dict[str, Any] = {}
    i = 0
    for aug in cfg.augmentations:
        for _ in range(int(aug.num_crops)):
            out[f"views.{i}.crop_size"] = aug.crop_size
            for key in AUGMENTATION_OPTIONS:
                if key in ("crop_size", "num_crops", "gaussian_prob"):
                    continue
                value = augmentation_value(aug, key)
                if OmegaConf.is_config(value):
                    value = OmegaConf.to_container(value)
                out[f"views.{i}.{key}"] = value
            i += 1
    return out


def effective_values(
    cfg: DictConfig, keys: Iterable[str], steps_per_epoch: int = 100
) -> dict[str, Any]:
    """The effective value of each of ``keys`` (``runs.yaml``'s names) of the pretraining config
    ``cfg`` as an entry point's ``parse_cfg`` and its method's ``add_and_assert_specific_cfg``
    resolved it; a key the recipe does not have is absent."""
    keys = list(keys)
    schedule, warmup = _schedule(cfg)
    run: dict[str, Any] = {
        "backbone": cfg.backbone.name,
        "zero_init_residual": bool(select(cfg, "backbone.kwargs.zero_init_residual", False)),
        "precision": _PRECISION.get(str(cfg.precision), str(cfg.precision)),
        "gpus": world_size(cfg),
        "total_batch": cfg.optimizer.batch_size * world_size(cfg),
        "optimizer": cfg.optimizer.name,
        "lr": cfg.optimizer.lr,
        "weight_decay": cfg.optimizer.weight_decay,
        "sgd_momentum": select(cfg, "optimizer.kwargs.momentum"),
        "nesterov": bool(select(cfg, "optimizer.kwargs.nesterov", False)),
        "epochs": cfg.max_epochs,
        "warmup_epochs": warmup,
        "schedule": schedule,
        "schedule_step": (
            "iteration"
            if cfg.scheduler.interval == "step" and schedule in ("cosine", "warmup_cosine")
            else "epoch"
        ),
        "lr_decay_epochs": (
            list(cfg.scheduler.lr_decay_steps) if schedule in ("step", "warmup_step") else []
        ),
        "shuffle_bn": False,  # neither host has MoCo's shuffle BN
        "sync_bn": bool(select(cfg, "sync_batchnorm")),
        "ema_base": select(cfg, "momentum.base_tau"),
        "ema_final": select(cfg, "momentum.final_tau"),
        **_views(cfg),
    }
    for key, value in (select(cfg, "optimizer.kwargs") or {}).items():
        run[f"optimizer_kwargs.{key}"] = value
    model = build_model(cfg)
    epochs = [int(k.split(".", 1)[1]) for k in keys if k.startswith("lr_at.")]
    lrs, peak = lr_by_epoch(model, [*epochs, 0], steps_per_epoch)
    run.update({f"lr_at.{e}": lrs["backbone"][e] for e in epochs})
    # a jointly trained head's lr (PaCo, BCL), else the online classifier's
    run["classifier_lr"] = peak.get("head", peak.get("classifier"))
    run["proj_bn"] = any(
        isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
        for m in (model.projector.modules() if hasattr(model, "projector") else ())
    )
    run["symmetric"] = type(model).anchors_both_views(cfg)
    out = {}
    for key in keys:
        if key in run:
            out[key] = run[key]
        elif key in (cfg.get("method_kwargs") or {}):
            value = cfg.method_kwargs[key]
            out[key] = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return out


def differences(
    official: Mapping[str, Any], effective: Mapping[str, Any], rel: float = 1e-6
) -> dict[str, tuple[Any, Any]]:
    """The keys whose effective value is not the official one: key -> (official, effective)."""
    out = {}
    for key, entry in official.items():
        want = entry["value"] if isinstance(entry, Mapping) else entry
        got = effective.get(key, "<absent>")
        if not _same(want, got, rel):
            out[key] = (want, got)
    return out


def _same(a: Any, b: Any, rel: float) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, rel) for x, y in zip(a, b))
    if a is None or b is None:
        return a is b
    return str(a) == str(b)


class _Features(torch.nn.Module):
    """A stand-in backbone: the width of the evaluated run's features, nothing else."""

    def __init__(self, width: int):
        super().__init__()
        self.num_features = width
        self.fc = torch.nn.Identity()


def linear_effective_values(
    cfg: DictConfig,
    keys: Iterable[str],
    entry: str,
    width: int = 2048,
    run_view: DictConfig | None = None,
) -> dict[str, Any]:
    """The effective values of a linear (classifier stage) recipe ``cfg`` resolved by ``entry``
    (``solo-ext-linear``: :func:`solo_ext.commands.linear.resolve`; ``main_linear.py``:
    solo-learn's ``parse_cfg`` through the plugin's patches), the lr of each epoch from the entry
    point's own optimizer and schedule (``solo_ext.commands.linear_stage.SGDSchedule``; solo-learn's
    ``LinearModel``). ``run_view``: the evaluated run's query view, which ``train_augmentation:
    pretrain`` trains on (each entry point reads it from the run's ``args.json``)."""
    from solo_ext.eval.classifier_stage import train_augmentation_entry

    keys = list(keys)
    epochs = sorted({int(k.split(".", 1)[1]) for k in keys if k.startswith("lr_at.")} | {0})
    if entry == "solo-ext-linear":
        from solo_ext.commands.linear import stage_sampler
        from solo_ext.commands.linear_stage import SGDSchedule

        schedule = SGDSchedule.from_cfg(cfg)
        lr = schedule.lr
        (optimizer,), scheds = schedule.configure([torch.nn.Parameter(torch.zeros(1))])
        sampler = stage_sampler(cfg, cfg.data)
        momentum, weight_decay = schedule.momentum, schedule.weight_decay
    else:
        from solo.methods.linear import LinearModel

        model = LinearModel(_Features(width), cfg=cfg.copy())
        answer = model.configure_optimizers()
        optimizer, scheds = (
            (answer, []) if isinstance(answer, torch.optim.Optimizer) else (answer[0][0], answer[1])
        )
        lr = cfg.optimizer.lr
        sampler = select(cfg, "data.sampler.name")
        momentum = select(cfg, "optimizer.kwargs.momentum")
        weight_decay = cfg.optimizer.weight_decay
    at: dict[int, float] = {}
    for epoch in range(max(epochs) + 1):
        if epoch in epochs:
            at[epoch] = float(optimizer.param_groups[0]["lr"])
        optimizer.step()
        for sched in scheds:
            (sched["scheduler"] if isinstance(sched, Mapping) else sched).step()
    name = str(cfg.scheduler.name)
    no_warmup = name in ("step", "none") or entry == "solo-ext-linear"
    warmup = 0.0 if no_warmup else float(cfg.scheduler.warmup_epochs)
    view = train_augmentation_entry(cfg.data.dataset, select(cfg, "train_augmentation"), run_view)
    run: dict[str, Any] = {
        "backbone": select(cfg, "backbone.name"),
        "precision": _PRECISION.get(str(select(cfg, "precision")), str(select(cfg, "precision"))),
        "gpus": world_size(cfg),
        "total_batch": cfg.optimizer.batch_size * world_size(cfg),
        "optimizer": cfg.optimizer.name,
        "lr": lr,
        "classifier_lr": lr,  # (the only trained layer)
        "weight_decay": weight_decay,
        "sgd_momentum": momentum,
        "epochs": cfg.max_epochs,
        "warmup_epochs": warmup,  # (solo-ext-linear's cosine has none)
        "schedule": {"warmup_cosine": "cosine"}.get(name, name),
        "schedule_step": "epoch",  # (both entry points step the stage's schedule per epoch)
        "lr_decay_epochs": list(cfg.scheduler.lr_decay_steps) if name == "step" else [],
        "sync_bn": bool(select(cfg, "sync_batchnorm")),
        "sampler": sampler,
        "classifier_init": select(cfg, "classifier_init"),
        "backbone_bn": select(cfg, "backbone_bn"),
        **{f"lr_at.{e}": lr_e for e, lr_e in at.items()},
    }
    run.update(_views(OmegaConf.create({"augmentations": [view]})))
    return {key: run[key] for key in keys if key in run}
