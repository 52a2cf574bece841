"""Several batches through a network in one call, each BatchNorm layer normalising each batch
with its own statistics and updating its running statistics as one call per batch would.

PBSD's student runs the L patches of each image as L batches of B (as published: each patch
index has its own BatchNorm statistics). :func:`grouped_batch_norm` lets the L batches go
through the backbone as one batch of L x B, batch-major, with the same outputs, gradients and
running statistics: each layer's input [L * B, C, ...] is viewed as [B, L * C, ...], so that
``F.batch_norm`` computes one statistic per (batch, channel) in one kernel.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn


def _groupable(module: nn.Module) -> bool:
    """A BatchNorm layer whose grouped forward equals per-batch calls (not SyncBatchNorm, whose
    statistics span the processes; not a cumulative average, ``momentum=None``)."""
    return (
        isinstance(module, nn.modules.batchnorm._BatchNorm)
        and not isinstance(module, nn.SyncBatchNorm)
        and module.momentum is not None
    )


def grouped_forward(bn: nn.modules.batchnorm._BatchNorm, x: torch.Tensor, groups: int):
    """``bn`` applied to each of the ``groups`` consecutive batches of ``x`` as ``groups``
    separate training-mode calls, in one call."""
    n, c, *spatial = x.shape
    if n % groups:
        raise ValueError(f"batch of {n}: not {groups} batches of one size")
    b = n // groups
    # [L * B, C, ...] -> [B, L * C, ...]: one statistic per (batch, channel)
    xs = x.reshape(groups, b, c, *spatial).transpose(0, 1).reshape(b, groups * c, *spatial)
    stats = bn.running_mean is not None
    dtype = bn.running_mean.dtype if stats else x.dtype
    # momentum 1: the buffers receive the batch statistics themselves (variance unbiased)
    mean = torch.zeros(groups * c, dtype=dtype, device=x.device) if stats else None
    var = torch.ones(groups * c, dtype=dtype, device=x.device) if stats else None
    weight = bn.weight.repeat(groups) if bn.weight is not None else None
    bias = bn.bias.repeat(groups) if bn.bias is not None else None
    y = F.batch_norm(xs, mean, var, weight, bias, True, 1.0, bn.eps)
    if stats:
        # one momentum step per batch, in order; on ``.data``, as BatchNorm's kernel updates
        # them: the earlier calls of this layer in the step saved these buffers for their
        # backward, and a version bump would refuse it
        m = bn.momentum
        running_mean, running_var = bn.running_mean.data, bn.running_var.data
        for j in range(groups):
            running_mean.mul_(1 - m).add_(mean[j * c : (j + 1) * c], alpha=m)
            running_var.mul_(1 - m).add_(var[j * c : (j + 1) * c], alpha=m)
        bn.num_batches_tracked.add_(groups)
    out = y.reshape(b, groups, c, *spatial).transpose(0, 1).reshape(n, c, *spatial)
    return out.contiguous(memory_format=_memory_format(x))


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


@contextlib.contextmanager
def grouped_batch_norm(modules: Iterable[nn.Module], groups: int) -> Iterator[bool]:
    """Within it, every training-mode BatchNorm layer of ``modules`` treats its input as
    ``groups`` consecutive batches (:func:`grouped_forward`). Yields False, and changes nothing,
    when a layer cannot be grouped (SyncBatchNorm, ``momentum=None``): the caller then makes one
    call per batch."""
    layers = [
        m
        for module in modules
        for m in module.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training
    ]
    if not all(_groupable(m) for m in layers):
        yield False
        return
    for m in layers:
        m.forward = lambda x, m=m: grouped_forward(m, x, groups)  # (an instance attribute)
    try:
        yield True
    finally:
        for m in layers:
            del m.forward
