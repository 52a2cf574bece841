"""One direction per step by default, as the published DSCL and DenseCL code trains (the first
crop's queries against the second crop's keys, B keys enqueued); ``symmetric: true`` runs both
directions with one queue per view (solo-learn's MoCo v2+)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_scl_loss import scl_reference

from solo_ext.commands.pretrain import parse_cfg
from solo_ext.host import METHODS

B = 8


def _model_and_batch(make_cfg, method: str, **overrides):
    cfg = parse_cfg(make_cfg(method, **overrides))
    torch.manual_seed(0)
    model = METHODS[method](cfg)
    gen = torch.Generator().manual_seed(1)
    crops = [torch.randn(B, 3, 32, 32, generator=gen) for _ in range(2)]
    labels = torch.randint(0, 4, (B,), generator=gen)
    return model, [torch.arange(B), crops, labels]


def _fill(queue, gen_seed: int = 2) -> None:
    """Half the queue with known keys and labels, so the loss sees filled and empty slots."""
    gen = torch.Generator().manual_seed(gen_seed)
    n = queue.size // 2
    queue.enqueue(F.normalize(torch.randn(n, queue.keys.size(1), generator=gen), dim=1),
                  torch.randint(0, 4, (n,), generator=gen))  # fmt: skip


def _spy(model):
    calls = []
    loss_fn = model.contrastive_loss

    def spy(q, k, labels, queue):
        queue_state = (queue.keys.clone(), queue.labels.clone())
        value = loss_fn(q, k, labels, queue)
        calls.append((q.detach(), k.detach(), labels, queue, queue_state, value.detach()))
        return value

    model.contrastive_loss = spy
    return calls


def _projections(model, batch):
    """The query of each crop (online encoder) and its key (momentum encoder), recomputed."""
    with torch.no_grad():
        q = [F.normalize(model.projector(model.backbone(x)), dim=-1) for x in batch[1]]
        k = [
            F.normalize(model.momentum_projector(model.momentum_backbone(x)), dim=-1)
            for x in batch[1]
        ]
    return q, k


def test_scl_step_is_the_first_crops_queries_against_the_second_crops_keys(make_cfg):
    model, batch = _model_and_batch(make_cfg, "scl")
    _fill(model.queue)
    assert model.queue_view1 is None
    calls = _spy(model)
    model.training_step(batch, 0)
    (q, k, labels, queue, (keys, queue_labels), value) = calls[0]
    assert len(calls) == 1 and queue is model.queue
    want_q, want_k = _projections(model, batch)
    torch.testing.assert_close(q, want_q[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(k, want_k[1], rtol=1e-4, atol=1e-5)
    reference = scl_reference(q, k, keys, labels, queue_labels, model.temperature)
    assert float(value) == pytest.approx(reference.item(), rel=1e-5)
    # B keys of the second crop, with their labels, enter the queue after the step
    ptr = int(model.queue.ptr)
    model.write_queues()
    assert int(model.queue.ptr) == (ptr + B) % model.queue.size
    torch.testing.assert_close(model.queue.keys[ptr : ptr + B], k)
    assert torch.equal(model.queue.labels[ptr : ptr + B], batch[2])


@pytest.mark.parametrize("method", ["scl", "dscl"])
def test_symmetric_runs_both_directions_with_a_queue_per_view(method, make_cfg):
    model, batch = _model_and_batch(make_cfg, method, **{"method_kwargs.symmetric": True})
    _fill(model.queue, 2)
    _fill(model.queue_view1, 3)
    calls = _spy(model)
    model.training_step(batch, 0)
    assert [c[3] for c in calls] == [model.queue, model.queue_view1]
    want_q, want_k = _projections(model, batch)
    for (q, k, *_), (qi, ki) in zip(calls, ((0, 1), (1, 0))):
        torch.testing.assert_close(q, want_q[qi], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(k, want_k[ki], rtol=1e-4, atol=1e-5)
    ptrs = [int(model.queue.ptr), int(model.queue_view1.ptr)]
    model.write_queues()
    # each queue gets B keys of its own view: no image enters a queue twice
    for queue, ptr, ki in ((model.queue, ptrs[0], 1), (model.queue_view1, ptrs[1], 0)):
        assert int(queue.ptr) == (ptr + B) % queue.size
        torch.testing.assert_close(queue.keys[ptr : ptr + B], want_k[ki], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("symmetric", [False, True])
def test_densecl_enqueues_b_keys_per_direction(symmetric, make_cfg):
    kwargs = {"method_kwargs.symmetric": symmetric, "method_kwargs.queue_size": 64}
    model, batch = _model_and_batch(make_cfg, "densecl", **kwargs)
    assert model.cfg.method_kwargs.warmup_steps == 0  # lambda from the first step
    queues = [model.queue, model.dense_queue]
    if symmetric:
        queues += [model.queue_view1, model.dense_queue_view1]
    else:
        assert model.queue_view1 is None and model.dense_queue_view1 is None
    model.current_lambda = lambda: 0.5  # (the trainer's step decides it in a run)
    model.training_step(batch, 0)
    model.write_queues()
    assert [int(q.ptr) for q in queues] == [B] * len(queues)
    with torch.no_grad():
        k2 = F.normalize(model.momentum_projector(model.momentum_backbone(batch[1][1])), dim=-1)
    torch.testing.assert_close(model.queue.keys[:B], k2, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("start", ["random", "empty"])
def test_dscl_first_step_against_the_published_start_of_the_queue(start, make_cfg):
    """``queue_start: random`` (the default, as the published DSCL code): the queue starts as
    random unit keys with random labels in [0, classes), and the first step's loss is eq. 8-9
    over the whole of it; ``empty``: the first step contrasts the batch alone."""
    from test_dscl_loss import dscl_reference

    model, batch = _model_and_batch(make_cfg, "dscl", **{"method_kwargs.queue_start": start})
    labels = model.queue.labels
    if start == "random":
        assert labels.min() >= 0 and labels.max() < model.num_classes
        assert len(labels.unique()) == model.num_classes  # 64 draws of 4 classes
        torch.testing.assert_close(model.queue.keys.norm(dim=1), torch.ones(labels.numel()))
    else:
        assert (labels == -1).all()
    calls = _spy(model)
    model.training_step(batch, 0)
    (q, k, targets, _, (keys, queue_labels), value) = calls[0]
    alpha = 1 / (1 + model.cfg.method_kwargs.beta)
    want = dscl_reference(q, k, keys, targets, queue_labels, alpha, model.temperature)
    assert float(value) == pytest.approx(want.item(), rel=1e-5)
    batch_only = dscl_reference(
        q, k, keys, targets, torch.full_like(labels, -1), alpha, model.temperature
    )
    assert (float(value) == pytest.approx(batch_only.item(), rel=1e-5)) == (start == "empty")


@pytest.mark.parametrize("start", ["random", "empty"])
def test_densecl_queues_start_as_published(start, make_cfg):
    """DenseCL's global and dense queues: random unit keys, every one a negative from the
    first step (``random``, the published start), or none until written (``empty``)."""
    model, _ = _model_and_batch(make_cfg, "densecl", **{"method_kwargs.queue_start": start})
    for queue in (model.queue, model.dense_queue):
        torch.testing.assert_close(queue.keys.norm(dim=1), torch.ones(queue.size))
        assert queue.valid.all() if start == "random" else not queue.valid.any()
