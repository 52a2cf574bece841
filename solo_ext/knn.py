"""``solo-ext-knn``: weighted kNN accuracy of a pretrained backbone's frozen features.

    solo-ext-knn --pretrained_checkpoint_dir trained_models/scl/offline-ab12cd34

Reads ``args.json`` and the newest ``.ckpt`` of the run (solo-ext's or solo-learn's layout),
scores the validation split against the training split (no augmentation), and writes
``metrics.json`` beside the checkpoint.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from solo_ext.cli import one_line_errors
from solo_ext.data.datasets import build_dataset, check_data_cfg
from solo_ext.data.transforms import build_eval_transform
from solo_ext.eval.knn_classifier import DISTANCES, knn_predict
from solo_ext.eval.metrics_file import update_metrics
from solo_ext.eval.pretrained import extract_features, load_run


def topk_accuracy(scores: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """acc@1 and acc@5 in percent of class scores [N, C] against labels [N]."""
    top = scores.topk(min(5, scores.size(1)), dim=1).indices
    hit = top.eq(labels[:, None])
    return hit[:, 0].float().mean().item() * 100, hit.any(dim=1).float().mean().item() * 100


def evaluate_model(
    backbone: nn.Module,
    cfg: DictConfig,
    k: int = 20,
    temperature: float = 0.07,
    distance: str = "cosine",
    out_dir: str | Path | None = None,
    batch_size: int = 256,
) -> dict[str, Any]:
    """kNN top-1 / top-5 of ``backbone`` on ``cfg.data``'s val split; prints and saves them."""
    crop = cfg.augmentations[0].crop_size if cfg.get("augmentations") else 224
    transform = build_eval_transform(cfg.data.dataset, crop)
    train = build_dataset(cfg.data, "train", transform)
    val = build_dataset(cfg.data, "val", transform)
    train_x, train_y = extract_features(backbone, train, batch_size)
    val_x, val_y = extract_features(backbone, val, batch_size)
    scores = knn_predict(train_x, train_y, val_x, cfg.data.num_classes, k, temperature, distance)
    acc1, acc5 = topk_accuracy(scores, val_y)
    metrics = {
        "knn_acc1": acc1,
        "knn_acc5": acc5,
        "k": k,
        "temperature": temperature,
        "distance": distance,
        "num_train": len(train),
        "num_val": len(val),
    }
    print(
        f"kNN (k={k}, {distance}) on {cfg.data.dataset} val: acc@1 {acc1:.2f}%  acc@5 {acc5:.2f}%"
    )
    if out_dir is not None:
        update_metrics(out_dir, metrics)
    return metrics


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="solo-ext-knn", description=__doc__.splitlines()[0])
    p.add_argument(
        "--pretrained_checkpoint_dir",
        required=True,
        help="run directory holding args.json and the .ckpt",
    )
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--temperature", type=float, default=0.07)
    p.add_argument("--distance", choices=DISTANCES, default="cosine")
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--train_path", help="override the run's data.train_path")
    p.add_argument("--val_path", help="override the run's data.val_path")
    return p


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Parses ``argv``, evaluates, returns the metrics."""
    args = parser().parse_args(argv)
    with one_line_errors("solo-ext-knn"):
        backbone, cfg, ckpt = load_run(args.pretrained_checkpoint_dir)
        for key in ("train_path", "val_path"):
            if getattr(args, key):
                cfg.data[key] = getattr(args, key)
        check_data_cfg(cfg)
        return evaluate_model(
            backbone,
            cfg,
            args.k,
            args.temperature,
            args.distance,
            out_dir=ckpt.parent,
            batch_size=args.batch_size,
        )


def main() -> None:
    run()


if __name__ == "__main__":
    main()
