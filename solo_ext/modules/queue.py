"""FIFO queues of key embeddings, kept in buffers (checkpointed, resumable).

- :class:`KeyQueue`: keys only (MoCo's and DenseCL's negatives); written slots are tracked.
- :class:`LabeledQueue`: keys with their labels (the supervised contrastive losses); a slot is
  empty while its label is ``EMPTY``.

Both write a batch at the pointer and wrap around, so any batch size works, also one that does
not divide the size. Under distributed training the caller passes the gathered batch, so every
rank holds the same queue.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from solo_ext.common import EMPTY


class _Ring(nn.Module):
    """``size`` keys [size, dim] (random unit vectors until written) and the write pointer."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        if size < 1:
            raise ValueError(f"queue size={size}: must be >= 1")
        self.size = size
        self.register_buffer("keys", F.normalize(torch.randn(size, dim), dim=1))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def _write_keys(self, keys: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Writes keys [n, dim] at the pointer (the last ``size`` when n > size) and moves it;
        returns the slots written and how many of the batch's last rows they hold."""
        n = keys.size(0)
        kept = min(n, self.size)
        start = self.ptr + (n - kept)
        slots = (start + torch.arange(kept, device=self.ptr.device)) % self.size
        self.keys.index_copy_(0, slots, keys[n - kept :].to(self.keys.dtype))
        self.ptr.copy_((self.ptr + n) % self.size)
        return slots, kept


class KeyQueue(_Ring):
    """Queue of unlabelled keys; ``valid`` marks the slots in use.

    Args:
        size, dim: slots and key dimension.
        filled: the random unit keys it starts with count as keys (valid from the first step,
            as the published MoCo-style code starts); otherwise only written slots are valid.
    """

    def __init__(self, size: int, dim: int, filled: bool = False):
        super().__init__(size, dim)
        self.register_buffer("written", torch.full((size,), bool(filled), dtype=torch.bool))

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor) -> None:
        """Writes keys [n, dim]; when n > size only the last ``size`` are kept."""
        slots, _ = self._write_keys(keys)
        self.written[slots] = True

    @property
    def valid(self) -> torch.Tensor:
        """Mask [size] of the written slots."""
        return self.written


class LabeledQueue(_Ring):
    """Queue of keys and labels [size] (``EMPTY`` = an empty slot, to be masked).

    Args:
        size, dim: slots and key dimension.
        num_classes: when given, the queue starts full: its random unit keys get random labels
            in [0, num_classes) (the published DSCL code's start); otherwise it starts empty.
    """

    def __init__(self, size: int, dim: int, num_classes: int | None = None):
        super().__init__(size, dim)
        if num_classes is None:
            labels = torch.full((size,), EMPTY, dtype=torch.long)
        elif num_classes < 1:
            raise ValueError(f"num_classes={num_classes}: must be >= 1")
        else:
            labels = torch.randint(0, num_classes, (size,))
        self.register_buffer("labels", labels)

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Writes keys [n, dim] and labels [n]; when n > size only the last ``size`` are kept.
        Returns the slots written (for the newest ``min(n, size)`` rows)."""
        slots, kept = self._write_keys(keys)
        self.labels.index_copy_(0, slots, labels[labels.size(0) - kept :].to(self.labels.dtype))
        return slots

    @property
    def valid(self) -> torch.Tensor:
        """Mask [size] of the filled slots."""
        return self.labels != EMPTY
