"""Decoupled supervised contrastive loss (Xuan & Zhang, AAAI 2024, eq. 8-9).

For anchor i (a query q_i) with its augmented positive k_i (the key of the same image), the
contrast set A_i (all queries but q_i, all keys, the filled queue) and the same-class
positives P_i (the members of A_i with the anchor's label, k_i excluded):

    L_i = -alpha * log p(k_i | q_i) - (1 - alpha) / |P_i| * sum_{p in P_i} log p(p | q_i)
    p(c | q_i) = exp(q_i . c / t) / sum_{a in A_i} exp(q_i . a / t)

So k_i keeps the weight alpha whatever the class size, where SCL gives it 1 / (|P_i| + 1)
(recovered with ``alpha="scl"``). An anchor with no other same-class entry puts all weight on
k_i. The official code's ``beta`` (positives beta / |P_i| each, k_i 1, normalised) is
alpha = 1 / (1 + beta).
"""

from __future__ import annotations

from typing import Literal

import torch

from solo_ext.losses.scl import positive_terms


def resolve_alpha(alpha: float | Literal["scl"] | None, beta: float | None) -> float | str:
    """The weight of k_i from either form; raises one-line ValueErrors naming the argument."""
    if alpha is not None and beta is not None:
        raise ValueError(f"alpha={alpha!r}, beta={beta!r}: give one of the two, not both")
    if alpha is None and beta is None:
        raise ValueError("alpha=None, beta=None: give alpha in [0, 1], 'scl', or beta >= 0")
    if beta is not None:
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not beta >= 0:
            raise ValueError(f"beta={beta!r}: must be a number >= 0")
        return 1.0 / (1.0 + beta)
    if alpha == "scl":
        return "scl"
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha={alpha!r}: must be a number in [0, 1] or 'scl'")
    return float(alpha)


def dscl_loss(
    q: torch.Tensor,
    k: torch.Tensor,
    queue: torch.Tensor,
    labels: torch.Tensor,
    queue_labels: torch.Tensor,
    *,
    alpha: float | Literal["scl"] | None = None,
    beta: float | None = None,
    temperature: float = 0.07,
    num_classes: int | None = None,
) -> torch.Tensor:
    """Mean over anchors of the DSCL loss (module docstring).

    Args:
        q: [B, D] normalised queries (anchors); k: [B, D] normalised keys, k_i of q_i.
        queue: [K, D] normalised queued keys; queue_labels: [K], ``-1`` marks an empty slot.
        labels: [B] the batch labels.
        alpha: weight of k_i in [0, 1], or ``"scl"`` for 1 / (|P_i| + 1) (the SCL loss).
        beta: the official code's form, alpha = 1 / (1 + beta); give alpha or beta.
        temperature: softmax temperature t > 0. Similarities and softmax are in float32.
        num_classes: an upper bound of the labels, which spares a device sync.
    """
    a = resolve_alpha(alpha, beta)
    log_p_aug, sum_other, n_other = positive_terms(
        q, k, queue, labels, queue_labels, temperature, num_classes
    )
    if a == "scl":
        weight = 1.0 / (n_other + 1).float()
    else:
        weight = torch.where(n_other > 0, torch.full_like(log_p_aug, a), torch.ones_like(log_p_aug))
    per_anchor = -(weight * log_p_aug + (1 - weight) * sum_other / n_other.clamp(min=1))
    return per_anchor.mean()
