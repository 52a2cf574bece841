"""All4One's three objectives (Estepa et al., ICCV 2023) as pure functions.

    L = sigma * L_neighbour + kappa * L_centroid + eta * L_feature

- **Neighbour contrast** (NNCLR): InfoNCE between the nearest support-set neighbour of one view's
  momentum projection and the other view's prediction; the other predictions of the (gathered)
  batch are the negatives.
- **Centroid contrast**: InfoNCE between two centroids from the centroid transformer: one built
  from the k nearest neighbours of a view, the other from the *shifted* sequence of the other
  view, whose centroid-predictor output is put first and whose last neighbour drops out
  (:func:`shift_in`).
- **Feature contrast** (redundancy reduction): the cross-correlation of the momentum and online
  projections of opposite views, each column normalised over the batch; the root mean square of
  (1 - diagonal) and of the off-diagonal, averaged over both directions, then averaged.

Upstream's total is 0.5 L_neighbour + 0.5 L_centroid + 0.5 * 10 * L_feature, i.e. sigma = kappa
= 0.5 and eta = 5, with the centroid InfoNCE at a fixed temperature of 0.1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F


class All4OneTerms(NamedTuple):
    """The weighted total and its three unweighted terms."""

    total: torch.Tensor
    neighbour: torch.Tensor
    centroid: torch.Tensor
    feature: torch.Tensor


def batch_info_nce(
    anchors: torch.Tensor, candidates: torch.Tensor, temperature: float, offset: int = 0
) -> torch.Tensor:
    """Mean over anchors i [B, D] of -log softmax_j(a_i . c_j / t) at j = offset + i.

    Both sides are L2-normalised; ``candidates`` [N, D] is the gathered batch and ``offset`` the
    position of this process's rows in it (rank x B), as in NNCLR.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature}: must be > 0")
    with torch.autocast(device_type=anchors.device.type, enabled=False):
        a = F.normalize(anchors.float(), dim=-1)
        c = F.normalize(candidates.float(), dim=-1)
        target = torch.arange(offset, offset + a.size(0), device=a.device)
        return F.cross_entropy(a @ c.T / temperature, target)


def shift_in(first: torch.Tensor, neighbours: torch.Tensor, k: int) -> torch.Tensor:
    """The shift operation: ``first`` [B, D] becomes token 0, followed by the nearest k - 1 of
    ``neighbours`` [B, >=k-1, D]; returns [B, k, D]."""
    return torch.cat([first.unsqueeze(1), neighbours[:, : k - 1]], dim=1)


def redundancy_reduction(
    momentum: tuple[torch.Tensor, torch.Tensor], online: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """The feature term on views (1, 2): correlations momentum_1 x online_2 and momentum_2 x
    online_1 of the batch-normalised columns [B, D] -> [D, D];
    0.5 * sqrt(mean over directions of mean (c_dd - 1)^2)
    + 0.5 * sqrt(mean over directions of mean c_de^2, d != e)."""
    with torch.autocast(device_type=online[0].device.type, enabled=False):
        on_diag, off_diag = [], []
        for m, o in ((momentum[0], online[1]), (momentum[1], online[0])):
            corr = F.normalize(m.float(), dim=0).T @ F.normalize(o.float(), dim=0)
            diag = corr.diagonal()
            on_diag.append((diag - 1).pow(2).mean())
            # the sum of squared off-diagonal entries without materialising a mask
            d = corr.size(0)
            off_diag.append((corr.pow(2).sum() - diag.pow(2).sum()) / (d * d - d))
        on = (sum(on_diag) / 2).sqrt()
        off = (sum(off_diag) / 2).sqrt()
    return 0.5 * on + 0.5 * off


def all4one_loss(
    neighbour: torch.Tensor,
    centroid: torch.Tensor,
    feature: torch.Tensor,
    sigma: float = 0.5,
    kappa: float = 0.5,
    eta: float = 5.0,
) -> All4OneTerms:
    """The weighted sum of the three (already symmetrised) terms."""
    total = sigma * neighbour + kappa * centroid + eta * feature
    return All4OneTerms(total, neighbour, centroid, feature)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


Pair = tuple[torch.Tensor, torch.Tensor]


def all4one_objective(
    p: Pair,
    p_centroid: Pair,
    proj: Pair,
    momentum_z: Pair,
    neighbours: Pair,
    centroid_fn: Callable[[torch.Tensor], torch.Tensor],
    k: int,
    temperature: float,
    centroid_temperature: float,
    sigma: float = 0.5,
    kappa: float = 0.5,
    eta: float = 5.0,
    gather: Callable[[torch.Tensor], torch.Tensor] = _identity,
    offset: int = 0,
    gather_feature: bool = False,
) -> All4OneTerms:
    """The loss of one step, both views (each argument is a (view 1, view 2) pair of [B, ...]).

    Args:
        p, p_centroid: the two predictors' outputs; proj: the raw online projections;
        momentum_z: the normalised momentum projections; neighbours: each view's k nearest
        support-set keys [B, >=k, D], nearest first.
        centroid_fn: sequences [N, k, D] -> centroids [N, D] (the centroid transformer).
        gather, offset: the all-gather of the batch (with gradients) and this process's first
            row in it; the InfoNCE candidates use the gathered batch.
        gather_feature: the feature term on the gathered batch too; by default on this
            process's own batch, as the published code computes it (the same on one process).
    """
    b = p[0].size(0)
    nn1, nn2 = neighbours
    neighbour = (
        batch_info_nce(nn1[:, 0], gather(p[1]), temperature, offset)
        + batch_info_nce(nn2[:, 0], gather(p[0]), temperature, offset)
    ) / 2
    # one transformer call: the neighbours of views 1 and 2, then their shifted sequences
    sequences = torch.cat(
        [nn1[:, :k], nn2[:, :k], shift_in(p_centroid[0], nn1, k), shift_in(p_centroid[1], nn2, k)]
    )
    rich1, rich2, shifted1, shifted2 = centroid_fn(sequences).split(b)
    centroid = (
        batch_info_nce(rich1, gather(shifted2), centroid_temperature, offset)
        + batch_info_nce(rich2, gather(shifted1), centroid_temperature, offset)
    ) / 2
    batch = gather if gather_feature else _identity
    feature = redundancy_reduction(
        (batch(momentum_z[0]), batch(momentum_z[1])), (batch(proj[0]), batch(proj[1]))
    )
    return all4one_loss(neighbour, centroid, feature, sigma, kappa, eta)
