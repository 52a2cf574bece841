"""``queue_logsumexp`` against ``torch.logsumexp`` on the concatenated logits, including its
CPU buffer pool (buffers reused across steps, several live in one step)."""

import pytest
import torch
import torch.nn.functional as F

from solo_ext.losses import queue_lse
from solo_ext.losses.queue_lse import EXCLUDED, queue_logsumexp


def reference(qs, queue, bias, extra):
    logits = qs @ queue.T + bias
    return torch.logsumexp(torch.cat([extra[:, None], logits], dim=1), dim=1)


def test_value_and_gradient_match_logsumexp():
    gen = torch.Generator().manual_seed(0)
    qs = (F.normalize(torch.randn(6, 8, generator=gen), dim=1) / 0.1).requires_grad_()
    queue = F.normalize(torch.randn(20, 8, generator=gen), dim=1).requires_grad_()
    extra = torch.randn(6, generator=gen).requires_grad_()
    bias = torch.zeros(20)
    bias[[3, 7]] = EXCLUDED  # two empty slots
    w = torch.randn(6, generator=gen)
    got = queue_logsumexp(qs, queue, bias, extra)
    grads = torch.autograd.grad((got * w).sum(), (qs, queue, extra))
    want = reference(qs, queue, bias, extra)
    want_grads = torch.autograd.grad((want * w).sum(), (qs, queue, extra))
    torch.testing.assert_close(got, want)
    for g, h in zip(grads, want_grads):
        torch.testing.assert_close(g, h)


def test_pooled_buffers_are_never_shared_between_live_calls(monkeypatch):
    """Steps of two live calls each (like DenseCL's two directions) reuse the pool's buffers;
    a buffer handed out twice at once would corrupt the first call's backward."""
    pool = queue_lse._BufferPool()
    monkeypatch.setattr(queue_lse, "_POOL", pool)
    monkeypatch.setattr(queue_lse._BufferPool, "MIN_BYTES", 0)
    gen = torch.Generator().manual_seed(1)
    queue = F.normalize(torch.randn(32, 8, generator=gen), dim=1)
    bias = torch.zeros(32)
    for _ in range(3):
        qs = [(torch.randn(5, 8, generator=gen) * 3).requires_grad_() for _ in range(2)]
        extra = [torch.randn(5, generator=gen) for _ in range(2)]
        loss = (
            queue_logsumexp(qs[0], queue, bias, extra[0]).sum()
            + 2 * queue_logsumexp(qs[1], queue, bias, extra[1]).sum()
        )
        loss.backward()
        want = (
            reference(qs[0], queue, bias, extra[0]).sum()
            + 2 * reference(qs[1], queue, bias, extra[1]).sum()
        )
        want_grads = torch.autograd.grad(want, qs)
        for q, g in zip(qs, want_grads):
            torch.testing.assert_close(q.grad, g)
        # both buffers came back and the next step takes them again
        assert len(pool.free[((5, 32), torch.float32, torch.device("cpu"))]) == 2


def test_pool_keeps_only_recent_shapes():
    pool = queue_lse._BufferPool(per_shape=1, shapes=2)
    pool.MIN_BYTES = 0
    for n in (1, 2, 3):
        pool.give(torch.empty(n, 4))
    assert [key[0] for key in pool.free] == [(2, 4), (3, 4)]
    pool.give(torch.empty(3, 4))  # a second one of a full shape is not kept
    assert len(pool.free[((3, 4), torch.float32, torch.device("cpu"))]) == 1
    taken = pool.take((3, 4), torch.float32, torch.device("cpu"))
    assert taken.shape == (3, 4) and not pool.free[((3, 4), torch.float32, torch.device("cpu"))]


def test_empty_queue_returns_extra():
    qs, extra = torch.randn(3, 4), torch.randn(3)
    assert torch.equal(queue_logsumexp(qs, torch.empty(0, 4), None, extra), extra)


def test_gradcheck_in_float64_with_once_false():
    """torch.autograd.gradcheck (finite differences against the analytic backward, which it
    runs many times over one graph): the repeatable path, ``once=False``."""
    gen = torch.Generator().manual_seed(1)
    qs = torch.randn(4, 5, generator=gen, dtype=torch.float64).requires_grad_()
    queue = torch.randn(7, 5, generator=gen, dtype=torch.float64).requires_grad_()
    extra = torch.randn(4, generator=gen, dtype=torch.float64).requires_grad_()
    bias = torch.zeros(7, dtype=torch.float64)
    bias[2] = EXCLUDED

    def fn(q, k, e):
        return queue_logsumexp(q, k, bias, e, once=False)

    assert torch.autograd.gradcheck(fn, (qs, queue, extra))


def test_second_backward_of_the_training_path_says_why():
    gen = torch.Generator().manual_seed(2)
    qs = torch.randn(3, 4, generator=gen).requires_grad_()
    queue = torch.randn(6, 4, generator=gen)
    lse = queue_logsumexp(qs, queue, None, torch.zeros(3)).sum()
    first = torch.autograd.grad(lse, qs, retain_graph=True)[0]
    with pytest.raises(RuntimeError, match="runs once.*once=False"):
        torch.autograd.grad(lse, qs)
    repeat = queue_logsumexp(qs, queue, None, torch.zeros(3), once=False).sum()
    again = [torch.autograd.grad(repeat, qs, retain_graph=True)[0] for _ in range(2)]
    torch.testing.assert_close(again[0], first)
    torch.testing.assert_close(again[1], first)
