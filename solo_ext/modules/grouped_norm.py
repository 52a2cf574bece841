"""Several batches through a network in one call, each BatchNorm layer normalising each batch
with its own statistics and updating its running statistics as one call per batch would.

PBSD's student runs the L patches of each image as L batches of B (as published: each patch
index has its own BatchNorm statistics). :func:`grouped_batch_norm` lets the L batches go
through the backbone as one batch of L x B, batch-major, with the same outputs, gradients and
running statistics: each layer's input [L * B, C, ...] is copied to [B, L * C, ...], so that
one ``native_batch_norm`` computes one statistic per (batch, channel), and the L momentum steps
of the running statistics are one matrix-vector product.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
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
    separate training-mode calls, in one call.

    On a GPU a step of small batches is bound by the number of kernels it launches, so this
    launches few: one copy into the grouped layout and one back (channels-last inputs stay
    channels-last), the batch norm, and one matrix-vector product per running statistic for the
    ``groups`` momentum steps; its backward is one autograd node (the copies of the gradient and
    the batch norm's backward)."""
    n, c, *_ = x.shape
    if n % groups:
        raise ValueError(f"batch of {n}: not {groups} batches of one size")
    stats = bn.running_mean is not None
    mean, var = _batch_stats(bn, groups * c, x.device) if stats else (None, None)
    y = _GroupedBatchNorm.apply(x, bn.weight, bn.bias, groups, bn.eps, mean, var)
    if stats:
        _momentum_steps(bn, mean, var, groups)
    return y


class _GroupedBatchNorm(torch.autograd.Function):
    """Training-mode batch norm of ``groups`` consecutive batches, each with its own statistics:
    the input seen as [B, L * C, ...] for one ``native_batch_norm``, whose momentum 1 writes the
    batch statistics into ``mean`` and ``var`` (the variance unbiased)."""

    @staticmethod
    def forward(ctx, x, weight, bias, groups, eps, mean, var):
        c = x.size(1)
        last = _channels_last(x)
        xs = _grouped(x, groups, last)
        w = weight.repeat(groups) if weight is not None else None
        b = bias.repeat(groups) if bias is not None else None
        y, save_mean, save_invstd = torch.native_batch_norm(xs, w, b, mean, var, True, 1.0, eps)
        ctx.save_for_backward(xs, w, save_mean, save_invstd)
        ctx.groups, ctx.eps, ctx.last, ctx.c = groups, eps, last, c
        ctx.affine = weight is not None, bias is not None
        return _ungrouped(y, groups, c, last)

    @staticmethod
    def backward(ctx, grad):
        xs, w, save_mean, save_invstd = ctx.saved_tensors
        groups, c, last = ctx.groups, ctx.c, ctx.last
        gs = _grouped(grad, groups, last)
        mask = [
            ctx.needs_input_grad[0],
            ctx.affine[0] and ctx.needs_input_grad[1],
            ctx.affine[1] and ctx.needs_input_grad[2],
        ]
        gx, gw, gb = torch.ops.aten.native_batch_norm_backward(
            gs, xs, w, None, None, save_mean, save_invstd, True, ctx.eps, mask
        )
        gx = _ungrouped(gx, groups, c, last) if mask[0] else None
        gw = gw.view(groups, c).sum(0) if mask[1] else None
        gb = gb.view(groups, c).sum(0) if mask[2] else None
        return gx, gw, gb, None, None, None, None


def _grouped(x: torch.Tensor, groups: int, last: bool) -> torch.Tensor:
    """[L * B, C, ...] -> [B, L * C, ...], one statistic per (batch, channel)."""
    n, c, *spatial = x.shape
    return _swap(x, groups, n // groups, c, (n // groups, groups * c, *spatial), last)


def _ungrouped(y: torch.Tensor, groups: int, c: int, last: bool) -> torch.Tensor:
    """The inverse of :func:`_grouped`."""
    b, _, *spatial = y.shape
    return _swap(y, b, groups, c, (b * groups, c, *spatial), last)


def _swap(t: torch.Tensor, outer: int, inner: int, c: int, shape: tuple, last: bool):
    """``t`` seen as [outer, inner, C, ...] with its first two axes swapped, copied once into a
    new tensor of ``shape`` (not a view, so that an in-place ReLU may follow) in the input's
    memory format; ``t`` may have any strides."""
    spatial = t.shape[2:]
    fmt = torch.channels_last if last else torch.contiguous_format
    out = torch.empty(shape, dtype=t.dtype, device=t.device, memory_format=fmt)
    out.view(inner, outer, c, *spatial).copy_(t.view(outer, inner, c, *spatial).transpose(0, 1))
    return out


def _channels_last(x: torch.Tensor) -> bool:
    return x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)


def _batch_stats(
    bn: nn.modules.batchnorm._BatchNorm, size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's scratch mean and variance for ``native_batch_norm`` to write the batch statistics
    into: kept on the layer between calls (not a buffer: no checkpoint holds it), finite, and
    so overwritten exactly under momentum 1."""
    dtype = bn.running_mean.dtype
    scratch = getattr(bn, "_grouped_stats", None)
    if scratch is None or scratch.shape[1] != size or scratch.dtype != dtype:
        scratch = torch.ones(2, size, dtype=dtype, device=device)
    elif scratch.device != device:
        scratch = scratch.to(device)
    bn._grouped_stats = scratch
    return scratch[0], scratch[1]


def _momentum_steps(
    bn: nn.modules.batchnorm._BatchNorm, mean: torch.Tensor, var: torch.Tensor, groups: int
) -> None:
    """The ``groups`` momentum steps ``r <- (1 - m) r + m s_j`` (j = 0 .. L - 1, in order) in
    closed form: ``r <- (1 - m)^L r + sum_j m (1 - m)^(L - 1 - j) s_j``, one matrix-vector
    product a statistic. On ``.data``, as BatchNorm's kernel updates them: the earlier calls of
    this layer in the step saved these buffers for their backward, and a version bump would
    refuse it."""
    m = bn.momentum
    key = (groups, m, mean.dtype, mean.device)
    cached = getattr(bn, "_grouped_steps", None)
    if cached is None or cached[0] != key:  # made once: no host-to-device copy per step
        decay = (1 - m) ** torch.arange(groups - 1, -1, -1, dtype=torch.float64)
        cached = key, (m * decay).to(dtype=mean.dtype, device=mean.device)
        bn._grouped_steps = cached
    steps, c = cached[1], mean.numel() // groups
    with torch.autocast(mean.device.type, enabled=False):  # in the buffers' dtype
        for running, batch in ((bn.running_mean, mean), (bn.running_var, var)):
            running.data.addmv_(batch.view(groups, c).t(), steps, beta=(1 - m) ** groups)
    bn.num_batches_tracked.add_(groups)


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
