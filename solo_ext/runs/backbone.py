"""The pretraining run's backbone, carried into an evaluation config.

A checkpoint's ``args.json`` (beside it, in solo-learn's and solo-ext's run layout) records how
its backbone was built: ``backbone.name`` and every ``backbone.kwargs`` (the small-image stem,
a ViT's patch size, ...). An evaluation config (solo-learn's linear configs name only the
backbone) gets the keys it does not give from there, so the backbone it builds is the one the
weights were trained in; a value it gives that differs from the run's stops in one line naming
both, before any backbone is built or weight loaded.

Part of the core: it reads a JSON file and edits a config, and imports neither a host nor
Lightning (``main_linear.py``'s ``parse_cfg`` calls it through ``solo_ext.solo_learn.args``,
``solo-ext-linear`` through ``solo_ext.runs.load``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from solo_ext.config import ConfigError, select

ARGS_JSON = "args.json"


def _plain(value: Any) -> Any:
    """A config value as plain Python (lists and dicts instead of OmegaConf's containers)."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _same(given: Any, trained: Any) -> bool:
    """Equal as settings: ``0`` and ``0.0`` are, ``True`` and ``1`` are not."""
    if isinstance(given, bool) or isinstance(trained, bool):
        return type(given) is type(trained) and given == trained
    if isinstance(given, (list, tuple)) and isinstance(trained, (list, tuple)):
        return len(given) == len(trained) and all(map(_same, given, trained))
    if isinstance(given, Mapping) and isinstance(trained, Mapping):
        return given.keys() == trained.keys() and all(_same(given[k], trained[k]) for k in given)
    return given == trained


def read_run_config(checkpoint: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``args.json`` beside ``checkpoint`` (a pretraining run's config), or None when
    there is none.

    Raises:
        ConfigError: ``args.json`` is there but is not a JSON object.
    """
    path = Path(checkpoint).parent / ARGS_JSON
    if not path.is_file():
        return None
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{str(path)!r}: not a readable run config ({err})") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"{str(path)!r}: not a run config (a JSON object)")
    return saved


def read_run_backbone(checkpoint: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``backbone`` section of the ``args.json`` beside ``checkpoint``.

    Args:
        checkpoint: The checkpoint file of a pretraining run.

    Returns:
        ``{"name": ..., "kwargs": {...}}`` as the run recorded it (either key may be absent),
        or None when there is no ``args.json`` beside the checkpoint.

    Raises:
        ConfigError: ``args.json`` is there but is not a JSON object, or its ``backbone`` is
            not one.
    """
    saved = read_run_config(checkpoint)
    if saved is None:
        return None
    backbone = saved.get("backbone") or {}
    if not isinstance(backbone, dict) or not isinstance(backbone.get("kwargs") or {}, dict):
        path = Path(checkpoint).parent / ARGS_JSON
        raise ConfigError(f"{str(path)!r}: backbone={backbone!r} is not a backbone section")
    return backbone


def merge_run_backbone(
    cfg: DictConfig, trained: Mapping[str, Any], checkpoint: str | os.PathLike[str]
) -> None:
    """Fills ``cfg.backbone`` from a run's recorded backbone, or stops where they differ.

    ``backbone.name`` and each key of ``backbone.kwargs`` that ``cfg`` does not give (absent,
    null or solo-learn's ``"None"``) is set to the run's value; one that ``cfg`` gives must be
    the run's (all are checked before any is filled in). Keys that ``cfg`` gives and the run
    did not record are left as they are (what the run built with there, its builder's default,
    is not known here).

    Args:
        cfg: The evaluation config; edited in place (struct mode or not).
        trained: The run's ``backbone`` section (``args.json``'s, or a run config's).
        checkpoint: The checkpoint the run section belongs to, named in the error.

    Raises:
        ConfigError: One line naming the key, the value given and the run's, e.g.
            ``backbone.kwargs.small_image_stem=False: the checkpoint '<path>' was trained with
            True``.
    """
    trained = _plain(trained) or {}
    shown = str(checkpoint)
    kwargs = _plain(trained.get("kwargs")) or {}
    wanted = [("backbone.name", trained.get("name"))]
    wanted += [(f"backbone.kwargs.{key}", value) for key, value in kwargs.items()]
    wanted = [(key, value) for key, value in wanted if value is not None]
    missing: list[tuple[str, Any]] = []
    for key, value in wanted:  # every given value first: nothing is filled in when one differs
        given = _plain(select(cfg, key))
        if given is None:
            missing.append((key, value))
        elif not _same(given, value):
            raise ConfigError(
                f"{key}={given!r}: the checkpoint {shown!r} was trained with {value!r}"
            )
    for key, value in missing:
        OmegaConf.update(cfg, key, value, force_add=True)


def fill_run_backbone(cfg: DictConfig, checkpoint: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's backbone (``args.json`` beside ``checkpoint``) into the evaluation config.

    Call it before anything fills backbone defaults in (solo-learn's ``parse_cfg`` sets
    ``backbone.kwargs`` to ``{}``, :func:`solo_ext.config.fill_stem_option` the dataset table's
    stem), so that the run's values win over defaults and only values the config gives are
    compared. Without an ``args.json`` nothing happens.

    Args:
        cfg: The evaluation config (``main_linear.py``'s, ``solo-ext-linear``'s); edited in
            place: see :func:`merge_run_backbone`.
        checkpoint: The pretrained checkpoint file (``pretrained_feature_extractor``).

    Returns:
        The run's ``backbone`` section, or None when there is no ``args.json``.

    Raises:
        ConfigError: A given value differs from the run's, or ``args.json`` is unreadable.
    """
    trained = read_run_backbone(checkpoint)
    if trained is not None:
        merge_run_backbone(cfg, trained, checkpoint)
    return trained
