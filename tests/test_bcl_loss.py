"""The BCL losses against the official code, run in float64, and properties of its formula."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from straightforward import bcl_straightforward

from solo_ext.losses.bcl import (
    bcl_contrastive_loss,
    bcl_loss,
    log_prior_from_counts,
    logit_adjusted_ce,
)


def balscl_reference(centers, features, targets, num_classes, temperature):
    """BalSCL.forward of the official loss/contrastive.py (``straightforward.py``'s replica) in
    float64: the per-anchor losses as [2, B] (the official value is their mean)."""
    assert centers.size(0) == num_classes
    features, centers = features.double(), centers.double()
    return bcl_straightforward(features, centers, targets, temperature, reduction="none")


def logit_adjust_reference(x, target, cls_num_list, tau):
    """LogitAdjust of the official loss/logitadjust.py (its float32 prior, on the CPU)."""
    cls_num_list = torch.tensor(cls_num_list, dtype=torch.float32)
    m_list = (tau * torch.log(cls_num_list / cls_num_list.sum())).view(1, -1)
    return F.cross_entropy(x + m_list.to(x.dtype), target)


def _unit(*shape, gen, dtype=torch.float64):
    return F.normalize(torch.randn(*shape, generator=gen, dtype=dtype), dim=-1)


# (B, C, D, t, number of classes the labels are drawn from): the classes at and above the last
# are absent from the batch; C = 2 with B = 1 has a singleton class and an absent one
CASES = [
    (1, 2, 4, 0.5, 1),
    (4, 3, 8, 0.07, 3),
    (8, 10, 16, 0.1, 6),
    (16, 5, 32, 0.2, 2),
    (6, 50, 8, 1.0, 50),
    (32, 100, 24, 0.07, 12),
]
TOLERANCES = {
    torch.float64: {"value": dict(rtol=1e-10, atol=1e-12), "grad": dict(rtol=1e-9, atol=1e-12)},
    torch.float32: {"value": dict(rtol=5e-6, atol=5e-6), "grad": dict(rtol=1e-4, atol=1e-5)},
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("b,c,d,t,drawn", CASES + [(8, 4, 16, 0.01, 3)])
def test_values_and_gradients_match_official_float64(b, c, d, t, drawn, dtype):
    """Per anchor, mean and gradients (t = 0.01 puts logits at 100: exp would overflow without
    the logsumexp)."""
    gen = torch.Generator().manual_seed(b * 100 + c)
    features = _unit(b, 2, d, gen=gen, dtype=dtype).requires_grad_()
    prototypes = _unit(c, d, gen=gen, dtype=dtype).requires_grad_()
    labels = torch.randint(0, drawn, (b,), generator=gen)
    f64, p64 = (x.detach().double().requires_grad_() for x in (features, prototypes))
    want = balscl_reference(p64, f64, labels, c, t)
    tol = TOLERANCES[dtype]
    got = bcl_contrastive_loss(features, prototypes, labels, temperature=t, reduction="none")
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), want, **tol["value"])
    got_mean = bcl_contrastive_loss(features, prototypes, labels, temperature=t)
    torch.testing.assert_close(got_mean.double(), want.mean(), **tol["value"])
    for g, w in zip(
        torch.autograd.grad(got_mean, (features, prototypes)),
        torch.autograd.grad(want.mean(), (f64, p64)),
    ):
        torch.testing.assert_close(g.double(), w, **tol["grad"])


def test_half_precision_and_autocast_compute_in_float32():
    gen = torch.Generator().manual_seed(5)
    features = _unit(8, 2, 16, gen=gen, dtype=torch.float32)
    prototypes = _unit(4, 16, gen=gen, dtype=torch.float32)
    labels = torch.randint(0, 4, (8,), generator=gen)
    f16, p16 = features.to(torch.bfloat16), prototypes.to(torch.bfloat16)
    got = bcl_contrastive_loss(f16, p16, labels, temperature=0.1)
    want = bcl_contrastive_loss(f16.float(), p16.float(), labels, temperature=0.1)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = bcl_contrastive_loss(features, prototypes, labels, temperature=0.1)
    plain = bcl_contrastive_loss(features, prototypes, labels, temperature=0.1)
    assert under.dtype == torch.float32
    assert under.item() == pytest.approx(plain.item(), rel=1e-6)


def test_a_collapsed_class_counts_once_whatever_its_batch_count():
    """Class-averaging and class-complement: if every batch member of class k sits on its
    prototype w_k, an anchor of another class sees class k as exp(z . w_k / t) alone, so its
    loss does not depend on n_k (0 included: the absent class enters through w_k)."""
    gen = torch.Generator().manual_seed(3)
    c, d, t = 4, 8, 0.1
    prototypes = _unit(c, d, gen=gen)
    base = _unit(6, 2, d, gen=gen)
    base_labels = torch.tensor([0, 1, 0, 3, 1, 0])
    losses = []
    for n_k in (0, 1, 3, 10):
        collapsed = prototypes[2].expand(n_k, 2, d)
        features = torch.cat([base, collapsed])
        labels = torch.cat([base_labels, torch.full((n_k,), 2)])
        per_anchor = bcl_contrastive_loss(
            features, prototypes, labels, temperature=t, reduction="none"
        )
        losses.append(per_anchor[:, :6])
    for other in losses[1:]:
        torch.testing.assert_close(other, losses[0], rtol=1e-12, atol=1e-12)

    # not vacuous: class 2 members off the prototype do change the others' losses
    spread = _unit(3, 2, d, gen=gen)
    features = torch.cat([base, spread])
    labels = torch.cat([base_labels, torch.full((3,), 2)])
    moved = bcl_contrastive_loss(features, prototypes, labels, temperature=t, reduction="none")
    assert (moved[:, :6] - losses[0]).abs().max() > 1e-3


def test_each_class_enters_the_denominator_as_its_mean():
    """Anchor i's denominator is sum_k mean_{a in A_k minus z_i} exp(z_i . a / t): check one
    anchor by hand against the reduction='none' value."""
    gen = torch.Generator().manual_seed(9)
    c, d, t = 5, 6, 0.2
    features, prototypes = _unit(7, 2, d, gen=gen), _unit(c, d, gen=gen)
    labels = torch.tensor([0, 0, 0, 1, 3, 3, 0])
    per_anchor = bcl_contrastive_loss(features, prototypes, labels, temperature=t, reduction="none")
    for view, i in [(0, 0), (1, 3), (0, 4)]:
        z = features[i, view]
        members = {k: [prototypes[k]] for k in range(c)}
        for j in range(7):
            for v in range(2):
                if (j, v) != (i, view):
                    members[labels[j].item()].append(features[j, v])
        sims = {k: torch.stack([z @ a / t for a in m]) for k, m in members.items()}
        denominator = sum(s.exp().mean() for s in sims.values())
        own = sims[labels[i].item()]
        expected = -(own - denominator.log()).mean()
        assert per_anchor[view, i].item() == pytest.approx(expected.item(), rel=1e-12)


def test_invariant_to_batch_order_and_view_order():
    gen = torch.Generator().manual_seed(4)
    features, prototypes = _unit(10, 2, 8, gen=gen), _unit(6, 8, gen=gen)
    labels = torch.randint(0, 4, (10,), generator=gen)
    loss = bcl_contrastive_loss(features, prototypes, labels, temperature=0.1)
    perm = torch.randperm(10, generator=gen)
    shuffled = bcl_contrastive_loss(features[perm], prototypes, labels[perm], temperature=0.1)
    swapped = bcl_contrastive_loss(features.flip(1), prototypes, labels, temperature=0.1)
    assert shuffled.item() == pytest.approx(loss.item(), rel=1e-12)
    assert swapped.item() == pytest.approx(loss.item(), rel=1e-12)


def test_nonnegative_and_zero_at_the_collapsed_separated_optimum():
    """The own class enters the denominator as the mean of exp over P_i, so by Jensen
    L_i >= 0 (SCL's own bound is log |P_i|); it tends to 0 when each class collapses onto its
    prototype and the classes are far apart."""
    gen = torch.Generator().manual_seed(6)
    for _ in range(5):
        features, prototypes = _unit(12, 2, 4, gen=gen), _unit(3, 4, gen=gen)
        labels = torch.randint(0, 3, (12,), generator=gen)
        per_anchor = bcl_contrastive_loss(
            features, prototypes, labels, temperature=0.5, reduction="none"
        )
        assert (per_anchor >= 0).all()
    prototypes = torch.eye(3, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 2, 0])
    features = prototypes[labels][:, None, :].expand(5, 2, 3)
    loss = bcl_contrastive_loss(features, prototypes, labels, temperature=0.05)
    assert loss.item() == pytest.approx(2 * math.exp(-1 / 0.05), rel=1e-6)


def test_every_prototype_gets_a_gradient_absent_classes_included():
    gen = torch.Generator().manual_seed(8)
    features = _unit(6, 2, 8, gen=gen)
    prototypes = _unit(9, 8, gen=gen).requires_grad_()
    labels = torch.tensor([0, 1, 1, 2, 0, 0])  # classes 3-8 absent
    bcl_contrastive_loss(features, prototypes, labels, temperature=0.1).backward()
    assert (prototypes.grad.norm(dim=1) > 0).all()


@pytest.mark.parametrize("tau", [0.0, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("b,c", [(1, 2), (8, 5), (32, 100)])
def test_logit_adjusted_ce_matches_official(tau, b, c):
    gen = torch.Generator().manual_seed(b + c)
    counts = torch.randint(1, 500, (c,), generator=gen).tolist()
    logits = (30 * torch.randn(b, c, generator=gen)).requires_grad_()
    labels = torch.randint(0, c, (b,), generator=gen)
    got = logit_adjusted_ce(logits, labels, log_prior_from_counts(counts), tau=tau)
    want = logit_adjust_reference(logits, labels, counts, tau)
    assert got.item() == pytest.approx(want.item(), rel=1e-6, abs=1e-6)
    (g,), (w,) = torch.autograd.grad(got, logits), torch.autograd.grad(want, logits)
    torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)
    per_sample = logit_adjusted_ce(
        logits, labels, log_prior_from_counts(counts), tau=tau, reduction="none"
    )
    assert per_sample.shape == (b,)
    assert per_sample.mean().item() == pytest.approx(got.item(), rel=1e-6)


def test_logit_adjustment_properties():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(16, 7, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 7, (16,), generator=gen)
    plain = F.cross_entropy(logits, labels)
    log_prior = log_prior_from_counts([100, 50, 20, 10, 5, 3, 1]).double()
    uniform = logit_adjusted_ce(logits, labels, log_prior_from_counts([4] * 7), tau=1.0)
    assert uniform.item() == pytest.approx(plain.item(), rel=1e-12)
    no_tau = logit_adjusted_ce(logits, labels, log_prior, tau=0.0)
    assert no_tau.item() == pytest.approx(plain.item(), rel=1e-12)
    adjusted = logit_adjusted_ce(logits, labels, log_prior, tau=1.5)
    shifted = logit_adjusted_ce(logits, labels, log_prior + 3.25, tau=1.5)
    assert shifted.item() == pytest.approx(adjusted.item(), rel=1e-12)
    unnormalised = logit_adjusted_ce(logits, labels, log_prior + 17.0, tau=1.5)
    assert unnormalised.item() == pytest.approx(adjusted.item(), rel=1e-12)
    by_hand = F.cross_entropy(logits + 1.5 * log_prior, labels)
    assert adjusted.item() == pytest.approx(by_hand.item(), rel=1e-12)
    # the prior raises head logits over tail ones in the loss: a head label costs less, a tail
    # label more, so training pushes the raw logits towards the tail
    for label, cheaper in ((0, True), (6, False)):
        target = torch.full((16,), label)
        is_cheaper = logit_adjusted_ce(logits, target, log_prior) < F.cross_entropy(logits, target)
        assert bool(is_cheaper) == cheaper
    torch.testing.assert_close(
        log_prior_from_counts([3, 1]), torch.tensor([math.log(0.75), math.log(0.25)])
    )


def test_bcl_loss_is_alpha_ce_plus_beta_contrastive():
    gen = torch.Generator().manual_seed(2)
    features, prototypes = _unit(8, 2, 16, gen=gen), _unit(5, 16, gen=gen)
    logits = torch.randn(8, 5, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 5, (8,), generator=gen)
    log_prior = log_prior_from_counts([50, 20, 10, 5, 2])
    out = bcl_loss(logits, features, prototypes, labels, log_prior, alpha=2.0, beta=0.6)
    ce = logit_adjusted_ce(logits, labels, log_prior)
    scl = bcl_contrastive_loss(features, prototypes, labels, temperature=0.07)
    assert out.ce.item() == pytest.approx(ce.item(), rel=1e-12)
    assert out.contrastive.item() == pytest.approx(scl.item(), rel=1e-12)
    assert out.total.item() == pytest.approx(2.0 * ce.item() + 0.6 * scl.item(), rel=1e-12)


def _contrastive_args(**overrides):
    gen = torch.Generator().manual_seed(0)
    args = {
        "features": _unit(4, 2, 8, gen=gen),
        "prototypes": _unit(3, 8, gen=gen),
        "labels": torch.tensor([0, 1, 2, 0]),
        "temperature": 0.1,
    }
    args.update(overrides)
    return args


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"features": torch.zeros(4, 8)}, r"features shape \(4, 8\)"),
        ({"features": torch.zeros(4, 3, 8)}, r"features shape \(4, 3, 8\)"),
        ({"features": torch.zeros(0, 2, 8)}, "the batch is empty"),
        ({"prototypes": torch.zeros(3, 5)}, r"prototypes shape \(3, 5\)"),
        ({"prototypes": torch.zeros(0, 8)}, "at least one class"),
        ({"labels": torch.tensor([0, 1, 2])}, r"labels shape \(3,\)"),
        ({"labels": torch.tensor([0.0, 1.0, 2.0, 0.0])}, "labels dtype torch.float32"),
        ({"labels": torch.tensor([0, 1, 3, 0])}, r"labels range \[0, 3\]"),
        ({"labels": torch.tensor([0, -1, 2, 0])}, r"labels range \[-1, 2\]"),
        ({"temperature": 0.0}, "temperature=0.0"),
        ({"temperature": -0.1}, "temperature=-0.1"),
        ({"temperature": float("nan")}, "temperature=nan"),
        ({"temperature": True}, "temperature=True"),
        ({"reduction": "sum"}, "reduction='sum'"),
    ],
)
def test_contrastive_bad_arguments(overrides, message):
    args = _contrastive_args(**overrides)
    with pytest.raises(ValueError, match=message) as info:
        bcl_contrastive_loss(
            args.pop("features"), args.pop("prototypes"), args.pop("labels"), **args
        )
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: log_prior_from_counts([3, 0, 2]), "class_counts min 0.0"),
        (lambda: log_prior_from_counts([[1, 2]]), r"class_counts shape \(1, 2\)"),
        (lambda: log_prior_from_counts([]), r"class_counts shape \(0,\)"),
        (
            lambda: logit_adjusted_ce(torch.zeros(2, 3), torch.tensor([0, 1]), torch.zeros(4)),
            r"log_prior shape \(4,\)",
        ),
        (
            lambda: logit_adjusted_ce(torch.zeros(2), torch.tensor([0, 1]), torch.zeros(2)),
            r"logits shape \(2,\)",
        ),
        (
            lambda: logit_adjusted_ce(
                torch.zeros(2, 3), torch.tensor([0, 1]), torch.zeros(3), tau=-1.0
            ),
            "tau=-1.0",
        ),
        (
            lambda: logit_adjusted_ce(torch.zeros(2, 3), torch.tensor([0, 3]), torch.zeros(3)),
            r"labels range \[0, 3\]",
        ),
        (
            lambda: bcl_loss(
                torch.zeros(4, 3),
                *list(_contrastive_args().values())[:3],
                torch.zeros(3),
                alpha=-1.0,
            ),
            "alpha=-1.0",
        ),
        (
            lambda: bcl_loss(torch.zeros(4, 2), *list(_contrastive_args().values())[:3], [0, 0]),
            r"logits shape \(4, 2\)",
        ),
    ],
)
def test_other_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "\n" not in str(info.value)
