"""Contract tests, parametrised over every registered solo-ext method (a new one is covered free).

Each method builds from a tiny config, returns solo-learn's outputs, trains a few steps on the
embedded data, and leaves a checkpoint in solo-learn's layout that the kNN evaluation loads.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import METHOD_NAMES, eval_cfg

from solo_ext import register
from solo_ext.commands import knn
from solo_ext.commands.pretrain import parse_cfg, run
from solo_ext.data.datasets import IndexedNCrop, build_dataset
from solo_ext.data.samplers import build_sampler
from solo_ext.eval.knn_classifier import LongTailKNN
from solo_ext.host import METHODS, BaseMethod
from solo_ext.methods.registry import load


def test_every_method_registered_into_host():
    """Each name maps to solo-ext's class for it; the host's own methods keep theirs."""
    register()
    for name in METHOD_NAMES:
        assert METHODS[name] is load(name) and issubclass(METHODS[name], BaseMethod)
    for name, cls in METHODS.items():
        if name not in METHOD_NAMES:  # no host method replaced by one of solo-ext's
            assert not cls.__module__.startswith("solo_ext.methods"), (name, cls)


BACKBONES = {
    "resnet18": {},
    # dynamic_img_size: pbsd feeds the ViT crops smaller than its img_size
    "vit_tiny": {"img_size": 32, "patch_size": 8, "dynamic_img_size": True},
}


@pytest.mark.parametrize("backbone", sorted(BACKBONES))
@pytest.mark.parametrize("method", METHOD_NAMES)
def test_forward_outputs(method, backbone, make_cfg):
    cfg = parse_cfg(
        make_cfg(method, **{"backbone": {"name": backbone, "kwargs": BACKBONES[backbone]}})
    )
    model = METHODS[method](cfg).eval()
    x = torch.randn(3, 3, 32, 32)
    out = model(x)
    assert out["feats"].shape == (3, model.features_dim)
    assert out["logits"].shape == (3, cfg.data.num_classes)
    z = out["z"]
    assert z.shape == (3, cfg.method_kwargs.proj_output_dim)
    torch.testing.assert_close(z.norm(dim=1), torch.ones(3))
    # the online classifier sees detached features: no gradient reaches the backbone from it
    out["logits"].sum().backward()
    assert all(p.grad is None for p in model.backbone.parameters())


@pytest.mark.parametrize("backbone", sorted(BACKBONES))
@pytest.mark.parametrize("method", METHOD_NAMES)
def test_fit_checkpoint_and_knn(method, backbone, make_cfg, tmp_path, capsys):
    """A step on each backbone, its checkpoint and the kNN of the checkpoint (one step: the
    steps after it are the tests that read them, such as the sampler's and the resume's)."""
    backbone_cfg = {"name": backbone, "kwargs": BACKBONES[backbone]}
    result = run(make_cfg(method, **{"backbone": backbone_cfg, "limit_train_batches": 1}))
    run_dir = Path(result["run_dir"])
    assert run_dir.parent == tmp_path / "trained_models" / method
    ckpts = list(run_dir.glob(f"tiny-{method}-{run_dir.name}-ep=0.ckpt"))
    assert len(ckpts) == 1
    args = json.loads((run_dir / "args.json").read_text())
    assert args["method"] == method and args["backbone"]["name"] == backbone
    state = torch.load(ckpts[0], map_location="cpu", weights_only=False)["state_dict"]
    assert any(k.startswith("backbone.") for k in state)
    assert result["metrics"]["train_class_loss"] > 0

    metrics = knn.run(eval_cfg("knn", run_dir, k=3))
    assert 0 <= metrics["knn_acc1"] <= metrics["knn_acc5"] <= 100
    assert json.loads((run_dir / "metrics.json").read_text())["knn_acc1"] == metrics["knn_acc1"]
    assert "kNN (k=3" in capsys.readouterr().out


@pytest.mark.parametrize("sampler", ["class_balanced", "progressive"])
def test_fit_with_long_tail_sampler(sampler, make_cfg, monkeypatch):
    """The images the training steps get are the sampler's draw for epoch 0, seeded with the
    run's seed (progressive: over the run's epochs)."""
    drawn = []
    original = IndexedNCrop.__getitem__

    def recording(self, index):
        drawn.append(int(index))
        return original(self, index)

    monkeypatch.setattr(IndexedNCrop, "__getitem__", recording)
    cfg = make_cfg("scl", **{"data.sampler": {"name": sampler}, "checkpoint.enabled": False})
    result = run(cfg)
    assert result["metrics"]["train_class_loss"] > 0
    kwargs = {"total_epochs": cfg.max_epochs} if sampler == "progressive" else {}
    targets = build_dataset(cfg.data, "train", None).targets
    order = list(build_sampler(sampler, targets, seed=cfg.seed, **kwargs))
    steps = 2 * cfg.optimizer.batch_size  # limit_train_batches 2
    assert len(drawn) >= steps and drawn[:steps] == order[:steps]


def weighted_knn_hits(
    train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor, k: int
) -> torch.Tensor:
    """Whether each test feature's class is the vote of its k most cosine-similar training
    features, each voting exp(similarity / 0.07) (solo-learn's temperature) for its class."""
    train_x = train_x / train_x.norm(dim=1, keepdim=True)
    hits = []
    for x, y in zip(test_x / test_x.norm(dim=1, keepdim=True), test_y.tolist()):
        sim = train_x @ x
        votes: dict[int, float] = {}
        for i in sim.argsort(descending=True)[:k].tolist():
            label = int(train_y[i])
            votes[label] = votes.get(label, 0.0) + math.exp(float(sim[i]) / 0.07)
        hits.append(max(votes, key=votes.__getitem__) == y)
    return torch.tensor(hits, dtype=torch.float64)


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_online_knn_logs_shot_groups(method, make_cfg, monkeypatch):
    """The logged Many / Medium / Few accuracies are those of the weighted kNN written here
    (cosine, k 3, T 0.07) on the features the online kNN was given (recorded as it gets them),
    grouped by the training images per class with the thresholds given here."""
    fed: dict[str, list] = {"train": [], "val": []}
    original = LongTailKNN.update

    def recording(
        self, train_features=None, train_targets=None, test_features=None, test_targets=None
    ):
        if train_features is not None:
            fed["train"].append((train_features.detach().clone(), train_targets.clone()))
        if test_features is not None:
            fed["val"].append((test_features.detach().clone(), test_targets.clone()))
        return original(self, train_features, train_targets, test_features, test_targets)

    monkeypatch.setattr(LongTailKNN, "update", recording)
    cfg = make_cfg(
        method,
        **{
            "knn_eval": {"enabled": True, "k": 3, "distance_func": "cosine"},
            "data.many_threshold": 20,
            "data.few_threshold": 8,
            "checkpoint.enabled": False,
            "limit_val_batches": 2,
        },
    )
    metrics = run(cfg)["metrics"]
    assert list(cfg.data.train_class_counts) == [24, 15, 9, 6]  # lt_counts(24, 4, 4)
    # many: more than 20 training images, few: fewer than 8, medium: the rest
    groups = {"many": [0], "medium": [1, 2], "few": [3]}
    train_x, train_y = (torch.cat(t) for t in zip(*fed["train"]))
    val_x, val_y = (torch.cat(t) for t in zip(*fed["val"]))
    # every large crop of 2 steps
    assert len(train_y) == 2 * cfg.data.num_large_crops * cfg.optimizer.batch_size
    assert sorted(val_y.tolist()) == [c for c in range(4) for _ in range(4)]  # both val batches
    hits = weighted_knn_hits(train_x, train_y, val_x, val_y, k=3)
    # one online kNN: the overall accuracy is that of the same vote
    assert metrics["val_knn_acc1"] == pytest.approx(100 * hits.mean().item(), abs=1e-3)
    for group, classes in groups.items():
        want = 100 * hits[torch.isin(val_y, torch.tensor(classes))].mean().item()
        assert metrics[f"val_knn_acc1_{group}"] == pytest.approx(want, abs=1e-3), group
