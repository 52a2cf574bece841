"""The log-sum-exp of a batch against a queue, holding one [B, K] buffer.

``torch.logsumexp`` on ``q @ queue.T`` keeps the logits for its backward and makes the softmax
as a second [B, K] tensor there (plus a copy for each concatenation or masking step). Here the
forward turns the logits buffer into exp(logit - max) in place and keeps it, and the backward
scales that same buffer into the softmax, so a call holds one [B, K] buffer from forward to
backward. That is what DenseCL's dense term needs: its [B S^2, K] logits are 3.2 GB at
B 256, S^2 49, K 65536 (float32), and the straightforward form held 9.4 GB at its peak on an
H200 (docs/performance.md).
"""

from __future__ import annotations

import torch

EXCLUDED = -1e9  # the logit bias of an empty queue slot: no logit survives it


def slot_bias(valid: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[K] logit bias: 0 for the filled slots, :data:`EXCLUDED` for the empty ones."""
    return torch.where(valid, 0.0, EXCLUDED).to(dtype)


class _QueueLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qs, queue, bias, extra, once):
        if bias is None:
            exps = qs @ queue.T
        else:
            exps = torch.addmm(bias, qs, queue.T)
        # offset: the row's largest logit (0 where a row has none that is finite)
        off = exps.amax(dim=1)
        off = torch.where(torch.isfinite(off), off, torch.zeros_like(off))
        exps.sub_(off[:, None]).exp_()
        total = exps.sum(dim=1)
        if extra is None:
            lse = off + total.log()
        else:
            top = torch.maximum(off, extra)
            lse = top + (total * (off - top).exp() + (extra - top).exp()).log()
        ctx.save_for_backward(qs, queue, exps, off, lse, extra)
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
        qs, queue, exps, off, lse, extra = ctx.saved_tensors
        ctx.used = ctx.once
        # softmax = exp(logit - off) * exp(off - lse), times the incoming gradient
        scale = (grad * (off - lse).exp())[:, None]
        probs = exps.mul_(scale) if ctx.once else exps * scale
        grad_qs = probs @ queue if ctx.needs_input_grad[0] else None
        grad_queue = probs.T @ qs if ctx.needs_input_grad[1] else None
        grad_extra = grad * (extra - lse).exp() if ctx.needs_input_grad[3] else None
        return grad_qs, grad_queue, None, grad_extra, None


def queue_logsumexp(
    qs: torch.Tensor,
    queue: torch.Tensor,
    bias: torch.Tensor | None = None,
    extra: torch.Tensor | None = None,
    once: bool = True,
) -> torch.Tensor:
    """lse_i = log( exp(extra_i) + sum_j exp(qs_i . queue_j + bias_j) ).

    Args:
        qs: [B, D] queries, the temperature already folded in (q / t).
        queue: [K, D] keys; bias: [K] added to every row (a large negative value removes a
            column; it carries no gradient); extra: [B] one more logit per row (the positive,
            or the log-sum-exp of other columns), or None.
        once: the backward runs at most once (a training step): it turns the forward's buffer
            into the softmax in place, and a second backward raises. False allows repeated
            backward passes (``torch.autograd.gradcheck``, ``retain_graph``) at the cost of one
            more [B, K] tensor in the backward.

    Returns:
        [B], in the dtype of ``qs``.
    """
    if queue.size(0) == 0:
        return extra if extra is not None else qs.new_full((qs.size(0),), float("-inf"))
    return _QueueLogSumExp.apply(qs, queue, bias, extra, once)
