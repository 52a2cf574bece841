"""Many / Medium / Few top-1 accuracy accumulated over batches (a torchmetrics Metric, so it
syncs across processes); the streaming counterpart of ``longtail_report`` for a classifier
evaluated batch by batch, such as solo-learn's linear model."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchmetrics import Metric

from solo_ext.data.longtail import SHOT_GROUPS, shot_groups
from solo_ext.facts import FEW_THRESHOLD, MANY_THRESHOLD


class ShotGroupAccuracy(Metric):
    """Top-1 accuracy (percent) over the samples of each shot group's classes.

    Args:
        train_class_counts: training images per class, which decide the groups.
        many_threshold, few_threshold: the group boundaries (see ``solo_ext.data.longtail``).
    """

    full_state_update = False

    def __init__(
        self,
        train_class_counts: Sequence[int],
        many_threshold: int = MANY_THRESHOLD,
        few_threshold: int = FEW_THRESHOLD,
    ):
        super().__init__()
        groups = shot_groups(list(train_class_counts), many_threshold, few_threshold)
        # [3, C]: class c belongs to group g
        member = torch.tensor([[g == group for g in groups] for group in SHOT_GROUPS])
        self.register_buffer("member", member.double(), persistent=False)
        num_classes = len(groups)
        self.add_state("correct", torch.zeros(num_classes, dtype=torch.float64), "sum")
        self.add_state("total", torch.zeros(num_classes, dtype=torch.float64), "sum")

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """logits [N, C], targets [N]."""
        hit = (logits.argmax(dim=1) == targets).double()
        self.correct.index_add_(0, targets, hit)
        self.total.index_add_(0, targets, torch.ones_like(hit))

    def compute(self, prefix: str = "val_acc1_") -> dict[str, torch.Tensor]:
        """``{prefix}many`` ... (NaN for a group without a sample)."""
        member = self.member.to(self.correct.device)
        acc = 100 * (member @ self.correct) / (member @ self.total)
        return {f"{prefix}{group}": acc[i] for i, group in enumerate(SHOT_GROUPS)}


class HeadAccuracy(Metric):
    """Top-1 / top-5 accuracy (percent) of a classifier over all samples and, when the training
    class counts are known, top-1 over each shot group's samples: a one-stage method's head,
    evaluated batch by batch during validation.

    Args:
        num_classes: C.
        train_class_counts: training images per class (None: no groups, e.g. a balanced set).
        many_threshold, few_threshold: the group boundaries.
    """

    full_state_update = False

    def __init__(
        self,
        num_classes: int,
        train_class_counts: Sequence[int] | None = None,
        many_threshold: int = MANY_THRESHOLD,
        few_threshold: int = FEW_THRESHOLD,
    ):
        super().__init__()
        self.groups = None
        if train_class_counts is not None:
            if len(train_class_counts) != num_classes:
                raise ValueError(
                    f"train_class_counts has {len(train_class_counts)} classes, not {num_classes}"
                )
            self.groups = ShotGroupAccuracy(train_class_counts, many_threshold, few_threshold)
        self.add_state("top1", torch.zeros((), dtype=torch.float64), "sum")
        self.add_state("top5", torch.zeros((), dtype=torch.float64), "sum")
        self.add_state("total", torch.zeros((), dtype=torch.float64), "sum")

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """logits [N, C], targets [N]."""
        best = logits.topk(min(5, logits.size(1)), dim=1).indices
        hits = best == targets[:, None]
        self.top1 += hits[:, 0].sum().double()
        self.top5 += hits.any(dim=1).sum().double()
        self.total += targets.numel()
        if self.groups is not None:
            self.groups.update(logits, targets)

    def compute(self, prefix: str = "val_head_") -> dict[str, torch.Tensor]:
        """``{prefix}acc1``, ``{prefix}acc5`` and ``{prefix}acc1_<group>`` with the counts."""
        out = {
            f"{prefix}acc1": 100 * self.top1 / self.total,
            f"{prefix}acc5": 100 * self.top5 / self.total,
        }
        if self.groups is not None:
            out.update(self.groups.compute(prefix=f"{prefix}acc1_"))
        return out

    def reset(self) -> None:
        super().reset()
        if self.groups is not None:
            self.groups.reset()
