"""``scl``: supervised contrastive learning (L_out) with a momentum encoder and a label queue.

The SCL baseline of the DSCL paper (Xuan & Zhang, AAAI 2024, eq. 1-2), MoCo-style.

One direction per step, as the published DSCL code trains: the anchors are the queries of the
first large crop, their keys come from the second one (momentum encoder), and those B keys (of
the gathered batch) are enqueued after the step. Under distributed training the in-batch
contrast set is each process's own queries and keys, as the published code's (only the enqueued
keys are gathered); ``batch_gather`` contrasts the gathered batch instead.

Extra config (``method_kwargs``):
    proj_hidden_dim (int): projector hidden width. Default 2048.
    proj_output_dim (int): embedding dimension. Default 128.
    temperature (float): softmax temperature, > 0. Default 0.07.
    queue_size (int): number of queued keys (with their labels). Default 65536.
    symmetric (bool): both directions per step, as solo-learn's MoCo v2+ runs them: each view's
        queries against the other view's keys and a queue of the other view's keys (one queue
        per view, so no image is twice in a queue). Default False.
    batch_gather (bool): the in-batch contrast set (anchors, their keys and the other
        positives and negatives of the batch) is the batch gathered over all processes; by
        default each process's own, as the published code. The same on one process.
    queue_start (str): ``random``: the queue starts as random unit keys with random labels in
        [0, classes), all of them in the loss from the first step, as the published code;
        ``empty``: slots are left out of the loss until written. Default ``random``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from omegaconf import DictConfig

from solo_ext.config import Option
from solo_ext.host import gather
from solo_ext.losses.scl import scl_loss
from solo_ext.methods.base import QUEUE_STARTS, MomentumQueueMethod
from solo_ext.modules import LabeledQueue


class SCL(MomentumQueueMethod):
    LOSS_NAME = "scl"  # logged as train_<LOSS_NAME>_loss
    METHOD_KWARGS: dict[str, Option] = {
        **MomentumQueueMethod.METHOD_KWARGS,
        "symmetric": Option(False, "bool"),
        "queue_start": Option("random", "str", choices=QUEUE_STARTS),
        "batch_gather": Option(False, "bool"),
    }

    def __init__(self, cfg: DictConfig):
        super().__init__(cfg)
        # self.queue holds the second view's keys; with symmetric, a queue of the first view's
        self.queue_view1 = self.build_queue(cfg.method_kwargs) if self.symmetric else None

    def build_queue(self, kw: DictConfig) -> LabeledQueue:
        """The labelled queue, started as ``queue_start`` says."""
        classes = self.num_classes if kw.queue_start == "random" else None
        return LabeledQueue(kw.queue_size, kw.proj_output_dim, num_classes=classes)

    @property
    def symmetric(self) -> bool:
        return bool(self.cfg.method_kwargs.symmetric)

    def contrastive_loss(
        self, q: torch.Tensor, k: torch.Tensor, labels: torch.Tensor, queue: LabeledQueue
    ) -> torch.Tensor:
        """The method's loss for one (query view, key view) direction on the in-batch set (this
        process's batch, or the gathered one), against the queue of the key view's earlier
        keys."""
        return scl_loss(
            q, k, queue.keys, labels, queue.labels, self.temperature, num_classes=self.num_classes
        )

    def training_step(self, batch: Sequence[Any], batch_idx: int) -> torch.Tensor:
        """The first crop's queries against the second crop's keys (both directions with
        ``symmetric``), then the keys enqueued."""
        out = super().training_step(batch, batch_idx)
        self.record_train_features(out, batch)
        # the in-batch set: this process's batch (published), or the gathered one
        batch_set = gather if self.cfg.method_kwargs.batch_gather else (lambda x: x)
        targets = batch_set(batch[2])
        q1, k2 = batch_set(out["z"][0]), batch_set(out["momentum_z"][1])
        loss = self.contrastive_loss(q1, k2, targets, self.queue)
        if self.symmetric:
            q2, k1 = batch_set(out["z"][1]), batch_set(out["momentum_z"][0])
            loss = (loss + self.contrastive_loss(q2, k1, targets, self.queue_view1)) / 2
        self.log(f"train_{self.LOSS_NAME}_loss", loss, on_epoch=True, sync_dist=True)
        terms = {f"train_{self.LOSS_NAME}_loss": loss}
        extra = self.auxiliary_loss(out, batch)
        if extra is not None:
            terms["train_auxiliary_loss"] = extra
            loss = loss + extra
        self.check_finite(terms)
        # the keys of every process enter the queue (gathered once: a gathered set stays as is)
        enqueued = (lambda x: x) if self.cfg.method_kwargs.batch_gather else gather
        targets = enqueued(targets)
        self.enqueue_after_step(self.queue, enqueued(k2), targets)
        if self.symmetric:
            self.enqueue_after_step(self.queue_view1, enqueued(k1), targets)
        return loss + out["loss"]

    def auxiliary_loss(self, out: dict[str, Any], batch: Sequence[Any]) -> torch.Tensor | None:
        """A further weighted loss of a subclass (PBSD), given the step's outputs (per crop)."""
        return None
