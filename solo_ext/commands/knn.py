"""``solo-ext-knn``: weighted kNN accuracy of a pretrained backbone's frozen features.

    solo-ext-knn pretrained_checkpoint_dir=trained_models/scl/offline-ab12cd34 k=20
    solo-ext-knn pretrained_checkpoint_dir=trained_models/scl/offline-ab12cd34 "k=[20,10]"

Reads ``args.json`` and the newest ``.ckpt`` of the run (solo-ext's or solo-learn's layout),
scores the validation split against the training split (no augmentation), and writes overall
top-1 / top-5 and Many / Medium / Few accuracy into ``metrics.json`` beside the checkpoint, the
per-class accuracy into ``knn_per_class.csv`` and its plot into ``knn_per_class.png``; with a
list of ``k`` (as solo-learn's ``main_knn.py`` takes), the first as above and each further one
under ``knn_k<k>_`` (keys and files), on the same features. The
features are extracted on the GPU when torch sees one (``accelerator``: ``auto``; ``gpu`` or
``cpu`` force either), ``batch_size`` images a batch loaded by ``num_workers`` processes, and
scored on the CPU. Keys: ``solo_ext/conf/knn.yaml``; ``data.*`` overrides the run's data config
(paths, thresholds).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from solo_ext.commands import mains
from solo_ext.commands.devices import eval_device
from solo_ext.commands.options import KNN_OPTIONS as OPTIONS
from solo_ext.commands.options import check_knn_early, neighbour_counts
from solo_ext.config import declared, fill_options
from solo_ext.data.options import DATA_KEYS
from solo_ext.eval.common import report, split_features
from solo_ext.eval.knn_classifier import knn_predict
from solo_ext.runs.environment import environment
from solo_ext.runs.load import load_for_eval


def evaluate_model(
    backbone: nn.Module,
    pre_cfg: DictConfig,
    k: int | Sequence[int] = OPTIONS["k"].default,
    temperature: float = OPTIONS["temperature"].default,
    distance: str = OPTIONS["distance"].default,
    out_dir: str | Path | None = None,
    batch_size: int = OPTIONS["batch_size"].default,
    num_workers: int | None = OPTIONS["num_workers"].default,
    device: torch.device | str | None = None,
) -> dict[str, Any]:
    """kNN report of ``backbone`` on ``pre_cfg.data``'s val split; prints and saves it. The
    features are extracted on ``device`` (default: the backbone's) by ``num_workers`` loading
    processes (None: ``pre_cfg``'s ``data.num_workers``). ``k``: one count, or several scored
    on the same features (the first under ``knn_``, the others under ``knn_k<k>_``). The defaults
    are solo-ext-knn's (``conf/knn.yaml``); pretraining's final kNN takes them, with its own
    ``knn_eval.k``, on its trainer's device."""
    device = torch.device(device) if device is not None else next(backbone.parameters()).device
    if num_workers is None:
        num_workers = declared(pre_cfg, "data.num_workers", DATA_KEYS)
    feats = split_features(backbone, pre_cfg, batch_size, device, num_workers=num_workers)
    metrics: dict[str, Any] = {}
    for i, count in enumerate(neighbour_counts(k)):
        scores = knn_predict(
            feats["train_x"],
            feats["train_y"],
            feats["val_x"],
            pre_cfg.data.num_classes,
            count,
            temperature,
            distance,
        )
        prefix = "knn_" if i == 0 else f"knn_k{count}_"
        extra = {f"{prefix}k": count}
        if i == 0:
            extra.update(
                knn_temperature=temperature,
                knn_distance=distance,
                num_train=len(feats["train"]),
                num_val=len(feats["val"]),
                knn_environment=environment(
                    precision="32-true", accelerator=device.type, world_size=1
                ),
            )
        label = f"kNN (k={count}, {distance})"
        metrics.update(
            report(
                scores, feats["val_y"], feats["train"], pre_cfg.data, prefix, out_dir, extra, label
            )
        )
    return metrics


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
