"""Weighted kNN classification of features (Wu et al. 2018), as solo-learn's online kNN.

Pure (no config, no host): the standalone host's online kNN and solo-ext's evaluation both use it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics import Metric

DISTANCES = ("cosine", "euclidean")


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


class WeightedKNNClassifier(Metric):
    """Online kNN: accumulates train and test features during an epoch, scores at ``compute``.

    ``compute`` returns (acc@1, acc@5) in percent, like solo-learn's metric of the same name.
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

    def compute(self) -> tuple[float, float]:
        if not self.train_features or not self.test_features:
            return -1.0, -1.0
        cat = lambda xs: torch.cat(xs) if isinstance(xs, list) else xs  # noqa: E731
        train_y = cat(self.train_targets)
        test_y = cat(self.test_targets)
        num_classes = int(max(train_y.max(), test_y.max()).item()) + 1
        scores = knn_predict(
            cat(self.train_features),
            train_y,
            cat(self.test_features),
            num_classes,
            self.k,
            self.T,
            self.distance_fx,
        )
        hit1, hit5 = top1_top5_hits(scores, test_y)
        acc1 = hit1.float().mean().item() * 100
        acc5 = hit5.float().mean().item() * 100
        self.reset()
        return acc1, acc5
