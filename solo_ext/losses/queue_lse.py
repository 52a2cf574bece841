"""The log-sum-exp of a batch against a queue, with one [B, K] buffer and one exp per entry.

``torch.logsumexp`` on ``q @ queue.T`` keeps the logits for its backward and computes their
exponentials twice (forward and backward), plus a copy per masking or scaling step. Profiles of
the DenseCL step (its dense term is [B * S^2, 65536]) put those exponentials and copies at about
half the loss's time on CPU. Here the forward turns the logits buffer into exp(logit - max) in
place and keeps it; the backward scales the same buffer into the softmax and multiplies it back
through the queue.
"""

from __future__ import annotations

import torch

# On CPU, exp of arguments below about -87 (float32 denormals and empty slots) takes a slow
# path, up to 30x slower; such terms are below 1e-35 of the largest and cannot change a float32
# sum, so their arguments are clamped first.
_CPU_EXP_FLOOR = -80.0


class _BufferPool:
    """Free [B, K] float buffers kept between steps, on CPU only.

    glibc hands blocks above 32 MiB back to the system when they are freed, so a fresh
    [B * S^2, 65536] buffer (256 MiB for DenseCL's dense term) pays its page faults again at
    every step: about a quarter of the dense term's time on CPU. CUDA's caching allocator already
    reuses its blocks. At most ``per_shape`` buffers of each of the last ``shapes`` shapes are
    kept, which is what one step holds at its peak anyway.
    """

    MIN_BYTES = 32 * 2**20

    def __init__(self, per_shape: int = 2, shapes: int = 2):
        self.per_shape, self.shapes = per_shape, shapes
        self.free: dict[tuple, list[torch.Tensor]] = {}

    @staticmethod
    def _key(shape, dtype: torch.dtype, device: torch.device) -> tuple:
        return (tuple(shape), dtype, device)

    def take(self, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        free = self.free.get(self._key(shape, dtype, device))
        if free:
            return free.pop()
        return torch.empty(shape, dtype=dtype, device=device)

    def give(self, buf: torch.Tensor) -> None:
        if buf.device.type != "cpu" or buf.numel() * buf.element_size() < self.MIN_BYTES:
            return
        key = self._key(buf.shape, buf.dtype, buf.device)
        free = self.free.pop(key, [])  # re-inserted last: the most recently used shape
        if len(free) < self.per_shape:
            free.append(buf)
        self.free[key] = free
        while len(self.free) > self.shapes:
            del self.free[next(iter(self.free))]


_POOL = _BufferPool()


def empty_buffer_pool() -> None:
    """Frees the buffers kept for reuse (the next calls allocate again)."""
    _POOL.free.clear()


@torch.no_grad()
def _exp_buffer(qs, queue, bias, extra, pooled: bool = False):
    """(exp(logits - top) [B, K] in one buffer, top [B], lse [B]); with ``pooled`` the buffer
    comes from the pool (the caller gives it back)."""
    if pooled and qs.device.type == "cpu":
        shape = (qs.size(0), queue.size(0))
        buf = torch.mm(qs, queue.T, out=_POOL.take(shape, qs.dtype, qs.device))
    else:
        buf = torch.mm(qs, queue.T)
    if bias is not None:
        buf.add_(bias)
    top = buf.amax(dim=1)
    if extra is not None:
        top = torch.maximum(top, extra)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    buf.sub_(top[:, None])
    if buf.device.type == "cpu":
        buf.clamp_(min=_CPU_EXP_FLOOR)
    buf.exp_()
    total = buf.sum(dim=1)
    if extra is not None:
        total = total + (extra - top).exp()
    return buf, top, top + total.log()


EXCLUDED = -1e9  # the logit bias of an empty queue slot: no logit survives it


def slot_bias(valid: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[K] logit bias: 0 for the filled slots, :data:`EXCLUDED` for the empty ones."""
    return torch.where(valid, 0.0, EXCLUDED).to(dtype)


class _QueueLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qs, queue, bias, extra, once):
        buf, top, lse = _exp_buffer(qs, queue, bias, extra, pooled=once)
        ctx.save_for_backward(qs, queue, buf, top, lse, extra)
        ctx.once, ctx.used = once, False
        return lse

    @staticmethod
    def backward(ctx, grad):
        if ctx.used:
            raise RuntimeError(
                "queue_logsumexp: its backward turns the saved exponentials into the softmax "
                "in place, so it runs once; for repeated backward passes (gradcheck, "
                "retain_graph) call it with once=False"
            )
        qs, queue, buf, top, lse, extra = ctx.saved_tensors
        # softmax = exp(logit - top) * exp(top - lse), times the incoming gradient
        scale = (grad * (top - lse).exp())[:, None]
        if ctx.once:  # in place, into the buffer the forward kept
            ctx.used = True
            probs = buf.mul_(scale)
        else:
            probs = buf * scale
        grad_qs = probs @ queue if ctx.needs_input_grad[0] else None
        grad_queue = probs.T @ qs if ctx.needs_input_grad[1] else None
        grad_extra = grad * (extra - lse).exp() if ctx.needs_input_grad[3] else None
        if ctx.once:
            _POOL.give(buf)  # (a forward whose backward never runs leaves it to autograd)
        return grad_qs, grad_queue, None, grad_extra, None


def queue_logsumexp(
    qs: torch.Tensor,
    queue: torch.Tensor,
    bias: torch.Tensor | None = None,
    extra: torch.Tensor | None = None,
    once: bool = True,
) -> torch.Tensor:
    """lse_i = log( exp(extra_i) + sum_j exp(qs_i . queue_j + bias_j) ), float32.

    Args:
        qs: [B, D] queries, the temperature already folded in (q / t).
        queue: [K, D] keys; bias: [K] added to every row (a large negative value removes a
            column; it carries no gradient); extra: [B] one more logit per row (the positive,
            or the log-sum-exp of other columns), or None.
        once: the backward runs at most once (a training step): it reuses the forward's buffer
            in place, from a pool of CPU buffers kept between steps, and a second backward
            raises. False allows repeated backward passes (``torch.autograd.gradcheck``,
            ``retain_graph``) at the cost of one more [B, K] buffer.
    """
    if queue.size(0) == 0:
        return extra if extra is not None else qs.new_full((qs.size(0),), float("-inf"))
    return _QueueLogSumExp.apply(qs, queue, bias, extra, once)


@torch.no_grad()
def queue_softmax(
    qs: torch.Tensor,
    queue: torch.Tensor,
    bias: torch.Tensor | None = None,
    extra: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The softmax over [extra, queue] of the same logits, without gradient: (p_extra [B],
    p_queue [B, K]), the latter in one buffer."""
    if queue.size(0) == 0:
        return torch.ones(qs.size(0), device=qs.device), qs.new_zeros(qs.size(0), 0)
    buf, top, lse = _exp_buffer(qs, queue, bias, extra)
    p_queue = buf.mul_((top - lse).exp()[:, None])
    p_extra = (extra - lse).exp() if extra is not None else None
    return p_extra, p_queue
