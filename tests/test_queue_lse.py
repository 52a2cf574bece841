"""``queue_logsumexp`` against ``torch.logsumexp`` on the concatenated logits (float64), and the
one [B, K] buffer it holds from forward to backward."""

import pytest
import torch
import torch.nn.functional as F

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


def far_apart_case(gen, rows=5, k=23, dim=8, t=0.05):
    """Logits far apart: columns 13-15 are 30 above the others, 0, 8-11 and 17 are empty slots."""
    qs = F.normalize(torch.randn(rows, dim, generator=gen), dim=1) / t
    queue = F.normalize(torch.randn(k, dim, generator=gen), dim=1)
    bias = torch.zeros(k)
    bias[13:16] = 30.0
    bias[8:12] = EXCLUDED
    bias[[0, 17]] = EXCLUDED
    extra = torch.randn(rows, generator=gen) * 5
    return qs, queue, bias, extra


@pytest.mark.parametrize("once", [True, False])
@pytest.mark.parametrize("extra_shift", [0.0, 200.0, -200.0])
def test_far_apart_logits_against_float64(once, extra_shift):
    """The extra logit among the others, 200 above them all or 200 below; the gradients for the
    queries, the queue and the extra logit against float64 ``torch.logsumexp``."""
    gen = torch.Generator().manual_seed(int(extra_shift) + 7)
    qs, queue, bias, extra = far_apart_case(gen)
    extra = extra + extra_shift
    for x in (qs, queue, extra):
        x.requires_grad_()
    w = torch.randn(5, generator=gen)
    got = queue_logsumexp(qs, queue, bias, extra, once=once)
    grads = torch.autograd.grad((got * w).sum(), (qs, queue, extra))
    want = reference(qs.double(), queue.double(), bias.double(), extra.double())
    want_grads = torch.autograd.grad((want * w.double()).sum(), (qs, queue, extra))
    torch.testing.assert_close(got, want.float())
    for g, h in zip(grads, want_grads):
        torch.testing.assert_close(g, h.float(), rtol=1e-4, atol=1e-5)


def test_without_extra_and_bias():
    gen = torch.Generator().manual_seed(4)
    qs = (torch.randn(4, 6, generator=gen) * 3).requires_grad_()
    queue = torch.randn(9, 6, generator=gen).requires_grad_()
    got = queue_logsumexp(qs, queue)
    want = torch.logsumexp(qs.double() @ queue.double().T, dim=1)
    torch.testing.assert_close(got, want.float())
    grads = torch.autograd.grad(got.sum(), (qs, queue))
    want_grads = torch.autograd.grad(want.sum(), (qs, queue))
    for g, h in zip(grads, want_grads):
        torch.testing.assert_close(g, h.float(), rtol=1e-4, atol=1e-5)


def test_holds_one_batch_by_queue_buffer_where_logsumexp_holds_more():
    """The memory it exists for: forward and backward together peak at one [B, K] float32
    buffer (plus vectors), where ``torch.logsumexp`` over the concatenated logits holds at
    least two (the logits it keeps and the softmax of its backward)."""
    from benchmarks.timing import cpu_peak_mib

    gen = torch.Generator().manual_seed(5)
    rows, k, dim = 256, 4096, 16  # (a copy of the queue, 1/16 of a block, may come and go)
    qs = (torch.randn(rows, dim, generator=gen) * 3).requires_grad_()
    queue, extra = torch.randn(k, dim, generator=gen), torch.randn(rows, generator=gen)
    bias = torch.zeros(k)
    block = rows * k * 4 / 2**20  # MiB

    def ours():
        torch.autograd.grad(queue_logsumexp(qs, queue, bias, extra).sum(), qs)

    def straightforward():
        torch.autograd.grad(reference(qs, queue, bias, extra).sum(), qs)

    assert cpu_peak_mib(ours) < 1.1 * block
    assert cpu_peak_mib(straightforward) > 2 * block
