"""The decoupled classifier stages (cRT, tau-normalisation, LWS, post-hoc logit adjustment):
each against a re-derivation written here as the papers' code computes it, the choice of tau
kept off the test split, a known-prior case where the post-hoc stages provably move accuracy
from the head classes to the tail, and a whole ``solo-ext-linear`` run of all the stages."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import eval_cfg, tiny_cfg

from solo_ext.commands.options import LINEAR_OPTIONS
from solo_ext.eval.decoupled import (
    ScaledLinear,
    choose_tau,
    class_mean_accuracy,
    held_out_split,
    logit_adjusted_scores,
    tau_grid,
    tau_norm_scores,
    tau_normalised_weight,
)
from solo_ext.eval.options import CLASSIFIER_STAGES, stages_of


def test_tau_normalised_weight_is_the_row_loop():
    """Each row divided by its norm to the power tau, row by row as the official script does
    (with tau 0 the weights unchanged, with tau 1 unit rows)."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(7, 5, generator=gen, dtype=torch.float64) * torch.arange(1, 8)[:, None]
    for tau in (0.0, 0.3, 1.0, 1.7):
        want = weight.clone()
        for i in range(weight.size(0)):
            want[i] = weight[i] / math.sqrt(sum(float(v) ** 2 for v in weight[i])) ** tau
        torch.testing.assert_close(tau_normalised_weight(weight, tau), want)
    torch.testing.assert_close(tau_normalised_weight(weight, 0.0), weight)
    norms = tau_normalised_weight(weight, 1.0).norm(dim=1)
    torch.testing.assert_close(norms, torch.ones(7, dtype=torch.float64))
    # the scores: features times the normalised rows, no bias
    x = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    want = torch.tensor(
        [
            [sum(float(x[n, d]) * float(want[c, d]) for d in range(5)) for c in range(7)]
            for n in range(3)
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(tau_norm_scores(x, weight, 1.7), want)


def test_logit_adjustment_subtracts_tau_times_the_log_prior():
    counts = [50, 20, 5, 1]
    logits = torch.tensor([[1.0, 2.0, 0.5, -1.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    total = sum(counts)
    for tau in (0.0, 1.0, 2.5):
        want = torch.tensor(
            [
                [row[j] - tau * math.log(counts[j] / total) for j in range(4)]
                for row in logits.tolist()
            ],
            dtype=torch.float64,
        )
        torch.testing.assert_close(logit_adjusted_scores(logits, counts, tau), want)
    # a uniform prior shifts every logit alike: no prediction changes
    flat = logit_adjusted_scores(logits, [3, 3, 3, 3], 1.0)
    assert torch.equal(flat.argmax(1), logits.argmax(1))
    with pytest.raises(ValueError, match="counts > 0"):
        logit_adjusted_scores(logits, [3, 0, 3, 3])


def test_lws_scales_the_frozen_classifiers_logits_per_class():
    torch.manual_seed(0)
    linear = torch.nn.Linear(6, 4)
    model = ScaledLinear(linear)
    with torch.no_grad():
        model.scales.copy_(torch.tensor([0.5, 1.0, 2.0, 3.0]))
    x = torch.randn(5, 6)
    want = (x @ linear.weight.T + linear.bias) * torch.tensor([0.5, 1.0, 2.0, 3.0])
    torch.testing.assert_close(model(x), want)
    # only the scales train; they start at one
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["scales"]
    assert torch.equal(ScaledLinear(torch.nn.Linear(6, 4)).scales, torch.ones(4))
    model(x).sum().backward()
    assert linear.weight.grad is None and model.scales.grad is not None


def test_the_held_out_split_is_per_class_and_disjoint():
    labels = torch.tensor([0] * 10 + [1] * 5 + [2] * 2 + [3] * 1)
    fit, held = held_out_split(labels, 0.2, seed=3)
    assert sorted(fit.tolist() + held.tolist()) == list(range(18))
    assert set(fit.tolist()).isdisjoint(held.tolist())
    per_class = torch.bincount(labels[held], minlength=4).tolist()
    assert per_class == [2, 1, 1, 0]  # floor(0.2 n), at least one from two images, none from one
    assert torch.bincount(labels[fit], minlength=4).min() >= 1
    # seeded: the same split again, another seed another one
    assert torch.equal(held_out_split(labels, 0.2, seed=3)[1], held)
    assert not torch.equal(held_out_split(labels, 0.2, seed=4)[1], held)


def test_choose_tau_takes_the_best_mean_class_accuracy_and_the_smallest_on_a_tie():
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(3, 4, generator=gen)
    weight[0] *= 10  # a head class with a large weight norm
    x = torch.randn(60, 4, generator=gen)
    y = torch.randint(0, 3, (60,), generator=gen)
    taus = tau_grid(2.0, 21)
    assert taus[0] == 0.0 and taus[-1] == 2.0 and len(taus) == 21
    tau, accs = choose_tau(x, y, weight, taus)
    want = [class_mean_accuracy(tau_norm_scores(x, weight, t), y, 3) for t in taus]
    assert accs == want
    best = max(want)
    assert tau == taus[want.index(best)]  # the first (smallest) of the best


def _bayes_case(n_test: int = 6000):
    """Three Gaussian classes with equal spread, trained on a long-tailed prior (1000, 100, 10):
    the instance-trained posterior (logits log p(x|y) + log pi_y) against a balanced test."""
    gen = torch.Generator().manual_seed(0)
    means = torch.tensor([[0.0, 0.0], [2.0, 0.0], [1.0, 1.7]], dtype=torch.float64)
    counts = [1000, 100, 10]
    y = torch.arange(3).repeat_interleave(n_test // 3)
    x = means[y] + torch.randn(len(y), 2, generator=gen, dtype=torch.float64)
    log_pi = torch.log(torch.tensor(counts, dtype=torch.float64) / sum(counts))
    logits = -0.5 * ((x[:, None, :] - means[None]) ** 2).sum(-1) + log_pi
    return x, y, logits, counts, means


def _per_class(scores, y):
    pred = scores.argmax(1)
    return [float((pred[y == c] == c).double().mean()) for c in range(3)]


def test_on_a_known_prior_the_post_hoc_stages_move_accuracy_from_head_to_tail():
    """Logit adjustment of the prior-weighted Bayes posterior gives the balanced Bayes rule: the
    tail class gains, the head loses, and the mean class accuracy rises. Tau-normalising weights
    whose norms grow with the class count (the bias of instance sampling) moves the same way."""
    x, y, logits, counts, means = _bayes_case()
    before, after = _per_class(logits, y), _per_class(logit_adjusted_scores(logits, counts), y)
    assert after[2] > before[2] + 0.2 and after[0] < before[0]
    assert sum(after) > sum(before)
    # tau-norm: linear scores x . w_c with |w_c| growing with n_c (unit directions otherwise)
    directions = torch.nn.functional.normalize(means - means.mean(0), dim=1)
    weight = directions * torch.tensor(counts, dtype=torch.float64).log()[:, None]
    centred = x - means.mean(0)
    plain, normed = tau_norm_scores(centred, weight, 0.0), tau_norm_scores(centred, weight, 1.0)
    before, after = _per_class(plain, y), _per_class(normed, y)
    assert after[2] > before[2] and after[0] < before[0]


def test_stage_names_and_lists_are_put_in_order():
    """(Bad names and lists, one line each: tests/test_schema.py's linear-classifier_stage.)"""
    assert stages_of("all") == list(CLASSIFIER_STAGES)
    assert stages_of(["logit_adjust", "crt"]) == ["crt", "logit_adjust"]


@pytest.fixture(scope="module")
def scl_run(tmp_path_factory):
    from solo_ext.commands.pretrain import run

    cfg = tiny_cfg("scl", tmp_path_factory.mktemp("decoupled"))
    return Path(run(cfg)["run_dir"])


@pytest.fixture(scope="module")
def five_stages(scl_run):
    """``classifier_stage=all`` on the tiny run: its metrics, and how often the features were
    extracted."""
    from unittest import mock

    from solo_ext.commands import linear

    cfg = eval_cfg(
        "linear",
        scl_run,
        classifier_stage="all",
        max_epochs=1,
        **{"decoupled.epochs": 2, "decoupled.lws_epochs": 1, "enable_progress_bar": False},
    )
    with mock.patch.object(linear, "split_features", wraps=linear.split_features) as extract:
        metrics = linear.run(cfg)
    return metrics, extract.call_count


def test_all_five_stages_in_one_command(scl_run, five_stages):
    """``classifier_stage=all``: the balanced stage as before and the four decoupled stages on
    features extracted once, each under its own keys in metrics.json, tau_norm's tau recorded
    (its choice without the test split: the test below)."""
    metrics, extractions = five_stages
    assert extractions == 1  # one feature pass for the four decoupled stages
    on_disk = json.loads((scl_run / "metrics.json").read_text())
    for stage in ("crt", "tau_norm", "lws", "logit_adjust"):
        for key in ("acc1", "acc1_many", "acc1_medium", "acc1_few"):
            name = f"linear_{stage}_{key}"
            if math.isnan(metrics[name]):  # an empty shot group (the tiny data has no many)
                assert on_disk[name] is None
            else:
                assert on_disk[name] == pytest.approx(metrics[name])
        assert (scl_run / f"linear_{stage}_per_class.csv").is_file()
    assert "linear_acc1" in metrics  # balanced_linear's keys, as before
    assert metrics["linear_crt_sampler"] == metrics["linear_lws_sampler"] == "class_balanced"
    assert metrics["linear_logit_adjust_tau"] == 1.0
    assert metrics["linear_tau_norm_tau"] in tau_grid(2.0, 21)
    assert metrics["linear_tau_norm_held_out"] > 0


def test_tau_is_chosen_without_the_test_split():
    """The decoupled stages on fixed features, twice: the test split replaced by noise changes
    the scores but not the tau chosen (nor the held-out part it was chosen on)."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from solo_ext.config import fill_options
    from solo_ext.eval.decoupled import report_stages

    gen = torch.Generator().manual_seed(0)
    counts = [40, 20, 10, 5]
    train_y = torch.arange(4).repeat_interleave(torch.tensor(counts))
    centres = torch.randn(4, 8, generator=gen) * 2
    train_x = centres[train_y] + torch.randn(len(train_y), 8, generator=gen)
    val_y = torch.arange(4).repeat_interleave(10)
    train = SimpleNamespace(train_class_counts=counts)
    cfg = OmegaConf.create({})
    fill_options(cfg, LINEAR_OPTIONS)
    cfg.decoupled.epochs = 3
    data = {"dataset": "synthetic_lt", "num_classes": 4, "many_threshold": 30, "few_threshold": 8}
    pre_cfg = OmegaConf.create({"data": data})
    found = []
    for val_x in (centres[val_y], torch.randn(40, 8, generator=gen) * 50):
        feats = {"train_x": train_x, "train_y": train_y, "val_x": val_x, "val_y": val_y}
        feats["train"] = train
        options = OmegaConf.to_container(cfg.decoupled)
        found.append(report_stages(["tau_norm"], options, feats, pre_cfg.data, 0, "cpu", None))
    assert found[0]["linear_tau_norm_tau"] == found[1]["linear_tau_norm_tau"]
    assert found[0]["linear_tau_norm_held_out"] == found[1]["linear_tau_norm_held_out"] == 15
    assert found[0]["linear_tau_norm_acc1"] != found[1]["linear_tau_norm_acc1"]


def test_the_leaderboard_shows_each_stage_as_its_own_flagged_column(scl_run, five_stages):
    """Each decoupled stage is a column of its own, beside the balanced stage's, and flagged
    against the stage a published linear number uses."""
    from solo_ext.leaderboard.runs import read_args, read_run
    from solo_ext.leaderboard.table import markdown, measured_row

    metrics, _ = five_stages
    row = measured_row(read_run(scl_run, read_args(scl_run), []), [])
    stages = ["linear_crt", "linear_tau_norm", "linear_lws", "linear_logit_adjust"]
    assert row.evaluations[:5] == ["linear", *stages]
    for key in stages:
        assert row.value(key) == pytest.approx(metrics[f"{key}_acc1"])
    assert "linear cRT: classifier stage crt (published: the balanced linear stage)" in (
        row.differences
    )
    assert sum("classifier stage" in d for d in row.differences) == 4
    header = markdown("synthetic_lt", [row]).split("\n")
    assert any("linear tau-norm top-1" in line for line in header), header[:6]


def _sgd_loop(weight, bias, x, y, *, epochs, batch, lr, momentum, wd, seed):
    """The stage's training as its definition reads: SGD with momentum (the buffer starts at the
    first step's gradient) and weight decay added to the gradient, the lr of epoch e
    lr (1 + cos(pi e / E)) / 2, a seeded permutation per epoch in full batches."""
    w, b = weight.clone().double(), bias.clone().double()
    vw = vb = None
    gen = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        step_lr = lr * (1 + math.cos(math.pi * epoch / epochs)) / 2
        order = torch.randperm(len(y), generator=gen)
        for start in range(0, len(y) - len(y) % batch, batch):
            idx = order[start : start + batch]
            xb, yb = x[idx].double(), y[idx]
            logits = xb @ w.T + b
            p = logits.softmax(dim=1)
            p[torch.arange(len(yb)), yb] -= 1  # d(mean cross-entropy) / d(logits), times B
            gw, gb = p.T @ xb / len(yb) + wd * w, p.sum(0) / len(yb) + wd * b
            vw = gw if vw is None else momentum * vw + gw
            vb = gb if vb is None else momentum * vb + gb
            w, b = w - step_lr * vw, b - step_lr * vb
    return w, b


def test_the_stage_training_is_sgd_with_a_cosine_per_epoch():
    """fit_on_features against the written-out loop: same weights after three epochs of
    shuffled full batches (the last short batch dropped)."""
    from torch import nn

    from solo_ext.eval.decoupled import fit_on_features

    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(50, 6, generator=gen), torch.randint(0, 4, (50,), generator=gen)
    layer = nn.Linear(6, 4)
    want_w, want_b = _sgd_loop(layer.weight.detach(), layer.bias.detach(), x, y, epochs=3,
                               batch=16, lr=0.5, momentum=0.9, wd=5e-3, seed=7)  # fmt: skip
    fit_on_features(layer, x, y, epochs=3, batch_size=16, lr=0.5, momentum=0.9,
                    weight_decay=5e-3, sampler=None, seed=7)  # fmt: skip
    assert torch.allclose(layer.weight.double(), want_w, atol=1e-5)
    assert torch.allclose(layer.bias.double(), want_b, atol=1e-5)
    assert not layer.training


def test_crt_and_lws_draw_each_class_equally_often():
    """cRT's and LWS's batches come from the class-balanced draw, the others' from the
    instance draw: counted through the head's inputs on a 9:1 training set."""
    from torch import nn

    from solo_ext.eval.decoupled import fit_on_features

    y = torch.tensor([0] * 90 + [1] * 10)
    x = torch.nn.functional.one_hot(y, 2).float()  # the input says its class
    for sampler, share in (("class_balanced", 0.5), (None, 0.1)):
        seen = []
        head = nn.Linear(2, 2)
        head.register_forward_hook(
            lambda _m, inp, _o, seen=seen: seen.append(inp[0][:, 1].sum().item())
        )
        fit_on_features(head, x, y, epochs=20, batch_size=10, lr=0.1, momentum=0.0,
                        weight_decay=0.0, sampler=sampler, seed=0)  # fmt: skip
        assert sum(seen) / (10 * len(seen)) == pytest.approx(share, abs=0.05)
