"""``scl``: supervised contrastive learning (L_out) with a momentum encoder and a label queue.

The SCL baseline of the DSCL paper (Xuan & Zhang, AAAI 2024, eq. 1-2), MoCo-style.

One direction per step, as the published DSCL code trains: the anchors are the queries of the
first large crop, their keys come from the second one (momentum encoder), and those B keys (of
the gathered batch) are enqueued after the step. Under distributed training the in-batch
contrast set is each process's own queries and keys, as the published code's (only the enqueued
keys are gathered); ``batch_gather`` contrasts the gathered batch instead.

Its ``method_kwargs``: the class's docstring lists them, from their declarations.

The supervised family (``dscl``, ``pbsd``, ``kcl``, ``tsc``) is this step with other parts, each
method one class over ``SCL``: a ``Criterion`` (the loss of a direction, with its options) and
``StepTerm`` components that add a weighted term to the step (PBSD's distillation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from omegaconf import DictConfig

from solo_ext.config import Option
from solo_ext.host import gather
from solo_ext.losses.scl import scl_loss
from solo_ext.methods.base import QUEUE_STARTS, MomentumQueueMethod
from solo_ext.modules import LabeledQueue


class Criterion:
    """The loss of one (query view, key view) direction of the supervised queue step, as a
    part of a method: the ``method_kwargs`` it declares (``OPTIONS``), the defaults that depend
    on other keys (``fill``), the checks across keys (``check``), and the loss."""

    OPTIONS: dict[str, Option] = {}
    # the queue's random start keys carry random labels (SupCon, DSCL), or none (KCL, TSC)
    LABELLED_QUEUE_START = True

    @classmethod
    def fill(cls, cfg: DictConfig) -> None:
        """Defaults that depend on other keys."""

    @classmethod
    def check(cls, cfg: DictConfig) -> None:
        """Checks across keys (each key alone is checked against its option)."""

    def __init__(self, method: SCL):
        self.method = method

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, labels: torch.Tensor, queue: LabeledQueue
    ) -> torch.Tensor:
        raise NotImplementedError


class SupConLoss(Criterion):
    """SupCon's L_out over [k_i, in-batch keys, queue]."""

    def __call__(self, q, k, labels, queue):
        m = self.method
        return scl_loss(
            q, k, queue.keys, labels, queue.labels, m.temperature, num_classes=m.num_classes
        )


class StepTerm(torch.nn.Module):
    """A weighted loss term a method adds to the supervised step (PBSD's distillation), with
    its ``method_kwargs`` (``OPTIONS``), its checks, and what it needs from the loader."""

    OPTIONS: dict[str, Option] = {}
    NEEDS_FEATURE_MAP = False  # the step's online forward adds the backbone's last map

    @classmethod
    def fill(cls, cfg: DictConfig) -> None:
        """Defaults that depend on other keys."""

    @classmethod
    def check(cls, cfg: DictConfig) -> None:
        """Checks across keys."""

    @classmethod
    def fit_to_loader(cls, cfg: DictConfig, data_format: str) -> str | None:
        return None

    @classmethod
    def pretrain_transform(cls, cfg: DictConfig) -> Callable | None:
        return None

    def take_from_batch(self, batch: Sequence[Any], num_crops: int) -> Sequence[Any]:
        """The batch without what the term's loader transform added to the crops."""
        return batch

    def forward(self, method: SCL, out: dict[str, Any], batch: Sequence[Any]) -> dict:
        """``{name: weighted loss}`` of the step, given its outputs (per crop)."""
        raise NotImplementedError

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """State that is not a tensor of the module (a random stream)."""

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restores what ``on_save_checkpoint`` saved."""


class SCL(MomentumQueueMethod):
    LOSS_NAME = "scl"  # logged as train_<LOSS_NAME>_loss
    # with TERMS, the contrastive part's name (train_<CONTRASTIVE_NAME>_loss; LOSS_NAME: the sum)
    CONTRASTIVE_NAME: str | None = None
    CRITERION: type[Criterion] = SupConLoss
    TERMS: tuple[type[StepTerm], ...] = ()
    METHOD_KWARGS: dict[str, Option] = {
        **MomentumQueueMethod.METHOD_KWARGS,
        "symmetric": Option(
            False,
            "bool",
            help=(
                "both directions per step, as solo-learn's MoCo v2+: each view's queries "
                "against the other view's keys and a queue of that view's keys (one queue per"
                " view); false: the first crop's queries against the second crop's keys, as "
                "published"
            ),
        ),
        "queue_start": Option(
            "random",
            "str",
            choices=QUEUE_STARTS,
            help=(
                "`random`: the queue starts as random unit keys with random labels in [0, "
                "classes), all in the loss from the first step, as published; `empty`: slots "
                "left out of the loss until written"
            ),
        ),
        "batch_gather": Option(
            False,
            "bool",
            help=(
                "the in-batch contrast set is the batch gathered over all processes; false: "
                "each process's own queries and keys, as published (the same on one process)"
            ),
        ),
    }

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass's ``method_kwargs``, derived: the supervised step's, then its parts'
        (criterion, terms), unless it declares its own table."""
        if "METHOD_KWARGS" not in vars(cls):
            parts = {key: option for part in cls.parts() for key, option in part.OPTIONS.items()}
            cls.METHOD_KWARGS = {**SCL.METHOD_KWARGS, **parts}
        super().__init_subclass__(**kwargs)  # (after: the docstring lists METHOD_KWARGS)

    @classmethod
    def parts(cls) -> tuple[Any, ...]:
        return (cls.CRITERION, *cls.TERMS)

    @classmethod
    def fill_method_kwargs(cls, cfg: DictConfig) -> None:
        super().fill_method_kwargs(cfg)
        for part in cls.parts():
            part.fill(cfg)

    @classmethod
    def check_method_kwargs(cls, cfg: DictConfig) -> None:
        super().check_method_kwargs(cfg)
        for part in cls.parts():
            part.check(cfg)

    @classmethod
    def fit_to_loader(cls, cfg: DictConfig, data_format: str) -> str | None:
        notes = [term.fit_to_loader(cfg, data_format) for term in cls.TERMS]
        return "; ".join(n for n in notes if n) or None

    @classmethod
    def pretrain_transform(cls, cfg: DictConfig) -> Callable | None:
        transforms = [t for t in (term.pretrain_transform(cfg) for term in cls.TERMS) if t]
        return transforms[0] if transforms else None

    def __init__(self, cfg: DictConfig):
        super().__init__(cfg)
        self.criterion = self.CRITERION(self)
        self.terms = torch.nn.ModuleList(term(cfg) for term in self.TERMS)
        # self.queue holds the second view's keys; with symmetric, a queue of the first view's
        self.queue_view1 = self.build_queue(cfg.method_kwargs) if self.symmetric else None

    def build_queue(self, kw: DictConfig) -> LabeledQueue:
        """The labelled queue, started as ``queue_start`` says: random unit keys (with random
        labels in [0, classes) where the criterion says so), or empty slots."""
        random_labels = kw.queue_start == "random" and self.CRITERION.LABELLED_QUEUE_START
        classes = self.num_classes if random_labels else None
        return LabeledQueue(kw.queue_size, kw.proj_output_dim, num_classes=classes)

    @property
    def symmetric(self) -> bool:
        return bool(self.cfg.method_kwargs.symmetric)

    @property
    def mask_empty(self) -> bool:
        """Slots never written are left out of the loss (``queue_start: empty``)."""
        return self.cfg.method_kwargs.queue_start == "empty"

    def wants_feature_map(self, momentum: bool) -> bool:
        return not momentum and any(term.NEEDS_FEATURE_MAP for term in self.TERMS)

    def contrastive_loss(
        self, q: torch.Tensor, k: torch.Tensor, labels: torch.Tensor, queue: LabeledQueue
    ) -> torch.Tensor:
        """The method's loss for one (query view, key view) direction on the in-batch set (this
        process's batch, or the gathered one), against the queue of the key view's earlier
        keys: the criterion's."""
        return self.criterion(q, k, labels, queue)

    def training_step(self, batch: Sequence[Any], batch_idx: int) -> torch.Tensor:
        """The first crop's queries against the second crop's keys (both directions with
        ``symmetric``), plus the terms' losses, then the keys enqueued."""
        for term in self.terms:
            batch = term.take_from_batch(batch, self.num_crops)
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
        part = self.CONTRASTIVE_NAME or self.LOSS_NAME
        self.log(f"train_{part}_loss", loss, on_epoch=True, sync_dist=True)
        terms = {f"train_{part}_loss": loss}
        for term in self.terms:
            terms.update(term(self, out, batch))
        self.check_finite(terms)
        if self.terms:  # the method's own loss: its contrastive part and its terms
            total = sum(terms.values())
            self.log(f"train_{self.LOSS_NAME}_loss", total, on_epoch=True, sync_dist=True)
        # the keys of every process enter the queue (gathered once: a gathered set stays as is)
        enqueued = (lambda x: x) if self.cfg.method_kwargs.batch_gather else gather
        targets = enqueued(targets)
        self.enqueue_after_step(self.queue, enqueued(k2), targets)
        if self.symmetric:
            self.enqueue_after_step(self.queue_view1, enqueued(k1), targets)
        return sum(terms.values()) + out["loss"]

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        for term in self.terms:
            term.on_save_checkpoint(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        for term in self.terms:
            term.on_load_checkpoint(checkpoint)
