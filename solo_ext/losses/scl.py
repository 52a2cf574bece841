"""Supervised contrastive loss (Khosla et al., NeurIPS 2020), L_out form, with a MoCo queue.

This is the SCL baseline of DSCL (Xuan & Zhang, AAAI 2024, eq. 1-2): for anchor i (a query),

    L_i = -1/|P+_i| sum_{p in P+_i} log( exp(q_i . c_p / t) / sum_{a in A_i} exp(q_i . c_a / t) )

with the contrast set A_i = {all queries but q_i} u {all keys} u {filled queue entries} and
P+_i = the entries of A_i with the anchor's label (k_i, the key of the same image, among them).
Every positive has weight 1 / |P+_i| = 1 / (|P_i| + 1), where P_i excludes k_i.
"""

from __future__ import annotations

import torch

EMPTY = -1


def contrastive_log_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    queue: torch.Tensor,
    labels: torch.Tensor,
    queue_labels: torch.Tensor,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities of every anchor over its contrast set and the same-label mask.

    Args:
        q: [B, D] normalised query embeddings (the anchors).
        k: [B, D] normalised keys; k_i is the augmented positive of q_i.
        queue: [K, D] normalised queued keys; queue_labels: [K], ``-1`` for empty slots.
        labels: [B] the batch labels.

    Returns:
        log_prob [B, 2B + K] (columns: queries, keys, queue; excluded columns hold 0),
        positive mask [B, 2B + K] of same-label members of the contrast set (k_i included),
        and the column index of k_i for each anchor [B].
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature}: must be > 0")
    b = q.size(0)
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, queue = q.float(), k.float(), queue.float()
        logits = torch.cat([q @ q.T, q @ k.T, q @ queue.T], dim=1) / temperature
        col_labels = torch.cat([labels, labels, queue_labels])
        in_set = (col_labels != EMPTY)[None, :].expand(b, -1).clone()
        in_set[:, :b].fill_diagonal_(False)  # self-similarity q_i . q_i is not contrasted
        in_set[:, b:].fill_diagonal_(True)  # k_i is always in the set, even if unlabelled
        logits = logits.masked_fill(~in_set, float("-inf"))
        log_prob = logits - logits.logsumexp(dim=1, keepdim=True)
        log_prob = log_prob.masked_fill(~in_set, 0.0)
        positive = (labels[:, None] == col_labels[None, :]) & in_set & (labels[:, None] != EMPTY)
        positive[:, b:].fill_diagonal_(True)
    aug_col = torch.arange(b, device=q.device) + b
    return log_prob, positive, aug_col


def scl_loss(
    q: torch.Tensor,
    k: torch.Tensor,
    queue: torch.Tensor,
    labels: torch.Tensor,
    queue_labels: torch.Tensor,
    temperature: float = 0.07,
) -> torch.Tensor:
    """Mean over anchors of the SCL (L_out) loss; see the module docstring.

    An anchor with no other same-label entry contrasts k_i alone (plain InfoNCE).
    """
    log_prob, positive, _ = contrastive_log_probs(q, k, queue, labels, queue_labels, temperature)
    per_anchor = -(log_prob * positive).sum(dim=1) / positive.sum(dim=1)
    return per_anchor.mean()
