"""Weighted kNN classification of features (Wu et al. 2018), as solo-learn's online kNN.

Pure (no config, no host): the standalone host's online kNN and solo-ext's evaluation both use it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

from solo_ext.common import DISTANCES


@torch.no_grad()
def knn_predict(
    train_feats: torch.Tensor,
    train_labels: torch.Tensor,
    test_feats: torch.Tensor,
    num_classes: int,
    k: int = 20,
    temperature: float = 0.07,
    distance: str = "cosine",
    chunk_size: int = 1024,
) -> torch.Tensor:
    """Class scores [M, C] of test features by a similarity-weighted vote of k neighbours.

    Args:
        train_feats: [N, D] bank features; train_labels: [N] their labels in [0, C).
        test_feats: [M, D] features to classify.
        k: neighbours (capped at N); temperature: for the cosine weights exp(s / T).
        distance: ``cosine`` (weights exp(cos / T)) or ``euclidean`` (weights 1 / (d + eps)).
    """
    if distance not in DISTANCES:
        raise ValueError(f"distance={distance!r}: must be one of {DISTANCES}")
    train_feats, test_feats = train_feats.float(), test_feats.float()
    if distance == "cosine":
        train_feats = F.normalize(train_feats, dim=1)
        test_feats = F.normalize(test_feats, dim=1)
    k = min(k, train_feats.size(0))
    scores = []
    for chunk in test_feats.split(chunk_size):
        if distance == "cosine":
            sim, idx = (chunk @ train_feats.T).topk(k, dim=1)
            weight = (sim / temperature).exp()
        else:
            dist, idx = torch.cdist(chunk, train_feats).topk(k, dim=1, largest=False)
            weight = 1.0 / (dist + 1e-7)
        votes = torch.zeros(chunk.size(0), num_classes, device=chunk.device)
        votes.scatter_add_(1, train_labels[idx], weight)
        scores.append(votes)
    return torch.cat(scores)


def top1_top5_hits(scores: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample of class scores [N, C] and labels [N]: whether the top-scored class is the
    label, and whether the label is among the 5 top-scored (all C when fewer): bool [N] each."""
    top = scores.topk(min(5, scores.size(1)), dim=1).indices
    hit = top.eq(labels[:, None])
    return hit[:, 0], hit.any(dim=1)


def state_tensor(state: list[torch.Tensor] | torch.Tensor) -> torch.Tensor | None:
    """A ``cat`` list state as one tensor, None when it holds nothing.

    torchmetrics keeps such a state as a list of tensors on one process and as one tensor once
    it has been synced across processes (``compute`` under DDP): both are read here.
    """
    if isinstance(state, list | tuple) and len(state) == 0:
        return None
    state = dim_zero_cat(state)
    return state if state.numel() else None


class WeightedKNNClassifier(Metric):
    """Online kNN: accumulates train and test features during an epoch, scores at ``compute``.

    ``compute`` returns (acc@1, acc@5) in percent, like solo-learn's metric of the same name,
    (-1, -1) before both kinds of features have been seen. Under distributed training it scores
    the features of all processes (torchmetrics syncs the states first), so two processes that
    split the features give what one process given all of them gives. It does not reset: the
    caller does (``reset()``), after every process has computed.
    """

    full_state_update = False

    def __init__(self, k: int = 20, T: float = 0.07, distance_fx: str = "cosine"):
        super().__init__(dist_sync_on_step=False)
        if distance_fx not in DISTANCES:
            raise ValueError(f"distance_fx={distance_fx!r}: must be one of {DISTANCES}")
        self.k, self.T, self.distance_fx = k, T, distance_fx
        for name in ("train_features", "train_targets", "test_features", "test_targets"):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(
        self, train_features=None, train_targets=None, test_features=None, test_targets=None
    ) -> None:
        if train_features is not None:
            self.train_features.append(train_features.detach())
            self.train_targets.append(train_targets.detach())
        if test_features is not None:
            self.test_features.append(test_features.detach())
            self.test_targets.append(test_targets.detach())

    def scores(self, num_classes: int | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(class scores [M, C] of the test features, their labels [M]); None while the train
        or test features are missing. ``num_classes``: C (default: the largest label + 1)."""
        train_x, test_x = state_tensor(self.train_features), state_tensor(self.test_features)
        if train_x is None or test_x is None:
            return None
        train_y, test_y = dim_zero_cat(self.train_targets), dim_zero_cat(self.test_targets)
        if num_classes is None:
            num_classes = int(max(train_y.max(), test_y.max()).item()) + 1
        scores = knn_predict(
            train_x, train_y, test_x, num_classes, self.k, self.T, self.distance_fx
        )
        return scores, test_y

    def compute(self) -> tuple[float, float]:
        scored = self.scores()
        if scored is None:
            return -1.0, -1.0
        hit1, hit5 = top1_top5_hits(*scored)
        return hit1.float().mean().item() * 100, hit5.float().mean().item() * 100
