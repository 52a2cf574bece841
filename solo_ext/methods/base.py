"""What solo-ext's MoCo-style methods share: config handling, the projector and its momentum copy,
queues written after the backward pass, and the long-tail online kNN.

Subclasses declare ``METHOD_KWARGS`` (every ``method_kwargs`` key as an ``Option``: default,
kind, bounds; unknown keys are rejected) and extend ``check_method_kwargs`` only for checks
across keys; they stay thin.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from solo_ext.common import announce
from solo_ext.config import (
    ConfigError,
    Option,
    check_options,
    fill_options,
    options_docstring,
    world_size,
)
from solo_ext.eval.knn_classifier import LongTailKNN
from solo_ext.eval.shot_accuracy import HeadAccuracy
from solo_ext.facts import FEW_THRESHOLD, MANY_THRESHOLD
from solo_ext.host import (
    BaseMomentumMethod,
    build_backbone,
    initialize_momentum_params,
    omegaconf_select,
)
from solo_ext.methods.schedules import SCHEDULES, check_schedule, warmup_step
from solo_ext.modules import build_mlp
from solo_ext.modules.feature_maps import feature_map, last_feature_map
from solo_ext.modules.queue import KeyQueue, LabeledQueue


def _meta_pass(
    cfg: DictConfig, size: int, what: str, hint: str = ""
) -> tuple[torch.Tensor, torch.Tensor]:
    """(last map, pooled features) of the run's backbone on images of ``size`` px, built and run
    on the meta device (shapes only, no arithmetic); a backbone without a known map stops in one
    line (ValueError naming its class), one that refuses the size in one line naming ``what``
    (then ``hint``)."""
    kwargs = dict(omegaconf_select(cfg, "backbone.kwargs") or {})
    name = cfg.backbone.name
    with torch.device("meta"):
        backbone = build_backbone(name, cfg.method, cfg.data.dataset, kwargs).eval()
        try:
            return feature_map(backbone, torch.empty(2, 3, size, size))
        except (AssertionError, RuntimeError) as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ConfigError(
                f"backbone.name={name!r} does not take the {size} px {what} of "
                f"method={cfg.method!r} ({reason}){hint}"
            ) from None


def require_spatial_map(cfg: DictConfig) -> None:
    """Stops a method that works on the backbone's last feature map (PBSD's teacher, DenseCL's
    dense term) when that map is 1x1 at the first crop size: both would degenerate silently.
    Also stops, in one line, a backbone without a known map (:mod:`solo_ext.modules.feature_maps`)
    and one that refuses the crop (a timm ViT or Swin built for another ``img_size``).

    The map is measured by a forward pass on the meta device (shapes only, no arithmetic).
    """
    augs = omegaconf_select(cfg, "augmentations")
    if not augs:
        return
    crop = augs[0].crop_size
    name = str(cfg.backbone.name)
    hint = ""
    if name.startswith(("vit", "swin")):  # timm's, built for their img_size
        hint = (
            f"; set backbone.kwargs.img_size={crop} (224 by default) or "
            "backbone.kwargs.dynamic_img_size=true"
        )
    fmap, _ = _meta_pass(cfg, crop, "crops", hint)
    if fmap.shape[-2] * fmap.shape[-1] == 1:
        stem = "or a small-image stem (backbone.kwargs.small_image_stem=true, cifar_resnet32)"
        raise ConfigError(
            f"backbone.name={name!r} on data.dataset={cfg.data.dataset!r} at "
            f"crop_size={crop}: its last feature map is 1x1, so method={cfg.method!r} has no "
            "locations to work on; use a larger crop"
            + (f" {stem}" if name.startswith("resnet") else "")
        )


def require_input_size(cfg: DictConfig, size: int, what: str) -> None:
    """Stops, in one line naming ``what``, a run whose backbone refuses ``size`` px inputs (a
    meta-device pass, as :func:`require_spatial_map`)."""
    _meta_pass(cfg, size, what)


# how a queue starts (``method_kwargs.queue_start``): random unit keys in the loss from the first
# step (with random labels for a labelled queue), as the published code; or empty slots, left out
QUEUE_STARTS = ("random", "empty")


def long_tail_knn(cfg: DictConfig) -> LongTailKNN | None:
    """The online kNN with the Many / Medium / Few split, when the run knows its class counts
    (``data.train_class_counts``, set by solo-ext-pretrain) and ``knn_eval.enabled``."""
    counts = omegaconf_select(cfg, "data.train_class_counts")
    if not counts or not cfg.knn_eval.enabled:
        return None
    return LongTailKNN(
        list(counts),
        omegaconf_select(cfg, "data.many_threshold", MANY_THRESHOLD),
        omegaconf_select(cfg, "data.few_threshold", FEW_THRESHOLD),
        k=cfg.knn_eval.k,
        distance_fx=cfg.knn_eval.distance_func,  # filled in by the host
    )


# callbacks that every solo-ext method brings where an entry point builds no Trainer of its own,
# each a function of the model (solo-learn's main_pretrain.py, through the plugin's patches: the
# per-epoch seeding that makes a resumed run the uninterrupted one)
SCRIPT_CALLBACKS: list[Callable[[Any], list[Any]]] = []


class SoloExtMethod:
    """What every solo-ext method adds to the host's base class (mixed in before it): the
    check that stops a non-finite loss, and the online evaluations.

    - The long-tail kNN (:func:`long_tail_knn`) in place of the host's kNN, fed with the large
      crops' features (``record_train_features``).
    - One-stage methods (``JOINT_HEAD``: PaCo, GPaCo, BCL, whose papers report the classifier
      head trained with their loss) also log that head's validation top-1 / top-5 as
      ``val_head_acc1`` / ``val_head_acc5`` and, on long-tailed data, its Many / Medium / Few
      top-1 as ``val_head_acc1_<group>``; they define ``head_logits``.
    """

    JOINT_HEAD = False
    # main_pretrain.py takes two large crops only (wmse and mae aside): a method with more crops
    # of one size gives the split solo-learn should count, (large, small); only its step reads it
    SOLO_LEARN_CROPS: tuple[int, int] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # the host's schedules and solo-ext's (warmup_step), which configure_optimizers runs
        cls._SCHEDULERS = list(dict.fromkeys([*cls._SCHEDULERS, *SCHEDULES]))
        # the class's docstring ends with its method_kwargs, generated from their declarations
        own = inspect.cleandoc(vars(cls).get("__doc__") or "")
        listed = options_docstring(getattr(cls, "METHOD_KWARGS", {}))
        cls.__doc__ = f"{own}\n\n{listed}" if own else listed

    @classmethod
    def add_and_assert_specific_cfg(cls, cfg: DictConfig) -> DictConfig:
        """The host's defaults and checks, then the schedule's (solo-ext's included), for
        both entry points."""
        cfg = super().add_and_assert_specific_cfg(cfg)
        check_schedule(cfg, cls._SCHEDULERS)
        return cfg

    def configure_optimizers(self):
        """The host's optimizer and schedule; solo-ext's ``warmup_step`` on the host's
        optimizer (:mod:`solo_ext.methods.schedules`), stepped once per epoch."""
        if self.scheduler != "warmup_step":
            return super().configure_optimizers()
        static = {g.get("name") for g in self.learnable_params if g.get("static_lr")}
        self.scheduler = "none"  # the host's optimizer alone (its param groups and wd split)
        try:
            optimizer = super().configure_optimizers()
        finally:
            self.scheduler = "warmup_step"
        flags = [
            str(g.get("name", "")).removesuffix("_no_decay") in static
            for g in optimizer.param_groups
        ]
        steps = list(self.cfg.scheduler.lr_decay_steps)
        schedule = warmup_step(optimizer, self.warmup_epochs, steps, flags)
        return [optimizer], [{"scheduler": schedule, "interval": "epoch", "frequency": 1}]

    @classmethod
    def anchors_both_views(cls, cfg: DictConfig) -> bool:
        """Whether a step takes the anchors of both views (the loss in both directions), as
        ``method_kwargs.symmetric`` says where the method has it."""
        return bool(omegaconf_select(cfg, "method_kwargs.symmetric"))

    @classmethod
    def fit_to_loader(cls, cfg: DictConfig, data_format: str) -> str | None:
        """Adapts the run's config to what its loader (``data.format``) can give, for both
        entry points (solo-ext-pretrain and solo-learn's main_pretrain.py), before the model is
        built; returns what it changed (said once), or None. The plugin's patches names no method:
        what a method needs from the loader is said here and in ``pretrain_transform``."""
        return None

    def configure_callbacks(self) -> list[Any]:
        """Lightning's hook: the callbacks of :data:`SCRIPT_CALLBACKS`."""
        return [cb for make in SCRIPT_CALLBACKS for cb in make(self)]

    @classmethod
    def adapt_to_loader(cls, cfg: DictConfig, data_format: str) -> None:
        """:meth:`fit_to_loader`, and what it changed said once: the one call of both entry
        points."""
        note = cls.fit_to_loader(cfg, data_format)
        if note:
            announce(note)

    @classmethod
    def pretrain_transform(cls, cfg: DictConfig) -> Any:
        """The loader transform the method asks for (PBSD's views); None: the usual crops."""
        return None

    def __init__(self, cfg: DictConfig):
        super().__init__(cfg)
        self.lt_knn = long_tail_knn(self.cfg)
        if self.lt_knn is not None:
            # one online kNN: the long-tail one logs val_knn_acc1 / acc5 (on the features the
            # host's would take) with the split; two would log the same keys, which Lightning
            # averages into a value of neither
            self.knn_eval = False
            del self.knn
        self.head_accuracy = None
        if self.JOINT_HEAD:
            counts = omegaconf_select(self.cfg, "data.train_class_counts")
            self.head_accuracy = HeadAccuracy(
                self.num_classes,
                list(counts) if counts else None,
                omegaconf_select(self.cfg, "data.many_threshold", MANY_THRESHOLD),
                omegaconf_select(self.cfg, "data.few_threshold", FEW_THRESHOLD),
            )

    def check_finite(self, terms: dict[str, torch.Tensor]) -> None:
        """Stops the run when a loss term is NaN or infinite, naming it, before the backward
        pass: no NaN reaches the weights, the queues or a checkpoint. One device sync.

        Under distributed training every process stops at the same step (the decision is
        reduced over them): one that stopped alone would leave the others waiting in the
        gradient all-reduce."""
        values = torch.stack([v.detach().float().reshape(()) for v in terms.values()])
        finite = bool(torch.isfinite(values).all())
        trainer = self._trainer  # (None: a step called outside a fit, as tests do)
        if trainer is not None:
            finite = trainer.strategy.reduce_boolean_decision(finite, all=True)
        if not finite:
            bad = ", ".join(
                f"{name}={float(v):g}" for name, v in zip(terms, values) if not v.isfinite()
            )
            raise FloatingPointError(
                f"non-finite loss at step {trainer.global_step if trainer else 0}: "
                f"{bad or 'on another process'}; stopped before anything was written (lower "
                "the lr, or use bf16 or 32-bit precision)"
            )

    def head_logits(self, feats: torch.Tensor) -> torch.Tensor:
        """A one-stage method's class scores of the backbone's pooled features (its reported
        classifier, as its paper evaluates it)."""
        raise NotImplementedError

    def record_train_features(
        self, out: dict[str, Any], batch: Sequence[Any], crops: int | None = None
    ) -> None:
        """Feeds the long-tail online kNN with the features of every large crop (or of the
        first ``crops``), as solo-learn's online kNN takes them."""
        if self.lt_knn is not None:
            crops = crops or self.num_large_crops
            labels = batch[2].repeat(crops)
            feats = torch.cat(out["feats"][:crops])
            labelled = labels != -1
            self.lt_knn.update(
                train_features=feats[labelled].detach(), train_targets=labels[labelled]
            )

    def base_validation_step(self, X: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        out = super().base_validation_step(X, targets)
        if self._trainer is None or not self.trainer.sanity_checking:
            if self.lt_knn is not None:
                self.lt_knn.update(test_features=out["feats"], test_targets=targets)
            if self.head_accuracy is not None:
                logits = self.head_logits(out["feats"]).detach().float()
                self.head_accuracy.update(logits, targets)
        return out

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if self.trainer.sanity_checking:
            if self.head_accuracy is not None:
                self.head_accuracy.reset()
            return
        if self.lt_knn is not None:
            # computed on the features of every process (the same on each), then emptied
            self.log_dict(self.lt_knn.compute(), sync_dist=True)
            self.lt_knn.reset()
        if self.head_accuracy is not None:
            self.log_dict(self.head_accuracy.compute())  # synced by the metric
            self.head_accuracy.reset()


class MomentumQueueMethod(SoloExtMethod, BaseMomentumMethod):
    """Projector + momentum projector (``z`` in the outputs) and a queue of keys."""

    METHOD_KWARGS: dict[str, Option] = {
        "proj_hidden_dim": Option(2048, "int", 1, help="the projector's hidden width"),
        "proj_output_dim": Option(128, "int", 1, help="the embedding's width"),
        "temperature": Option(0.07, "float", 0, low_open=True, help="the softmax temperature"),
        "queue_size": Option(65536, "int", 1, help="keys in the queue (with their labels)"),
    }

    def __init__(self, cfg: DictConfig):
        super().__init__(cfg)
        kw = cfg.method_kwargs
        self.temperature: float = kw.temperature
        self.projector, self.momentum_projector = (self.build_projector(kw) for _ in range(2))
        initialize_momentum_params(self.projector, self.momentum_projector)
        self.queue = self.build_queue(kw)
        self._pending: list[tuple[KeyQueue | LabeledQueue, tuple[torch.Tensor, ...]]] = []

    def build_projector(self, kw: DictConfig) -> torch.nn.Module:
        """The projector (and, called again, its momentum copy): MoCo v2's 2-layer MLP."""
        return build_mlp(
            self.features_dim, kw.proj_hidden_dim, kw.proj_output_dim, batch_norm=False
        )

    def build_queue(self, kw: DictConfig) -> KeyQueue | LabeledQueue:
        """The queue of keys and labels (a method without labels builds a KeyQueue)."""
        return LabeledQueue(kw.queue_size, kw.proj_output_dim)

    @classmethod
    def fill_method_kwargs(cls, cfg: DictConfig) -> None:
        """Defaults that depend on other keys (after ``METHOD_KWARGS``'s); subclasses add theirs."""

    @classmethod
    def check_method_kwargs(cls, cfg: DictConfig) -> None:
        """The checks that involve more than one key (each key alone is checked against its
        ``Option``); subclasses add theirs. Checks only: nothing is changed here."""
        kw = cfg.method_kwargs
        gathered = cfg.optimizer.batch_size * world_size(cfg)
        if kw.queue_size < gathered:
            raise ConfigError(
                f"method_kwargs.queue_size={kw.queue_size}: smaller than the gathered batch "
                f"({gathered} = optimizer.batch_size x processes)"
            )

    @classmethod
    def add_and_assert_specific_cfg(cls, cfg: DictConfig) -> DictConfig:
        """Parent defaults first, then this class's ``METHOD_KWARGS``: unknown keys rejected,
        defaults filled, each key checked against its option, then the checks across keys.

        A classmethod, so that a subclass only extends ``METHOD_KWARGS`` (and, where keys
        depend on each other, ``fill_method_kwargs`` / ``check_method_kwargs``).
        """
        for section in ("momentum", "method_kwargs"):  # solo-learn's base expects them to exist
            if cfg.get(section) is None:
                cfg[section] = {}
        cfg = super().add_and_assert_specific_cfg(cfg)
        fill_options(cfg, cls.METHOD_KWARGS, "method_kwargs")
        cls.fill_method_kwargs(cfg)
        check_options(cfg, cls.METHOD_KWARGS, "method_kwargs")
        cls.check_method_kwargs(cfg)
        return cfg

    @property
    def learnable_params(self) -> list[dict[str, Any]]:
        return super().learnable_params + [
            {"name": "projector", "params": self.projector.parameters()}
        ]

    @property
    def momentum_pairs(self) -> list[tuple[Any, Any]]:
        return super().momentum_pairs + [(self.projector, self.momentum_projector)]

    def wants_feature_map(self, momentum: bool) -> bool:
        """Whether a training step reads the last feature map of the online (or momentum)
        backbone: PBSD's teacher, DenseCL's dense term. Then ``forward`` (``momentum_forward``)
        adds it as ``fmap``, from the host's own pass."""
        return False

    def _tap(self, backbone: torch.nn.Module, momentum: bool) -> Any:
        wanted = self.training and self.wants_feature_map(momentum)
        return last_feature_map(backbone) if wanted else contextlib.nullcontext()

    def forward(self, X: torch.Tensor) -> dict[str, Any]:
        """The host's outputs plus the projection ``proj``, its normalisation ``z`` and, where
        the step asks for it, the backbone's last feature map ``fmap``."""
        with self._tap(self.backbone, momentum=False) as tap:
            out = super().forward(X)
        proj = self.projector(out["feats"])
        out.update(proj=proj, z=F.normalize(proj, dim=-1))
        if tap is not None:
            out["fmap"] = tap.map
        return out

    def channels_last(self, X: torch.Tensor) -> torch.Tensor:
        """``X`` in the memory format the host's forward uses (channels-last unless the run
        sets ``performance.disable_channel_last``)."""
        return X if self.no_channel_last else X.to(memory_format=torch.channels_last)

    @torch.no_grad()
    def momentum_forward(self, X: torch.Tensor) -> dict[str, Any]:
        with self._tap(self.momentum_backbone, momentum=True) as tap:
            out = super().momentum_forward(X)
        out["z"] = F.normalize(self.momentum_projector(out["feats"]), dim=-1)
        if tap is not None:
            out["fmap"] = tap.map
        return out

    def enqueue_after_step(self, queue: KeyQueue | LabeledQueue, *tensors: torch.Tensor) -> None:
        """``queue.enqueue(*tensors)`` (keys, labels, ...) in on_train_batch_end: queues are read
        by the backward pass."""
        self._pending.append((queue, tensors))

    def on_train_start(self) -> None:
        """Also on resumption: the EMA's tau of the step the run continues at (both hosts
        otherwise start again from ``base_tau`` until the first update)."""
        super().on_train_start()
        if self.trainer.global_step > 0:
            self.momentum_updater.update_tau(
                cur_step=self.trainer.global_step,
                max_steps=self.trainer.estimated_stepping_batches,
            )

    def write_queues(self) -> None:
        """Writes what the step asked to enqueue (after its backward pass)."""
        for queue, tensors in self._pending:
            queue.enqueue(*tensors)
        self._pending.clear()

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        self.write_queues()
        super().on_train_batch_end(outputs, batch, batch_idx)
