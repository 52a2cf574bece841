"""``solo-ext-knn``: weighted kNN accuracy of a pretrained backbone's frozen features.

    solo-ext-knn pretrained_checkpoint_dir=trained_models/scl/offline-ab12cd34 k=20

Reads ``args.json`` and the newest ``.ckpt`` of the run (solo-ext's or solo-learn's layout),
scores the validation split against the training split (no augmentation), and writes overall
top-1 / top-5 and Many / Medium / Few accuracy into ``metrics.json`` beside the checkpoint, the
per-class accuracy into ``knn_per_class.csv`` and its plot into ``knn_per_class.png``. The
features are extracted on the GPU when torch sees one (``accelerator``: ``auto``; ``gpu`` or
``cpu`` force either), ``batch_size`` images a batch loaded by ``num_workers`` processes, and
scored on the CPU. Keys: ``solo_ext/conf/knn.yaml``; ``data.*`` overrides the run's data config
(paths, thresholds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from solo_ext.commands import mains
from solo_ext.commands.devices import eval_device
from solo_ext.commands.options import KNN_OPTIONS as OPTIONS
from solo_ext.commands.options import check_knn_early
from solo_ext.config import declared, fill_options
from solo_ext.data.options import DATA_KEYS
from solo_ext.eval.common import report, split_features
from solo_ext.eval.knn_classifier import knn_predict
from solo_ext.runs.environment import environment
from solo_ext.runs.load import load_for_eval


def evaluate_model(
    backbone: nn.Module,
    pre_cfg: DictConfig,
    k: int = OPTIONS["k"].default,
    temperature: float = OPTIONS["temperature"].default,
    distance: str = OPTIONS["distance"].default,
    out_dir: str | Path | None = None,
    batch_size: int = OPTIONS["batch_size"].default,
    num_workers: int | None = OPTIONS["num_workers"].default,
    device: torch.device | str | None = None,
) -> dict[str, Any]:
    """kNN report of ``backbone`` on ``pre_cfg.data``'s val split; prints and saves it. The
    features are extracted on ``device`` (default: the backbone's) by ``num_workers`` loading
    processes (None: ``pre_cfg``'s ``data.num_workers``). The defaults are solo-ext-knn's
    (``conf/knn.yaml``); pretraining's final kNN takes them, with its own ``knn_eval.k``, on
    its trainer's device."""
    device = torch.device(device) if device is not None else next(backbone.parameters()).device
    if num_workers is None:
        num_workers = declared(pre_cfg, "data.num_workers", DATA_KEYS)
    feats = split_features(backbone, pre_cfg, batch_size, device, num_workers=num_workers)
    scores = knn_predict(
        feats["train_x"],
        feats["train_y"],
        feats["val_x"],
        pre_cfg.data.num_classes,
        k,
        temperature,
        distance,
    )
    extra = {
        "knn_k": k,
        "knn_temperature": temperature,
        "knn_distance": distance,
        "num_train": len(feats["train"]),
        "num_val": len(feats["val"]),
        "knn_environment": environment(precision="32-true", accelerator=device.type, world_size=1),
    }
    return report(
        scores,
        feats["val_y"],
        feats["train"],
        pre_cfg.data,
        "knn_",
        out_dir,
        extra,
        f"kNN (k={k}, {distance})",
    )


def run(cfg: DictConfig) -> dict[str, Any]:
    """Checks ``cfg`` (see the module docstring), evaluates, returns the metrics."""
    OmegaConf.set_struct(cfg, False)
    check_knn_early(cfg)  # (again: run() is also called directly)
    fill_options(cfg, OPTIONS)  # (a whole config given with --config-name may leave keys out)
    backbone, pre_cfg, out_dir = load_for_eval(cfg)
    return evaluate_model(
        backbone,
        pre_cfg,
        cfg.k,
        cfg.temperature,
        cfg.distance,
        out_dir,
        cfg.batch_size,
        cfg.num_workers,
        eval_device(cfg.accelerator),
    )


main = mains.knn  # (its console script: the same, imported without this module)

if __name__ == "__main__":
    main()
