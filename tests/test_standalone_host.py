"""The embedded host's parts against their definitions: schedules, EMA, kNN, metrics."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from solo_ext.host.standalone.backbones import build_backbone, feature_dim
from solo_ext.host.standalone.momentum import MomentumUpdater, initialize_momentum_params
from solo_ext.host.standalone.optim import OPTIMIZERS, warmup_cosine
from solo_ext.host.standalone.utils import accuracy_at_k, omegaconf_select, split_weight_decay
from solo_ext.modules.knn import WeightedKNNClassifier, knn_predict


def test_warmup_cosine_values():
    p1, p2, p3 = (nn.Parameter(torch.zeros(1)) for _ in range(3))
    opt = torch.optim.SGD(
        [{"params": [p1], "lr": 1.0}, {"params": [p2], "lr": 0.5}, {"params": [p3], "lr": 0.3}],
        lr=1.0,
    )
    sched = warmup_cosine(
        opt, warmup_steps=4, total_steps=14, warmup_start_lr=0.1, min_lr=0.01, static_groups=[2]
    )
    lrs = []
    for _ in range(15):
        lrs.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sched.step()

    def expected(step, base):  # solo-learn's warm-up: the last warm-up step is at the lr
        if step < 4:
            return 0.1 + (base - 0.1) * step / 3
        return 0.01 + (base - 0.01) * 0.5 * (1 + math.cos(math.pi * (step - 4) / 10))

    for step, (lr1, lr2, lr3) in enumerate(lrs):
        assert lr1 == pytest.approx(expected(step, 1.0))
        assert lr2 == pytest.approx(expected(step, 0.5))
        assert lr3 == pytest.approx(0.3)  # static_lr group untouched
    assert lrs[3][0] == lrs[4][0] == pytest.approx(1.0) and lrs[14][0] == pytest.approx(0.01)


@pytest.mark.solo_learn
@pytest.mark.parametrize("warmup, total", [(4, 14), (10, 400), (0, 30), (1, 5)])
def test_warmup_cosine_is_solo_learns(warmup, total):
    from solo.utils import lr_scheduler

    (p1,), (p2,) = [nn.Parameter(torch.zeros(1))], [nn.Parameter(torch.zeros(1))]
    ours, theirs = (torch.optim.SGD([p], lr=0.4) for p in (p1, p2))
    start = 3e-5 if warmup > 0 else 0.4  # (solo-learn's configure_optimizers passes the lr)
    a = warmup_cosine(ours, warmup, total, warmup_start_lr=start, min_lr=0.001)
    b = lr_scheduler.LinearWarmupCosineAnnealingLR(theirs, warmup, total, start, 0.001)
    for _ in range(total + 1):
        assert ours.param_groups[0]["lr"] == pytest.approx(theirs.param_groups[0]["lr"], rel=1e-9)
        for opt, sched in ((ours, a), (theirs, b)):
            opt.step()
            sched.step()


def lars_reference(params, grads_per_step, lr, wd, momentum, eta, clip, exclude):
    """solo-learn's LARS step written out, parameter by parameter: the trust ratio on
    (g + wd p) when both norms are non-zero (no decay otherwise), 1-D parameters left out with
    ``exclude``, the ratio / lr capped at 1 with ``clip``, then SGD momentum."""
    params = [p.detach().clone().double() for p in params]
    bufs = [None] * len(params)
    for grads in grads_per_step:
        for i, (p, g) in enumerate(zip(params, grads)):
            d = g.double()
            if p.ndim != 1 or not exclude:
                pn, gn = p.norm().item(), g.double().norm().item()
                if pn != 0 and gn != 0:
                    ratio = eta * pn / (gn + pn * wd + 1e-8)
                    if clip:
                        ratio = min(ratio / lr, 1.0)
                    d = (d + wd * p) * ratio
            bufs[i] = d.clone() if bufs[i] is None else momentum * bufs[i] + d
            params[i] = p - lr * bufs[i]
    return params


@pytest.mark.parametrize("exclude", [True, False])
@pytest.mark.parametrize("clip", [True, False])
def test_lars_steps_as_solo_learns(exclude, clip):
    """The embedded LARS against solo-learn's rule written in the test, over three steps, on a
    weight, a bias, a norm weight, a zero weight and a parameter whose gradient is zero."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(6, 5), (6,), (6,), (4, 3), (3,)]
    params = [nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    with torch.no_grad():
        params[3].zero_()
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(3)]
    for step in grads:
        step[4].zero_()
    kwargs = dict(lr=0.5, wd=1e-2, momentum=0.9, eta=0.02, clip=clip, exclude=exclude)
    want = lars_reference(params, grads, **kwargs)
    opt = OPTIMIZERS["lars"](
        params,
        lr=0.5,
        weight_decay=1e-2,
        momentum=0.9,
        eta=0.02,
        clip_lr=clip,
        exclude_bias_n_norm=exclude,
    )
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g.clone()
        opt.step()
    for got, ref in zip(params, want):
        torch.testing.assert_close(got.detach().double(), ref, rtol=1e-5, atol=1e-6)
    # the rule matters: 1-D parameters moved by plain SGD momentum only when excluded
    plain = lars_reference(params, grads, **{**kwargs, "exclude": not exclude})
    assert not torch.allclose(plain[1], want[1])


def test_exclude_bias_and_norm_from_weight_decay():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    groups = split_weight_decay([{"name": "m", "params": model.parameters(), "lr": 0.3}])
    decay, no_decay = groups
    assert [p.shape for p in decay["params"]] == [torch.Size([4, 3])]
    assert len(no_decay["params"]) == 3 and no_decay["weight_decay"] == 0.0
    assert decay["lr"] == no_decay["lr"] == 0.3


def test_momentum_ema_and_cosine_tau():
    online, momentum = nn.Linear(3, 2), nn.Linear(3, 2)
    initialize_momentum_params(online, momentum)
    assert torch.equal(online.weight, momentum.weight) and not momentum.weight.requires_grad
    with torch.no_grad():
        online.weight.add_(1.0)
    updater = MomentumUpdater(base_tau=0.9, final_tau=1.0)
    old = momentum.weight.clone()
    updater.update(online, momentum)
    torch.testing.assert_close(momentum.weight, 0.9 * old + 0.1 * online.weight)
    updater.update_tau(cur_step=5, max_steps=10)
    assert updater.cur_tau == pytest.approx(1.0 - 0.1 * (math.cos(math.pi / 2) + 1) / 2)
    updater.update_tau(cur_step=10, max_steps=10)
    assert updater.cur_tau == pytest.approx(1.0)
    with pytest.raises(ValueError, match="momentum.base_tau=1.5"):
        MomentumUpdater(1.5, 1.0)


def knn_reference(train_x, train_y, test_x, num_classes, k, t):
    train_x = torch.nn.functional.normalize(train_x, dim=1)
    test_x = torch.nn.functional.normalize(test_x, dim=1)
    scores = []
    for x in test_x:
        sims = [(float(x @ tx), int(ty)) for tx, ty in zip(train_x, train_y)]
        sims.sort(key=lambda s: -s[0])
        votes = [0.0] * num_classes
        for sim, label in sims[:k]:
            votes[label] += math.exp(sim / t)
        scores.append(votes)
    return torch.tensor(scores)


def test_knn_predict_matches_loop():
    gen = torch.Generator().manual_seed(0)
    train_x, test_x = torch.randn(30, 5, generator=gen), torch.randn(7, 5, generator=gen)
    train_y = torch.randint(0, 4, (30,), generator=gen)
    got = knn_predict(train_x, train_y, test_x, 4, k=6, temperature=0.1, chunk_size=3)
    torch.testing.assert_close(
        got, knn_reference(train_x, train_y, test_x, 4, 6, 0.1), rtol=1e-4, atol=1e-4
    )


def test_online_knn_metric_separable_clusters():
    centers = torch.eye(3) * 10
    train = centers.repeat_interleave(5, 0) + torch.randn(15, 3) * 0.1
    metric = WeightedKNNClassifier(k=3, distance_fx="cosine")
    metric(train_features=train, train_targets=torch.arange(3).repeat_interleave(5))
    metric(test_features=centers + 0.1, test_targets=torch.arange(3))
    acc1, acc5 = metric.compute()
    assert acc1 == pytest.approx(100.0) and acc5 == pytest.approx(100.0)


def test_accuracy_at_k_percent_and_ignore_index():
    logits = torch.tensor([[3.0, 2.0, 1.0], [1.0, 3.0, 2.0], [1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    targets = torch.tensor([0, 2, 0, -1])
    acc1, acc2 = accuracy_at_k(logits, targets, top_k=(1, 2))
    assert acc1.item() == pytest.approx(100 / 3) and acc2.item() == pytest.approx(200 / 3)


@pytest.mark.parametrize(
    "name,dataset,dim,first_stride",
    [
        # the dataset table decides the stem: 32 px datasets get the small-image one
        ("resnet18", "cifar10", 512, 1),
        ("resnet18", "cifar100_lt", 512, 1),
        ("resnet18", "synthetic_lt", 512, 1),
        ("resnet18", "imagenet_lt", 512, 2),
        ("resnet50", "cifar100", 2048, 1),
        ("vit_tiny", "synthetic_lt", 192, None),
    ],
)
def test_backbones(name, dataset, dim, first_stride):
    kwargs = {"img_size": 32, "patch_size": 8} if name.startswith("vit") else {}
    backbone = build_backbone(name, "scl", dataset, kwargs)
    assert feature_dim(backbone) == dim
    assert backbone(torch.randn(2, 3, 32, 32)).shape == (2, dim)
    if first_stride is not None:
        assert backbone.conv1.stride == (first_stride, first_stride)


def test_omegaconf_select_defaults():
    cfg = OmegaConf.create({"a": {"b": None, "c": 0}})
    assert omegaconf_select(cfg, "a.b", 5) == 5
    assert omegaconf_select(cfg, "a.c", 5) == 0
    assert omegaconf_select(cfg, "x.y", "d") == "d"
