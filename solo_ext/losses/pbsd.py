"""Patch-based self-distillation (PBSD; Xuan & Zhang, AAAI 2024, eq. 11-14).

For box j of image i, the teacher c_i[j] (the query encoder's feature map ROI-pooled at the box,
through the projector) and the student s_i[j] (the box cut from the image, through the query
encoder and projector) are compared on the same set, the key k_i of the image and the queue:

    p_t = softmax([c . k_i, c . M] / t)   (a target: no gradient)
    L = -sum p_t log softmax([s . k_i, s . M] / t)

averaged over boxes and images (M: the filled queue entries).
"""

from __future__ import annotations

import torch

from solo_ext.common import EMPTY
from solo_ext.losses.queue_lse import queue_logsumexp, slot_bias


def pbsd_loss(
    student: torch.Tensor,
    teacher: torch.Tensor,
    keys: torch.Tensor,
    queue: torch.Tensor,
    queue_labels: torch.Tensor,
    temperature: float = 0.07,
) -> torch.Tensor:
    """Mean cross-entropy from the teacher's to the student's distribution over [k_i, queue].

    Args:
        student: [B * L, D] normalised student embeddings (box-major within each image).
        teacher: [B * L, D] normalised teacher embeddings; no gradient flows into them.
        keys: [B, D] normalised keys k_i of the images; box j of image i uses k_i.
        queue: [K, D] normalised queue; queue_labels: [K], ``-1`` marks an empty slot.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature}: must be > 0")
    if student.shape != teacher.shape or student.size(0) % keys.size(0):
        raise ValueError(
            f"student {tuple(student.shape)}, teacher {tuple(teacher.shape)}, keys "
            f"{tuple(keys.shape)}: need equal [B * L, D] and L boxes per key"
        )
    boxes = student.size(0) // keys.size(0)
    with torch.autocast(device_type=student.device.type, enabled=False):
        keys = keys.float().repeat_interleave(boxes, dim=0)
        members = queue.float()
        bias = slot_bias(queue_labels != EMPTY, members.dtype)

        def logits(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """(z / t, its logit of k_i [N]), 1 / t folded into z."""
            zs = z.float() / temperature
            return zs, (zs * keys).sum(dim=1)

        with torch.no_grad():  # the teacher's distribution p over [k_i, queue]
            ts, t_key = logits(teacher.detach())
            p = torch.cat([t_key[:, None], torch.addmm(bias, ts, members.T)], dim=1).softmax(1)
            # sum_j p_j m_j, so that the student's [B * L, K] logits never meet the p_j
            p_key, p_members = p[:, 0], p[:, 1:] @ members
        ss, s_key = logits(student)
        s_lse = queue_logsumexp(ss, members, bias, extra=s_key)
        # -sum_j p_j log softmax(s)_j = lse(s) - sum_j p_j s_j, as the p_j sum to 1
        return (s_lse - p_key * s_key - (ss * p_members).sum(dim=1)).mean()
