"""``scl``: supervised contrastive learning (L_out) with a momentum encoder and a label queue.

The SCL baseline of the DSCL paper (Xuan & Zhang, AAAI 2024, eq. 1-2), MoCo-style.

Extra config (``method_kwargs``):
    proj_hidden_dim (int): projector hidden width. Default 2048.
    proj_output_dim (int): embedding dimension. Default 128.
    temperature (float): softmax temperature, > 0. Default 0.07.
    queue_size (int): number of queued keys (with their labels). Default 65536.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from solo_ext.host import gather
from solo_ext.losses.scl import scl_loss
from solo_ext.methods.base import MomentumQueueMethod


class SCL(MomentumQueueMethod):
    LOSS_NAME = "scl"  # logged as train_<LOSS_NAME>_loss

    def contrastive_loss(
        self, q: torch.Tensor, k: torch.Tensor, labels: torch.Tensor, batch: Sequence[Any]
    ) -> torch.Tensor:
        """The method's loss for one (query view, key view) direction on the gathered batch."""
        return scl_loss(
            q,
            k,
            self.queue.keys,
            labels,
            self.queue.labels,
            self.temperature,
            num_classes=self.num_classes,
        )

    def training_step(self, batch: Sequence[Any], batch_idx: int) -> torch.Tensor:
        """Symmetric loss (each large crop is the query once), then both views' keys enqueued."""
        out = super().training_step(batch, batch_idx)
        self.record_train_features(out, batch)
        targets = gather(batch[2])
        q1, q2 = (gather(z) for z in out["z"][:2])
        k1, k2 = (gather(z) for z in out["momentum_z"][:2])
        loss = (
            self.contrastive_loss(q1, k2, targets, batch)
            + self.contrastive_loss(q2, k1, targets, batch)
        ) / 2
        self.log(f"train_{self.LOSS_NAME}_loss", loss, on_epoch=True, sync_dist=True)
        terms = {f"train_{self.LOSS_NAME}_loss": loss}
        extra = self.auxiliary_loss(out, batch)
        if extra is not None:
            terms["train_auxiliary_loss"] = extra
            loss = loss + extra
        self.check_finite(terms)
        self.enqueue_after_step(self.queue, torch.cat([k1, k2]), torch.cat([targets, targets]))
        return loss + out["loss"]

    def auxiliary_loss(self, out: dict[str, Any], batch: Sequence[Any]) -> torch.Tensor | None:
        """A further weighted loss of a subclass (PBSD), given the step's outputs (per crop)."""
        return None
