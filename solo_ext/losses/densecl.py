"""Dense contrastive learning (Wang et al., CVPR 2021).

    L = (1 - lambda) * L_global + lambda * L_dense

L_global is MoCo's InfoNCE of the global projections against a queue of global keys. L_dense is
the same at every location of the S x S map: the positive of query location i is the key's dense
vector at the location j whose *backbone* feature is the most similar to i's (cosine), and the
negatives are a second queue holding the global average of each key's dense output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solo_ext.losses.queue_lse import queue_logsumexp, slot_bias


def dense_correspondence(query_feats: torch.Tensor, key_feats: torch.Tensor) -> torch.Tensor:
    """For each query location, the key location of highest cosine similarity.

    Args:
        query_feats: [B, C, Sq] backbone features of view 1, flattened over locations.
        key_feats: [B, C, Sk] backbone features of view 2.

    Returns:
        [B, Sq] indices into the Sk key locations (one batched matmul, no loop).
    """
    q = F.normalize(query_feats.float(), dim=1)
    k = F.normalize(key_feats.float(), dim=1)
    return torch.bmm(q.transpose(1, 2), k).argmax(dim=2)


def queue_info_nce(
    q: torch.Tensor, k: torch.Tensor, queue: torch.Tensor, valid: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Mean InfoNCE of normalised q [N, D] with positives k [N, D] and negatives queue [K, D]
    (``valid`` [K] masks empty slots); float32 under autocast.

    The [N, K] negatives live in one buffer (:func:`queue_logsumexp`); the positive joins
    them as one more logit instead of a concatenated copy of the logits."""
    if temperature <= 0:
        raise ValueError(f"temperature={temperature}: must be > 0")
    with torch.autocast(device_type=q.device.type, enabled=False):
        qs, k, queue = q.float() / temperature, k.float(), queue.float()
        positive = (qs * k).sum(dim=1)
        bias = slot_bias(valid, qs.dtype)
        return (queue_logsumexp(qs, queue, bias, extra=positive) - positive).mean()


def densecl_loss(
    q_global: torch.Tensor,
    k_global: torch.Tensor,
    global_queue: torch.Tensor,
    q_dense: torch.Tensor,
    k_dense: torch.Tensor,
    dense_queue: torch.Tensor,
    correspondence: torch.Tensor,
    lam: float,
    temperature: float = 0.2,
    global_valid: torch.Tensor | None = None,
    dense_valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, global term, dense term) of DenseCL.

    Args:
        q_global, k_global: [B, D] normalised global projections of the query / key view.
        global_queue: [K, D] queued global keys.
        q_dense, k_dense: [B, D, S] normalised dense projections (per location).
        dense_queue: [K2, D] queued global averages of the keys' dense outputs.
        correspondence: [B, S] key location matched to each query location.
        lam: weight of the dense term in [0, 1].
    """
    if not 0 <= lam <= 1:
        raise ValueError(f"lambda={lam}: must be in [0, 1]")
    if global_valid is None:
        global_valid = torch.ones(global_queue.size(0), dtype=torch.bool, device=q_global.device)
    if dense_valid is None:
        dense_valid = torch.ones(dense_queue.size(0), dtype=torch.bool, device=q_global.device)
    global_term = queue_info_nce(q_global, k_global, global_queue, global_valid, temperature)
    b, d, s = q_dense.shape
    matched = torch.gather(k_dense, 2, correspondence[:, None, :].expand(b, d, s))
    dense_term = queue_info_nce(
        q_dense.transpose(1, 2).reshape(b * s, d),
        matched.transpose(1, 2).reshape(b * s, d),
        dense_queue,
        dense_valid,
        temperature,
    )
    return (1 - lam) * global_term + lam * dense_term, global_term, dense_term
