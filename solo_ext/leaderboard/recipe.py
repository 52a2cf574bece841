"""A measured run against the shipped recipe it follows: the pretraining keys it gives another
value than the recipe does.

The recipe is the one the run's record names (``args.json``'s ``environment.config.recipe``,
written by both entry points when the config is one of solo-ext's ``scripts/pretrain/``), else the
one shipped recipe of the run's method and dataset (GPaCo's and PaCo's apart). It is composed by
Hydra as the entry points compose it. Compared: every key the recipe sets, with the lr and the
classifier lr per 256 images (both entry points scale them by the total batch), the total batch in
place of the per-process batch, and the sampler whether the recipe sets one or not. Left out:
what is bookkeeping or a column of the table already (paths, workers, checkpoints, logging,
seed, devices, the dataset, epochs, backbone), the protocol options (flagged on their own) and
the augmentations (their protocol keys are flagged on their own).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from solo_ext.leaderboard.published import PROTOCOL_OPTIONS, SHUFFLING, as_number, same, show_value
from solo_ext.leaderboard.runs import Run, total_batch

# top-level sections and keys that are not the protocol, or are columns of the table
LEFT_OUT = (
    "defaults", "hydra", "name", "seed", "checkpoint", "auto_resume", "wandb", "dali",
    "performance", "resume_from_checkpoint", "debug_augmentations", "devices", "num_nodes",
    "accelerator", "strategy", "knn_eval", "max_epochs", "backbone.name", "augmentations",
    "data.dataset", "data.train_path", "data.val_path", "data.format", "data.num_workers",
    "data.train_split_file", "data.val_split_file", "data.no_labels", "data.sampler",
    "optimizer.batch_size", "optimizer.lr", "optimizer.classifier_lr", "environment",
)  # fmt: skip
# per 256 images: the recipes give them so, both entry points scale them by the total batch
PER_256 = ("optimizer.lr", "optimizer.classifier_lr")
# no sampler given (each image once an epoch) or one that draws so
PLAIN_SAMPLERS = (None, *SHUFFLING)


def _scripts() -> Path | None:
    from hydra_plugins.solo_ext_configs import scripts_dir

    return scripts_dir()


def recorded_recipe(args: dict[str, Any]) -> str | None:
    """The shipped recipe a run's record names (``pretrain/imagenet-lt/dscl``), if any."""
    config = (args.get("environment") or {}).get("config")
    recipe = config.get("recipe") if isinstance(config, dict) else None
    return recipe if isinstance(recipe, str) else None


@functools.cache
def _index() -> dict[tuple[str, str, bool], list[str]]:
    """(method, dataset, gpaco) -> the shipped pretraining recipes (``pretrain/<dir>/<name>``)
    that set them; a recipe that only points at another (the short names) is left out."""
    import yaml

    scripts = _scripts()
    index: dict[tuple[str, str, bool], list[str]] = {}
    if scripts is None:
        return index
    for path in sorted((scripts / "pretrain").rglob("*.yaml")):
        try:
            text = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if not isinstance(text, dict):  # (an augmentations file: a list of crops)
            continue
        method, data = text.get("method"), text.get("data") or {}
        if isinstance(method, str) and isinstance(data.get("dataset"), str):
            gpaco = bool((text.get("method_kwargs") or {}).get("gpaco"))
            name = str(path.relative_to(scripts).with_suffix(""))
            index.setdefault((method, data["dataset"], gpaco), []).append(name)
    return index


def recipe_for(run: Run) -> str | None:
    """The recipe a run is compared with: the recorded one, else the one shipped recipe of its
    method and dataset (None when there is none, or several)."""
    recorded = recorded_recipe(run.args)
    if recorded is not None:
        return recorded
    gpaco = bool(run.method_kwargs.get("gpaco"))
    found = _index().get((run.method, run.dataset, gpaco), [])
    return found[0] if len(found) == 1 else None


@functools.cache
def composed(recipe: str) -> dict[str, Any] | None:
    """The recipe as Hydra composes it (its defaults followed), as a dict; None when it
    cannot be read."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    scripts = _scripts()
    kind, _, name = recipe.partition("/")
    if scripts is None or not (scripts / kind / f"{name}.yaml").is_file():
        return None
    if GlobalHydra.instance().is_initialized():  # (inside a Hydra application: its own)
        return None
    try:
        with initialize_config_dir(str(scripts / kind), version_base=None):
            cfg = compose(config_name=name)
    except Exception:  # a recipe Hydra cannot compose here: nothing to compare with
        return None
    out = OmegaConf.to_container(cfg, resolve=False)
    return out if isinstance(out, dict) else None


def _leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if dotted in LEFT_OUT:
            continue
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{dotted}."))
        else:
            out[dotted] = value
    return out


def _get(tree: Any, dotted: str) -> tuple[bool, Any]:
    for key in dotted.split("."):
        if not isinstance(tree, dict) or key not in tree:
            return False, None
        tree = tree[key]
    return True, tree


def _sampler_name(cfg: dict[str, Any]) -> Any:
    sampler = (cfg.get("data") or {}).get("sampler")
    return sampler.get("name") if isinstance(sampler, dict) else sampler


def recipe_differences(run: Run) -> list[str]:
    """``recipe <key>=<value> (<recipe>: <value>)`` for each pretraining key the run gives
    another value than its shipped recipe (see the module's docstring)."""
    recipe = recipe_for(run)
    cfg = composed(recipe) if recipe is not None else None
    if cfg is None:
        return []
    args, out = run.args, []
    protocol = {f"method_kwargs.{k}" for k in PROTOCOL_OPTIONS.get(run.method, ())}

    def differs(key: str, value: Any, want: Any) -> None:
        out.append(f"{key}={show_value(value)} ({recipe}: {show_value(want)})")

    # the per-GPU batch (the in-batch contrast set of SCL / DSCL / PBSD, part of their
    # protocol), else the total batch (the same per-GPU batch on other GPUs)
    batch, want_batch = total_batch(args), total_batch(cfg)
    per_gpu = _get(args, "optimizer.batch_size")[1]
    want_per_gpu = _get(cfg, "optimizer.batch_size")[1]
    if isinstance(per_gpu, int) and isinstance(want_per_gpu, int) and per_gpu != want_per_gpu:
        differs("per-GPU batch", per_gpu, want_per_gpu)
    elif None not in (batch, want_batch) and batch != want_batch:
        differs("total batch", batch, want_batch)
    for key in PER_256:
        has, value = _get(args, key)
        wants, want = _get(cfg, key)
        if has and wants and batch and as_number(value) is not None and as_number(want) is not None:
            per_256 = as_number(value) * 256 / batch
            if not same(per_256, want):
                differs(f"{key} per 256 images", float(f"{per_256:.6g}"), want)
    sampler, want_sampler = _sampler_name(args), _sampler_name(cfg)
    if not (sampler in PLAIN_SAMPLERS and want_sampler in PLAIN_SAMPLERS) and not same(
        sampler, want_sampler
    ):
        differs("data.sampler.name", sampler, want_sampler or "instance")
    for key, want in _leaves(cfg).items():
        if key in protocol:
            continue
        has, value = _get(args, key)
        if has and not same(value, want):
            differs(key, value, want)
    return out
