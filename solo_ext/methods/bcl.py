"""``bcl``: balanced contrastive learning (Zhu et al., CVPR 2022), one-stage: the cosine classifier
trained with the loss is the reported classifier (``val_head_acc1`` and its Many / Medium / Few;
``head_*`` in ``metrics.json``).

The step of the official ``main.py`` / ``BCLModel``: three large crops of each image (the
published recipe: the first with RandAugment for the classifier, two SimCLR-style views for the
contrast) go through the backbone in one pass (each process's BatchNorm over its 3B images, the
three crops of its own B; the official forward of the concatenated views under
``nn.DataParallel`` normalises each GPU's contiguous chunk of the 3 x 256 images instead, so its
first GPU sees classifier crops only, and the recipes say so); the classifier is a cosine
classifier (``NormedLinear``,
scale 30) on the pooled features; the embeddings are an MLP (Linear, BatchNorm, ReLU, Linear)
of the features, normalised; the class prototypes are the classifier's weights through their own
MLP of the same shape, normalised. The loss (``solo_ext.losses.bcl``'s ``bcl_loss``) is
alpha x the logit-adjusted cross-entropy of the first crop's logits (the log prior of the
training counts) + beta x the balanced contrastive loss of the other two crops' embeddings and
the prototypes. No momentum encoder, no queue. The classifier predicts from its plain logits.

The official batch is one DataParallel batch, all of it in one loss: under several processes
the contrast set is the batch gathered over them (``batch_gather: true``; false: each process's
own). solo-learn's online linear classifier on detached features still runs beside it
(``val_acc1``), as for every method.

Its ``method_kwargs``: the class's docstring lists them, from their declarations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from solo_ext.config import (
    CROP_OPTIONS,
    ConfigError,
    Option,
    check_options,
    declared,
    fill_options,
)
from solo_ext.host import BaseMethod, gather, omegaconf_select
from solo_ext.losses.bcl import (
    BCLLoss,
    bcl_contrastive_loss,
    log_prior_from_counts,
    logit_adjusted_ce,
)
from solo_ext.methods.base import SoloExtMethod
from solo_ext.methods.paco import training_class_counts
from solo_ext.modules import build_mlp

# the crops of one step: the classifier's, then the two contrastive views
NUM_VIEWS = 3
# how solo-learn's main_pretrain.py counts them (it asserts two large crops): the classifier's
# crop as its "small" one, which only BCL's own step reads
SOLO_LEARN_SPLIT = (2, 1)


class CosineClassifier(nn.Module):
    """The official ``NormedLinear``: ``s * normalize(x) @ normalize(W)`` with ``W`` [in, C]
    (columns started at unit norm), s = 30."""

    def __init__(self, in_features: int, num_classes: int, scale: float = 30.0):
        super().__init__()
        weight = torch.empty(in_features, num_classes).uniform_(-1, 1)
        self.weight = nn.Parameter(weight.renorm_(2, 1, 1e-5).mul_(1e5))
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * F.normalize(x, dim=1) @ F.normalize(self.weight, dim=0)


class BCL(SoloExtMethod, BaseMethod):
    LOSS_NAME = "bcl"
    JOINT_HEAD = True
    SOLO_LEARN_CROPS = SOLO_LEARN_SPLIT
    METHOD_KWARGS: dict[str, Option] = {
        "proj_hidden_dim": Option(
            2048, "int", 1, help="the MLPs' hidden width (the features' width officially)"
        ),
        "proj_output_dim": Option(
            1024, "int", 1, help="the embeddings' and prototypes' width (`--feat_dim`)"
        ),
        "temperature": Option(
            0.07, "float", 0, low_open=True, help="of the contrastive loss (`--temp`)"
        ),
        "alpha": Option(1.0, "float", 0, help="weight of the logit-adjusted cross-entropy"),
        "beta": Option(0.35, "float", 0, help="weight of the balanced contrast"),
        "tau": Option(1.0, "float", 0, help="strength of the logit adjustment"),
        "batch_gather": Option(
            True,
            "bool",
            help=(
                "the contrast set is the batch gathered over all processes, as the official "
                "run's one DataParallel batch; false: each process's own"
            ),
        ),
    }

    @classmethod
    def anchors_both_views(cls, cfg: DictConfig) -> bool:
        """Both contrastive views are anchors of the balanced contrast."""
        return True

    @classmethod
    def add_and_assert_specific_cfg(cls, cfg: DictConfig) -> DictConfig:
        if cfg.get("method_kwargs") is None:
            cfg.method_kwargs = {}
        cfg = super().add_and_assert_specific_cfg(cfg)
        fill_options(cfg, cls.METHOD_KWARGS, "method_kwargs")
        check_options(cfg, cls.METHOD_KWARGS, "method_kwargs")
        large = omegaconf_select(cfg, "data.num_large_crops")
        small = declared(cfg, "data.num_small_crops", CROP_OPTIONS)
        if large is not None and (large, small) not in ((NUM_VIEWS, 0), SOLO_LEARN_SPLIT):
            raise ConfigError(
                f"data.num_large_crops={large}: method='bcl' takes {NUM_VIEWS} crops of one size "
                "(the classifier's, then two contrastive views; augmentations' num_crops)"
            )
        training_class_counts(cfg, cfg.method)  # a dataset without counts stops here
        return cfg

    def __init__(self, cfg: DictConfig):
        super().__init__(cfg)
        kw = cfg.method_kwargs
        self.temperature: float = kw.temperature
        self.projector = build_mlp(self.features_dim, kw.proj_hidden_dim, kw.proj_output_dim)
        self.prototype_projector = build_mlp(
            self.features_dim, kw.proj_hidden_dim, kw.proj_output_dim
        )
        self.head = CosineClassifier(self.features_dim, self.num_classes)
        counts = training_class_counts(cfg, cfg.method)
        self.register_buffer("log_prior", log_prior_from_counts(counts), persistent=False)

    @property
    def learnable_params(self) -> list[dict[str, Any]]:
        return super().learnable_params + [
            {"name": "projector", "params": self.projector.parameters()},
            {"name": "prototype_projector", "params": self.prototype_projector.parameters()},
            {"name": "head", "params": self.head.parameters()},
        ]

    def head_logits(self, feats: torch.Tensor) -> torch.Tensor:
        return self.head(feats)

    def prototypes(self) -> torch.Tensor:
        """[C, proj_output_dim]: the classifier's weights through their MLP, normalised."""
        return F.normalize(self.prototype_projector(self.head.weight.T), dim=1)

    def forward(self, X: torch.Tensor) -> dict[str, Any]:
        out = super().forward(X)
        out["z"] = F.normalize(self.projector(out["feats"]), dim=1)
        return out

    def training_step(self, batch: Sequence[Any], batch_idx: int) -> torch.Tensor:
        """The three crops in one pass, the online classifier as the host trains it (the mean
        over the crops), then BCL's loss."""
        _, X, targets = batch
        if len(X) != NUM_VIEWS:
            raise ValueError(f"got {len(X)} crops, method='bcl' takes {NUM_VIEWS}")
        b = targets.size(0)
        out = self.base_training_step(torch.cat(list(X)), targets.repeat(NUM_VIEWS))
        self.log_dict(
            {
                "train_class_loss": out["loss"],
                "train_acc1": out["acc1"],
                "train_acc5": out["acc5"],
            },
            on_epoch=True,
            sync_dist=True,
        )
        feats, z = out["feats"].split(b), out["z"].split(b)
        self.record_train_features({"feats": list(feats)}, batch, crops=NUM_VIEWS)
        if self.knn_eval:  # the host's online kNN, when the long-tail one is not used
            labels = targets.repeat(NUM_VIEWS)
            keep = labels != -1
            self.knn.update(train_features=out["feats"][keep].detach(), train_targets=labels[keep])
        kw = self.cfg.method_kwargs
        batch_set = gather if kw.batch_gather else (lambda x: x)
        # alpha x CE(first crop) + beta x BalSCL(other two), as bcl_loss adds them; the contrast
        # may take the gathered batch, the cross-entropy is each process's mean
        ce = logit_adjusted_ce(self.head(feats[0]), targets, self.log_prior, tau=kw.tau)
        views = torch.stack([batch_set(z[1]), batch_set(z[2])], dim=1)
        contrastive = bcl_contrastive_loss(
            views, self.prototypes(), batch_set(targets), temperature=self.temperature
        )
        terms = BCLLoss(kw.alpha * ce + kw.beta * contrastive, ce, contrastive)
        self.log_dict(
            {
                f"train_{self.LOSS_NAME}_loss": terms.total,
                "train_bcl_ce_loss": terms.ce,
                "train_bcl_contrastive_loss": terms.contrastive,
            },
            on_epoch=True,
            sync_dist=True,
        )
        self.check_finite({f"train_{self.LOSS_NAME}_loss": terms.total})
        return terms.total + out["loss"]
