"""The SCL loss (L_out with a MoCo queue) against a loop re-derivation of the equation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from solo_ext.losses.scl import scl_loss


def scl_reference(q, k, queue, labels, queue_labels, t):
    """Eq. 1-2 of DSCL, one anchor at a time in differentiable float64: the mean of
    -log p(c | q_i) over the positives of the contrast set A_i (other queries, all keys, filled
    queue slots); k_i is one of them, since it carries the anchor's label."""
    q, k, queue = q.double(), k.double(), queue.double()
    b = q.size(0)
    total = 0
    for i in range(b):
        members = [(q[j], labels[j]) for j in range(b) if j != i] + list(zip(k, labels))
        members += [(c, y) for c, y in zip(queue, queue_labels) if y != -1]
        logits = torch.stack([q[i] @ c for c, _ in members]) / t
        log_p = logits - logits.logsumexp(0)
        positives = torch.tensor([bool(y == labels[i]) for _, y in members])
        total = total - log_p[positives].mean()
    return total / b


def _embeddings(n, d, gen):
    return F.normalize(torch.randn(n, d, generator=gen), dim=1)


@pytest.mark.parametrize("b,k_size,d", [(4, 0, 8), (6, 10, 8), (8, 33, 16), (3, 5, 4)])
@pytest.mark.parametrize("t", [0.07, 0.2, 1.0])
def test_value_and_gradient_match_loop_reference(b, k_size, d, t):
    gen = torch.Generator().manual_seed(b * 100 + k_size)
    q, k = _embeddings(b, d, gen).requires_grad_(), _embeddings(b, d, gen)
    queue = _embeddings(k_size, d, gen)
    labels = torch.randint(0, 3, (b,), generator=gen)
    queue_labels = torch.randint(-1, 3, (k_size,), generator=gen)  # -1 = empty slot
    got = scl_loss(q, k, queue, labels, queue_labels, temperature=t)
    q64 = q.detach().double().requires_grad_()
    want = scl_reference(q64, k, queue, labels, queue_labels, t)
    assert got.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-6)
    (g,), (w,) = torch.autograd.grad(got, q), torch.autograd.grad(want, q64)
    torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-6)


def test_anchor_without_same_class_positive_is_infonce():
    gen = torch.Generator().manual_seed(0)
    q, k, queue = _embeddings(3, 8, gen), _embeddings(3, 8, gen), _embeddings(5, 8, gen)
    labels = torch.tensor([0, 1, 2])
    queue_labels = torch.tensor([3, 3, 4, 4, 5])
    logits = torch.cat([q @ q.T, q @ k.T, q @ queue.T], 1) / 0.1
    logits[:, :3].fill_diagonal_(float("-inf"))
    expected = F.cross_entropy(logits, torch.arange(3) + 3)  # positive = k_i only
    assert scl_loss(q, k, queue, labels, queue_labels, 0.1).item() == pytest.approx(
        expected.item(), rel=1e-6
    )


def test_empty_queue_slots_are_ignored():
    gen = torch.Generator().manual_seed(1)
    q, k, queue = _embeddings(4, 8, gen), _embeddings(4, 8, gen), _embeddings(6, 8, gen)
    labels = torch.tensor([0, 0, 1, 1])
    empty = torch.full((6,), -1)
    no_queue = scl_loss(q, k, queue[:0], labels, empty[:0], 0.2)
    # whatever the empty slots hold, they change nothing
    assert scl_loss(q, k, queue, labels, empty, 0.2).item() == pytest.approx(no_queue.item())
    assert scl_loss(q, k, -queue, labels, empty, 0.2).item() == pytest.approx(no_queue.item())


def test_float32_under_autocast():
    gen = torch.Generator().manual_seed(3)
    q, k, queue = _embeddings(4, 8, gen), _embeddings(4, 8, gen), _embeddings(8, 8, gen)
    labels, queue_labels = torch.tensor([0, 1, 0, 1]), torch.randint(0, 2, (8,), generator=gen)
    full = scl_loss(q, k, queue, labels, queue_labels, 0.05)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = scl_loss(q.bfloat16(), k.bfloat16(), queue.bfloat16(), labels, queue_labels, 0.05)
    assert mixed.dtype == torch.float32
    assert mixed.item() == pytest.approx(full.item(), rel=2e-2)


def test_rejects_non_positive_temperature():
    q = F.normalize(torch.randn(2, 4), dim=1)
    with pytest.raises(ValueError, match="temperature=0"):
        scl_loss(q, q, q[:0], torch.tensor([0, 1]), torch.tensor([], dtype=torch.long), 0)
