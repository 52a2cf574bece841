"""A FIFO queue of key embeddings with their labels, kept in buffers (checkpointed, resumable)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from solo_ext.common import EMPTY


class LabeledQueue(nn.Module):
    """Queue of ``size`` keys [size, dim] and labels [size] (``-1`` = empty slot, to be masked).

    ``enqueue`` writes a batch at the pointer and wraps around, so any batch size works, also one
    that does not divide ``size``. Under distributed training the caller passes the gathered
    batch, so every rank holds the same queue.
    """

    def __init__(self, size: int, dim: int):
        super().__init__()
        if size < 1:
            raise ValueError(f"method_kwargs.queue_size={size}: must be >= 1")
        self.size = size
        self.register_buffer("keys", F.normalize(torch.randn(size, dim), dim=1))
        self.register_buffer("labels", torch.full((size,), EMPTY, dtype=torch.long))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor, labels: torch.Tensor | None = None) -> None:
        """Writes keys [n, dim] and labels [n]; when n > size only the last ``size`` are kept.

        Without labels (a plain MoCo queue) the slots are marked filled with label 0.
        """
        n = keys.size(0)
        if labels is None:
            labels = torch.zeros(n, dtype=torch.long, device=keys.device)
        if n > self.size:
            keys, labels = keys[-self.size :], labels[-self.size :]
            self.ptr += n - self.size
            n = self.size
        idx = (self.ptr + torch.arange(n, device=self.ptr.device)) % self.size
        self.keys.index_copy_(0, idx, keys.to(self.keys.dtype))
        self.labels.index_copy_(0, idx, labels.to(self.labels.dtype))
        self.ptr.copy_((self.ptr + n) % self.size)

    @property
    def valid(self) -> torch.Tensor:
        """Mask [size] of the filled slots."""
        return self.labels != EMPTY
