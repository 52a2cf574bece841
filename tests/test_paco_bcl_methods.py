"""The ``paco`` (PaCo, GPaCo) and ``bcl`` methods' steps against the official steps, and their
reported classifier (the head trained with the loss) in the online metrics and ``metrics.json``.

Each official step is written here from the official builders (PaCo/LT/moco/builder.py,
GPaCo/LT/moco/builder.py, BCL's models/resnext.py and main.py ``train``) on a copy of the model's
own modules, with the official losses of ``test_paco_loss.py`` / ``test_bcl_loss.py`` (float64):
the loss and the gradients of every trained parameter must agree."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import RESNET18
from test_bcl_loss import balscl_reference, logit_adjust_reference
from test_paco_loss import official_reference

from solo_ext.commands.pretrain import parse_cfg, run
from solo_ext.data.datasets import build_dataset
from solo_ext.data.transforms import build_eval_transform
from solo_ext.host import METHODS

B = 8
COUNTS = [9, 5, 3, 2]


def build(make_cfg, method: str, crops: int, **overrides):
    # (ResNet-18: the float32 step against the float64 official loss within the tolerances)
    given = {"data.train_class_counts": COUNTS, "backbone": RESNET18, **overrides}
    cfg = parse_cfg(make_cfg(method, **given))
    torch.manual_seed(0)
    model = METHODS[method](cfg)
    gen = torch.Generator().manual_seed(1)
    views = [torch.randn(B, 3, 32, 32, generator=gen) for _ in range(crops)]
    labels = torch.randint(0, 4, (B,), generator=gen)
    return model, [torch.arange(B), views, labels]


def trained_grads(model, names=("backbone", "projector", "head", "prototype_projector")):
    return {
        n: p.grad.clone()
        for n, p in model.named_parameters()
        if n.split(".")[0] in names and p.grad is not None
    }


def assert_same_grads(got: dict, want: dict) -> None:
    assert got.keys() == want.keys() and got
    for name in got:  # float32 (the model) against float64 (the official loss): relative error
        error = (got[name] - want[name]).norm() / want[name].norm().clamp_min(1e-12)
        assert error < 1e-3, (name, float(error))


@pytest.mark.parametrize("gpaco,prior", [(False, True), (True, True), (False, False)])
def test_paco_step_is_the_official_one(gpaco, prior, make_cfg):
    overrides = {"method_kwargs.gpaco": gpaco, "method_kwargs.log_prior": prior}
    model, batch = build(make_cfg, "paco", 2, **overrides)
    # the official start: keys normalised over the queue, random labels, all in the loss
    torch.testing.assert_close(model.queue.keys.norm(dim=0), torch.ones(16))
    assert (model.queue.labels >= 0).all()
    official = copy.deepcopy(model)
    queue, queue_labels = model.queue.keys.clone(), model.queue.labels.clone()
    seen, momentum_calls = [], []
    terms = model.paco_terms
    model.paco_terms = lambda *a: seen.append(terms(*a)) or seen[-1]
    model.momentum_backbone.register_forward_hook(lambda *a: momentum_calls.append(1))
    model.training_step(batch, 0).backward()
    ((loss, _),) = seen
    # GPaCo computes no momentum branch, nor an EMA update after the step
    assert (momentum_calls == [] and model.momentum_pairs == []) == gpaco

    _, (im_q, im_k), y = batch
    feat_q = official.backbone(im_q)
    q = F.normalize(official.projector(feat_q), dim=1)
    if gpaco:  # one encoder, both views anchors with their logits
        feat_k = official.backbone(im_k)
        k = F.normalize(official.projector(feat_k), dim=1)
        logits, anchors = official.head(torch.cat([feat_q, feat_k])), 2 * B
    else:
        with torch.no_grad():
            k = F.normalize(official.momentum_projector(official.momentum_backbone(im_k)), dim=1)
        logits, anchors = official.head(feat_q), B
    features = torch.cat([q, k, queue])
    labels = torch.cat([y, y, queue_labels])
    kw = model.cfg.method_kwargs
    want = official_reference(
        features, labels, logits, anchors=anchors, alpha=kw.alpha, beta=kw.beta,
        gamma=kw.gamma, t=kw.temperature, counts=COUNTS if prior else None,
    )  # fmt: skip
    assert float(loss.detach()) == pytest.approx(float(want), rel=1e-5)
    want.backward()
    assert_same_grads(trained_grads(model), trained_grads(official))
    # the keys that enter the queue after the step: the second view's (detached)
    model.write_queues()
    torch.testing.assert_close(model.queue.keys[:B], k.detach().float(), rtol=1e-3, atol=1e-4)
    assert torch.equal(model.queue.labels[:B], y)


def test_paco_defaults_are_the_official_imagenet_lt_run(make_cfg):
    kw = parse_cfg(make_cfg("paco")).method_kwargs
    defaults = {k: o.default for k, o in METHODS["paco"].METHOD_KWARGS.items()}
    assert (defaults["alpha"], defaults["beta"], defaults["gamma"]) == (0.05, 1.0, 1.0)
    assert (defaults["temperature"], defaults["queue_size"]) == (0.2, 8192)
    assert defaults["log_prior"] is True and defaults["gpaco"] is False
    assert kw.label_smoothing == 0.0


def bcl_official_loss(model, batch):
    """The official train step's loss on a copy of the model: the three views in one forward."""
    _, views, y = batch
    feat = model.backbone(torch.cat(views))
    feat_mlp = F.normalize(model.projector(feat), dim=1)
    logits = model.head(feat)
    centers = F.normalize(model.prototype_projector(model.head.weight.T), dim=1)
    _, f2, f3 = torch.split(feat_mlp, [B, B, B], dim=0)
    features = torch.cat([f2.unsqueeze(1), f3.unsqueeze(1)], dim=1)
    logits, _, __ = torch.split(logits, [B, B, B], dim=0)
    kw = model.cfg.method_kwargs
    scl = balscl_reference(centers, features, y, 4, kw.temperature).mean()
    ce = logit_adjust_reference(logits.double(), y, COUNTS, kw.tau)
    # the host's online classifier on detached features, as solo-learn trains it on every crop
    online = F.cross_entropy(model.classifier(feat.detach()), y.repeat(3))
    return kw.alpha * ce + kw.beta * scl, online


def test_bcl_step_is_the_official_one(make_cfg):
    model, batch = build(make_cfg, "bcl", 3)
    official = copy.deepcopy(model)
    loss = model.training_step(batch, 0)
    loss.backward()
    want, online = bcl_official_loss(official, batch)
    assert float(loss) == pytest.approx(float(want) + float(online), rel=1e-5)
    (want + online).backward()
    assert_same_grads(trained_grads(model), trained_grads(official))


def test_bcl_cosine_classifier(make_cfg):
    model, _ = build(make_cfg, "bcl", 3)
    w = model.head.weight  # [features, C], columns started at unit norm
    torch.testing.assert_close(w.norm(dim=0), torch.ones(4))
    x = torch.randn(5, w.size(0))
    want = 30 * (x / x.norm(dim=1, keepdim=True)) @ (w / w.norm(dim=0, keepdim=True))
    torch.testing.assert_close(model.head_logits(x), want)


@pytest.mark.parametrize("method", ["paco", "bcl"])
def test_the_reported_head_in_the_online_metrics_and_metrics_json(method, make_cfg):
    """The head's top-1 and Many / Medium / Few: online (val_head_*) over the validation batches
    and in metrics.json at the end, each equal to the head's predictions counted here."""
    cfg = make_cfg(method, limit_val_batches=1.0, **{"data.many_threshold": 12,
                                                       "data.few_threshold": 8})  # fmt: skip
    result = run(cfg)
    model = result["model"].eval()
    data = parse_cfg(make_cfg(method)).data
    val = build_dataset(data, "val", build_eval_transform("synthetic_lt", 32))
    x = torch.stack([val[i][0] for i in range(len(val))])
    y = torch.tensor([val[i][1] for i in range(len(val))])
    with torch.no_grad():
        pred = model.head_logits(model.backbone(x)).argmax(dim=1)
    counts = val.train_class_counts
    group = ["many" if c > 12 else "few" if c < 8 else "medium" for c in counts]
    expected = {"acc1": 100 * (pred == y).double().mean().item()}
    for g in ("many", "medium", "few"):
        mask = torch.tensor([group[int(c)] == g for c in y])
        expected[f"acc1_{g}"] = 100 * (pred[mask] == y[mask]).double().mean().item()
    saved = json.loads((Path(result["run_dir"]) / "metrics.json").read_text())
    for key, value in expected.items():
        assert result["metrics"][f"val_head_{key}"] == pytest.approx(value, abs=1e-4), key
        assert saved[f"head_{key}"] == pytest.approx(value, abs=1e-4), key


def test_the_leaderboard_reports_the_head_of_a_one_stage_run(make_cfg, tmp_path):
    """metrics.json's head_* in the head columns (its own evaluation); an imagenet_lt run with
    gpaco: true sits beside the published GPaCo row (a CSV log's val_head_acc1 stands in when
    there is no metrics.json, as for solo-learn's main_pretrain.py)."""
    import csv

    from solo_ext.leaderboard import run as leaderboard
    from solo_ext.leaderboard.runs import read_args, read_run

    result = run(make_cfg("paco", **{"method_kwargs.gpaco": True}))
    run_dir = Path(result["run_dir"])
    metrics = json.loads((run_dir / "metrics.json").read_text())
    args = read_args(run_dir)
    found = read_run(run_dir, args, [])
    assert found.evals["head"].acc1 == metrics["head_acc1"] and "linear" not in found.evals
    # without metrics.json: the last validation row of the run's CSV log
    (run_dir / "metrics.json").unlink()
    found = read_run(run_dir, args, [])
    head = found.evals["head"].acc1
    assert head == pytest.approx(result["metrics"]["val_head_acc1"], abs=1e-3)
    # the same run as an imagenet_lt one: compared with the published GPaCo row
    args["data"]["dataset"] = "imagenet_lt"
    (run_dir / "args.json").write_text(json.dumps(args))
    leaderboard([str(run_dir.parent), "--out", str(tmp_path / "board")])
    with open(tmp_path / "board" / "imagenet_lt.csv") as f:
        rows = list(csv.DictReader(f))
    (measured,) = [r for r in rows if r["kind"] == "measured"]
    assert float(measured["head_acc1"]) == pytest.approx(head, abs=1e-3)
    assert measured["linear_acc1"] == "" and measured["compared_with"] == "GPaCo"
    published = {r["label"]: r for r in rows if r["kind"] == "published"}
    for label in ("GPaCo", "PaCo", "BCL"):  # one-stage: the head's number, in its columns
        assert published[label]["head_acc1"] and not published[label]["linear_acc1"], label
    for label in ("KCL", "TSC"):  # two-stage: the offline classifier stage's
        assert published[label]["linear_acc1"] and not published[label]["head_acc1"], label
    assert "| head top-1 |" in (tmp_path / "board" / "imagenet_lt.md").read_text()
