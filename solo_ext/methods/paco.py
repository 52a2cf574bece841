"""``paco``: parametric contrastive learning (Cui et al., ICCV 2021), and GPaCo (``gpaco: true``,
Cui et al., TPAMI 2023), one-stage: the classifier head trained with the loss is the reported
classifier (``val_head_acc1`` and its Many / Medium / Few; ``head_*`` in ``metrics.json``).

The step of the official MoCo builders (``PaCo/LT/moco/builder.py``, ``GPaCo/LT/moco/builder.py``):

- PaCo: the first crop's queries q (online encoder), the second crop's keys k (momentum
  encoder), the contrast set ``cat(q, k, queue)`` with labels ``cat(y, y, queue_labels)`` (this
  process's q and k, as the official loss runs per GPU), the anchors q with their head logits
  (a linear layer on the pooled backbone features, trained jointly, no detach) plus the log
  class prior, the loss ``solo_ext.losses.paco.paco_loss``; the gathered keys are enqueued after
  the step. The projector is the official ``--mlp`` head (Linear, BatchNorm, ReLU, Linear).
- GPaCo: no momentum encoder: both crops go through the online encoder (with gradient) and
  both are anchors, with both views' head logits; the keys enqueued are the second crop's. The
  projector is GPaCo's (Linear, ReLU, Linear, ReLU, Linear, no BatchNorm).

The queue starts as the official one: random keys normalised over the queue (rows of norm
about sqrt(dim / size), not unit vectors) with random labels, all in the loss from the first
step (``queue_start: empty`` leaves unwritten slots out instead). The head predicts from its
plain logits (the prior is added in the loss only). solo-learn's online linear classifier on
detached features still runs beside it (``val_acc1``), as for every method.

Its ``method_kwargs``: the class's docstring lists them, from their declarations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from solo_ext.config import HOST_OPTIONS, ConfigError, Option, declared
from solo_ext.facts import facts
from solo_ext.host import gather, omegaconf_select
from solo_ext.losses.paco import gpaco_loss, paco_log_prior, paco_loss
from solo_ext.methods.base import QUEUE_STARTS, MomentumQueueMethod
from solo_ext.modules import LabeledQueue, build_mlp


def training_class_counts(cfg: DictConfig, method: str) -> list[int]:
    """The run's training images per class (``data.train_class_counts``); equal counts when the
    dataset is balanced and does not carry them (solo-learn's CIFAR and ImageNet). A
    long-tailed dataset's counts are filled in before the model is built (both entry points)."""
    counts = omegaconf_select(cfg, "data.train_class_counts")
    if counts:
        return [int(c) for c in counts]
    dataset = omegaconf_select(cfg, "data.dataset")
    f = facts(dataset)
    if not f.balanced and not f.long_tailed:  # an image folder whose profile is not known
        raise ConfigError(
            f"data.dataset={dataset!r} with method={method!r}: the loss needs the training "
            "class counts, which this image folder does not give (custom_lt does)"
        )
    return [1] * int(cfg.data.num_classes)


class PaCo(MomentumQueueMethod):
    LOSS_NAME = "paco"
    JOINT_HEAD = True
    METHOD_KWARGS: dict[str, Option] = {
        **MomentumQueueMethod.METHOD_KWARGS,
        "temperature": Option(
            0.2,
            "float",
            0,
            low_open=True,
            help="of the sample logits (`--moco-t`: ImageNet-LT 0.2, CIFAR 0.05)",
        ),
        "queue_size": Option(8192, "int", 1, help="keys in the queue (with their labels)"),
        "alpha": Option(
            0.05,
            "float",
            0,
            help=(
                "weight of each same-class sample (ImageNet-LT 0.05; CIFAR-100-LT 0.01; GPaCo"
                " ImageNet-LT 0.045)"
            ),
        ),
        "beta": Option(1.0, "float", 0, help="weight of the anchor's own class centre"),
        "gamma": Option(1.0, "float", 0, help="weight of the samples in the denominator"),
        "gpaco": Option(
            False,
            "bool",
            help=(
                "GPaCo's step: no momentum encoder, both views anchors with their head "
                "logits, GPaCo's projection without BN"
            ),
        ),
        "label_smoothing": Option(
            0.0,
            "float",
            0,
            1,
            high_open=True,
            help="GPaCo's `smooth` on the centre weights (only with `gpaco`)",
        ),
        "log_prior": Option(
            True,
            "bool",
            help=(
                "log(n_c / n) of the training counts added to the head's logits in the loss, "
                "as the long-tailed runs (false: none, GPaCo's full-ImageNet run)"
            ),
        ),
        "queue_start": Option(
            "random",
            "str",
            choices=QUEUE_STARTS,
            help=(
                "`random`: keys normalised over the queue with random labels, all in the loss"
                " from the first step, the official start; `empty`: unwritten slots left out"
            ),
        ),
    }

    @classmethod
    def anchors_both_views(cls, cfg: DictConfig) -> bool:
        """GPaCo takes both views as anchors; PaCo the queries of the first."""
        return bool(cfg.method_kwargs.gpaco)

    @classmethod
    def check_method_kwargs(cls, cfg: DictConfig) -> None:
        super().check_method_kwargs(cfg)
        kw = cfg.method_kwargs
        if kw.alpha == 0 and kw.beta == 0:
            raise ConfigError(
                "method_kwargs.alpha=0 with method_kwargs.beta=0: no anchor would have a positive"
            )
        if kw.label_smoothing > 0 and not kw.gpaco:
            raise ConfigError(
                f"method_kwargs.label_smoothing={kw.label_smoothing}: GPaCo's option; set "
                "method_kwargs.gpaco=true"
            )
        if kw.gpaco and declared(cfg, "momentum.classifier", HOST_OPTIONS):
            raise ConfigError(
                "momentum.classifier=true with method_kwargs.gpaco=true: GPaCo has no momentum "
                "encoder to classify with"
            )
        training_class_counts(cfg, cfg.method)  # a dataset without counts stops here

    def __init__(self, cfg: DictConfig):
        super().__init__(cfg)
        self.head = torch.nn.Linear(self.features_dim, self.num_classes)
        counts = training_class_counts(cfg, cfg.method)
        self.register_buffer("log_prior", paco_log_prior(counts), persistent=False)

    @property
    def gpaco(self) -> bool:
        return bool(self.cfg.method_kwargs.gpaco)

    def build_projector(self, kw: DictConfig) -> torch.nn.Module:
        """PaCo's ``--mlp`` head (with BatchNorm), or GPaCo's three layers (without)."""
        if kw.gpaco:
            return build_mlp(
                self.features_dim, kw.proj_hidden_dim, kw.proj_output_dim, 3, batch_norm=False
            )
        return build_mlp(self.features_dim, kw.proj_hidden_dim, kw.proj_output_dim)

    def build_queue(self, kw: DictConfig) -> LabeledQueue:
        """The official start: keys ``normalize(randn(size, dim), dim=0)`` with random labels;
        or empty slots, left out until written."""
        if kw.queue_start == "empty":
            return LabeledQueue(kw.queue_size, kw.proj_output_dim)
        queue = LabeledQueue(kw.queue_size, kw.proj_output_dim, num_classes=self.num_classes)
        queue.keys.copy_(F.normalize(torch.randn(kw.queue_size, kw.proj_output_dim), dim=0))
        return queue

    @property
    def learnable_params(self) -> list[dict[str, Any]]:
        return super().learnable_params + [{"name": "head", "params": self.head.parameters()}]

    @property
    def momentum_pairs(self) -> list[tuple[Any, Any]]:
        """GPaCo has no momentum encoder: no EMA is updated at each step."""
        return [] if self.gpaco else super().momentum_pairs

    def head_logits(self, feats: torch.Tensor) -> torch.Tensor:
        return self.head(feats)

    @torch.no_grad()
    def momentum_forward(self, X: torch.Tensor) -> dict[str, Any]:
        """GPaCo has no momentum encoder: nothing is computed (its keys are the online
        encoder's)."""
        if self.gpaco:
            return {"feats": X.new_zeros(X.size(0), 0)}
        return super().momentum_forward(X)

    def paco_terms(
        self,
        z: Sequence[torch.Tensor],
        momentum_z: Sequence[torch.Tensor],
        feats: Sequence[torch.Tensor],
        targets: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss of one step from the crops' projections and pooled features, and the keys
        to enqueue (this process's)."""
        kw = self.cfg.method_kwargs
        queue = self.queue
        queue_keys, queue_labels = queue.keys, queue.labels
        if kw.queue_start == "empty":
            valid = queue.valid
            queue_keys, queue_labels = queue_keys[valid], queue_labels[valid]
        prior = self.log_prior if kw.log_prior else None
        common = dict(
            alpha=kw.alpha,
            beta=kw.beta,
            gamma=kw.gamma,
            temperature=self.temperature,
            num_classes=self.num_classes,
            log_prior=prior,
        )
        b = targets.size(0)
        if self.gpaco:
            q, k = z[0], z[1]
            logits = self.head(torch.cat([feats[0], feats[1]]))
            features = torch.cat([q, k, queue_keys.to(q.dtype)])
            labels = torch.cat([targets, targets, queue_labels])
            loss = gpaco_loss(
                features,
                labels,
                logits,
                batch_size=b,
                label_smoothing=kw.label_smoothing,
                **common,
            )
            return loss, k.detach()
        q, k = z[0], momentum_z[1]
        features = torch.cat([q, k, queue_keys.to(q.dtype)])
        labels = torch.cat([targets, targets, queue_labels])
        loss = paco_loss(features, labels, self.head(feats[0]), batch_size=b, **common)
        return loss, k

    def training_step(self, batch: Sequence[Any], batch_idx: int) -> torch.Tensor:
        out = super().training_step(batch, batch_idx)
        self.record_train_features(out, batch)
        targets = batch[2]
        loss, keys = self.paco_terms(out["z"], out.get("momentum_z"), out["feats"], targets)
        self.log(f"train_{self.LOSS_NAME}_loss", loss, on_epoch=True, sync_dist=True)
        self.check_finite({f"train_{self.LOSS_NAME}_loss": loss})
        self.enqueue_after_step(self.queue, gather(keys), gather(targets))
        return loss + out["loss"]
