"""KCL and TSC against float64 replicas of the official code's operations, and their properties.

The replicas follow ``bingykang/BalFeat`` ``moco/kcl_builder.py`` (KCL.forward and
``util.SoftCrossEntropyLoss``: ``straightforward.py``'s) and ``LTH14/targeted-supcon``
``moco/builder.py`` (KCL.forward, its sampling loop ``straightforward.py``'s, centroid update,
matching) and ``target_generation.py``, with the queue as [K, D] rows instead of [D, K] columns
and without the devices and the process group. They import nothing from solo_ext.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from straightforward import kcl_straightforward, official_sampling

from solo_ext.losses.kcl import (
    kcl_loss,
    kcl_positives,
    kcl_soft_target,
    sample_positives,
    tsc_assign,
    tsc_loss,
    tsc_targets,
    tsc_update_centroids,
)


def _unit(n, d, gen, dtype=torch.float32):
    return F.normalize(torch.randn(n, d, generator=gen), dim=1).to(dtype)


def _case(b, k_size, d, n_cls, seed, empty=0.2):
    """Unit q, k, queue; labels in [0, n_cls); a share ``empty`` of the slots empty (-1)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, queue = _unit(b, d, gen), _unit(b, d, gen), _unit(k_size, d, gen)
    labels = torch.randint(0, n_cls, (b,), generator=gen)
    queue_labels = torch.randint(0, n_cls, (k_size,), generator=gen)
    queue_labels[torch.rand(k_size, generator=gen) < empty] = -1
    return q, k, queue, labels, queue_labels


# --------------------------------------------------------------------------------------------
# BalFeat KCL, replicated


def balfeat_kcl(q, k, queue, *args):
    """BalFeat's KCL (``straightforward.py``'s replica) in float64."""
    return kcl_straightforward(q.double(), k.double(), queue.double(), *args)


def infonce(q, k, queue, t):
    """MoCo's InfoNCE, one anchor at a time in Python floats: k_i against k_i and the queue."""
    total = 0.0
    for i in range(q.size(0)):
        pos = math.exp(float(q[i].double() @ k[i].double()) / t)
        neg = sum(math.exp(float(q[i].double() @ c.double()) / t) for c in queue)
        total += -math.log(pos / (pos + neg))
    return total / q.size(0)


@pytest.mark.parametrize("b,k_size,d,n_cls", [(4, 8, 8, 2), (6, 24, 16, 3), (8, 40, 8, 5)])
@pytest.mark.parametrize("posk", [None, 0, 2, 6])
def test_kcl_matches_balfeat(b, k_size, d, n_cls, posk):
    q, k, queue, labels, queue_labels = _case(b, k_size, d, n_cls, seed=b * 31 + k_size)
    for t, losstype in itertools.product((0.07, 0.5), ("v1", "v2")):
        got = kcl_loss(
            q, k, queue, labels, queue_labels, k_pos=posk, temperature=t, loss_type=losstype
        )
        want = balfeat_kcl(q, k, queue, labels, queue_labels, posk, t, losstype)
        assert got.dtype == torch.float32
        assert got.item() == pytest.approx(want.item(), rel=2e-6, abs=1e-6), (t, losstype)


@pytest.mark.parametrize("posk,losstype", [(None, "v1"), (2, "v1"), (3, "v2"), (0, "v1")])
def test_kcl_gradients_match_balfeat(posk, losstype):
    q, k, queue, labels, queue_labels = _case(6, 30, 8, 3, seed=5)
    leaves = [x.double().requires_grad_() for x in (q, k, queue)]
    got = kcl_loss(*leaves, labels, queue_labels, k_pos=posk, temperature=0.1, loss_type=losstype)
    want = balfeat_kcl(*leaves, labels, queue_labels, posk, 0.1, losstype)
    assert got.dtype == torch.float64
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    for g, w in zip(torch.autograd.grad(got, leaves), torch.autograd.grad(want, leaves)):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_kcl_few_same_class_slots_and_empty_queue_slots():
    """Fewer than k same-class slots: all of them, 1 / (1 + n) each; empty slots: negatives."""
    gen = torch.Generator().manual_seed(3)
    q, k, queue = _unit(3, 8, gen), _unit(3, 8, gen), _unit(12, 8, gen)
    labels = torch.tensor([0, 1, 2])
    queue_labels = torch.tensor([0, -1, -1, 1, 0, -1, 1, 1, 1, 1, 1, 1])
    # anchor 0: 2 slots (< 6); anchor 1: 7 slots (> 6); anchor 2: none
    chosen = kcl_positives(labels, queue_labels, k_pos=6)
    assert chosen.sum(dim=1).tolist() == [2, 6, 0]
    soft = kcl_soft_target(chosen, torch.float64)
    torch.testing.assert_close(soft.sum(dim=1), torch.ones(3, dtype=torch.float64))
    assert soft[0, [0, 1, 5]].tolist() == [1 / 3] * 3
    assert soft[2, 0].item() == 1.0
    for t in (0.07, 0.5):
        got = kcl_loss(q, k, queue, labels, queue_labels, k_pos=6, temperature=t)
        want = balfeat_kcl(q, k, queue, labels, queue_labels, 6, t)
        assert got.item() == pytest.approx(want.item(), rel=2e-6)
    # an empty queue (the official start): every slot is a negative, KCL is InfoNCE
    empty = torch.full((12,), -1)
    got = kcl_loss(q, k, queue, labels, empty, k_pos=6, temperature=0.2)
    assert got.item() == pytest.approx(infonce(q, k, queue, 0.2), rel=2e-6)


@pytest.mark.parametrize("k_size", [0, 1, 16])
def test_kcl_with_k_zero_is_infonce(k_size):
    q, k, queue, labels, queue_labels = _case(5, k_size, 8, 2, seed=k_size, empty=0.0)
    for t in (0.07, 0.5):
        got = kcl_loss(q, k, queue, labels, queue_labels, k_pos=0, temperature=t)
        assert got.item() == pytest.approx(infonce(q, k, queue, t), rel=2e-6)


def test_kcl_mask_empty_drops_the_empty_slots():
    q, k, queue, labels, queue_labels = _case(6, 20, 8, 3, seed=9, empty=0.4)
    filled = queue_labels != -1
    got = kcl_loss(q, k, queue, labels, queue_labels, k_pos=None, mask_empty=True)
    want = balfeat_kcl(q, k, queue[filled], labels, queue_labels[filled], None, 0.07)
    assert got.item() == pytest.approx(want.item(), rel=2e-6)
    # "first" keeps its slots when the empty ones are cut out ("topk" need not: its ties)
    kw = dict(k_pos=2, selection="first", loss_type="v2")
    got = kcl_loss(q, k, queue, labels, queue_labels, mask_empty=True, **kw)
    want = kcl_loss(q, k, queue[filled], labels, queue_labels[filled], **kw)
    assert got.item() == pytest.approx(want.item(), rel=1e-6)


def test_kcl_selections():
    """topk/first: min(k, n) same-class slots; first: the lowest slots; explicit positives."""
    _, _, _, labels, queue_labels = _case(8, 50, 4, 3, seed=11)
    same = (labels[:, None] == queue_labels[None, :]) & (queue_labels != -1)
    for k_pos in (0, 1, 3, 6, 100):
        for selection in ("topk", "first", "random"):
            gen = torch.Generator().manual_seed(0)
            chosen = kcl_positives(labels, queue_labels, k_pos, selection, gen)
            assert not (chosen & ~same).any()
            assert chosen.sum(dim=1).tolist() == same.sum(dim=1).clamp(max=k_pos).tolist()
        first = kcl_positives(labels, queue_labels, k_pos, "first")
        for i in range(8):
            lowest = [j for j in range(50) if same[i, j]][:k_pos]
            assert first[i].nonzero().flatten().tolist() == lowest
    assert torch.equal(kcl_positives(labels, queue_labels, None), same)
    q, k, queue, labels, queue_labels = _case(8, 50, 8, 3, seed=11)
    chosen = kcl_positives(labels, queue_labels, 2, "first")
    by_mask = kcl_loss(q, k, queue, labels, queue_labels, positives=chosen, loss_type="v2")
    by_name = kcl_loss(
        q, k, queue, labels, queue_labels, k_pos=2, selection="first", loss_type="v2"
    )
    assert by_mask.item() == by_name.item()


# --------------------------------------------------------------------------------------------
# targeted-supcon KCL / TSC, replicated


def official_tsc(
    q, k, queue, im_labels, queue_labels, targets, col_ind, num_positive, t, tr, tw, sep_t, gen
):
    """targeted-supcon KCL.forward from the logits on, ``targeted`` when targets is given; the
    matching (row_ind, col_ind) is given. float64 except the sampled masks (float32 there)."""
    q, k, queue = q.double(), k.double(), queue.double()
    n_queue = queue.size(0)
    targeted = targets is not None
    l_pos = torch.einsum("nc,nc->n", [q, k]).unsqueeze(-1)
    if targeted:
        n_cls = targets.size(0)
        optimal_target = torch.cat([targets[i : i + 1].repeat(tr, 1) for i in range(n_cls)])
        target_labels = torch.cat([torch.tensor([i]).repeat(tr) for i in range(n_cls)])
        target_labels = target_labels.long().unsqueeze(-1).transpose(0, 1)
        negatives = torch.cat([queue.T, optimal_target.double().T], dim=1)
        l_neg = torch.einsum("nc,ck->nk", [q, negatives])
    else:
        l_neg = torch.einsum("nc,ck->nk", [q, queue.T])
    logits = torch.cat([l_pos, l_neg], dim=1)
    im_labels = im_labels.contiguous().view(-1, 1)
    queue_labels = queue_labels.view(1, -1)
    if targeted:
        all_labels = torch.cat([queue_labels, torch.full_like(target_labels, -1)], dim=1)
        mask = torch.eq(im_labels, all_labels).float()
        for one_label, one_idx in zip(range(len(col_ind)), col_ind):
            if one_label not in im_labels:
                continue
            one_indices = torch.tensor([i + one_idx * tr for i in range(tr)]).long()
            tmp = mask[im_labels[:, 0].eq(one_label), :]
            tmp[:, queue_labels.size(1) + one_indices] = 1
            mask[im_labels[:, 0].eq(one_label), :] = tmp
        if sep_t:
            mask_target = mask.clone()
            mask_target[:, : queue_labels.size(1)] = 0
            mask[:, queue_labels.size(1) :] = 0
    else:
        mask = torch.eq(im_labels, queue_labels).float()
    if num_positive > 0:
        mask_pos_view = official_sampling(mask, num_positive, gen)
    else:
        mask_pos_view = mask.clone()
    if targeted and sep_t:
        mask_pos_view_class = mask_pos_view.clone()
        mask_pos_view_target = mask_target.clone()
        mask_pos_view += mask_target
    else:
        mask_pos_view_class = mask_pos_view.clone()
        mask_pos_view_target = mask_pos_view.clone()
        mask_pos_view_class[:, n_queue:] = 0
        mask_pos_view_target[:, :n_queue] = 0
    b = mask_pos_view.shape[0]
    mask_pos_view = torch.cat([torch.ones([b, 1]), mask_pos_view], dim=1).double()
    mask_pos_view_class = torch.cat([torch.ones([b, 1]), mask_pos_view_class], dim=1).double()
    mask_pos_view_target = torch.cat([torch.zeros([b, 1]), mask_pos_view_target], dim=1).double()
    logits = logits / t
    log_prob = F.normalize(logits.exp(), dim=1, p=1).log()
    loss_class = -torch.sum((mask_pos_view_class * log_prob).sum(1) / mask_pos_view.sum(1)) / b
    loss_target = -torch.sum((mask_pos_view_target * log_prob).sum(1) / mask_pos_view.sum(1)) / b
    loss_target = loss_target * tw
    return loss_class + loss_target, loss_class, loss_target


def _tsc_case(seed, b=8, k_size=30, d=8, n_cls=4, empty=0.2):
    q, k, queue, labels, queue_labels = _case(b, k_size, d, n_cls, seed, empty)
    gen = torch.Generator().manual_seed(seed + 1)
    targets = _unit(n_cls, d, gen)
    assignment = torch.randperm(n_cls, generator=gen)
    return q, k, queue, labels, queue_labels, targets, assignment


@pytest.mark.parametrize("num_positive", [0, 1, 3, 6])
@pytest.mark.parametrize("sep_t", [False, True])
def test_tsc_matches_official(num_positive, sep_t):
    for tr, (tw, t) in itertools.product((1, 3), ((1.0, 0.07), (0.2, 0.3))):
        seed = 100 * num_positive + 10 * tr + int(sep_t)
        q, k, queue, labels, queue_labels, targets, assignment = _tsc_case(seed)
        got = tsc_loss(
            q, k, queue, labels, queue_labels, targets, assignment,
            num_positive=num_positive or None, temperature=t, target_weight=tw,
            target_repeat=tr, separate_target=sep_t, generator=torch.Generator().manual_seed(seed),
        )  # fmt: skip
        want = official_tsc(
            q, k, queue, labels, queue_labels, targets, assignment.tolist(), num_positive, t, tr,
            tw, sep_t, torch.Generator().manual_seed(seed),
        )  # fmt: skip
        for g, w in zip(got, want):
            assert g.item() == pytest.approx(w.item(), rel=2e-6, abs=1e-7), (tr, tw, t)


@pytest.mark.parametrize("num_positive,sep_t", [(0, True), (2, False), (4, True)])
def test_tsc_gradients_match_official(num_positive, sep_t):
    q, k, queue, labels, queue_labels, targets, assignment = _tsc_case(21, b=6, k_size=20)
    leaves = [x.double().requires_grad_() for x in (q, k, queue)]
    got = tsc_loss(
        *leaves, labels, queue_labels, targets.double(), assignment,
        num_positive=num_positive or None, temperature=0.1, target_weight=0.2, target_repeat=2,
        separate_target=sep_t, generator=torch.Generator().manual_seed(4),
    ).loss  # fmt: skip
    want = official_tsc(
        *leaves, labels, queue_labels, targets.double(), assignment.tolist(), num_positive, 0.1,
        2, 0.2, sep_t, torch.Generator().manual_seed(4),
    )[0]  # fmt: skip
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    for g, w in zip(torch.autograd.grad(got, leaves), torch.autograd.grad(want, leaves)):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("num_positive", [0, 1, 6])
def test_targeted_supcon_kcl_is_tsc_without_targets_and_kcl_random(num_positive):
    q, k, queue, labels, queue_labels = _case(8, 40, 8, 3, seed=num_positive)
    n = num_positive or None
    got = tsc_loss(
        q, k, queue, labels, queue_labels, None, None,
        num_positive=n, temperature=0.1, generator=torch.Generator().manual_seed(1),
    )  # fmt: skip
    want = official_tsc(
        q, k, queue, labels, queue_labels, None, None, num_positive, 0.1, 1, 1.0, False,
        torch.Generator().manual_seed(1),
    )  # fmt: skip
    assert got.loss.item() == pytest.approx(want[0].item(), rel=2e-6)
    assert got.loss_target.item() == 0.0
    as_kcl = kcl_loss(
        q, k, queue, labels, queue_labels, k_pos=n, temperature=0.1, selection="random",
        generator=torch.Generator().manual_seed(1),
    )  # fmt: skip
    assert as_kcl.item() == pytest.approx(got.loss.item(), rel=1e-6)


def test_sample_positives_matches_official_draws():
    gen = torch.Generator().manual_seed(2)
    pool = torch.rand(16, 40, generator=gen) < torch.rand(16, 1, generator=gen)
    pool[3] = False  # an anchor with no candidate
    for num in (1, 2, 6, 50):
        got = sample_positives(pool, num, torch.Generator().manual_seed(num))
        want = official_sampling(pool.float(), num, torch.Generator().manual_seed(num))
        assert torch.equal(got, want.bool())
        assert got.sum(dim=1).tolist() == pool.sum(dim=1).clamp(max=num).tolist()


def test_tsc_with_separate_targets_is_kcl_with_the_target_as_a_queued_key():
    """sep_t, tr = 1, tw = 1, all positives: the target is one more same-class key."""
    q, k, queue, labels, queue_labels, targets, assignment = _tsc_case(8)
    got = tsc_loss(
        q, k, queue, labels, queue_labels, targets, assignment,
        num_positive=None, temperature=0.2, separate_target=True,
    ).loss  # fmt: skip
    target_label = torch.argsort(assignment)  # target j belongs to class assignment^-1(j)
    want = balfeat_kcl(
        q, k, torch.cat([queue, targets]), labels, torch.cat([queue_labels, target_label]),
        None, 0.2,
    )  # fmt: skip
    assert got.item() == pytest.approx(want.item(), rel=2e-6)


def test_tsc_mask_empty_drops_the_empty_slots():
    q, k, queue, labels, queue_labels, targets, assignment = _tsc_case(13, empty=0.5)
    filled = queue_labels != -1
    kwargs = dict(num_positive=None, target_repeat=2, separate_target=True, target_weight=0.3)
    got = tsc_loss(
        q, k, queue, labels, queue_labels, targets, assignment, mask_empty=True, **kwargs
    )
    want = tsc_loss(
        q, k, queue[filled], labels, queue_labels[filled], targets, assignment, **kwargs
    )
    for g, w in zip(got, want):
        assert g.item() == pytest.approx(w.item(), rel=1e-6)


# --------------------------------------------------------------------------------------------
# centroids, matching, targets


def official_centroid_update(class_centroid, features_all, im_labels_all):
    class_centroid = class_centroid.clone()
    im_labels_all = im_labels_all.view(-1, 1)
    for one_label in torch.unique(im_labels_all):
        members = features_all[im_labels_all[:, 0].eq(one_label), :]
        class_centroid_batch = F.normalize(torch.mean(members, dim=0), dim=0)
        class_centroid[one_label] = 0.9 * class_centroid[one_label] + 0.1 * class_centroid_batch
        class_centroid[one_label] = F.normalize(class_centroid[one_label], dim=0)
    return class_centroid


def test_centroid_update_matches_official():
    gen = torch.Generator().manual_seed(6)
    centroids = _unit(10, 8, gen, torch.float64)
    features = _unit(32, 8, gen, torch.float64).requires_grad_()
    labels = torch.randint(0, 6, (32,), generator=gen)  # classes 6..9 absent
    got = tsc_update_centroids(centroids, features, labels)
    want = official_centroid_update(centroids, features.detach(), labels)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(got[6:], centroids[6:])
    assert not got.requires_grad


def _brute_force_best(sim):
    n, m = sim.shape
    return max(sum(sim[i, p[i]] for i in range(n)) for p in itertools.permutations(range(m), n))


@pytest.mark.parametrize("n,m", [(1, 1), (3, 3), (5, 5), (6, 6), (4, 7)])
def test_assignment_is_an_optimal_permutation(n, m):
    for seed in range(4):
        gen = torch.Generator().manual_seed(seed)
        centroids, targets = _unit(n, 5, gen, torch.float64), _unit(m, 5, gen, torch.float64)
        cols = tsc_assign(centroids, targets)
        assert cols.dtype == torch.long and cols.shape == (n,)
        assert len(set(cols.tolist())) == n and all(0 <= c < m for c in cols.tolist())
        sim = (centroids @ targets.T).numpy()
        assert sim[np.arange(n), cols.numpy()].sum() == pytest.approx(_brute_force_best(sim))


def official_targets(n, m, n_iter, gen, lr=1e-3, t=0.07):
    """target_generation.py with N = n, M = m, N_iter = n_iter and a seeded start."""
    x = torch.randn(n, m, generator=gen).float().requires_grad_()
    optimizer = torch.optim.Adam([x], lr=lr)
    min_loss, optimal_target = 100, None
    for _ in range(n_iter):
        x_norm = F.normalize(x, dim=1)
        loss = x_norm.matmul(x_norm.T).div(t).exp().sum(dim=-1).log().mean()
        if loss.item() < min_loss:
            min_loss = loss.item()
            optimal_target = x_norm
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return optimal_target.detach()


def test_targets_match_official_generation_and_spread_as_a_simplex():
    got = tsc_targets(5, 8, steps=60, generator=torch.Generator().manual_seed(0))
    want = official_targets(5, 8, 60, torch.Generator().manual_seed(0))
    assert torch.equal(got, want)
    # 4 targets in 3 dimensions end near the regular tetrahedron, cos = -1/3 (at t = 0.07 the
    # self term exp(1 / t) leaves so few points a float32 loss too flat to rank the steps by)
    z = tsc_targets(
        4, 3, steps=200, lr=0.05, temperature=0.3, generator=torch.Generator().manual_seed(1)
    )
    torch.testing.assert_close(z.norm(dim=1), torch.ones(4))
    off = (z @ z.T)[~torch.eye(4, dtype=torch.bool)]
    torch.testing.assert_close(off, torch.full_like(off, -1 / 3), atol=1e-3, rtol=0)


# --------------------------------------------------------------------------------------------
# arguments


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"temperature": 0.0}, "temperature=0.0"),
        ({"k_pos": -1}, "k_pos=-1"),
        ({"loss_type": "v3"}, "loss_type='v3'"),
        ({"selection": "last"}, "selection='last'"),
        ({"positives": torch.zeros(2, 5)}, "positives: torch.float32"),
    ],
)
def test_kcl_bad_arguments(kwargs, message):
    q = F.normalize(torch.randn(2, 4), dim=1)
    queue = F.normalize(torch.randn(3, 4), dim=1)
    with pytest.raises(ValueError, match=message):
        kcl_loss(q, q, queue, torch.tensor([0, 1]), torch.tensor([0, 1, -1]), **kwargs)


def test_bad_shapes_and_tsc_arguments():
    q = F.normalize(torch.randn(2, 4), dim=1)
    queue, qlab = F.normalize(torch.randn(3, 4), dim=1), torch.tensor([0, 1, -1])
    labels, targets, assignment = torch.tensor([0, 1]), torch.eye(2, 4), torch.tensor([1, 0])
    with pytest.raises(ValueError, match=r"queue.shape=\(3, 5\)"):
        kcl_loss(q, q, torch.zeros(3, 5), labels, qlab)
    with pytest.raises(ValueError, match=r"labels.shape=\(3,\)"):
        kcl_loss(q, q, queue, torch.tensor([0, 1, 2]), qlab)
    with pytest.raises(ValueError, match="give both or neither"):
        tsc_loss(q, q, queue, labels, qlab, targets, None)
    with pytest.raises(ValueError, match="target_repeat=0"):
        tsc_loss(q, q, queue, labels, qlab, targets, assignment, target_repeat=0)
    with pytest.raises(ValueError, match="num_positive=-2"):
        tsc_loss(q, q, queue, labels, qlab, targets, assignment, num_positive=-2)
    with pytest.raises(ValueError, match="needs at least C=3"):
        tsc_assign(torch.eye(3, 4), targets)
