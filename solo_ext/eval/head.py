"""The reported classifier of a one-stage method (PaCo, GPaCo, BCL): the head trained with its
loss, evaluated on the validation split at the end of ``solo-ext-pretrain``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from solo_ext.data.datasets import build_dataset
from solo_ext.data.transforms import build_eval_transform
from solo_ext.eval.common import extract_features, report


@torch.no_grad()
def evaluate_head(
    model: nn.Module,
    pre_cfg: DictConfig,
    out_dir: str | Path | None = None,
    batch_size: int = 256,
    extra: dict[str, Any] | None = None,
    device: torch.device | str | None = None,
) -> dict[str, Any]:
    """``head_acc1`` / ``head_acc5`` and the Many / Medium / Few top-1 of ``model.head_logits``
    on the backbone's features of ``pre_cfg.data``'s val split (the deterministic transform),
    computed on ``device`` (default: the model's; the model goes back where it was); printed,
    and with ``out_dir`` saved (``metrics.json``, ``head_per_class.csv`` / ``.png``), with
    ``extra`` keys."""
    crop = pre_cfg.augmentations[0].crop_size if pre_cfg.get("augmentations") else 224
    transform = build_eval_transform(pre_cfg.data.dataset, crop)
    train = build_dataset(pre_cfg.data, "train", None)
    val = build_dataset(pre_cfg.data, "val", transform)
    home = next(model.parameters()).device
    device = torch.device(device) if device is not None else home
    was_training = model.training
    model.to(device).eval()
    try:
        feats, labels = extract_features(model.backbone, val, batch_size, device=device)
        with torch.no_grad():
            scores = torch.cat(
                [model.head_logits(f.to(device)).float().cpu() for f in feats.split(batch_size)]
            )
    finally:
        model.to(home).train(was_training)
    extra = {
        "head": f"{pre_cfg.method}: the classifier trained with the loss (one stage)",
        **(extra or {}),
    }
    return report(scores, labels, train, pre_cfg.data, "head_", out_dir, extra, "head")
