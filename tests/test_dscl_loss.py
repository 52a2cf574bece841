"""The DSCL loss against a loop over the paper's equations 8-9, and the properties it proves."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from solo_ext.losses.dscl import dscl_loss
from solo_ext.losses.scl import scl_loss


def dscl_reference(q, k, queue, labels, queue_labels, alpha, t):
    """Eq. 8-9, one anchor at a time in differentiable float64 (no masks): alpha on k_i,
    (1 - alpha) / |P_i| on the other positives P_i ("scl": alpha = 1 / (|P_i| + 1))."""
    b = q.size(0)
    filled = [j for j in range(queue.size(0)) if queue_labels[j].item() != -1]
    total = 0
    for i in range(b):
        members = [q[j] for j in range(b) if j != i] + list(k) + [queue[j] for j in filled]
        ys = [labels[j] for j in range(b) if j != i] + list(labels)
        ys = [y.item() for y in ys + [queue_labels[j] for j in filled]]
        aug_at = b - 1 + i  # k_i
        logits = torch.stack([q[i].double() @ c.double() for c in members]) / t
        log_p = logits - torch.logsumexp(logits, dim=0)
        others = [j for j, y in enumerate(ys) if j != aug_at and y == labels[i].item()]
        a = (1 / (len(others) + 1) if alpha == "scl" else alpha) if others else 1.0
        total = total - a * log_p[aug_at]
        if others:
            total = total - (1 - a) * log_p[others].mean()
    return total / b


def _unit(n, d, gen):
    return F.normalize(torch.randn(n, d, generator=gen), dim=1)


@pytest.mark.parametrize("b,k_size,d", [(4, 0, 8), (6, 12, 8), (8, 40, 16), (2, 3, 4)])
@pytest.mark.parametrize("t", [0.07, 0.3])
@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.5, 1.0, "scl"])
def test_matches_loop_reference(b, k_size, d, t, alpha):
    gen = torch.Generator().manual_seed(7 * b + k_size)
    q, k, queue = _unit(b, d, gen), _unit(b, d, gen), _unit(k_size, d, gen)
    labels = torch.randint(0, 3, (b,), generator=gen)
    queue_labels = torch.randint(-1, 3, (k_size,), generator=gen)
    got = dscl_loss(q, k, queue, labels, queue_labels, alpha=alpha, temperature=t)
    want = dscl_reference(q, k, queue, labels, queue_labels, alpha, t)
    assert got.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("alpha", [0.3, "scl"])
@pytest.mark.parametrize("num_classes", [None, 5])
def test_gradients_match_loop_reference(alpha, num_classes):
    gen = torch.Generator().manual_seed(11)
    leaves = [_unit(n, 8, gen).double().requires_grad_() for n in (6, 6, 20)]
    labels = torch.randint(0, 3, (6,), generator=gen)
    queue_labels = torch.randint(-1, 3, (20,), generator=gen)
    got = dscl_loss(
        *leaves, labels, queue_labels, alpha=alpha, temperature=0.1, num_classes=num_classes
    )
    want = dscl_reference(*leaves, labels, queue_labels, alpha, 0.1)
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    for g, w in zip(torch.autograd.grad(got, leaves), torch.autograd.grad(want, leaves)):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("beta", [0.0, 1.0, 6.0, 8.0])
def test_beta_form_is_alpha_one_over_one_plus_beta(beta):
    gen = torch.Generator().manual_seed(1)
    q, k, queue = _unit(6, 8, gen), _unit(6, 8, gen), _unit(10, 8, gen)
    labels, queue_labels = torch.tensor([0, 1, 0, 2, 1, 0]), torch.randint(0, 3, (10,))
    by_beta = dscl_loss(q, k, queue, labels, queue_labels, beta=beta)
    by_alpha = dscl_loss(q, k, queue, labels, queue_labels, alpha=1 / (1 + beta))
    assert by_beta.item() == pytest.approx(by_alpha.item(), rel=1e-6)


def test_alpha_scl_is_the_scl_loss():
    gen = torch.Generator().manual_seed(2)
    for _ in range(5):
        q, k, queue = _unit(8, 16, gen), _unit(8, 16, gen), _unit(20, 16, gen)
        labels = torch.randint(0, 4, (8,), generator=gen)
        queue_labels = torch.randint(-1, 4, (20,), generator=gen)
        d = dscl_loss(q, k, queue, labels, queue_labels, alpha="scl", temperature=0.1)
        s = scl_loss(q, k, queue, labels, queue_labels, temperature=0.1)
        assert d.item() == pytest.approx(s.item(), rel=1e-6)


def _gradient_ratio(alpha, num_positives, gen, d=256, k_size=65536, t=0.5):
    """|dL/ds_{k_i}| / |sum_{p in P_i} dL/ds_p| for one anchor at random initialisation.

    The queue requires grad; every gradient through a member c is (dL/ds_c) * q / t, parallel
    to q, so the norms are those of the logit gradients of the paper's eq. 10.
    """
    q, k = _unit(1, d, gen), _unit(1, d, gen).requires_grad_()
    queue = _unit(k_size, d, gen).requires_grad_()
    queue_labels = torch.ones(k_size, dtype=torch.long)
    queue_labels[:num_positives] = 0
    loss = dscl_loss(q, k, queue, torch.tensor([0]), queue_labels, alpha=alpha, temperature=t)
    loss.backward()
    through_aug = k.grad.norm()
    through_positives = queue.grad[:num_positives].sum(dim=0).norm()
    return (through_aug / through_positives).item()


@pytest.mark.parametrize("alpha", [0.1, 0.3, 0.5, "scl"])
def test_gradient_ratio_through_the_augmented_view(alpha):
    """alpha / (1 - alpha) whatever the class size; SCL's shrinks as 1 / |P_i|."""
    gen = torch.Generator().manual_seed(3)
    for num_positives in (4, 64, 512):
        ratio = _gradient_ratio(alpha, num_positives, gen)
        # p(c | q) ~ 1/K at random init: the ratio is (alpha - p) / (1 - alpha - |P| p), which
        # is alpha / (1 - alpha) up to |P| / K (DSCL eq. 10; K = 65536, the official queue)
        want = 1 / num_positives if alpha == "scl" else alpha / (1 - alpha)
        assert ratio == pytest.approx(want, rel=0.1), num_positives


@pytest.mark.parametrize("alpha", [0.3, 0.6, "scl"])
def test_optimum_puts_probability_alpha_on_the_augmented_view(alpha):
    """Minimising over free embeddings drives p(k_i | q_i) to alpha (SCL: 1 / (|P_i| + 1))."""
    torch.manual_seed(0)
    num_positives, num_negatives, d, t = 9, 20, 16, 0.1
    raw = torch.randn(2 + num_positives + num_negatives, d, requires_grad=True)
    queue_labels = torch.tensor([0] * num_positives + [1] * num_negatives)
    opt = torch.optim.Adam([raw], lr=0.05)
    for _ in range(600):
        z = F.normalize(raw, dim=1)
        loss = dscl_loss(
            z[:1], z[1:2], z[2:], torch.tensor([0]), queue_labels, alpha=alpha, temperature=t
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    z = F.normalize(raw.detach(), dim=1)
    p = F.softmax(z[0] @ z[1:].T / t, dim=0)
    expected = 1 / (num_positives + 1) if alpha == "scl" else alpha
    assert p[0].item() == pytest.approx(expected, abs=0.03)
    assert p[1 + num_positives :].sum().item() < 0.02  # negatives pushed out


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"alpha": 1.5}, "alpha=1.5"),
        ({"beta": -1.0}, "beta=-1.0"),
        ({"alpha": 0.5, "beta": 1.0}, "not both"),
        ({}, "alpha=None, beta=None"),
        ({"alpha": 0.5, "temperature": 0.0}, "temperature=0.0"),
    ],
)
def test_bad_arguments(kwargs, message):
    q = F.normalize(torch.randn(2, 4), dim=1)
    with pytest.raises(ValueError, match=message):
        dscl_loss(q, q, q[:0], torch.tensor([0, 1]), torch.tensor([], dtype=torch.long), **kwargs)
