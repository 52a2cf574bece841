"""What ``solo-ext-linear`` trains, by SGD with solo-learn's schedules: the probe on features
extracted once, or the published classifier stage, a linear layer trained on images through a
frozen backbone (DSCL's ``equal_lincls.py``; its keys: :mod:`solo_ext.eval.classifier_stage`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn
from torchvision import transforms as T

from solo_ext.commands.options import SCHEDULE_OPTIONS, check_step_epochs
from solo_ext.config import (
    declared,
    select,
    world_size,
)
from solo_ext.data.transforms import normalize
from solo_ext.eval.classifier_stage import init_classifier, stage_train_transform
from solo_ext.facts import facts
from solo_ext.host import feature_dim

# a scheduler's name in the records and tables (the lr's shape: a cosine has no warm-up here)
STAGE_SCHEDULE_NAMES = {"warmup_cosine": "cosine", "none": "constant"}


@dataclass(frozen=True)
class SGDSchedule:
    """SGD with momentum and one of :data:`SCHEDULERS`, stepped per epoch."""

    lr: float
    momentum: float
    weight_decay: float
    epochs: int
    scheduler: str = "warmup_cosine"
    lr_decay_steps: tuple[int, ...] = ()

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> SGDSchedule:
        """From a checked ``solo-ext-linear`` config: ``optimizer.lr`` is per 256 images and
        scaled by the total batch, ``optimizer.batch_size`` x processes (solo-learn's rule, as
        its ``main_linear.py`` scales it); ``step`` needs its epochs."""
        name = declared(cfg, "scheduler.name", SCHEDULE_OPTIONS)
        check_step_epochs(cfg)
        steps = select(cfg, "scheduler.lr_decay_steps")
        return cls(
            lr=cfg.optimizer.lr * cfg.optimizer.batch_size * world_size(cfg) / 256,
            momentum=declared(cfg, "optimizer.kwargs.momentum", SCHEDULE_OPTIONS),
            weight_decay=cfg.optimizer.weight_decay,
            epochs=cfg.max_epochs,
            scheduler=name,
            lr_decay_steps=tuple(steps or ()),
        )

    def configure(self, params: Iterable[nn.Parameter]) -> tuple[list, list]:
        """Lightning's ``configure_optimizers`` answer for ``params``."""
        opt = torch.optim.SGD(
            params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
        )
        if self.scheduler == "none":
            return [opt], []
        if self.scheduler == "step":
            sched: Any = torch.optim.lr_scheduler.MultiStepLR(opt, list(self.lr_decay_steps), 0.1)
        else:
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, self.epochs)
        return [opt], [sched]


class FeatureClassifier(pl.LightningModule):
    """A classifier ``head`` on fixed features [N, D], trained with cross-entropy; SGD as
    scheduled on its trainable parameters (LWS's scales: its linear layer is frozen)."""

    def __init__(self, head: nn.Module, schedule: SGDSchedule):
        super().__init__()
        self.head = head
        self.schedule = schedule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return self.schedule.configure(p for p in self.parameters() if p.requires_grad)


class LinearProbe(FeatureClassifier):
    """(BatchNorm without affine +) linear layer on fixed features [N, D]; SGD as scheduled."""

    def __init__(
        self,
        dim: int,
        num_classes: int,
        schedule: SGDSchedule,
        feature_norm: bool = True,
        classifier_init: str = "default",
    ):
        norm = nn.BatchNorm1d(dim, affine=False) if feature_norm else nn.Identity()
        super().__init__(nn.Sequential(norm, nn.Linear(dim, num_classes)), schedule)
        init_classifier(self.head[1], classifier_init)


class FrozenBackboneClassifier(pl.LightningModule):
    """A linear layer on a frozen backbone, trained on images with cross-entropy.

    ``backbone_bn="train"`` (the published stage): each training step runs the backbone in
    train mode (under ``no_grad``), so its BatchNorm running statistics follow the stage's
    images; ``"eval"``: the frozen statistics. Evaluation is the caller's, in eval mode.
    """

    def __init__(
        self,
        backbone: nn.Module,
        num_classes: int,
        schedule: SGDSchedule,
        backbone_bn: str = "train",
        classifier_init: str = "normal",
    ):
        super().__init__()
        self.backbone = backbone.requires_grad_(False).train(backbone_bn == "train")
        self.fc = nn.Linear(feature_dim(backbone), num_classes)
        init_classifier(self.fc, classifier_init)
        self.schedule = schedule
        self.backbone_bn = backbone_bn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            feats = self.backbone(x)
        return self.fc(feats)

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.backbone.train(self.backbone_bn == "train")  # Lightning's train() sets it too
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return self.schedule.configure(self.fc.parameters())


def train_transform(
    dataset: str, augmentation: str, run_view: DictConfig | None = None
) -> Callable[[Any], Any]:
    """The stage's training crops: ``pretrain`` (``run_view``, the run's query view) or
    ``published`` (:func:`stage_train_transform`), or ``solo-learn`` (``main_linear.py``'s:
    random resized crop 0.08-1, flip, at 224 px or the stored size of 32 px datasets)."""
    if augmentation != "solo-learn":
        return stage_train_transform(dataset, augmentation, run_view)
    size = facts(dataset).native_size or 224
    return T.Compose(
        [
            T.RandomResizedCrop(size, scale=(0.08, 1.0)),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            normalize(dataset),
        ]
    )
