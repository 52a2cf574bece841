"""``scl``: supervised contrastive learning (L_out) with a momentum encoder and a label queue.

The SCL baseline of the DSCL paper (Xuan & Zhang, AAAI 2024, eq. 1-2), MoCo-style.

Extra config (``method_kwargs``):
    proj_hidden_dim (int): projector hidden width. Default 2048.
    proj_output_dim (int): embedding dimension. Default 128.
    temperature (float): softmax temperature, > 0. Default 0.07.
    queue_size (int): number of queued keys, >= the keys enqueued per step. Default 65536.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from solo_ext.config import check_range, fill_section
from solo_ext.eval.knn_classifier import LongTailKNN
from solo_ext.host import BaseMomentumMethod, gather, initialize_momentum_params, omegaconf_select
from solo_ext.losses.scl import scl_loss
from solo_ext.modules import LabeledQueue, build_mlp


def long_tail_knn(cfg: DictConfig) -> LongTailKNN | None:
    """The online kNN with the Many / Medium / Few split, when the run knows its class counts
    (``data.train_class_counts``, set by solo-ext-pretrain) and ``knn_eval.enabled``."""
    counts = omegaconf_select(cfg, "data.train_class_counts")
    if not counts or not cfg.knn_eval.enabled:
        return None
    return LongTailKNN(
        list(counts),
        omegaconf_select(cfg, "data.many_threshold", 100),
        omegaconf_select(cfg, "data.few_threshold", 20),
        k=cfg.knn_eval.k,
        distance_fx=omegaconf_select(cfg, "knn_eval.distance_func", "cosine"),
    )


class SCL(BaseMomentumMethod):
    LOSS_NAME = "scl"  # logged as train_<LOSS_NAME>_loss
    METHOD_KWARGS: dict[str, Any] = {
        "proj_hidden_dim": 2048,
        "proj_output_dim": 128,
        "temperature": 0.07,
        "queue_size": 65536,
    }

    def __init__(self, cfg: DictConfig):
        super().__init__(cfg)
        kw = cfg.method_kwargs
        self.temperature: float = kw.temperature
        self.projector = build_mlp(
            self.features_dim, kw.proj_hidden_dim, kw.proj_output_dim, batch_norm=False
        )
        self.momentum_projector = build_mlp(
            self.features_dim, kw.proj_hidden_dim, kw.proj_output_dim, batch_norm=False
        )
        initialize_momentum_params(self.projector, self.momentum_projector)
        self.queue = LabeledQueue(kw.queue_size, kw.proj_output_dim)
        self._pending_keys: tuple[torch.Tensor, torch.Tensor] | None = None
        self.lt_knn = long_tail_knn(cfg)

    @classmethod
    def check_method_kwargs(cls, cfg: DictConfig) -> None:
        """Range checks of the keys of ``METHOD_KWARGS``; subclasses add theirs."""
        kw = cfg.method_kwargs
        check_range("method_kwargs.temperature", kw.temperature, 0, low_open=True)
        for key in ("proj_hidden_dim", "proj_output_dim", "queue_size"):
            check_range(f"method_kwargs.{key}", kw[key], 1)

    @classmethod
    def add_and_assert_specific_cfg(cls, cfg: DictConfig) -> DictConfig:
        """Parent defaults first, then this class's ``METHOD_KWARGS`` (unknown keys rejected).

        A classmethod, so that a subclass only extends ``METHOD_KWARGS`` and
        ``check_method_kwargs``.
        """
        for section in ("momentum", "method_kwargs"):  # solo-learn's base expects them to exist
            if cfg.get(section) is None:
                cfg[section] = {}
        cfg = super().add_and_assert_specific_cfg(cfg)
        fill_section(cfg, "method_kwargs", cls.METHOD_KWARGS)
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

    def forward(self, X: torch.Tensor) -> dict[str, Any]:
        out = super().forward(X)
        out["z"] = F.normalize(self.projector(out["feats"]), dim=-1)
        return out

    @torch.no_grad()
    def momentum_forward(self, X: torch.Tensor) -> dict[str, Any]:
        out = super().momentum_forward(X)
        out["z"] = F.normalize(self.momentum_projector(out["feats"]), dim=-1)
        return out

    def contrastive_loss(
        self, q: torch.Tensor, k: torch.Tensor, labels: torch.Tensor, batch: Sequence[Any]
    ) -> torch.Tensor:
        """The method's loss for one (query view, key view) direction on the gathered batch."""
        return scl_loss(q, k, self.queue.keys, labels, self.queue.labels, self.temperature)

    def training_step(self, batch: Sequence[Any], batch_idx: int) -> torch.Tensor:
        """Symmetric loss (each large crop is the query once), then both views' keys enqueued."""
        out = super().training_step(batch, batch_idx)
        if self.lt_knn is not None:
            labelled = batch[2] != -1
            self.lt_knn(train_features=out["feats"][0][labelled], train_targets=batch[2][labelled])
        targets = gather(batch[2])
        q1, q2 = (gather(z) for z in out["z"][:2])
        k1, k2 = (gather(z) for z in out["momentum_z"][:2])
        loss = (
            self.contrastive_loss(q1, k2, targets, batch)
            + self.contrastive_loss(q2, k1, targets, batch)
        ) / 2
        self.log(f"train_{self.LOSS_NAME}_loss", loss, on_epoch=True, sync_dist=True)
        extra = self.auxiliary_loss(out, batch)
        if extra is not None:
            loss = loss + extra
        # the queue is read by the backward pass: it is written after it, in on_train_batch_end
        self._pending_keys = (torch.cat([k1, k2]), torch.cat([targets, targets]))
        return loss + out["loss"]

    def auxiliary_loss(self, out: dict[str, Any], batch: Sequence[Any]) -> torch.Tensor | None:
        """A further weighted loss of a subclass (PBSD), given the step's outputs (per crop)."""
        return None

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if self._pending_keys is not None:
            self.queue.enqueue(*self._pending_keys)
            self._pending_keys = None
        super().on_train_batch_end(outputs, batch, batch_idx)

    def base_validation_step(self, X: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        out = super().base_validation_step(X, targets)
        if self.lt_knn is not None and not self.trainer.sanity_checking:
            self.lt_knn(test_features=out["feats"], test_targets=targets)
        return out

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if self.lt_knn is not None and not self.trainer.sanity_checking:
            self.log_dict(self.lt_knn.compute_report(), sync_dist=True)
