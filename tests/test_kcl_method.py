"""The ``kcl`` and ``tsc`` methods' steps against the official steps (BalFeat's KCL, targeted-
supcon's TSC), written in ``test_kcl_loss.py`` from the official code, on the model's own
queries, keys and queue at the step."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from conftest import RESNET18
from test_directions import _model_and_batch as model_and_batch
from test_kcl_loss import balfeat_kcl, official_centroid_update, official_tsc

from solo_ext.commands.pretrain import parse_cfg
from solo_ext.host import METHODS


def fill_half(model) -> None:
    gen = torch.Generator().manual_seed(2)
    n = model.queue.size // 2
    keys = F.normalize(torch.randn(n, model.queue.keys.size(1), generator=gen), dim=1)
    model.queue.enqueue(keys, torch.randint(0, 4, (n,), generator=gen))


def step(model, batch, fill: bool = True):
    """One training step (the queue half filled first): what its contrastive_loss call saw
    (queries, keys, labels, the queue's keys and labels), a generator at the global random state
    it started from (TSC draws its positives from it), and its value."""
    if fill:
        fill_half(model)
    calls = []
    loss_fn = model.contrastive_loss

    def spied(q, k, labels, queue):
        seen = (q.detach(), k.detach(), labels, queue.keys.clone(), queue.labels.clone())
        gen = torch.Generator()
        gen.set_state(torch.get_rng_state())
        value = loss_fn(q, k, labels, queue)
        calls.append((*seen, gen, value.detach()))
        return value

    model.contrastive_loss = spied
    model.training_step(batch, 0)
    (call,) = calls
    return call


@pytest.mark.parametrize("k_pos", [6, 1, "all"])
def test_kcl_step_is_balfeats(k_pos, make_cfg):
    model, batch = model_and_batch(
        make_cfg, "kcl", **{"method_kwargs.k_pos": k_pos, "method_kwargs.positives": "topk"}
    )
    k_pos = None if k_pos == "all" else k_pos
    # the official start: random unit keys without labels, every one a negative
    assert (model.queue.labels == -1).all()
    torch.testing.assert_close(model.queue.keys.norm(dim=1), torch.ones(model.queue.size))
    q, k, labels, keys, queue_labels, _, value = step(model, batch)
    want = balfeat_kcl(q, k, keys, labels, queue_labels, k_pos, model.temperature)
    assert float(value) == pytest.approx(float(want), rel=1e-5)


@pytest.mark.parametrize("k_pos", [6, 1, "all"])
def test_kcl_step_is_the_targeted_supcon_kcl_run_by_default(k_pos, make_cfg):
    """``positives: random`` (the default): the KCL run of the targeted-supcon repository, its
    code's loss without targets, with the draws of the step's random state."""
    model, batch = model_and_batch(make_cfg, "kcl", **{"method_kwargs.k_pos": k_pos})
    assert model.cfg.method_kwargs.positives == "random"
    q, k, labels, keys, queue_labels, gen, value = step(model, batch)
    count = 0 if k_pos == "all" else k_pos  # (the official --K 0: every candidate)
    want, _, _ = official_tsc(
        q, k, keys, labels, queue_labels, None, None, count, model.temperature, 1, 0.2, True, gen
    )
    assert float(value) == pytest.approx(float(want), rel=1e-5)
    if k_pos == 1:  # one draw among several same-class entries: not BalFeat's topk choice
        topk = balfeat_kcl(q, k, keys, labels, queue_labels, 1, model.temperature)
        assert float(value) != pytest.approx(float(topk), rel=1e-6)


def test_kcl_with_an_empty_queue_start_leaves_the_unwritten_slots_out(make_cfg):
    # (ResNet-18's features: spread enough that the whole-queue loss is far from 0)
    overrides = {"method_kwargs.queue_start": "empty", "backbone": RESNET18}
    model, batch = model_and_batch(make_cfg, "kcl", **overrides)
    q, k, labels, keys, queue_labels, _, value = step(model, batch, fill=False)
    # all slots unwritten: the loss is over the key alone, log p(k_i) = 0
    assert float(value) == pytest.approx(0.0, abs=1e-6)
    everything = balfeat_kcl(q, k, keys, labels, queue_labels, 6, model.temperature)
    assert float(everything) > 1.0


def best_assignment(centroids: torch.Tensor, targets: torch.Tensor) -> list[int]:
    """scipy's linear_sum_assignment(-centroids @ targets.T), by brute force (4 classes)."""
    sim = (centroids.double() @ targets.double().T).tolist()
    n = len(sim)
    return list(
        max(itertools.permutations(range(n)), key=lambda p: sum(sim[i][p[i]] for i in range(n)))
    )


@pytest.mark.parametrize("separate_target", [True, False])
def test_tsc_step_is_the_official_one(separate_target, make_cfg):
    model, batch = model_and_batch(
        make_cfg,
        "tsc",
        **{
            "method_kwargs.separate_target": separate_target,
            "method_kwargs.target_steps": 50,
            "method_kwargs.kcl_epochs": 0,
        },
    )
    centroids = model.centroids.clone()
    q, k, labels, keys, queue_labels, gen, value = step(model, batch)
    # the centroids moved towards this step's queries, as the official per-class loop moves them
    moved = official_centroid_update(centroids, q, labels)
    torch.testing.assert_close(model.centroids, moved)
    targets = model.targets
    assert bool(model.targets_made)
    torch.testing.assert_close(targets.norm(dim=1), torch.ones(4))
    col_ind = best_assignment(moved, targets)
    kw = model.cfg.method_kwargs
    want, _, _ = official_tsc(
        q, k, keys, labels, queue_labels, targets, col_ind, kw.num_positive, model.temperature,
        kw.target_repeat, kw.target_weight, separate_target, gen,
    )  # fmt: skip
    assert float(value) == pytest.approx(float(want), rel=1e-5)


def test_tsc_trains_kcl_first(make_cfg):
    """The first kcl_epochs: the TSC code's KCL (random draws, no targets), the centroids still."""
    model, batch = model_and_batch(make_cfg, "tsc", **{"method_kwargs.kcl_epochs": 1})
    centroids = model.centroids.clone()
    q, k, labels, keys, queue_labels, gen, value = step(model, batch)
    torch.testing.assert_close(model.centroids, centroids)
    assert not bool(model.targets_made)
    want, _, _ = official_tsc(
        q, k, keys, labels, queue_labels, None, None, 6, model.temperature, 1, 0.2, True, gen
    )
    assert float(value) == pytest.approx(float(want), rel=1e-5)


def test_tsc_published_run_by_default(make_cfg):
    kw = parse_cfg(make_cfg("tsc", max_epochs=400)).method_kwargs
    assert (kw.num_positive, kw.target_weight, kw.target_repeat) == (6, 0.2, 1)
    assert kw.separate_target is True
    assert METHODS["tsc"].METHOD_KWARGS["target_steps"].default == 10000  # (tests use fewer)
    assert kw.kcl_epochs == 200


def test_tsc_targets_travel_in_the_checkpoint(make_cfg):
    model, _ = model_and_batch(make_cfg, "tsc", **{"method_kwargs.target_steps": 20})
    model.make_targets()
    fresh, _ = model_and_batch(make_cfg, "tsc", **{"method_kwargs.target_steps": 20})
    fresh.load_state_dict(model.state_dict())
    assert bool(fresh.targets_made)
    torch.testing.assert_close(fresh.targets, model.targets)
