"""``solo-ext-linear``: linear probe on a pretrained backbone's frozen features.

    solo-ext-linear --pretrained_checkpoint_dir trained_models/scl/offline-ab12cd34

The backbone is frozen, so its features are extracted once (no augmentation) and a linear
classifier (after a non-affine BatchNorm, as in MAE's probe) is trained on them with Lightning.
acc@1 / acc@5 on the validation split go into ``metrics.json`` beside the checkpoint.
"""

from __future__ import annotations

import argparse
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from solo_ext.cli import one_line_errors
from solo_ext.config import check_range
from solo_ext.data.datasets import build_dataset, check_data_cfg
from solo_ext.data.transforms import build_eval_transform
from solo_ext.eval.metrics_file import update_metrics
from solo_ext.eval.pretrained import extract_features, load_run
from solo_ext.knn import topk_accuracy


class LinearProbe(pl.LightningModule):
    """BatchNorm (no affine) + linear layer on fixed features [N, D]."""

    def __init__(self, dim: int, num_classes: int, lr: float, weight_decay: float, epochs: int):
        super().__init__()
        self.save_hyperparameters()
        self.head = nn.Sequential(nn.BatchNorm1d(dim, affine=False), nn.Linear(dim, num_classes))
        self.val_scores: list[torch.Tensor] = []
        self.val_labels: list[torch.Tensor] = []
        self.result: dict[str, float] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.val_scores.append(self(x))
        self.val_labels.append(y)

    def on_validation_epoch_end(self) -> None:
        acc1, acc5 = topk_accuracy(torch.cat(self.val_scores), torch.cat(self.val_labels))
        self.val_scores.clear()
        self.val_labels.clear()
        self.result = {"linear_acc1": acc1, "linear_acc5": acc5}
        self.log_dict({"val_acc1": acc1, "val_acc5": acc5}, prog_bar=True)

    def configure_optimizers(self):
        hp = self.hparams
        opt = torch.optim.SGD(
            self.parameters(), lr=hp.lr, momentum=0.9, weight_decay=hp.weight_decay
        )
        return [opt], [torch.optim.lr_scheduler.CosineAnnealingLR(opt, hp.epochs)]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="solo-ext-linear", description=__doc__.splitlines()[0])
    p.add_argument(
        "--pretrained_checkpoint_dir",
        required=True,
        help="run directory holding args.json and the .ckpt",
    )
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--weight_decay", type=float, default=0.0)
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--train_path", help="override the run's data.train_path")
    p.add_argument("--val_path", help="override the run's data.val_path")
    return p


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Parses ``argv``, evaluates, returns the metrics."""
    args = parser().parse_args(argv)
    with one_line_errors("solo-ext-linear"):
        for key in ("epochs", "batch_size"):
            check_range(f"--{key}", getattr(args, key), 1)
        check_range("--lr", args.lr, 0, low_open=True)
        backbone, cfg, ckpt = load_run(args.pretrained_checkpoint_dir)
        for key in ("train_path", "val_path"):
            if getattr(args, key):
                cfg.data[key] = getattr(args, key)
        check_data_cfg(cfg)
    pl.seed_everything(args.seed, workers=True)
    crop = cfg.augmentations[0].crop_size if cfg.get("augmentations") else 224
    transform = build_eval_transform(cfg.data.dataset, crop)
    train_x, train_y = extract_features(backbone, build_dataset(cfg.data, "train", transform))
    val_x, val_y = extract_features(backbone, build_dataset(cfg.data, "val", transform))
    probe = LinearProbe(
        train_x.size(1), cfg.data.num_classes, args.lr, args.weight_decay, args.epochs
    )
    train = DataLoader(
        TensorDataset(train_x, train_y),
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=len(train_x) > args.batch_size,
    )
    val = DataLoader(TensorDataset(val_x, val_y), batch_size=1024)
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        check_val_every_n_epoch=args.epochs,
    )
    trainer.fit(probe, train, val)
    metrics = {**probe.result, "linear_epochs": args.epochs}
    print(
        f"linear probe on {cfg.data.dataset} val: acc@1 {metrics['linear_acc1']:.2f}%  "
        f"acc@5 {metrics['linear_acc5']:.2f}%"
    )
    update_metrics(ckpt.parent, metrics)
    return metrics


def main() -> None:
    run()


if __name__ == "__main__":
    main()
