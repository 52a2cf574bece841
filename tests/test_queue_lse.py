"""``queue_logsumexp`` against ``torch.logsumexp`` on the concatenated logits, including its
CPU buffer pool (buffers reused across steps, several live in one step) and its chunks of queue
columns; ``queue_softmax_sum`` against the float64 softmax."""

import pytest
import torch
import torch.nn.functional as F

from solo_ext.losses import queue_lse
from solo_ext.losses.queue_lse import EXCLUDED, chunk_spans, queue_logsumexp, queue_softmax_sum


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


def small_chunks(monkeypatch, columns):
    """Chunks of ``columns`` queue columns whatever the rows (the CPU default is megabytes)."""
    monkeypatch.setattr(queue_lse, "CHUNK_BYTES", 0)
    monkeypatch.setattr(queue_lse, "MIN_CHUNK_COLUMNS", columns)


def chunked_case(gen, rows=5, k=23, dim=8, t=0.05):
    """Logits whose chunks sit far apart (columns 13-15 are 30 above the others, 8-11 are
    empty slots), so that the chunks' offsets differ and the running sums must be rescaled."""
    qs = F.normalize(torch.randn(rows, dim, generator=gen), dim=1) / t
    queue = F.normalize(torch.randn(k, dim, generator=gen), dim=1)
    bias = torch.zeros(k)
    bias[13:16] = 30.0
    bias[8:12] = EXCLUDED
    bias[[0, 17]] = EXCLUDED
    extra = torch.randn(rows, generator=gen) * 5
    return qs, queue, bias, extra


def test_chunk_spans_cover_the_queue_once():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for rows, k in [(64, 65536), (320, 65536), (1024, 1000), (7, 1), (50000, 300)]:
        spans = chunk_spans(rows, k, cpu)
        assert spans[0][0] == 0 and spans[-1][1] == k
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        widths = {end - start for start, end in spans[:-1]}
        assert len(widths) <= 1 and all(w >= queue_lse.MIN_CHUNK_COLUMNS for w in widths)
        assert chunk_spans(rows, k, cuda) == [(0, k)]
    # a chunk's logits fit the chunk's bytes
    rows = 320
    (start, end), *_ = chunk_spans(rows, 65536, cpu)
    assert rows * (end - start) * 4 <= queue_lse.CHUNK_BYTES


@pytest.mark.parametrize("columns", [1, 4, 6, 23, 64])
@pytest.mark.parametrize("once", [True, False])
@pytest.mark.parametrize("extra_shift", [0.0, 200.0])
def test_chunks_give_the_logsumexp_and_its_gradient(monkeypatch, columns, once, extra_shift):
    """Chunks of 1 column, uneven chunks (23 = 3 x 6 + 5), one chunk, more columns than the
    queue, the extra logit among the others or above them all; the gradients for the queries,
    the queue and the extra logit."""
    small_chunks(monkeypatch, columns)
    gen = torch.Generator().manual_seed(columns)
    qs, queue, bias, extra = chunked_case(gen)
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


def test_gradcheck_over_chunks(monkeypatch):
    small_chunks(monkeypatch, 3)
    gen = torch.Generator().manual_seed(3)
    qs = torch.randn(4, 5, generator=gen, dtype=torch.float64).requires_grad_()
    queue = torch.randn(11, 5, generator=gen, dtype=torch.float64).requires_grad_()
    extra = torch.randn(4, generator=gen, dtype=torch.float64).requires_grad_()
    bias = torch.zeros(11, dtype=torch.float64)
    bias[3:6] = EXCLUDED  # a whole chunk empty

    def fn(q, k, e):
        return queue_logsumexp(q, k, bias, e, once=False)

    assert torch.autograd.gradcheck(fn, (qs, queue, extra))


def softmax_sum_reference(qs, queue, values, bias, extra):
    """float64: softmax over [extra, logits], then (p_extra, p_queue @ values)."""
    logits = qs.double() @ queue.double().T + bias.double()
    if extra is not None:
        logits = torch.cat([extra.double()[:, None], logits], dim=1)
    p = torch.softmax(logits, dim=1)
    if extra is None:
        return None, p @ values.double()
    return p[:, 0], p[:, 1:] @ values.double()


@pytest.mark.parametrize("columns", [1, 5, 23, 100])
@pytest.mark.parametrize("extra_shift", [0.0, 200.0, None])
def test_softmax_sum_over_chunks_matches_float64(monkeypatch, columns, extra_shift):
    """``extra_shift``: the extra logit among the others, above them all (it is the largest
    logit of every row), or none."""
    small_chunks(monkeypatch, columns)
    gen = torch.Generator().manual_seed(columns)
    qs, queue, bias, extra = chunked_case(gen)
    with_extra = extra_shift is not None
    extra = extra + extra_shift if with_extra else None
    values = torch.randn(23, 3, generator=gen)
    p_extra, mixed = queue_softmax_sum(qs, queue, values, bias, extra)
    want_extra, want_mixed = softmax_sum_reference(qs, queue, values, bias, extra)
    torch.testing.assert_close(mixed, want_mixed.float(), rtol=1e-5, atol=1e-6)
    if with_extra:
        torch.testing.assert_close(p_extra, want_extra.float(), rtol=1e-5, atol=1e-7)
    else:
        assert p_extra is None


def test_softmax_sum_of_an_empty_queue_puts_all_mass_on_extra():
    qs, extra = torch.randn(3, 4), torch.randn(3)
    p_extra, mixed = queue_softmax_sum(qs, torch.empty(0, 4), torch.empty(0, 6), None, extra)
    assert torch.equal(p_extra, torch.ones(3)) and torch.equal(mixed, torch.zeros(3, 6))
