"""A pretrained run, as the evaluation commands take it: its directory (``args.json`` and the
newest checkpoint, solo-ext's or solo-learn's layout) or a checkpoint file in it, loaded into
the active host's backbone. Above the host (it builds the host's backbone); the evaluation below it
(``solo_ext.eval``) only sees the backbone."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from torch import nn

from solo_ext.config import ConfigError, check_options
from solo_ext.data.datasets import fill_data_cfg
from solo_ext.data.options import DATA_KEYS
from solo_ext.host import build_backbone
from solo_ext.runs.backbone import merge_run_backbone
from solo_ext.runs.checkpoint import find_checkpoint, read_checkpoint
from solo_ext.runs.environment import warn_if_numbers_differ
from solo_ext.runs.keys import CHECKPOINT_KEY, RUN_DIR_KEY, run_key

_PATHS = ("train_path", "val_path")


def load_run(
    run_dir: str | Path, ckpt_path: str | Path | None = None, key: str = RUN_DIR_KEY
) -> tuple[nn.Module, DictConfig, Path]:
    """Backbone (with the run's weights), config (``args.json``) and checkpoint path of a run
    directory ``<dir>/<method>/<run id>/`` (its newest checkpoint, or ``ckpt_path``); ``key``
    named the directory (the errors name it)."""
    run_dir = Path(run_dir)
    args_path = run_dir / "args.json"
    if not args_path.is_file():
        raise FileNotFoundError(f"{key}={str(run_dir)!r}: no args.json")
    with open(args_path) as f:
        cfg = OmegaConf.create(json.load(f))
    ckpt_given = ckpt_path is not None
    ckpt_path = find_checkpoint(run_dir, key) if ckpt_path is None else Path(ckpt_path)
    backbone = build_backbone(
        cfg.backbone.name, cfg.method, cfg.data.dataset, cfg.backbone.get("kwargs") or {}
    )
    state = read_checkpoint(CHECKPOINT_KEY if ckpt_given else key, ckpt_path)
    state = state.get("state_dict", state)
    weights = {k[len("backbone.") :]: v for k, v in state.items() if k.startswith("backbone.")}
    if not weights:
        raise ConfigError(f"checkpoint {str(ckpt_path)!r}: no 'backbone.' weights in it")
    missing, unexpected = backbone.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ConfigError(
            f"checkpoint {str(ckpt_path)!r}: does not fit backbone.name={cfg.backbone.name!r} "
            f"({len(missing)} missing, {len(unexpected)} unexpected keys, e.g. "
            f"{(missing or unexpected)[0]!r})"
        )
    return backbone.eval(), cfg, ckpt_path


def load_for_eval(cfg: DictConfig) -> tuple[nn.Module, DictConfig, Path]:
    """The backbone and pretraining config of ``cfg.pretrained_checkpoint_dir`` (a run
    directory) or ``cfg.pretrained_feature_extractor`` (solo-learn's key: a checkpoint file in
    a run directory, or the directory), with ``cfg.data`` merged over the run's data config (a
    null ``train_path`` / ``val_path`` keeps the run's); returns the output directory too."""
    check_options(cfg, DATA_KEYS)  # the data keys given here: checked before the run is read
    key, given = run_key(cfg)
    if key == CHECKPOINT_KEY and not Path(given).is_dir():
        if not Path(given).is_file():
            raise FileNotFoundError(f"{key}={given!r}: no such file or run directory")
        backbone, pre_cfg, ckpt_path = load_run(Path(given).parent, given)
    else:
        backbone, pre_cfg, ckpt_path = load_run(given, None, key)
    given = OmegaConf.select(cfg, "method", default=None)  # named here: must be the run's
    if given is not None and given != pre_cfg.get("method"):
        raise ConfigError(
            f"method={given!r}: the checkpoint {str(ckpt_path)!r} was trained with "
            f"{pre_cfg.get('method')!r}"
        )
    # the backbone is the run's; backbone.name and backbone.kwargs given here must agree with it
    merge_run_backbone(cfg, pre_cfg.get("backbone") or {}, ckpt_path)
    recorded = pre_cfg.get("environment")
    warn_if_numbers_differ(
        OmegaConf.to_container(recorded) if recorded is not None else None, "solo-ext"
    )
    overrides = OmegaConf.select(cfg, "data", default=None) or {}
    # a path left null (the kNN configs' placeholders, there for plain overrides) is the run's
    overrides = {k: v for k, v in overrides.items() if v is not None or k not in _PATHS}
    pre_cfg.data = OmegaConf.merge(pre_cfg.data, overrides)
    OmegaConf.set_struct(pre_cfg, False)
    fill_data_cfg(pre_cfg)
    return backbone, pre_cfg, ckpt_path.parent
