"""``solo-ext-linear``: linear probe on a pretrained backbone's frozen features.

    solo-ext-linear pretrained_checkpoint_dir=trained_models/scl/offline-ab12cd34 \\
        data.sampler.name=class_balanced max_epochs=40

The backbone is frozen, so its features are extracted once (no augmentation) and a linear
classifier (after a non-affine BatchNorm when ``feature_norm``, as in MAE's probe) is trained on
them with Lightning, optionally with a long-tail sampler (``data.sampler``; DSCL trains its
classifier with ``class_balanced``). Overall and Many / Medium / Few accuracy go into
``metrics.json`` beside the checkpoint, per-class accuracy into ``linear_per_class.csv`` and
``linear_per_class.png``. Keys: ``solo_ext/conf/linear.yaml``.

It also takes solo-learn's linear configs (``scripts/linear``, the ones ``main_linear.py``
reads): ``pretrained_feature_extractor`` names the checkpoint, ``optimizer.lr`` is given per 256
images and scaled by the batch as solo-learn does, and the keys in :data:`SOLO_LINEAR_KEYS` are
accepted without being used (a frozen-feature probe needs no scheduler, strategy or
checkpointing). The backbone is the run's (``args.json``): a ``backbone.name`` or
``backbone.kwargs`` value given here that differs from the run's stops in one line naming both.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from solo_ext.cli import hydra_entry
from solo_ext.config import Option, check_given
from solo_ext.data.samplers import build_sampler, fill_sampler_cfg
from solo_ext.eval.common import report, split_features
from solo_ext.runs import load_for_eval

# keys of solo-learn's linear configs that this probe accepts and does not use
SOLO_LINEAR_KEYS = (
    "name", "backbone", "pretrain_method", "scheduler", "checkpoint", "auto_resume", "wandb",
    "strategy", "precision", "sync_batchnorm", "hydra", "defaults", "auto_augment",
    "label_smoothing", "mixup", "cutmix", "finetune", "performance", "num_nodes",
)  # fmt: skip


class LinearProbe(pl.LightningModule):
    """(BatchNorm without affine +) linear layer on fixed features [N, D]; cosine-decayed SGD."""

    def __init__(
        self,
        dim: int,
        num_classes: int,
        lr: float,
        weight_decay: float,
        epochs: int,
        feature_norm: bool = True,
    ):
        super().__init__()
        self.save_hyperparameters()
        norm = nn.BatchNorm1d(dim, affine=False) if feature_norm else nn.Identity()
        self.head = nn.Sequential(norm, nn.Linear(dim, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        hp = self.hparams
        opt = torch.optim.SGD(
            self.parameters(), lr=hp.lr, momentum=0.9, weight_decay=hp.weight_decay
        )
        return [opt], [torch.optim.lr_scheduler.CosineAnnealingLR(opt, hp.epochs)]


# every key solo-ext-linear reads, declared once (defaults in conf/linear.yaml)
OPTIONS: dict[str, Option] = {
    "max_epochs": Option(100, "int", 1),
    "feature_norm": Option(True, "bool"),
    "optimizer.name": Option("sgd", "str", choices=("sgd",)),
    "optimizer.lr": Option(0.1, "float", 0, low_open=True),
    "optimizer.weight_decay": Option(0.0, "float", 0),
    "optimizer.batch_size": Option(256, "int", 1),
    "seed": Option(5, "int", 0),
}


def run(cfg: DictConfig) -> dict[str, Any]:
    """Checks ``cfg`` (see the module docstring), trains the probe, returns the metrics."""
    OmegaConf.set_struct(cfg, False)
    check_given(cfg, OPTIONS)
    fill_sampler_cfg(cfg, total_epochs=cfg.max_epochs)  # a sampler given here, before the run
    backbone, pre_cfg, out_dir = load_for_eval(cfg)
    sampler_args = fill_sampler_cfg(pre_cfg, total_epochs=cfg.max_epochs)

    pl.seed_everything(cfg.seed, workers=True)
    feats = split_features(backbone, pre_cfg)
    train_x, train_y = feats["train_x"], feats["train_y"]
    sampler = None
    if sampler_args is not None:
        sampler = build_sampler(sampler_args.pop("name"), train_y, seed=cfg.seed, **sampler_args)
    batch_size = cfg.optimizer.batch_size
    train = DataLoader(
        TensorDataset(train_x, train_y),
        batch_size=batch_size,
        shuffle=sampler is None,
        sampler=sampler,
        drop_last=len(train_x) > batch_size,
    )
    probe = LinearProbe(
        train_x.size(1),
        pre_cfg.data.num_classes,
        cfg.optimizer.lr * batch_size / 256,  # solo-learn's rule: lr given per 256 images
        cfg.optimizer.weight_decay,
        cfg.max_epochs,
        cfg.feature_norm,
    )
    trainer = pl.Trainer(
        max_epochs=cfg.max_epochs,
        accelerator=cfg.accelerator,
        devices=cfg.devices,
        logger=False,
        enable_checkpointing=False,
        use_distributed_sampler=sampler is None,
    )
    trainer.fit(probe, train)
    probe.eval()
    with torch.no_grad():
        scores = probe(feats["val_x"].to(probe.device)).cpu()
    extra = {
        "linear_epochs": cfg.max_epochs,
        "linear_sampler": (OmegaConf.select(pre_cfg, "data.sampler.name") or "shuffle"),
    }
    return report(
        scores,
        feats["val_y"],
        feats["train"],
        pre_cfg.data,
        "linear_",
        out_dir,
        extra,
        "linear probe",
    )


main = hydra_entry("solo-ext-linear", run, "linear")

if __name__ == "__main__":
    main()
