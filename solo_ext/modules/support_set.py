"""The support set of NNCLR / All4One: momentum projections with labels and image indexes.

One similarity matmul per view gives both the nearest neighbour and the k nearest neighbours
(solo-learn's ``all4one`` computes it twice). Like upstream, slots start as random unit vectors,
so neighbours exist from the first step; their label and index stay -1 until written.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from solo_ext.common import EMPTY
from solo_ext.modules.queue import LabeledQueue


class Neighbours(NamedTuple):
    """k nearest neighbours of a batch: ``keys`` [B, k, D] (the first is the nearest),
    ``slots`` [B, k], ``labels`` [B, k], ``indexes`` [B, k] (-1 where not written)."""

    keys: torch.Tensor
    slots: torch.Tensor
    labels: torch.Tensor
    indexes: torch.Tensor


class SupportSet(LabeledQueue):
    """A :class:`LabeledQueue` that also keeps each entry's dataset index."""

    def __init__(self, size: int, dim: int):
        super().__init__(size, dim)
        self.register_buffer("indexes", torch.full((size,), EMPTY, dtype=torch.long))

    @torch.no_grad()
    def enqueue(
        self, keys: torch.Tensor, labels: torch.Tensor, indexes: torch.Tensor | None = None
    ) -> torch.Tensor:
        """As :meth:`LabeledQueue.enqueue`, plus the image indexes [n] at the same slots."""
        slots = super().enqueue(keys, labels)
        if indexes is not None:
            self.indexes.index_copy_(
                0, slots, indexes[indexes.size(0) - slots.size(0) :].to(self.indexes.dtype)
            )
        return slots

    @torch.no_grad()
    def neighbours(self, z: torch.Tensor, k: int) -> Neighbours:
        """The k entries of highest dot product with each row of z [B, D], nearest first."""
        if not 1 <= k <= self.size:
            raise ValueError(f"k={k}: must be in [1, {self.size}] (the support set's size)")
        slots = (z.float() @ self.keys.float().T).topk(k, dim=1).indices
        return Neighbours(self.keys[slots], slots, self.labels[slots], self.indexes[slots])
