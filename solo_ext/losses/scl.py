"""Supervised contrastive loss (Khosla et al., NeurIPS 2020), L_out form, with a MoCo queue.

This is the SCL baseline of DSCL (Xuan & Zhang, AAAI 2024, eq. 1-2): for anchor i (a query),

    L_i = -1/|P+_i| sum_{p in P+_i} log( exp(q_i . c_p / t) / sum_{a in A_i} exp(q_i . c_a / t) )

with the contrast set A_i = {all queries but q_i} u {all keys} u {filled queue entries} and
P+_i = the entries of A_i with the anchor's label (k_i, the key of the same image, among them).
Every positive has weight 1 / |P+_i| = 1 / (|P_i| + 1), where P_i excludes k_i.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from solo_ext.common import EMPTY
from solo_ext.losses.queue_lse import queue_logsumexp, slot_bias


class PositiveTerms(NamedTuple):
    """Per anchor [B]: log p(k_i | q_i), the sum of log p(c | q_i) over the other positives
    P_i (k_i excluded) and |P_i|."""

    log_p_aug: torch.Tensor
    sum_other: torch.Tensor
    n_other: torch.Tensor


def positive_terms(
    q: torch.Tensor,
    k: torch.Tensor,
    queue: torch.Tensor,
    labels: torch.Tensor,
    queue_labels: torch.Tensor,
    temperature: float,
    num_classes: int | None = None,
) -> PositiveTerms:
    """What SCL and DSCL need of each anchor's log-probabilities over its contrast set.

    Args:
        q: [B, D] normalised query embeddings (the anchors).
        k: [B, D] normalised keys; k_i is the augmented positive of q_i.
        queue: [K, D] normalised queued keys; queue_labels: [K], ``-1`` for empty slots.
        labels: [B] the batch labels (``-1``: unlabelled; such an anchor has P_i empty and
            such a column is left out of the contrast set, except as the anchor's own k_i).
        num_classes: labels are < num_classes; given, no device sync is needed.

    Cost: the queue block [B, K] is one matmul (the 1 / t folded into q) inside
    :func:`queue_logsumexp` (one buffer, one exp per entry; a per-column bias removes empty
    slots); the same-class sums over the queue are q_i . (sum of the class's keys) / t, from a
    [C, D] per-class sum of the keys, so no [B, K] mask, copy or gather is made. The small
    block [B, 2B] (queries, keys) uses masks.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature}: must be > 0")
    b = q.size(0)
    rows = torch.arange(b, device=q.device)
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, queue = q.float(), k.float(), queue.float()
        qs = q / temperature
        # queries and keys: [B, 2B], with masks
        small = qs @ torch.cat([q, k]).T
        small_labels = torch.cat([labels, labels])
        in_small = (small_labels != EMPTY)[None, :].expand(b, -1).clone()
        in_small[rows, rows] = False  # q_i . q_i is not contrasted
        in_small[rows, b + rows] = True  # k_i always is, even unlabelled
        labelled = labels != EMPTY
        other_small = (labels[:, None] == small_labels[None, :]) & in_small & labelled[:, None]
        other_small[rows, b + rows] = False  # P_i excludes k_i
        # the queue: [B, K]; empty slots get a bias that no logit survives (finite, so that
        # no 0 * inf reaches the gradients)
        queue_valid = queue_labels != EMPTY
        bias = slot_bias(queue_valid, qs.dtype)
        small_lse = small.masked_fill(~in_small, float("-inf")).logsumexp(dim=1)
        lse = queue_logsumexp(qs, queue, bias, extra=small_lse)
        # same-class sums over the queue: per-class sums of the keys; empty slots go to an
        # extra class that no anchor reads
        if num_classes is None:
            num_classes = int(torch.cat([labels, queue_labels]).max().clamp(min=0)) + 1
        slot_class = torch.where(queue_valid, queue_labels, num_classes)
        class_keys = queue.new_zeros(num_classes + 1, queue.size(1))
        if queue.requires_grad:
            class_keys = class_keys.index_add(0, slot_class, queue)
        else:  # a queue of buffers: in place is cheaper
            class_keys.index_add_(0, slot_class, queue)
        anchor_class = torch.where(labelled, labels, num_classes)
        sum_queue = torch.where(labelled, (qs * class_keys[anchor_class]).sum(dim=1), 0.0)
        class_count = torch.bincount(slot_class, minlength=num_classes + 1)
        n_queue = torch.where(labelled, class_count[anchor_class], 0)

        n_other = other_small.sum(dim=1) + n_queue
        sum_logits = small.masked_fill(~other_small, 0.0).sum(dim=1) + sum_queue
        log_p_aug = small[rows, b + rows] - lse
        return PositiveTerms(log_p_aug, sum_logits - n_other * lse, n_other)


def scl_loss(
    q: torch.Tensor,
    k: torch.Tensor,
    queue: torch.Tensor,
    labels: torch.Tensor,
    queue_labels: torch.Tensor,
    temperature: float = 0.07,
    num_classes: int | None = None,
) -> torch.Tensor:
    """Mean over anchors of the SCL (L_out) loss; see the module docstring.

    An anchor with no other same-label entry contrasts k_i alone (plain InfoNCE).
    """
    terms = positive_terms(q, k, queue, labels, queue_labels, temperature, num_classes)
    per_anchor = -(terms.log_p_aug + terms.sum_other) / (terms.n_other + 1)
    return per_anchor.mean()
