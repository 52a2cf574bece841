"""Parametric contrastive loss: PaCo (Cui et al., ICCV 2021) and GPaCo (Cui et al., TPAMI 2023).

Layout (that of the official MoCo builders): ``features`` [N, D] stacks the rows of the contrast
set, e.g. ``cat(q, k, queue)`` with ``labels = cat(y, y, queue_labels)``; the anchors are its
first A rows, with their classifier logits ``sup_logits`` [A, C] (the linear head on the pooled
backbone features). PaCo: A = B, the queries (keys from a momentum encoder). GPaCo: A = 2B, both
views of the one encoder, whose logits are stacked the same way.

For anchor i < A, with f the features, y the labels, s_i the anchor's logits, t the temperature
and t_sup the temperature of the centre logits:

    u_ic = (s_ic + log_prior_c) / t_sup               the C class-centre logits
    v_ij = f_i . f_j / t                              j = 0..N-1, j != i
    Z_i  = sum_c exp(u_ic) + gamma * sum_{j != i} exp(v_ij)
    P_i  = {j != i : y_j = y_i}
    w_ic = beta * ((1 - eps) [c = y_i] + eps / (C - 1) [c != y_i])     (GPaCo smoothing eps;
                                                                         PaCo: eps = 0)
    L_i  = -(t / t_base) * (sum_c w_ic (u_ic - log Z_i) + alpha * sum_{j in P_i} (v_ij - log Z_i))
                         / (beta + alpha |P_i|)
    L    = (1 / A) sum_{i < A} L_i

What this means, read off the official code:

* Only the anchor's own row (column i of row i) is masked out. The anchor's key k_i (GPaCo:
  its other view) is an ordinary member of P_i with weight alpha, like every same-class key and
  queue entry; nothing gives it a weight of its own. Every row, queue included, is in Z_i: the
  queue labels decide the positives, and a queue slot is never "empty" (the official queue starts
  as ``randn(K, dim)`` normalised over K, so short rows, with random labels, which count until
  they are overwritten). Drop unfilled slots before calling.
* All C centres are in Z_i with weight 1; gamma scales only the sample terms, so beta = 0 does
  not remove the centres from the denominator (they stay as negatives), and gamma = 0 removes
  the samples from it (the sample positives are then scored against the centres only).
* The log prior (log(n_c / sum n + 1e-9) of the training class counts n_c, see
  :func:`paco_log_prior`) is added to the logits before 1 / t_sup, in the loss only (the
  official evaluation scores the plain logits). Centres and samples share one softmax, so a
  constant added to every log_prior_c changes the loss unless alpha = gamma = 0; a uniform
  prior is not the same as none.
* log Z_i is m_i + log(sum exp(. - m_i) + 1e-12), with m_i the row's largest logit, its own
  self-similarity included, held constant for the gradient: the 1e-12 is kept here, so the
  loss equals the official one also where it matters (a row whose only large logit is the
  masked self-similarity). An anchor with beta + alpha |P_i| = 0 gives NaN, as officially.
* ``t / t_base`` is 1 unless ``base_temperature`` is given (no official script sets it).

Official settings (github.com/dvlab-research/Parametric-Contrastive-Learning):

* PaCo loss, ``PaCo/LT/losses.py`` ``PaCoLoss``: beta = gamma = supt = 1, base_temperature =
  temperature; the prior from ``cal_weight_for_classes(cls_num_list)``.
* PaCo ImageNet-LT ResNet-50, ``PaCo/LT/sh/ImageNetLT_train_R50.sh`` and ``paco_lt.py``:
  alpha 0.05, beta 1, gamma 1, ``--moco-t`` 0.2, ``--moco-k`` 8192, ``--moco-dim`` 128, batch
  128 over 4 GPUs (the loss runs per GPU: 32 anchors), 400 epochs, lr 0.02, wd 5e-4.
* PaCo CIFAR-100-LT ResNet-32, ``PaCo/LT/sh/CIFAR100_train_imb0.01.sh`` (also imb 0.02, 0.1)
  and ``paco_cifar.py``: alpha 0.01, beta 1, gamma 1, ``--moco-t`` 0.05, ``--moco-k`` 1024,
  ``--moco-dim`` 32, ``--feat_dim`` 64, batch 128, 400 epochs, lr 0.05, wd 5e-4.
* GPaCo loss, ``GPaCo/LT/losses.py`` ``PaCoLoss``: anchors = N - K rows, ``smooth`` 0 unless
  given, the prior only once ``cal_weight_for_classes`` is called; ``GPaCo/LT/moco/builder.py``
  has no key encoder (k = encoder_q(im_k), with gradient) and returns both views' logits.
* GPaCo ImageNet-LT ResNet-50, ``GPaCo/LT/sh/LT/ImageNetLT_train_R50.sh``: alpha 0.045, beta
  1, gamma 1, t 0.2, K 8192, lr 0.04, wd 5e-4, with the prior, no smoothing. GPaCo full
  ImageNet (``GPaCo/LT/paco_imagenet.py``): alpha 0.05, ``--smooth`` 0.1, t 0.2, K 8192, no
  prior. GPaCo CIFAR-100 (``GPaCo/LT/sh/CIFAR/CIFAR100_train.sh``, balanced, ResNet-50): alpha
  0.01, t 0.07, K 1024, beta = gamma = 1 (``paco_cifar.py`` passes neither), uniform prior.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def paco_log_prior(class_counts: torch.Tensor | Sequence[float]) -> torch.Tensor:
    """log(n_c / sum n + 1e-9) in float32: the official prior from the training class counts.

    Args:
        class_counts: [C] non-negative counts n_c (``cls_num_list``), not all zero.
    """
    counts = torch.as_tensor(class_counts, dtype=torch.float32)
    if counts.dim() != 1 or counts.numel() == 0:
        raise ValueError(f"class_counts shape {tuple(counts.shape)}: must be [C] with C >= 1")
    if not bool(torch.isfinite(counts).all()) or bool((counts < 0).any()) or counts.sum() <= 0:
        raise ValueError(f"class_counts={counts.tolist()}: must be finite, >= 0, not all zero")
    return torch.log(counts / counts.sum() + 1e-9)


def _check_number(name: str, value: float, *, positive: bool) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= 0 if positive else value < 0):
        raise ValueError(f"{name}={value!r}: must be a finite number {'>' if positive else '>='} 0")


def _parametric_contrastive(
    features: torch.Tensor,
    labels: torch.Tensor,
    sup_logits: torch.Tensor,
    *,
    num_anchors: int,
    alpha: float,
    beta: float,
    gamma: float,
    temperature: float,
    num_classes: int | None,
    log_prior: torch.Tensor | None,
    sup_temperature: float,
    base_temperature: float | None,
    label_smoothing: float,
) -> torch.Tensor:
    """The loss of the module docstring for the first ``num_anchors`` rows (checked there)."""
    for name, value in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
        _check_number(name, value, positive=False)
    if alpha == 0 and beta == 0:
        raise ValueError("alpha=0, beta=0: every anchor would have zero total weight")
    _check_number("temperature", temperature, positive=True)
    _check_number("sup_temperature", sup_temperature, positive=True)
    if base_temperature is not None:
        _check_number("base_temperature", base_temperature, positive=True)
    if features.dim() != 2:
        raise ValueError(f"features shape {tuple(features.shape)}: must be [N, D]")
    n = features.size(0)
    if labels.shape != (n,):
        raise ValueError(f"labels shape {tuple(labels.shape)}: must be [N] = [{n}] like features")
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise ValueError(f"labels dtype {labels.dtype}: must be an integer dtype")
    if sup_logits.dim() != 2 or sup_logits.size(0) != num_anchors:
        raise ValueError(
            f"sup_logits shape {tuple(sup_logits.shape)}: must be [{num_anchors}, C], "
            "one row per anchor"
        )
    c = sup_logits.size(1)
    if num_classes is not None and num_classes != c:
        raise ValueError(f"num_classes={num_classes!r}: sup_logits has {c} columns")
    if num_anchors > n:
        raise ValueError(f"{num_anchors} anchors: features has only {n} rows")
    if log_prior is not None and log_prior.shape != (c,):
        raise ValueError(f"log_prior shape {tuple(log_prior.shape)}: must be [C] = [{c}]")
    ok = isinstance(label_smoothing, (int, float)) and not isinstance(label_smoothing, bool)
    if not ok or not 0 <= label_smoothing < 1 or (label_smoothing > 0 and c < 2):
        raise ValueError(f"label_smoothing={label_smoothing!r}: must be in [0, 1), with C >= 2")

    with torch.autocast(device_type=features.device.type, enabled=False):
        dtype = torch.promote_types(features.dtype, torch.float32)
        f = features.to(dtype)
        centre = sup_logits.to(dtype)
        if log_prior is not None:
            centre = centre + log_prior.to(device=centre.device, dtype=dtype)
        centre = centre / sup_temperature  # [A, C]
        sample = (f[:num_anchors] / temperature) @ f.T  # [A, N]
        rows = torch.arange(num_anchors, device=f.device)
        others = torch.ones_like(sample, dtype=torch.bool)
        others[rows, rows] = False

        # log Z_i as officially: shift by the row max (self-similarity included, no gradient)
        # and add 1e-12 inside the log
        top = torch.maximum(centre.max(dim=1).values, sample.max(dim=1).values).detach()
        centre_sum = torch.exp(centre - top[:, None]).sum(dim=1)
        sample_sum = torch.exp(sample - top[:, None]).masked_fill(~others, 0.0).sum(dim=1)
        log_z = top + torch.log(centre_sum + gamma * sample_sum + 1e-12)

        anchor_labels = labels[:num_anchors]
        own = centre.gather(1, anchor_labels[:, None]).squeeze(1)
        if label_smoothing > 0:
            rest = centre.sum(dim=1) - own
            centre_term = (1 - label_smoothing) * own + label_smoothing / (c - 1) * rest
        else:
            centre_term = own
        positive = (anchor_labels[:, None] == labels[None, :]) & others
        n_pos = positive.sum(dim=1).to(dtype)
        pos_sum = sample.masked_fill(~positive, 0.0).sum(dim=1)

        weight = beta + alpha * n_pos
        numerator = beta * (centre_term - log_z) + alpha * (pos_sum - n_pos * log_z)
        scale = 1.0 if base_temperature is None else temperature / base_temperature
        return (-scale * numerator / weight).mean()


def paco_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    sup_logits: torch.Tensor,
    *,
    batch_size: int,
    alpha: float,
    beta: float = 1.0,
    gamma: float = 1.0,
    temperature: float = 0.2,
    num_classes: int | None = None,
    log_prior: torch.Tensor | None = None,
    sup_temperature: float = 1.0,
    base_temperature: float | None = None,
) -> torch.Tensor:
    """Mean over the ``batch_size`` anchors of the PaCo loss (module docstring).

    Args:
        features: [N, D] the contrast set, anchors first: ``cat(q, k, queue)`` in PaCo, with q
            and k unit vectors. Any dtype; similarities are computed in float32 or wider.
        labels: [N] integer labels of the rows (``cat(y, y, queue_labels)``); every row is in
            the contrast set, whatever its label.
        sup_logits: [batch_size, C] the anchors' classifier logits, without the prior.
        batch_size: the number of anchors A, the first rows of ``features``.
        alpha: weight of each same-class sample (official ImageNet-LT 0.05, CIFAR-100-LT 0.01).
        beta: weight of the anchor's own class centre.
        gamma: weight of the sample terms in the denominator.
        temperature: t of the sample logits (``--moco-t``; ImageNet-LT 0.2, CIFAR-100-LT 0.05).
        num_classes: C, checked against ``sup_logits`` if given.
        log_prior: [C] added to ``sup_logits``; the official one is
            ``paco_log_prior(class_counts)``. None: nothing added.
        sup_temperature: t_sup dividing the centre logits (official ``supt`` = 1).
        base_temperature: the loss is scaled by t / base_temperature; None: no scaling.

    Returns:
        The scalar loss, float32 (float64 for float64 inputs).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: must be an int >= 1")
    return _parametric_contrastive(
        features,
        labels,
        sup_logits,
        num_anchors=batch_size,
        alpha=alpha,
        beta=beta,
        gamma=gamma,
        temperature=temperature,
        num_classes=num_classes,
        log_prior=log_prior,
        sup_temperature=sup_temperature,
        base_temperature=base_temperature,
        label_smoothing=0.0,
    )


def gpaco_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    sup_logits: torch.Tensor,
    *,
    batch_size: int,
    alpha: float,
    beta: float = 1.0,
    gamma: float = 1.0,
    temperature: float = 0.2,
    num_classes: int | None = None,
    log_prior: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
    sup_temperature: float = 1.0,
    base_temperature: float | None = None,
) -> torch.Tensor:
    """Mean over the 2 * ``batch_size`` anchors (both views) of the GPaCo loss.

    Same loss as :func:`paco_loss`, with the anchors being the first 2B rows, ``cat(q, k)``
    from the one encoder, and the centre weights smoothed: beta (1 - eps) on the own class,
    beta eps / (C - 1) on each other class.

    Args:
        features: [N, D] ``cat(q, k, queue)``, N >= 2 * batch_size.
        labels: [N] ``cat(y, y, queue_labels)``.
        sup_logits: [2 * batch_size, C] ``cat(logits_q, logits_k)``, without the prior.
        batch_size: B, the images per view.
        label_smoothing: eps in [0, 1) (official ``smooth``: 0 for the long-tailed runs, 0.1
            on full ImageNet).
        Others as in :func:`paco_loss` (GPaCo ImageNet-LT ResNet-50: alpha 0.045, t 0.2).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: must be an int >= 1")
    return _parametric_contrastive(
        features,
        labels,
        sup_logits,
        num_anchors=2 * batch_size,
        alpha=alpha,
        beta=beta,
        gamma=gamma,
        temperature=temperature,
        num_classes=num_classes,
        log_prior=log_prior,
        sup_temperature=sup_temperature,
        base_temperature=base_temperature,
        label_smoothing=label_smoothing,
    )
