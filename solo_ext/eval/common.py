"""What the kNN and linear evaluations share: the frozen features of both splits and the report."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import DataLoader, Dataset

from solo_ext.config import ConfigError
from solo_ext.data.datasets import build_dataset, train_class_counts
from solo_ext.data.transforms import build_eval_transform
from solo_ext.eval.longtail import longtail_report, save_longtail_eval
from solo_ext.eval.metrics_file import update_metrics


@torch.no_grad()
def extract_features(
    backbone: nn.Module,
    dataset: Dataset,
    batch_size: int = 256,
    num_workers: int = 0,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Features [N, D] and labels [N] of a dataset of (image, label) under ``backbone.eval()``:
    the batches moved to ``device`` (default: the backbone's, where it must be), the features
    brought back to the CPU."""
    device = torch.device(device) if device is not None else next(backbone.parameters()).device
    was_training = backbone.training
    backbone.eval()
    feats, labels = [], []
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
    )
    for x, y in loader:
        feats.append(backbone(x.to(device, non_blocking=True)).float().cpu())
        labels.append(torch.as_tensor(y))
    backbone.train(was_training)
    return torch.cat(feats), torch.cat(labels)


def split_features(
    backbone: nn.Module,
    pre_cfg: DictConfig,
    batch_size: int = 256,
    device: torch.device | str | None = None,
    crop: int | None = None,
    num_workers: int = 0,
) -> dict:
    """Frozen features of the train and val splits (deterministic transform at ``crop``, by
    default the run's crop size; ``batch_size`` images a batch, loaded by ``num_workers``
    processes), and the datasets; extracted on ``device`` (default: the backbone's), the
    backbone moved back afterwards, the features on the CPU."""
    if crop is None:
        crop = pre_cfg.augmentations[0].crop_size if pre_cfg.get("augmentations") else 224
    transform = build_eval_transform(pre_cfg.data.dataset, crop)
    train = build_dataset(pre_cfg.data, "train", transform)
    val = build_dataset(pre_cfg.data, "val", transform)
    home = next(backbone.parameters()).device
    device = torch.device(device) if device is not None else home
    backbone.to(device)
    try:
        train_x, train_y = extract_features(backbone, train, batch_size, num_workers, device)
        val_x, val_y = extract_features(backbone, val, batch_size, num_workers, device)
    finally:
        backbone.to(home)
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
