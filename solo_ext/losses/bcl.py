"""Balanced contrastive learning (Zhu et al., CVPR 2022): the BalSCL loss and the logit-adjusted CE.

The official code is github.com/FlamieZhu/Balanced-Contrastive-Learning (``loss/contrastive.py``
``BalSCL``, ``loss/logitadjust.py`` ``LogitAdjust``, ``models/resnext.py`` ``BCLModel``,
``main.py``); these functions compute what it computes, on any device.

**Balanced supervised contrast.** A batch of B images with labels y, two contrastive views each,
gives 2B normalised embeddings z (view-major: view 0 of every image, then view 1) and C
normalised class prototypes w_0 .. w_{C-1} (class-complement: every class is present in every
batch). The columns are the 2B embeddings and the C prototypes, w_k labelled k. For class k let

    A_k = {columns of class k}                   |A_k| = 2 n_k + 1  (n_k: images of k in the batch)

and for anchor i (each of the 2B embeddings; prototypes are never anchors) of class c = y_i

    P_i = A_c \\ {z_i}                             (other view, same-class images, w_c: 2 n_c)
    L_i = -1/|P_i| sum_{p in P_i} log( exp(z_i . p / t) / D_i )
    D_i = sum_k 1/|A_k \\ {z_i}| sum_{a in A_k \\ {z_i}} exp(z_i . a / t)

so each class enters the denominator once, as the mean of its members (class-averaging),
whatever its count in the batch; an absent class enters through its prototype alone
(|A_k| = 1). The loss is the mean of L_i over the 2B anchors. In the official code the counts
are ``batch_cls_count`` (class counts over the 2B labels and the C prototype labels), the
per-column divisor is ``per_ins_weight = batch_cls_count[label of column] - mask`` (the anchor's
own class loses the anchor itself), ``logits_mask`` removes z_i . z_i, and the row maximum it
subtracts cancels exactly (here a logsumexp).

**Prototypes** (``BCLModel.forward``): ``centers_logits = F.normalize(head_fc(fc.weight.T))``:
the cosine classifier's raw weights (``NormedLinear``, stored [2048, C], scale 30) go through
their own MLP ``head_fc`` (Linear 2048-2048, BatchNorm1d over the C classes, ReLU, Linear
2048-feat_dim), separate from the embedding head ``head`` of the same shape, and are
L2-normalised; the loss reaches the classifier weights through them (nothing is detached).

**Logit-adjusted CE** (``LogitAdjust``, Menon et al.): CE(x + tau * log pi, y) with
pi_k = n_k / sum_j n_j the training-set class frequencies (``cls_num_list``), tau = 1.

**Combination** (``main.py`` ``train``): the 3B images of one batch go through the model in one
forward pass; the logits of view 0 (RandAugment view) feed the CE, the embeddings of views 1
and 2 feed BalSCL: loss = alpha * CE + beta * BalSCL.

**Official defaults** (``main.py`` argparse, for ImageNet-LT; the repository has no CIFAR
script): ``--temp`` 0.07 (``BalSCL``'s own default is 0.1), ``--alpha`` 1.0, ``--beta`` 0.35,
``--feat_dim`` 1024, ``-b`` 256 (one DataParallel batch: the loss sees all 256), ``--epochs``
90, ``--lr`` 0.1, ``--wd`` 5e-4, ``--momentum`` 0.9, ``--cos`` True, ``--warmup_epochs`` 0,
``--use_norm`` True, ``--randaug_n`` 2, ``--randaug_m`` 10, ``LogitAdjust`` ``tau`` 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F


def _check_labels(labels: torch.Tensor, size: int, num_classes: int, name: str = "labels") -> None:
    """Shape and dtype always; the range only on the CPU (elsewhere it would cost a sync)."""
    if labels.dim() != 1 or labels.size(0) != size:
        raise ValueError(f"{name} shape {tuple(labels.shape)}: must be [{size}]")
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"{name} dtype {labels.dtype}: must be an integer dtype")
    if labels.device.type == "cpu" and size > 0:
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= num_classes:
            raise ValueError(f"{name} range [{low}, {high}]: must lie in [0, {num_classes})")


def _check_reduction(reduction: str) -> None:
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction={reduction!r}: must be 'mean' or 'none'")


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float32, or float64 when an input is float64 (half precision is promoted)."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def bcl_contrastive_loss(
    features: torch.Tensor,
    prototypes: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 0.07,
    reduction: Literal["mean", "none"] = "mean",
) -> torch.Tensor:
    """The balanced supervised contrastive loss (BalSCL; module docstring).

    Args:
        features: [B, 2, D] L2-normalised embeddings of two views of B images (the official
            layout: ``features[:, v]`` is view v). Not normalised here.
        prototypes: [C, D] L2-normalised class prototypes; row k is class k, and C is the
            number of classes (the official ``len(cls_num_list)``).
        labels: [B] integer labels in [0, C). The range is checked on the CPU only.
        temperature: t > 0. Similarities and the softmax are in float32 (float64 inputs stay
            float64), with autocast off.
        reduction: ``"mean"``: the mean over the 2B anchors (the official value); ``"none"``:
            [2, B], row v holding the losses of the view-v anchors.

    Returns:
        A scalar, or [2, B] with ``reduction="none"``.
    """
    if features.dim() != 3 or features.size(1) != 2:
        raise ValueError(f"features shape {tuple(features.shape)}: must be [B, 2, D]")
    if prototypes.dim() != 2 or prototypes.size(1) != features.size(2):
        raise ValueError(
            f"prototypes shape {tuple(prototypes.shape)}: must be [C, {features.size(2)}]"
        )
    if prototypes.size(0) == 0:
        raise ValueError("prototypes shape (0, D): needs at least one class")
    if features.size(0) == 0:
        raise ValueError(f"features shape {tuple(features.shape)}: the batch is empty")
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not (0 < temperature < math.inf)
    ):
        raise ValueError(f"temperature={temperature!r}: must be a finite number > 0")
    _check_reduction(reduction)
    b, c = features.size(0), prototypes.size(0)
    _check_labels(labels, b, c)

    device = features.device
    with torch.autocast(device_type=device.type, enabled=False):
        dtype = _compute_dtype(features, prototypes)
        anchors = features.to(dtype).transpose(0, 1).reshape(2 * b, -1)  # view-major
        columns = torch.cat([anchors, prototypes.to(device=device, dtype=dtype)])
        logits = anchors @ columns.T / temperature  # [2B, 2B + C]

        labels = labels.to(device)
        anchor_labels = labels.repeat(2)
        column_labels = torch.cat([anchor_labels, torch.arange(c, device=device)])
        # |A_k| = 2 n_k + 1 without a device sync
        class_size = torch.ones(c, dtype=dtype, device=device).index_add(
            0, labels, torch.full((b,), 2.0, dtype=dtype, device=device)
        )
        rows = torch.arange(2 * b, device=device)
        is_self = torch.zeros(2 * b, 2 * b + c, dtype=torch.bool, device=device)
        is_self[rows, rows] = True
        positive = (anchor_labels[:, None] == column_labels[None, :]) & ~is_self
        # the divisor of column j in anchor i's denominator: |A_k|, less one in the own class
        divisor = class_size[column_labels][None, :] - positive.to(dtype)
        log_denominator = (logits - divisor.log()).masked_fill(is_self, -math.inf).logsumexp(1)
        num_positive = class_size[anchor_labels] - 1  # |P_i| = 2 n_c >= 2
        mean_positive = logits.masked_fill(~positive, 0.0).sum(dim=1) / num_positive
        loss = log_denominator - mean_positive
    if reduction == "none":
        return loss.view(2, b)
    return loss.mean()


def log_prior_from_counts(class_counts: torch.Tensor | Sequence[float]) -> torch.Tensor:
    """log(n_k / sum_j n_j) in float32, from [C] training-set class counts (``cls_num_list``).

    Every count must be > 0 (a zero gives -inf, and 0 * -inf = NaN for tau = 0).
    """
    counts = torch.as_tensor(class_counts)
    if counts.dim() != 1 or counts.numel() == 0:
        raise ValueError(f"class_counts shape {tuple(counts.shape)}: must be [C], C >= 1")
    counts = counts.to(torch.float32)
    if not bool(torch.isfinite(counts).all()) or bool((counts <= 0).any()):
        raise ValueError(f"class_counts min {counts.min().item()}: all must be finite and > 0")
    return torch.log(counts / counts.sum())


def logit_adjusted_ce(
    logits: torch.Tensor,
    labels: torch.Tensor,
    log_prior: torch.Tensor | Sequence[float],
    *,
    tau: float = 1.0,
    reduction: Literal["mean", "none"] = "mean",
) -> torch.Tensor:
    """Cross-entropy of logits + tau * log_prior (the official ``LogitAdjust``).

    Args:
        logits: [B, C] classifier logits (the official cosine classifier's, scale 30).
        labels: [B] integer labels in [0, C). The range is checked on the CPU only.
        log_prior: [C] log class priors, e.g. :func:`log_prior_from_counts`; a constant shift
            changes nothing. Moved to the logits' device.
        tau: the adjustment strength >= 0 (official 1; 0 is plain CE).
        reduction: ``"mean"`` (official) or ``"none"`` ([B]).

    The sum and the CE are in float32 (float64 inputs stay float64), with autocast off.
    """
    if logits.dim() != 2 or logits.size(1) == 0:
        raise ValueError(f"logits shape {tuple(logits.shape)}: must be [B, C], C >= 1")
    log_prior = torch.as_tensor(log_prior)
    if log_prior.shape != (logits.size(1),):
        raise ValueError(f"log_prior shape {tuple(log_prior.shape)}: must be [{logits.size(1)}]")
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not (0 <= tau < math.inf):
        raise ValueError(f"tau={tau!r}: must be a finite number >= 0")
    _check_reduction(reduction)
    _check_labels(labels, logits.size(0), logits.size(1))
    with torch.autocast(device_type=logits.device.type, enabled=False):
        dtype = _compute_dtype(logits)
        shift = tau * log_prior.to(device=logits.device, dtype=dtype)
        adjusted = logits.to(dtype) + shift[None, :]
        return F.cross_entropy(adjusted, labels.to(logits.device), reduction=reduction)


class BCLLoss(NamedTuple):
    """The total alpha * ce + beta * contrastive, and its two terms (scalars)."""

    total: torch.Tensor
    ce: torch.Tensor
    contrastive: torch.Tensor


def bcl_loss(
    logits: torch.Tensor,
    features: torch.Tensor,
    prototypes: torch.Tensor,
    labels: torch.Tensor,
    log_prior: torch.Tensor | Sequence[float],
    *,
    alpha: float = 1.0,
    beta: float = 0.35,
    temperature: float = 0.07,
    tau: float = 1.0,
) -> BCLLoss:
    """The official training loss, alpha * CE + beta * BalSCL (``main.py`` ``train``).

    Args:
        logits: [B, C] logits of the classification view (official: view 0, RandAugment).
        features: [B, 2, D] normalised embeddings of the two contrastive views.
        prototypes: [C, D] normalised prototypes; labels: [B]; log_prior: [C].
        alpha, beta: the weights (official ``--alpha`` 1.0, ``--beta`` 0.35).
        temperature, tau: as in :func:`bcl_contrastive_loss` and :func:`logit_adjusted_ce`.
    """
    for name, value in (("alpha", alpha), ("beta", beta)):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not 0 <= value < math.inf
        ):
            raise ValueError(f"{name}={value!r}: must be a finite number >= 0")
    if logits.dim() != 2 or logits.size(1) != prototypes.size(0):
        raise ValueError(
            f"logits shape {tuple(logits.shape)}: must be [B, C] with C = {prototypes.size(0)}"
        )
    ce = logit_adjusted_ce(logits, labels, log_prior, tau=tau)
    contrastive = bcl_contrastive_loss(features, prototypes, labels, temperature=temperature)
    return BCLLoss(alpha * ce + beta * contrastive, ce, contrastive)
