"""``BaseMethod`` / ``BaseMomentumMethod`` of the embedded host: solo-learn's contract, small.

Same config keys, attribute names, batch format and outputs as ``solo.methods.base``, so a
method class written against solo-learn runs here unchanged (and vice versa).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from solo_ext.config import CROP_OPTIONS, HOST_OPTIONS, fill_options
from solo_ext.host.standalone.backbones import BACKBONES, build_backbone, feature_dim
from solo_ext.host.standalone.momentum import MomentumUpdater, initialize_momentum_params
from solo_ext.host.standalone.optim import OPTIMIZERS, SCHEDULERS, step_schedule, warmup_cosine
from solo_ext.host.standalone.utils import (
    accuracy_at_k,
    omegaconf_select,
    split_weight_decay,
    weighted_mean,
)
from solo_ext.modules.knn import WeightedKNNClassifier

log = logging.getLogger(__name__)


def _section(cfg: DictConfig, key: str) -> None:
    if omegaconf_select(cfg, key) is None:
        cfg[key] = {}


class BaseMethod(pl.LightningModule):
    """Backbone + online linear classifier on detached features, N-crop training step,
    validation acc@1/acc@5, optional online kNN, optimizer and scheduler from the config."""

    _BACKBONES = BACKBONES
    _OPTIMIZERS = OPTIMIZERS
    _SCHEDULERS = SCHEDULERS

    def __init__(self, cfg: DictConfig):
        super().__init__()
        cfg = self.add_and_assert_specific_cfg(cfg)
        self.cfg = cfg

        self.backbone_args: dict[str, Any] = cfg.backbone.kwargs
        self.backbone_name: str = cfg.backbone.name
        self.base_model = self._BACKBONES[self.backbone_name]
        self.backbone = self._build_backbone(cfg)
        self.features_dim: int = feature_dim(self.backbone)

        self.num_classes: int = cfg.data.num_classes
        self.classifier = nn.Linear(self.features_dim, self.num_classes)

        self.max_epochs: int = cfg.max_epochs
        self.accumulate_grad_batches = cfg.accumulate_grad_batches
        opt, sch = cfg.optimizer, cfg.scheduler
        self.optimizer: str = opt.name
        self.batch_size: int = opt.batch_size
        self.lr: float = opt.lr
        self.weight_decay: float = opt.weight_decay
        self.classifier_lr: float = opt.classifier_lr
        self.extra_optimizer_args: dict[str, Any] = dict(opt.kwargs)
        self.exclude_bias_n_norm_wd: bool = opt.exclude_bias_n_norm_wd
        self.scheduler: str = sch.name
        self.lr_decay_steps = sch.lr_decay_steps
        self.min_lr: float = sch.min_lr
        self.warmup_start_lr: float = sch.warmup_start_lr
        self.warmup_epochs: float = sch.warmup_epochs
        self.scheduler_interval: str = sch.interval
        if self.accumulate_grad_batches:
            scale = self.accumulate_grad_batches
            self.lr, self.classifier_lr = self.lr * scale, self.classifier_lr * scale
            self.min_lr, self.warmup_start_lr = self.min_lr * scale, self.warmup_start_lr * scale

        self.num_large_crops: int = cfg.data.num_large_crops
        self.num_small_crops: int = cfg.data.num_small_crops
        self.num_crops = self.num_large_crops + self.num_small_crops
        self.multicrop = self.num_small_crops != 0

        self.knn_eval: bool = cfg.knn_eval.enabled
        self.knn_k: int = cfg.knn_eval.k
        if self.knn_eval:
            self.knn = WeightedKNNClassifier(k=self.knn_k, distance_fx=cfg.knn_eval.distance_func)
        self.no_channel_last: bool = cfg.performance.disable_channel_last
        self.validation_step_outputs: list[dict] = []

    def _build_backbone(self, cfg: DictConfig) -> nn.Module:
        return build_backbone(
            self.backbone_name, cfg.method, cfg.data.dataset, self.backbone_args, self._BACKBONES
        )

    @staticmethod
    def add_and_assert_specific_cfg(cfg: DictConfig) -> DictConfig:
        """Fills the base defaults (solo-learn's, declared in ``HOST_OPTIONS``) and checks the
        keys every method needs."""
        for key in (
            "backbone",
            "optimizer",
            "scheduler",
            "data",
            "knn_eval",
            "performance",
            "method_kwargs",
        ):
            _section(cfg, key)
        if omegaconf_select(cfg, "backbone.name") not in BaseMethod._BACKBONES:
            raise ValueError(
                f"backbone.name={omegaconf_select(cfg, 'backbone.name')!r}: not one of "
                f"{sorted(BaseMethod._BACKBONES)}"
            )
        cfg.backbone.kwargs = omegaconf_select(cfg, "backbone.kwargs", {})
        cfg.optimizer.kwargs = omegaconf_select(cfg, "optimizer.kwargs", {})
        cfg.scheduler.lr_decay_steps = omegaconf_select(cfg, "scheduler.lr_decay_steps", None)
        fill_options(cfg, {k: o for k, o in HOST_OPTIONS.items() if not k.startswith("momentum.")})
        fill_options(cfg, CROP_OPTIONS)
        checks = {
            "optimizer.name": (cfg.optimizer.get("name"), tuple(BaseMethod._OPTIMIZERS)),
            "scheduler.interval": (cfg.scheduler.interval, ("step", "epoch")),
        }
        for key, (value, allowed) in checks.items():
            if value not in allowed:
                raise ValueError(f"{key}={value!r}: not one of {list(allowed)}")
        for key in (
            "optimizer.batch_size",
            "optimizer.lr",
            "optimizer.classifier_lr",
            "optimizer.weight_decay",
            "data.num_classes",
            "max_epochs",
        ):
            if omegaconf_select(cfg, key) is None:
                raise ValueError(f"{key} is missing from the config")
        return cfg

    @property
    def learnable_params(self) -> list[dict[str, Any]]:
        return [
            {"name": "backbone", "params": self.backbone.parameters()},
            {
                "name": "classifier",
                "params": self.classifier.parameters(),
                "lr": self.classifier_lr,
                "weight_decay": 0,
            },
        ]

    def configure_optimizers(self):
        groups = [dict(g) for g in self.learnable_params]
        if self.exclude_bias_n_norm_wd:
            groups = split_weight_decay(groups)
        static = [i for i, g in enumerate(groups) if g.pop("static_lr", False)]
        for g in groups:
            g["params"] = list(g["params"])
        optimizer = self._OPTIMIZERS[self.optimizer](
            groups, lr=self.lr, weight_decay=self.weight_decay, **self.extra_optimizer_args
        )
        if self.scheduler == "none":
            return optimizer
        if self.scheduler == "warmup_cosine":
            per_epoch = self.trainer.estimated_stepping_batches / self.max_epochs
            by_step = self.scheduler_interval == "step"
            scheduler = warmup_cosine(
                optimizer,
                warmup_steps=self.warmup_epochs * per_epoch if by_step else self.warmup_epochs,
                total_steps=self.trainer.estimated_stepping_batches if by_step else self.max_epochs,
                warmup_start_lr=self.warmup_start_lr if self.warmup_epochs > 0 else self.lr,
                min_lr=self.min_lr,
                static_groups=static,
            )
        else:
            # solo-learn's ``step``: a MultiStepLR that Lightning steps once per epoch
            scheduler = step_schedule(optimizer, self.lr_decay_steps or [])
            return [optimizer], [{"scheduler": scheduler, "interval": "epoch"}]
        return [optimizer], [{"scheduler": scheduler, "interval": self.scheduler_interval}]

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer, *_):
        optimizer.zero_grad(set_to_none=True)

    def _channels_last(self, X: torch.Tensor) -> torch.Tensor:
        return X if self.no_channel_last else X.to(memory_format=torch.channels_last)

    def forward(self, X: torch.Tensor) -> dict[str, Any]:
        feats = self.backbone(self._channels_last(X))
        return {"logits": self.classifier(feats.detach()), "feats": feats}

    def multicrop_forward(self, X: torch.Tensor) -> dict[str, Any]:
        return {"feats": self.backbone(self._channels_last(X))}

    def _base_shared_step(self, X: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        out = self(X)
        logits = out["logits"]
        loss = F.cross_entropy(logits, targets, ignore_index=-1)
        acc1, acc5 = accuracy_at_k(logits, targets, top_k=(1, min(5, logits.size(1))))
        out.update({"loss": loss, "acc1": acc1, "acc5": acc5})
        return out

    def base_training_step(self, X: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        return self._base_shared_step(X, targets)

    def training_step(self, batch: Sequence[Any], batch_idx: int) -> dict[str, Any]:
        """``batch = [indexes, [crop_1, ..., crop_n], targets]``, large crops first."""
        _, X, targets = batch
        X = [X] if isinstance(X, torch.Tensor) else X
        if len(X) != self.num_crops:
            raise ValueError(
                f"got {len(X)} crops, expected data.num_large_crops + "
                f"data.num_small_crops = {self.num_crops}"
            )
        outs = [self.base_training_step(x, targets) for x in X[: self.num_large_crops]]
        outs = {k: [o[k] for o in outs] for k in outs[0]}
        if self.multicrop:
            small = [self.multicrop_forward(x) for x in X[self.num_large_crops :]]
            for k in small[0]:
                outs[k] = outs.get(k, []) + [o[k] for o in small]
        for k in ("loss", "acc1", "acc5"):
            outs[k] = sum(outs[k]) / self.num_large_crops
        self.log_dict(
            {
                "train_class_loss": outs["loss"],
                "train_acc1": outs["acc1"],
                "train_acc5": outs["acc5"],
            },
            on_epoch=True,
            sync_dist=True,
        )
        if self.knn_eval:
            labels = targets.repeat(self.num_large_crops)
            keep = labels != -1
            feats = torch.cat(outs["feats"][: self.num_large_crops])
            self.knn.update(train_features=feats[keep].detach(), train_targets=labels[keep])
        return outs

    def base_validation_step(self, X: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        return self._base_shared_step(X, targets)

    def validation_step(
        self, batch, batch_idx, dataloader_idx=None, update_validation_step_outputs: bool = True
    ) -> dict[str, Any]:
        X, targets = batch
        out = self.base_validation_step(X, targets)
        if self.knn_eval and not self.trainer.sanity_checking:
            self.knn.update(test_features=out.pop("feats").detach(), test_targets=targets.detach())
        metrics = {
            "batch_size": targets.size(0),
            "val_loss": out["loss"],
            "val_acc1": out["acc1"],
            "val_acc5": out["acc5"],
        }
        if update_validation_step_outputs:
            self.validation_step_outputs.append(metrics)
        return metrics

    def _validation_log(self, prefix: str = "") -> dict[str, Any]:
        outs = self.validation_step_outputs
        return {
            f"{prefix}val_{m}": weighted_mean(outs, f"{prefix}val_{m}", "batch_size")
            for m in ("loss", "acc1", "acc5")
        }

    def on_validation_epoch_end(self) -> None:
        log_dict = self._validation_log()
        if self.knn_eval and not self.trainer.sanity_checking:
            acc1, acc5 = self.knn.compute()  # over the features of every process
            self.knn.reset()
            log_dict.update({"val_knn_acc1": acc1, "val_knn_acc5": acc5})
        self.log_dict(log_dict, sync_dist=True)
        self.validation_step_outputs.clear()


class BaseMomentumMethod(BaseMethod):
    """Adds a momentum backbone (EMA with the cosine tau schedule) and an optional momentum
    classifier. Config: ``momentum.{base_tau, final_tau, classifier}``."""

    def __init__(self, cfg: DictConfig):
        super().__init__(cfg)
        self.momentum_backbone = self._build_backbone(cfg)
        initialize_momentum_params(self.backbone, self.momentum_backbone)
        self.momentum_classifier = (
            nn.Linear(self.features_dim, self.num_classes) if cfg.momentum.classifier else None
        )
        self.momentum_updater = MomentumUpdater(cfg.momentum.base_tau, cfg.momentum.final_tau)
        self.last_step = 0

    @staticmethod
    def add_and_assert_specific_cfg(cfg: DictConfig) -> DictConfig:
        cfg = super(BaseMomentumMethod, BaseMomentumMethod).add_and_assert_specific_cfg(cfg)
        _section(cfg, "momentum")
        fill_options(cfg, {k: o for k, o in HOST_OPTIONS.items() if k.startswith("momentum.")})
        return cfg

    @property
    def learnable_params(self) -> list[dict[str, Any]]:
        extra = []
        if self.momentum_classifier is not None:
            extra.append(
                {
                    "name": "momentum_classifier",
                    "params": self.momentum_classifier.parameters(),
                    "lr": self.classifier_lr,
                    "weight_decay": 0,
                }
            )
        return super().learnable_params + extra

    @property
    def momentum_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        return [(self.backbone, self.momentum_backbone)]

    def on_train_start(self) -> None:
        self.last_step = 0

    @torch.no_grad()
    def momentum_forward(self, X: torch.Tensor) -> dict[str, Any]:
        return {"feats": self.momentum_backbone(self._channels_last(X))}

    def _shared_step_momentum(self, X: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        out = self.momentum_forward(X)
        if self.momentum_classifier is not None:
            logits = self.momentum_classifier(out["feats"])
            loss = F.cross_entropy(logits, targets, ignore_index=-1)
            acc1, acc5 = accuracy_at_k(logits, targets, top_k=(1, min(5, logits.size(1))))
            out.update({"logits": logits, "loss": loss, "acc1": acc1, "acc5": acc5})
        return out

    def training_step(self, batch: Sequence[Any], batch_idx: int) -> dict[str, Any]:
        outs = super().training_step(batch, batch_idx)
        _, X, targets = batch
        X = [X] if isinstance(X, torch.Tensor) else X
        moms = [self._shared_step_momentum(x, targets) for x in X[: self.num_large_crops]]
        moms = {"momentum_" + k: [o[k] for o in moms] for k in moms[0]}
        if self.momentum_classifier is not None:
            for k in ("loss", "acc1", "acc5"):
                moms[f"momentum_{k}"] = sum(moms[f"momentum_{k}"]) / self.num_large_crops
            self.log_dict(
                {
                    "train_momentum_class_loss": moms["momentum_loss"],
                    "train_momentum_acc1": moms["momentum_acc1"],
                    "train_momentum_acc5": moms["momentum_acc5"],
                },
                on_epoch=True,
                sync_dist=True,
            )
            outs["loss"] = outs["loss"] + moms["momentum_loss"]
        outs.update(moms)
        return outs

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        """EMA update after each optimiser step, then the next tau of the cosine schedule."""
        if self.trainer.global_step > self.last_step:
            for online, momentum in self.momentum_pairs:
                self.momentum_updater.update(online, momentum)
            self.log("tau", self.momentum_updater.cur_tau)
            self.momentum_updater.update_tau(
                cur_step=self.trainer.global_step,
                max_steps=self.trainer.estimated_stepping_batches,
            )
        self.last_step = self.trainer.global_step

    def validation_step(
        self, batch, batch_idx, dataloader_idx=None, update_validation_step_outputs: bool = True
    ) -> dict[str, Any]:
        metrics = super().validation_step(batch, batch_idx, update_validation_step_outputs=False)
        X, targets = batch
        out = self._shared_step_momentum(X, targets)
        if self.momentum_classifier is not None:
            metrics.update(
                {
                    "momentum_val_loss": out["loss"],
                    "momentum_val_acc1": out["acc1"],
                    "momentum_val_acc5": out["acc5"],
                }
            )
        if update_validation_step_outputs:
            self.validation_step_outputs.append(metrics)
        return metrics

    def on_validation_epoch_end(self) -> None:
        if self.momentum_classifier is not None:
            self.log_dict(self._validation_log("momentum_"), sync_dist=True)
        super().on_validation_epoch_end()
