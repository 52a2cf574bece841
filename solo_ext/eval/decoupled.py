"""The decoupled classifier stages on a frozen backbone's features: cRT, tau-normalisation and
LWS (Kang et al., "Decoupling representation and classifier for long-tailed recognition", ICLR
2020) and post-hoc logit adjustment (Menon et al., "Long-tail learning via logit adjustment",
ICLR 2021). What each stage computes, as the papers' code computes it:

- the **instance-sampled classifier**: a linear layer (with bias) trained on the features with
  every image drawn equally often (the joint classifier the other stages start from);
- ``crt`` (classifier re-training): a linear layer trained from scratch on the same features
  with class-balanced sampling;
- ``tau_norm``: the instance-sampled classifier's weight rows divided by their norm to the power
  tau, the bias left out: ``s_j = x . w_j / ||w_j||^tau``; tau is chosen on a held-out split
  (never the test split) from a grid, by the mean of the per-class accuracies;
- ``lws`` (learnable weight scaling): the instance-sampled classifier frozen, its logits
  multiplied by a learnable scale per class (started at 1), trained with class-balanced sampling;
- ``logit_adjust``: the instance-sampled classifier's logits less tau x log of the training
  prior, ``s_j = f_j(x) - tau log(n_j / N)``.

The training loops are the command's (``solo-ext-linear``); this module holds what the stages
compute and the held-out split, with nothing of Lightning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from solo_ext.eval.options import DECOUPLED_STAGES

__all__ = ["DECOUPLED_STAGES"]  # (the stages this module computes, declared with their keys)


def tau_normalised_weight(weight: torch.Tensor, tau: float) -> torch.Tensor:
    """[C, D] weight rows divided by their L2 norm to the power ``tau`` (0: unchanged, 1: unit
    rows)."""
    return weight / weight.norm(dim=1, keepdim=True).pow(tau)


def tau_norm_scores(features: torch.Tensor, weight: torch.Tensor, tau: float) -> torch.Tensor:
    """[N, C] scores of the tau-normalised classifier: no bias, as the stage defines it."""
    return features @ tau_normalised_weight(weight, tau).T


def log_prior(class_counts: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """[C] log(n_j / N) of the training split's class counts (every count > 0)."""
    counts = torch.as_tensor(class_counts, dtype=torch.float64)
    if counts.dim() != 1 or bool((counts <= 0).any()):
        raise ValueError(f"class counts {counts.tolist()}: must be a list of counts > 0")
    return (counts / counts.sum()).log()


def logit_adjusted_scores(
    logits: torch.Tensor, class_counts: Sequence[int] | torch.Tensor, tau: float = 1.0
) -> torch.Tensor:
    """[N, C] logits less ``tau`` x the log training prior (post-hoc logit adjustment)."""
    return logits - tau * log_prior(class_counts).to(logits.dtype)


def class_mean_accuracy(scores: torch.Tensor, labels: torch.Tensor, num_classes: int) -> float:
    """The mean over the classes present in ``labels`` of each class's top-1 accuracy."""
    hit = (scores.argmax(dim=1) == labels).double()
    present = torch.bincount(labels, minlength=num_classes) > 0
    per_class = torch.zeros(num_classes, dtype=torch.float64).index_add_(0, labels, hit)
    per_class = per_class[present] / torch.bincount(labels, minlength=num_classes)[present]
    return float(per_class.mean())


def tau_grid(tau_max: float, steps: int) -> list[float]:
    """``steps`` evenly spaced values from 0 to ``tau_max`` (the papers' grid: 0 to 2, 21)."""
    if steps == 1:
        return [0.0]
    return [tau_max * i / (steps - 1) for i in range(steps)]


def choose_tau(
    features: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, taus: Sequence[float]
) -> tuple[float, list[float]]:
    """The tau of ``taus`` whose tau-normalised classifier has the best mean per-class accuracy
    on the given (held-out) features, the smallest on a tie; and the accuracy of each tau."""
    num_classes = weight.size(0)
    accs = [
        class_mean_accuracy(tau_norm_scores(features, weight, t), labels, num_classes) for t in taus
    ]
    best = max(range(len(taus)), key=lambda i: (accs[i], -i))
    return float(taus[best]), accs


def held_out_split(
    labels: torch.Tensor, fraction: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (fit, held out) of a seeded split of each class's images: ``floor(fraction x
    n_j)`` of class j held out, at least one where the class has two or more, none where it has
    one (every class keeps an image to fit on)."""
    if not 0 < fraction < 1:
        raise ValueError(f"held_out_fraction={fraction!r}: must lie in (0, 1)")
    gen = torch.Generator().manual_seed(seed)
    fit, held = [], []
    for c in torch.unique(labels).tolist():
        members = torch.nonzero(labels == c).flatten()
        members = members[torch.randperm(members.numel(), generator=gen)]
        n = members.numel()
        k = 0 if n < 2 else min(n - 1, max(1, math.floor(fraction * n)))
        held.append(members[:k])
        fit.append(members[k:])
    return torch.cat(fit).sort().values, torch.cat(held).sort().values


class ScaledLinear(nn.Module):
    """LWS's classifier: a frozen linear layer whose logits are multiplied by a learnable scale
    per class, started at 1: ``s_j = f_j * (W x + b)_j``."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.linear = linear
        for p in self.linear.parameters():
            p.requires_grad_(False)
        self.scales = nn.Parameter(torch.ones(linear.out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scales
