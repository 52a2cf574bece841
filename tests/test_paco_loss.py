"""PaCo and GPaCo against the official computation in float64, and properties of the formula."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from straightforward import paco_straightforward

from solo_ext.losses.paco import gpaco_loss, paco_log_prior, paco_loss


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These tensors are tiny: intra-op threads only add waits (10x on a loaded 2-core host)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def official_reference(features, labels, sup_logits, *, anchors, counts=None, **kwargs):
    """The official forward (``straightforward.py``'s, operation for operation) in float64;
    ``anchors`` = (N - K) // 2 for PaCo, N - K for GPaCo; ``counts``: the ``cls_num_list``
    (None: no prior, as GPaCo without ``cal_weight_for_classes``)."""
    features, sup_logits = features.double(), sup_logits.double()
    log_prior = None if counts is None else log_prior64(counts)
    return paco_straightforward(features, labels, sup_logits, log_prior, anchors, **kwargs)


def equation_reference(
    features, labels, sup_logits, *, anchors, alpha, beta, gamma, t, log_prior=None, eps=0.0
):
    """The module docstring's equation, one anchor at a time in Python floats."""
    f = features.double().tolist()
    y = labels.tolist()
    s = sup_logits.double().tolist()
    n, c = len(f), len(s[0])
    total = 0.0
    for i in range(anchors):
        u = [s[i][k] + (0.0 if log_prior is None else float(log_prior[k])) for k in range(c)]
        v = {j: sum(a * b for a, b in zip(f[i], f[j])) / t for j in range(n) if j != i}
        log_z = math.log(sum(math.exp(x) for x in u) + gamma * sum(math.exp(x) for x in v.values()))
        w = [beta * ((1 - eps) if k == y[i] else eps / (c - 1)) for k in range(c)]
        positives = [j for j in v if y[j] == y[i]]
        num = sum(w[k] * (u[k] - log_z) for k in range(c))
        num += alpha * sum(v[j] - log_z for j in positives)
        total += -num / (beta + alpha * len(positives))
    return total / anchors


def supcon_reference(features, labels, *, anchors, t):
    """Supervised contrastive loss (L_out): each anchor against all other rows, in floats."""
    f = features.double()
    total = 0.0
    for i in range(anchors):
        others = [j for j in range(f.size(0)) if j != i]
        logits = {j: float(f[i] @ f[j]) / t for j in others}
        lse = math.log(sum(math.exp(x) for x in logits.values()))
        positives = [j for j in others if labels[j] == labels[i]]
        total += -sum(logits[j] - lse for j in positives) / len(positives)
    return total / anchors


def make_batch(b, k, d, c, seed, views=1, logit_scale=3.0):
    """PaCo/GPaCo layout: cat(q, k, queue), cat(y, y, queue labels), [views * b, C] logits."""
    gen = torch.Generator().manual_seed(seed)
    features = F.normalize(torch.randn(2 * b + k, d, generator=gen, dtype=torch.float64), dim=1)
    y = torch.randint(0, c, (b,), generator=gen)
    labels = torch.cat([y, y, torch.randint(0, c, (k,), generator=gen)])
    sup_logits = logit_scale * torch.randn(views * b, c, generator=gen, dtype=torch.float64)
    counts = torch.randint(1, 500, (c,), generator=gen).tolist()
    return features, labels, sup_logits, counts


def log_prior64(counts):
    """The official prior, log(n_c / sum n + 1e-9), in float64 for the exact comparisons."""
    n = torch.tensor(counts, dtype=torch.float64)
    return torch.log(n / n.sum() + 1e-9)


def _leaves(*tensors):
    return [x.clone().requires_grad_() for x in tensors]


def _assert_matches_official(loss_fn, batch, b, anchors, alpha, beta, gamma, t, prior, **extra):
    """``loss_fn`` on the float32 path against the official value and gradients in float64."""
    features, labels, sup_logits, counts = batch
    counts = counts if prior else None
    weights = dict(alpha=alpha, beta=beta, gamma=gamma)
    log_prior = None if counts is None else paco_log_prior(counts)
    kwargs = dict(batch_size=b, temperature=t, log_prior=log_prior, **weights, **extra)
    ours_f, ours_s = _leaves(features, sup_logits)
    got = loss_fn(ours_f.float(), labels, ours_s.float(), **kwargs)
    smooth = extra.get("label_smoothing", 0.0)
    ref_f, ref_s = _leaves(features, sup_logits)
    want = official_reference(
        ref_f, labels, ref_s, anchors=anchors, t=t, counts=counts, smooth=smooth, **weights
    )
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-6)
    got_grads = torch.autograd.grad(got, [ours_f, ours_s])
    want_grads = torch.autograd.grad(want, [ref_f, ref_s])
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


SHAPES = [(4, 0, 8, 3), (6, 12, 8, 5), (8, 40, 16, 10), (2, 3, 4, 2), (1, 5, 4, 3)]
WEIGHTS = [(0.05, 1.0, 1.0), (1.0, 1.0, 0.0), (0.5, 0.3, 2.0), (0.0, 1.0, 1.0), (1.0, 0.0, 1.0)]


@pytest.mark.parametrize("b,k,d,c", SHAPES)
@pytest.mark.parametrize("t", [0.05, 1.0])
@pytest.mark.parametrize("alpha,beta,gamma", WEIGHTS)
@pytest.mark.parametrize("prior", [False, True])
def test_paco_matches_official_values_and_gradients(b, k, d, c, t, alpha, beta, gamma, prior):
    batch = make_batch(b, k, d, c, seed=b * 100 + k + c)
    _assert_matches_official(paco_loss, batch, b, b, alpha, beta, gamma, t, prior, num_classes=c)


@pytest.mark.parametrize("b,k,d,c", SHAPES[:4])
@pytest.mark.parametrize("smooth", [0.0, 0.1, 0.4])
@pytest.mark.parametrize("prior", [False, True])
@pytest.mark.parametrize("alpha,beta,gamma", [(0.045, 1.0, 1.0), (0.5, 0.3, 2.0)])
def test_gpaco_matches_official_values_and_gradients(b, k, d, c, smooth, prior, alpha, beta, gamma):
    batch = make_batch(b, k, d, c, seed=7 * b + k, views=2)
    _assert_matches_official(
        gpaco_loss, batch, b, 2 * b, alpha, beta, gamma, 0.07, prior, label_smoothing=smooth
    )


@pytest.mark.parametrize("supt,base_t", [(1.0, None), (0.5, None), (2.0, 0.07), (1.0, 0.3)])
def test_sup_and_base_temperature_match_official(supt, base_t):
    features, labels, sup_logits, counts = make_batch(6, 10, 8, 4, seed=5)
    lp, temps = log_prior64(counts), dict(sup_temperature=supt, base_temperature=base_t)
    got = paco_loss(features, labels, sup_logits, batch_size=6, alpha=0.05, log_prior=lp, **temps)
    weights = dict(alpha=0.05, beta=1.0, gamma=1.0, t=0.2)  # t: paco_loss's default temperature
    want = official_reference(
        features, labels, sup_logits, anchors=6, counts=counts, supt=supt, base_t=base_t, **weights
    )
    assert got.dtype == torch.float64  # float64 inputs stay float64
    assert got.item() == pytest.approx(want.item(), rel=1e-9)


@pytest.mark.parametrize(
    "gpaco,alpha,beta,gamma,eps",
    [
        (False, 0.05, 1.0, 1.0, 0.0),
        (False, 0.7, 0.4, 0.5, 0.0),
        (True, 0.05, 1.0, 1.0, 0.0),
        (True, 0.7, 0.4, 0.5, 0.2),
    ],
)
def test_matches_the_docstring_equation(gpaco, alpha, beta, gamma, eps):
    b, c = 5, 4
    features, labels, sup_logits, counts = make_batch(b, 9, 6, c, seed=3, views=2 if gpaco else 1)
    log_prior = paco_log_prior(counts).double()
    kwargs = dict(alpha=alpha, beta=beta, gamma=gamma, temperature=0.1, log_prior=log_prior)
    if gpaco:
        got = gpaco_loss(features, labels, sup_logits, batch_size=b, label_smoothing=eps, **kwargs)
    else:
        got = paco_loss(features, labels, sup_logits, batch_size=b, **kwargs)
    want = equation_reference(
        features,
        labels,
        sup_logits,
        anchors=2 * b if gpaco else b,
        alpha=alpha,
        beta=beta,
        gamma=gamma,
        t=0.1,
        log_prior=log_prior,
        eps=eps,
    )
    assert got.item() == pytest.approx(want, rel=1e-9)


def test_the_official_epsilon_in_the_log_is_kept():
    """Rows whose largest logit is the masked self-similarity (1 / t): the official 1e-12 in
    log(sum + 1e-12), after the shift by that maximum, outweighs the sum; kept, not fixed."""
    b, c, t = 2, 3, 0.01
    eye = torch.eye(8, dtype=torch.float64)
    features = torch.cat([eye[:b], eye[b : 2 * b], eye[2 * b :]])  # orthogonal rows
    labels = torch.tensor([0, 1, 0, 1, 2, 0, 1, 2])
    sup_logits = torch.zeros(b, c, dtype=torch.float64)
    got = paco_loss(
        features.float(), labels, sup_logits.float(), batch_size=b, alpha=1.0, temperature=t
    )
    want = official_reference(
        features, labels, sup_logits, anchors=b, alpha=1.0, beta=1.0, gamma=1.0, t=t
    )
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    # every kept logit is 0, so a plain log-softmax would give log(C + N - 1)
    assert want.item() == pytest.approx(1 / t + math.log(1e-12), rel=1e-6)
    assert abs(want.item() - math.log(c + features.size(0) - 1)) > 50


def test_beta_zero_alpha_cancels():
    features, labels, sup_logits, _ = make_batch(6, 20, 8, 4, seed=11)
    losses = [
        paco_loss(features, labels, sup_logits, batch_size=6, alpha=a, beta=0.0, temperature=0.1)
        for a in (0.01, 0.3, 5.0)
    ]
    for loss in losses[1:]:
        assert loss.item() == pytest.approx(losses[0].item(), rel=1e-9)


def test_beta_zero_keeps_the_centres_in_the_denominator():
    """beta = 0, gamma = 1 is SupCon only once the centre logits vanish (-> -inf)."""
    b, t = 6, 0.1
    features, labels, sup_logits, _ = make_batch(b, 20, 8, 4, seed=12)
    supcon = supcon_reference(features, labels, anchors=b, t=t)
    kwargs = dict(batch_size=b, alpha=1.0, beta=0.0, gamma=1.0, temperature=t)
    vanished = paco_loss(features, labels, sup_logits - 1e4, **kwargs)
    assert vanished.item() == pytest.approx(supcon, rel=1e-9)
    with_centres = paco_loss(features, labels, sup_logits, **kwargs)
    assert with_centres.item() > supcon + 1e-3  # the centres stay as negatives


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_alpha_zero_gamma_zero_is_logit_adjusted_cross_entropy(eps):
    """Only the centres remain: Balanced Softmax, with GPaCo's smoothing eps / (C - 1)."""
    b, c = 8, 6
    features, labels, sup_logits, counts = make_batch(b, 10, 8, c, seed=13, views=2)
    log_prior = paco_log_prior(counts)
    got = gpaco_loss(
        features,
        labels,
        sup_logits,
        batch_size=b,
        alpha=0.0,
        gamma=0.0,
        log_prior=log_prior,
        label_smoothing=eps,
    )
    # torch spreads label_smoothing / C over every class, the target included
    want = F.cross_entropy(
        sup_logits + log_prior.double(), labels[: 2 * b], label_smoothing=eps * c / (c - 1)
    )
    assert got.item() == pytest.approx(want.item(), rel=1e-7)


def test_prior_is_not_ignored():
    """A skewed prior moves the loss by much more than the tolerance, to the official value."""
    c = 5
    features, labels, sup_logits, _ = make_batch(6, 10, 8, c, seed=15)
    counts = [1000, 300, 50, 10, 2]
    kwargs = dict(anchors=6, alpha=0.05, beta=1.0, gamma=1.0, t=0.2)
    with_prior = official_reference(features, labels, sup_logits, counts=counts, **kwargs)
    without = official_reference(features, labels, sup_logits, **kwargs)
    got = paco_loss(
        features,
        labels,
        sup_logits,
        batch_size=6,
        alpha=0.05,
        temperature=0.2,
        log_prior=paco_log_prior(counts),
    )
    assert abs(with_prior.item() - without.item()) > 0.1
    assert got.item() == pytest.approx(with_prior.item(), rel=1e-6)


def test_a_constant_in_the_log_prior_matters_unless_only_centres_remain():
    """Centres and samples share one softmax: shifting every log prior changes the loss; with
    alpha = gamma = 0 (a plain softmax over the centres) it does not."""
    features, labels, sup_logits, counts = make_batch(6, 10, 8, 5, seed=16)
    lp = paco_log_prior(counts).double()
    for alpha, gamma, invariant in ((0.05, 1.0, False), (0.0, 1.0, False), (0.0, 0.0, True)):
        kwargs = dict(batch_size=6, alpha=alpha, gamma=gamma, temperature=0.2)
        base = paco_loss(features, labels, sup_logits, log_prior=lp, **kwargs).item()
        moved = paco_loss(features, labels, sup_logits, log_prior=lp + 2.0, **kwargs).item()
        if invariant:
            assert moved == pytest.approx(base, rel=1e-9)
        else:
            assert abs(moved - base) > 1e-3, (alpha, gamma)
    # and a uniform prior (a balanced dataset) is not the same as none
    uniform = paco_log_prior([7] * 5).double()
    kwargs = dict(batch_size=6, alpha=0.05, temperature=0.2)
    assert (
        abs(
            paco_loss(features, labels, sup_logits, log_prior=uniform, **kwargs).item()
            - paco_loss(features, labels, sup_logits, **kwargs).item()
        )
        > 1e-3
    )


def test_log_prior_from_counts():
    counts = [50, 20, 0, 5]
    lp = paco_log_prior(counts)
    assert lp.dtype == torch.float32
    want = [math.log(n / 75 + 1e-9) for n in counts]
    torch.testing.assert_close(lp.double(), torch.tensor(want, dtype=torch.float64))
    torch.testing.assert_close(paco_log_prior([10 * n for n in counts]), lp)


def test_the_key_is_an_ordinary_positive():
    """Rows after the anchors enter only through their labels: any order gives the same loss."""
    b = 5
    features, labels, sup_logits, _ = make_batch(b, 15, 8, 4, seed=17)
    perm = torch.cat([torch.arange(b), b + torch.randperm(features.size(0) - b)])
    kwargs = dict(batch_size=b, alpha=0.3, temperature=0.1)
    a = paco_loss(features, labels, sup_logits, **kwargs)
    p = paco_loss(features[perm], labels[perm], sup_logits, **kwargs)
    assert a.item() == pytest.approx(p.item(), rel=1e-12)


def test_gpaco_is_paco_with_both_views_as_anchors():
    b = 4
    features, labels, sup_logits, _ = make_batch(b, 8, 8, 3, seed=18, views=2)
    kwargs = dict(alpha=0.05, temperature=0.2)
    g = gpaco_loss(features, labels, sup_logits, batch_size=b, **kwargs)
    p = paco_loss(features, labels, sup_logits, batch_size=2 * b, **kwargs)
    assert g.item() == pytest.approx(p.item(), rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_are_computed_in_float32(dtype):
    features, labels, sup_logits, counts = make_batch(6, 10, 8, 4, seed=19)
    lp = paco_log_prior(counts)
    kwargs = dict(batch_size=6, alpha=0.05, temperature=0.05, log_prior=lp)
    low_f, low_s = features.to(dtype), sup_logits.to(dtype)
    got = paco_loss(low_f, labels, low_s, **kwargs)
    want = paco_loss(low_f.float(), labels, low_s.float(), **kwargs)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        auto = paco_loss(features.float(), labels, sup_logits.float(), **kwargs)
    assert auto.dtype == torch.float32
    plain = paco_loss(features.float(), labels, sup_logits.float(), **kwargs)
    assert auto.item() == pytest.approx(plain.item(), rel=1e-6)


def _call(fn=paco_loss, b=2, n=6, d=4, c=3, **kwargs):
    features = F.normalize(torch.randn(n, d), dim=1)
    labels = torch.randint(0, c, (n,))
    rows = 2 * b if fn is gpaco_loss else b
    args = dict(
        features=features, labels=labels, sup_logits=torch.randn(rows, c), batch_size=b, alpha=0.1
    )
    args.update(kwargs)
    return fn(**args)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"temperature": 0.0}, "temperature=0.0"),
        ({"temperature": -0.2}, "temperature=-0.2"),
        ({"sup_temperature": 0}, "sup_temperature=0"),
        ({"base_temperature": -1.0}, "base_temperature=-1.0"),
        ({"alpha": -0.1}, "alpha=-0.1"),
        ({"beta": float("nan")}, "beta=nan"),
        ({"gamma": -1}, "gamma=-1"),
        ({"alpha": 0.0, "beta": 0.0}, "alpha=0, beta=0"),
        ({"batch_size": 0}, "batch_size=0"),
        ({"batch_size": 7, "sup_logits": torch.randn(7, 3)}, "7 anchors: features has only 6"),
        ({"sup_logits": torch.randn(3, 3)}, r"sup_logits shape \(3, 3\)"),
        ({"sup_logits": torch.randn(2, 3), "num_classes": 4}, "num_classes=4"),
        ({"labels": torch.zeros(5, dtype=torch.long)}, r"labels shape \(5,\)"),
        ({"labels": torch.zeros(6)}, "labels dtype torch.float32"),
        ({"features": torch.randn(6)}, r"features shape \(6,\)"),
        ({"log_prior": torch.zeros(4)}, r"log_prior shape \(4,\)"),
        ({"fn": gpaco_loss, "label_smoothing": 1.0}, "label_smoothing=1.0"),
        ({"fn": gpaco_loss, "label_smoothing": -0.1}, "label_smoothing=-0.1"),
        ({"fn": gpaco_loss, "sup_logits": torch.randn(2, 3)}, r"\(2, 3\): must be \[4, C\]"),
        ({"fn": gpaco_loss, "b": 4}, "8 anchors: features has only 6"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        _call(**kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("counts", [[], [3, -1], [0, 0], [[1, 2]], [1.0, float("inf")]])
def test_bad_class_counts(counts):
    with pytest.raises(ValueError, match="class_counts") as err:
        paco_log_prior(counts)
    assert "\n" not in str(err.value)
