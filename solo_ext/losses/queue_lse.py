"""The log-sum-exp of a batch against a queue, with one [B, K] buffer and one exp per entry.

``torch.logsumexp`` on ``q @ queue.T`` keeps the logits for its backward and computes their
exponentials twice (forward and backward), plus a copy per masking or scaling step. Profiles of
the DenseCL step (its dense term is [B * S^2, 65536]) put those exponentials and copies at about
half the loss's time on CPU. Here the forward turns the logits buffer into exp(logit - max) in
place and keeps it; the backward scales the same buffer into the softmax and multiplies it back
through the queue.

On CPU both run over chunks of queue columns (:func:`chunk_spans`), each chunk's product,
exponentials and sums done while it is in cache, each chunk with its own offset (its largest
logit); :func:`queue_softmax_sum` keeps no [B, K] buffer at all. CUDA takes the queue in one
chunk.
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


# On CPU the logits are made and exponentiated in chunks of about this many bytes of float32
# logits (columns of the queue), each while it is in cache. One [B, K] product followed by passes
# over its buffer ran the products slower: a PBSD step's matrix products, mostly the four
# [320, 128] x [128, 65536] of its patch loss, took 0.37 s on 2 cores, 0.17 s in chunks.
CHUNK_BYTES = 4 * 2**20
MIN_CHUNK_COLUMNS = 256


def chunk_spans(rows: int, k: int, device: torch.device) -> list[tuple[int, int]]:
    """The [start, end) column ranges of the queue, one per chunk."""
    cols = k
    if device.type == "cpu":
        cols = max(MIN_CHUNK_COLUMNS, CHUNK_BYTES // (4 * max(rows, 1)))
    return [(j, min(k, j + cols)) for j in range(0, k, cols)]


def _exp_chunk(qs, queue, bias, span, out):
    """out <- exp(logits[:, span] - off), off the rows' largest logit in the chunk (0 where it is
    not finite); returns (off [B], the rows' sums of out [B])."""
    start, end = span
    if bias is None:
        torch.mm(qs, queue[start:end].T, out=out)
    else:
        torch.addmm(bias[start:end], qs, queue[start:end].T, out=out)
    off = out.amax(dim=1)
    off = torch.where(torch.isfinite(off), off, torch.zeros_like(off))
    out.sub_(off[:, None])
    if out.device.type == "cpu":
        out.clamp_(min=_CPU_EXP_FLOOR)
    out.exp_()
    return off, out.sum(dim=1)


def _chunk_view(flat: torch.Tensor, rows: int, span: tuple[int, int]) -> torch.Tensor:
    """Chunk ``span``'s [B, end - start] block of a buffer stored chunk after chunk."""
    start, end = span
    return flat[rows * start : rows * end].view(rows, end - start)


def _log_normaliser(offs, sums, extra):
    """lse [B] from the chunks' offsets and sums [chunks, B] and the extra logit."""
    top = offs.amax(dim=0)
    if extra is not None:
        top = torch.maximum(top, extra)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    total = (sums * (offs - top).exp()).sum(dim=0)
    if extra is not None:
        total = total + (extra - top).exp()
    return top + total.log()


@torch.no_grad()
def _exp_buffer(qs, queue, bias, extra, pooled: bool = False):
    """(a [B, K] buffer of exponentials, offsets [chunks, B], lse [B]): the buffer holds the
    chunks one after the other, chunk c's block exp(logits - offsets[c]) (:func:`_chunk_view`);
    with ``pooled`` it comes from the pool (the caller gives it back)."""
    rows, k = qs.size(0), queue.size(0)
    if pooled and qs.device.type == "cpu":
        buf = _POOL.take((rows, k), qs.dtype, qs.device)
    else:
        buf = qs.new_empty(rows, k)
    flat = buf.view(-1)
    spans = chunk_spans(rows, k, qs.device)
    parts = [_exp_chunk(qs, queue, bias, s, _chunk_view(flat, rows, s)) for s in spans]
    offs = torch.stack([off for off, _ in parts])
    lse = _log_normaliser(offs, torch.stack([total for _, total in parts]), extra)
    return buf, offs, lse


EXCLUDED = -1e9  # the logit bias of an empty queue slot: no logit survives it


def slot_bias(valid: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[K] logit bias: 0 for the filled slots, :data:`EXCLUDED` for the empty ones."""
    return torch.where(valid, 0.0, EXCLUDED).to(dtype)


class _QueueLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qs, queue, bias, extra, once):
        buf, offs, lse = _exp_buffer(qs, queue, bias, extra, pooled=once)
        ctx.save_for_backward(qs, queue, buf, offs, lse, extra)
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
        qs, queue, buf, offs, lse, extra = ctx.saved_tensors
        rows, k = buf.shape
        # softmax = exp(logit - offset) * exp(offset - lse), times the incoming gradient
        scales = grad * (offs - lse).exp()
        grad_qs = torch.zeros_like(qs) if ctx.needs_input_grad[0] else None
        grad_queue = torch.empty_like(queue) if ctx.needs_input_grad[1] else None
        ctx.used = ctx.once
        flat = buf.view(-1)
        for span, scale in zip(chunk_spans(rows, k, buf.device), scales):
            block = _chunk_view(flat, rows, span)
            # in place, into the buffer the forward kept, on the training path
            probs = block.mul_(scale[:, None]) if ctx.once else block * scale[:, None]
            if grad_qs is not None:  # (out=, not addmm_: the FLOP counter sees this form)
                torch.addmm(grad_qs, probs, queue[span[0] : span[1]], out=grad_qs)
            if grad_queue is not None:
                torch.mm(probs.T, qs, out=grad_queue[span[0] : span[1]])
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
def queue_softmax_sum(
    qs: torch.Tensor,
    queue: torch.Tensor,
    values: torch.Tensor,
    bias: torch.Tensor | None = None,
    extra: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The softmax p over [extra, queue] of :func:`queue_logsumexp`'s logits, without gradient,
    as (p_extra [B] (None without ``extra``), sum_j p_queue_j values_j [B, V]) for ``values``
    [K, V]; the [B, K] probabilities are never stored, only one chunk of them at a time."""
    rows, k = qs.size(0), queue.size(0)
    if k == 0:
        p_extra = torch.ones_like(extra) if extra is not None else None
        return p_extra, values.new_zeros(rows, values.size(1))
    spans = chunk_spans(rows, k, qs.device)
    work = qs.new_empty(rows * (spans[0][1] - spans[0][0]))
    mix = run = total = None
    for start, end in spans:
        block = _chunk_view(work, rows, (0, end - start))
        off, part_total = _exp_chunk(qs, queue, bias, (start, end), block)
        part = block @ values[start:end]
        if run is None:
            mix, run, total = part, off, part_total
            continue
        new = torch.maximum(run, off)  # the running sums rescaled to the larger offset
        old_scale, part_scale = (run - new).exp(), (off - new).exp()
        mix = mix.mul_(old_scale[:, None]).add_(part.mul_(part_scale[:, None]))
        total = total * old_scale + part_total * part_scale
        run = new
    lse = _log_normaliser(run[None], total[None], extra)
    mix = mix.mul_((run - lse).exp()[:, None])
    p_extra = (extra - lse).exp() if extra is not None else None
    return p_extra, mix
