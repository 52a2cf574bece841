"""The SCL loss (L_out with a MoCo queue) against a loop re-derivation of the equation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from solo_ext.losses.scl import scl_loss


def scl_reference(q, k, queue, labels, queue_labels, t):
    """Eq. 1-2 of DSCL, one anchor and one positive at a time, in float64."""
    q, k, queue = q.double(), k.double(), queue.double()
    b = q.size(0)
    total = 0.0
    for i in range(b):
        # contrast set A_i: other queries, all keys, filled queue slots
        members = [(q[j], labels[j].item()) for j in range(b) if j != i]
        members += [(k[j], labels[j].item()) for j in range(b)]
        members += [
            (queue[j], queue_labels[j].item())
            for j in range(queue.size(0))
            if queue_labels[j].item() != -1
        ]
        denominator = sum(math.exp(float(q[i] @ c) / t) for c, _ in members)
        positives = [c for c, y in members if y == labels[i].item()]
        # k_i is always a positive; it is in the list above because it carries the anchor's label
        terms = [-math.log(math.exp(float(q[i] @ c) / t) / denominator) for c in positives]
        total += sum(terms) / len(terms)
    return total / b


def _embeddings(n, d, gen):
    return F.normalize(torch.randn(n, d, generator=gen), dim=1)


@pytest.mark.parametrize("b,k_size,d", [(4, 0, 8), (6, 10, 8), (8, 33, 16), (3, 5, 4)])
@pytest.mark.parametrize("t", [0.07, 0.2, 1.0])
def test_matches_loop_reference(b, k_size, d, t):
    gen = torch.Generator().manual_seed(b * 100 + k_size)
    q, k = _embeddings(b, d, gen), _embeddings(b, d, gen)
    queue = _embeddings(k_size, d, gen)
    labels = torch.randint(0, 3, (b,), generator=gen)
    queue_labels = torch.randint(-1, 3, (k_size,), generator=gen)  # -1 = empty slot
    got = scl_loss(q, k, queue, labels, queue_labels, temperature=t)
    want = scl_reference(q, k, queue, labels, queue_labels, t)
    assert got.item() == pytest.approx(want, rel=1e-5, abs=1e-6)


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


def test_gradient_matches_reference_autograd():
    gen = torch.Generator().manual_seed(2)
    q = _embeddings(5, 6, gen).requires_grad_()
    k, queue = _embeddings(5, 6, gen), _embeddings(7, 6, gen)
    labels = torch.tensor([0, 1, 0, 2, 1])
    queue_labels = torch.tensor([0, 1, -1, 2, 2, 0, -1])
    scl_loss(q, k, queue, labels, queue_labels, 0.1).backward()

    q64 = q.detach().double().requires_grad_()
    ref = torch.zeros((), dtype=torch.float64)
    for i in range(5):  # the same equation written with autograd-able tensor ops, one anchor
        cols = [q64[j] for j in range(5) if j != i] + [k[j].double() for j in range(5)]
        ys = [labels[j] for j in range(5) if j != i] + list(labels)
        cols += [queue[j].double() for j in range(7) if queue_labels[j] != -1]
        ys += [queue_labels[j] for j in range(7) if queue_labels[j] != -1]
        sims = torch.stack([q64[i] @ c for c in cols]) / 0.1
        log_p = sims - sims.logsumexp(0)
        pos = torch.tensor([bool(y == labels[i]) for y in ys])
        ref = ref - log_p[pos].mean()
    (ref / 5).backward()
    torch.testing.assert_close(q.grad.double(), q64.grad, rtol=1e-4, atol=1e-6)


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
