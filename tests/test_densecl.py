"""DenseCL: correspondence, the loss against loops, the warm-up, and the method's wiring."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from solo_ext.commands.pretrain import parse_cfg, run
from solo_ext.host import METHODS
from solo_ext.losses.densecl import dense_correspondence, densecl_loss


def test_correspondence_recovers_a_horizontal_flip():
    gen = torch.Generator().manual_seed(0)
    b, c, h, w = 3, 32, 5, 7
    view1 = torch.randn(b, c, h, w, generator=gen)  # distinctive per location
    view2 = view1.flip(-1) + 0.01 * torch.randn(b, c, h, w, generator=gen)
    match = dense_correspondence(view1.flatten(2), view2.flatten(2))
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    expected = (ys * w + (w - 1 - xs)).flatten()
    assert torch.equal(match, expected.expand(b, -1))


def _infonce_loop(q, k, queue, t):
    total = 0.0
    for i in range(q.size(0)):
        pos = math.exp(float(q[i] @ k[i]) / t)
        neg = sum(math.exp(float(q[i] @ m) / t) for m in queue)
        total += -math.log(pos / (pos + neg))
    return total / q.size(0)


def _unit(*shape, gen, dim=-1):
    return F.normalize(torch.randn(*shape, generator=gen), dim=dim)


@pytest.mark.parametrize("lam", [0.0, 1.0, 0.3])
def test_loss_is_the_weighted_sum_of_the_loop_terms(lam):
    gen = torch.Generator().manual_seed(1)
    b, d, s, t = 3, 8, 4, 0.2
    q_g, k_g, queue = _unit(b, d, gen=gen), _unit(b, d, gen=gen), _unit(6, d, gen=gen)
    q_d, k_d = _unit(b, d, s, gen=gen, dim=1), _unit(b, d, s, gen=gen, dim=1)
    dense_queue = _unit(5, d, gen=gen)
    match = torch.randint(0, s, (b, s), generator=gen)
    total, global_term, dense_term = densecl_loss(
        q_g, k_g, queue, q_d, k_d, dense_queue, match, lam, t
    )
    want_global = _infonce_loop(q_g, k_g, queue, t)
    # every query location against the matched key location and the dense queue
    q_loc = q_d.transpose(1, 2).reshape(b * s, d)
    k_loc = torch.stack([k_d[i, :, match[i, j]] for i in range(b) for j in range(s)])
    want_dense = _infonce_loop(q_loc, k_loc, dense_queue, t)
    assert global_term.item() == pytest.approx(want_global, rel=1e-5)
    assert dense_term.item() == pytest.approx(want_dense, rel=1e-5)
    assert total.item() == pytest.approx((1 - lam) * want_global + lam * want_dense, rel=1e-5)


def test_empty_queue_slots_are_ignored():
    gen = torch.Generator().manual_seed(2)
    q_g, k_g, queue = _unit(2, 4, gen=gen), _unit(2, 4, gen=gen), _unit(3, 4, gen=gen)
    q_d, k_d = _unit(2, 4, 1, gen=gen, dim=1), _unit(2, 4, 1, gen=gen, dim=1)
    match = torch.zeros(2, 1, dtype=torch.long)
    valid = torch.tensor([True, False, False])
    masked = densecl_loss(q_g, k_g, queue, q_d, k_d, queue, match, 0.5, 0.2, valid, valid)[0]
    cut = densecl_loss(q_g, k_g, queue[:1], q_d, k_d, queue[:1], match, 0.5, 0.2)[0]
    assert masked.item() == pytest.approx(cut.item(), rel=1e-6)


class _Trainer:
    def __init__(self, step):
        self.global_step = step


def test_warmup_switches_at_the_right_step(make_cfg, monkeypatch):
    cfg = parse_cfg(
        make_cfg("densecl", **{"method_kwargs.warmup_steps": 3, "method_kwargs.lambda": 0.7})
    )
    model = METHODS["densecl"](cfg)
    for step, expected in ((0, 0.0), (2, 0.0), (3, 0.7), (10, 0.7)):
        monkeypatch.setattr(type(model), "trainer", property(lambda self, s=step: _Trainer(s)))
        assert model.current_lambda() == expected


def test_gradients_reach_only_the_query_branch(make_cfg):
    cfg = parse_cfg(make_cfg("densecl", **{"backbone.name": "cifar_resnet32"}))
    model = METHODS["densecl"](cfg).train()
    x1, x2 = torch.randn(4, 3, 32, 32), torch.randn(4, 3, 32, 32)
    q, k = model(x1), model.momentum_forward(x2)
    assert q["fmap"].shape == (4, 64, 64) and q["dense"].shape == (4, 16, 64)
    match = dense_correspondence(q["fmap"], k["fmap"])
    global_args = (q["z"], k["z"], model.queue.keys)
    dense_args = (q["dense"], k["dense"], model.dense_queue.keys)
    loss = densecl_loss(*global_args, *dense_args, match, 0.5, 0.2)[0]
    loss.backward()
    online = [model.backbone, model.projector, model.dense_projector]
    momentum = [model.momentum_backbone, model.momentum_projector, model.momentum_dense_projector]
    assert all(p.grad is not None for m in online for p in m.parameters() if p.requires_grad)
    assert all(p.grad is None and not p.requires_grad for m in momentum for p in m.parameters())


@pytest.mark.parametrize("start", ["random", "empty"])
def test_queues_advance_by_the_gathered_batch(start, make_cfg):
    cfg = make_cfg(
        "densecl",
        **{
            "checkpoint.enabled": False,
            "limit_train_batches": 2,
            "limit_val_batches": 0,
            "method_kwargs.queue_size": 20,
            "method_kwargs.warmup_steps": 1,
            "method_kwargs.queue_start": start,
        },
    )
    result = run(cfg)
    model, batch = result["model"], cfg.optimizer.batch_size
    for queue in (model.queue, model.dense_queue):
        assert queue.ptr.item() == (2 * batch) % 20  # 2 steps x the second view's batch
        # the published start: every random key is a negative from the first step
        written = 20 if start == "random" else min(20, 2 * batch)
        assert queue.valid.sum().item() == written
    assert result["metrics"]["densecl_lambda_epoch"] == pytest.approx(0.25)  # steps: 0, then 0.5


def test_lambda_zero_is_moco_v2_without_the_dense_branch(make_cfg):
    """lambda 0 skips the dense branch, yet trains exactly as the dense path does while its
    weight is 0 (during the warm-up)."""
    common = {"checkpoint.enabled": False, "limit_train_batches": 2, "limit_val_batches": 0}
    moco = run(make_cfg("densecl", **common, **{"method_kwargs.lambda": 0.0}))
    warm = run(
        make_cfg(
            "densecl", **common, **{"method_kwargs.lambda": 0.5, "method_kwargs.warmup_steps": 10}
        )
    )
    assert moco["metrics"]["train_densecl_loss"] == pytest.approx(
        warm["metrics"]["train_densecl_loss"], rel=1e-5
    )
    assert "train_dense_loss" not in moco["metrics"]
    assert torch.equal(moco["model"].queue.keys, warm["model"].queue.keys)


@pytest.mark.parametrize("init", ["kaiming", "default"])
def test_the_neck_starts_as_published(init, make_cfg):
    """``projector_init: kaiming`` (the published neck's start): the global projector's linear
    layers Kaiming-normal (fan in, ReLU gain: std sqrt(2 / fan_in)) with zero biases, the dense
    branch at PyTorch's default (uniform within 1 / sqrt(fan_in)), the key copies equal;
    ``default``: PyTorch's default for both."""
    cfg = parse_cfg(
        make_cfg(
            "densecl",
            **{"method_kwargs.projector_init": init, "method_kwargs.proj_hidden_dim": 256},
        )
    )
    torch.manual_seed(0)
    model = METHODS["densecl"](cfg)

    def linears(module):
        return [m for m in module.modules() if isinstance(m, torch.nn.Linear)]

    for layer in linears(model.projector):
        fan_in = layer.weight.size(1)
        if init == "kaiming":
            assert layer.weight.std().item() == pytest.approx((2 / fan_in) ** 0.5, rel=0.1)
            assert layer.weight.abs().max().item() > 1.5 / fan_in**0.5  # normal, not the uniform
            assert not layer.bias.any()
        else:
            assert layer.weight.abs().max().item() <= 1 / fan_in**0.5
            assert layer.bias.any()
    for layer in linears(model.dense_projector):
        assert layer.weight.abs().max().item() <= 1 / layer.weight.size(1) ** 0.5
        assert layer.bias.any()
    for a, b in zip(model.projector.parameters(), model.momentum_projector.parameters()):
        assert torch.equal(a, b)
