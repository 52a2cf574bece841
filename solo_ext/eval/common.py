"""What the kNN and linear evaluations share: the run to evaluate, its features, the report."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from solo_ext.config import ConfigError
from solo_ext.data.datasets import build_dataset, check_data_cfg, train_class_counts
from solo_ext.data.transforms import build_eval_transform
from solo_ext.eval.longtail import longtail_report, save_longtail_eval
from solo_ext.eval.metrics_file import update_metrics
from solo_ext.eval.pretrained import extract_features, load_run


def load_for_eval(cfg: DictConfig) -> tuple[nn.Module, DictConfig, Path]:
    """The backbone and pretraining config of ``cfg.pretrained_checkpoint_dir`` (a run
    directory) or ``cfg.pretrained_feature_extractor`` (a checkpoint file, solo-learn's key),
    with ``cfg.data`` merged over the run's data config; returns the output directory too."""
    run_dir = OmegaConf.select(cfg, "pretrained_checkpoint_dir", default=None)
    ckpt = OmegaConf.select(cfg, "pretrained_feature_extractor", default=None)
    if run_dir is None and ckpt is None:
        raise ConfigError(
            "pretrained_checkpoint_dir is missing (the run directory to evaluate; or "
            "pretrained_feature_extractor, its checkpoint)"
        )
    if run_dir is None and not Path(ckpt).is_file():
        raise FileNotFoundError(f"pretrained_feature_extractor={str(ckpt)!r}: no such file")
    backbone, pre_cfg, ckpt_path = (
        load_run(run_dir) if run_dir is not None else load_run(Path(ckpt).parent, ckpt)
    )
    for key in ("method", "backbone.name"):  # named in the evaluation config: must agree
        given = OmegaConf.select(cfg, key, default=None)
        trained = OmegaConf.select(pre_cfg, key, default=None)
        if given is not None and given != trained:
            raise ConfigError(
                f"{key}={given!r}: the checkpoint {str(ckpt_path)!r} was trained with {trained!r}"
            )
    overrides = OmegaConf.select(cfg, "data", default=None) or {}
    pre_cfg.data = OmegaConf.merge(pre_cfg.data, overrides)
    OmegaConf.set_struct(pre_cfg, False)
    check_data_cfg(pre_cfg)
    return backbone, pre_cfg, ckpt_path.parent


def split_features(backbone: nn.Module, pre_cfg: DictConfig, batch_size: int = 256) -> dict:
    """Frozen features of the train and val splits (deterministic transform), and the datasets."""
    crop = pre_cfg.augmentations[0].crop_size if pre_cfg.get("augmentations") else 224
    transform = build_eval_transform(pre_cfg.data.dataset, crop)
    train = build_dataset(pre_cfg.data, "train", transform)
    val = build_dataset(pre_cfg.data, "val", transform)
    train_x, train_y = extract_features(backbone, train, batch_size)
    val_x, val_y = extract_features(backbone, val, batch_size)
    return {
        "train": train,
        "val": val,
        "train_x": train_x,
        "train_y": train_y,
        "val_x": val_x,
        "val_y": val_y,
    }


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}%"


def report(
    scores: torch.Tensor,
    labels: torch.Tensor,
    train: Any,
    data: DictConfig,
    prefix: str,
    out_dir: str | Path | None,
    extra: dict[str, Any],
    label: str,
) -> dict[str, Any]:
    """Overall and Many / Medium / Few accuracy, printed as ``<label> on <dataset> val: ...``;
    with ``out_dir`` also the per-class CSV and plot and the merged ``metrics.json``."""
    counts = train_class_counts(train)
    if counts is None or len(counts) != scores.size(1):
        raise ConfigError(
            f"data.num_classes={scores.size(1)}: the training split has {len(counts or [])} classes"
        )
    thresholds = {"many_threshold": data.many_threshold, "few_threshold": data.few_threshold}
    if out_dir is None:
        metrics = longtail_report(scores, labels, counts, prefix=prefix, **thresholds)
    else:
        names = getattr(train, "classes", None)
        metrics = save_longtail_eval(
            out_dir, scores, labels, counts, names, prefix=prefix, **thresholds
        )
    metrics.update(extra)
    if out_dir is not None:
        update_metrics(out_dir, metrics)
    groups = "  ".join(
        f"{g} {_pct(metrics[f'{prefix}acc1_{g}'])}" for g in ("many", "medium", "few")
    )
    print(
        f"{label} on {data.dataset} val: acc@1 {_pct(metrics[f'{prefix}acc1'])}  "
        f"acc@5 {_pct(metrics[f'{prefix}acc5'])}  |  {groups}"
    )
    return metrics
