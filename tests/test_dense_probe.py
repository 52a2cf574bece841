"""Per-pixel labels of synthetic_lt, the segmentation metrics, and the dense probe end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import eval_cfg, tiny_cfg
from omegaconf import OmegaConf

from solo_ext.commands import dense_probe
from solo_ext.commands.pretrain import run
from solo_ext.config import ConfigError
from solo_ext.data.synthetic import PART_CLASSES, SHAPES, SyntheticLT
from solo_ext.eval.segmentation import confusion, segmentation_report


def test_label_maps_name_the_parts_of_each_class():
    data = SyntheticLT("val", num_classes=6, val_per_class=5)
    assert data.label_maps.shape == data.data.shape[:3]
    for i in range(len(data)):
        recipe = data.recipes[data.targets[i]]
        present = set(np.unique(data.label_maps[i]).tolist())
        main = 1 + SHAPES.index(recipe.shape)
        assert present <= {0, main, 1 + len(SHAPES) + SHAPES.index(recipe.shape2)}
        assert 0 in present and main in present  # background and the main object are visible
    assert (data.label_maps == 0).mean() > 0.5  # objects cover less than half of the image


def test_segmentation_report_by_hand():
    target = torch.tensor([[0, 0, 1, 1], [2, 2, 2, 0]])
    pred = torch.tensor([[0, 1, 1, 1], [2, 2, 0, 0]])
    report = segmentation_report(confusion(pred, target, num_classes=4))
    # IoU: class 0: tp 2, fp 1, fn 1 -> 2/4; class 1: 2/3; class 2: 2/3; class 3 absent
    assert report["miou"] == pytest.approx(100 * (1 / 2 + 2 / 3 + 2 / 3) / 3)
    assert report["pixel_acc"] == pytest.approx(100 * 6 / 8)
    assert report["num_seg_classes"] == 3


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    cfg = tiny_cfg(
        "densecl",
        tmp_path_factory.mktemp("dense"),
        **{
            "backbone.name": "cifar_resnet32",
            "method_kwargs.warmup_steps": 0,
            "data.synthetic.n_max": 40,
            "limit_train_batches": 4,
        },
    )
    return Path(run(cfg)["run_dir"])


def test_dense_probe_beats_predicting_background(trained_run):
    metrics = dense_probe.run(
        eval_cfg("dense_probe", trained_run, max_epochs=15, **{"+enable_progress_bar": False})
    )
    val = SyntheticLT("val", num_classes=4, n_max=40, imbalance_factor=4, val_per_class=4)
    labels = torch.as_tensor(val.label_maps)
    background_only = segmentation_report(
        confusion(torch.zeros_like(labels), labels, len(PART_CLASSES))
    )
    assert metrics["dense_map_size"] == [8, 8]
    assert metrics["dense_miou"] > background_only["miou"] + 5
    saved = json.loads((trained_run / "metrics.json").read_text())
    assert saved["dense_miou"] == metrics["dense_miou"]
    png = (trained_run / "dense_predictions.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_dense_probe_needs_label_maps(tmp_path, monkeypatch):
    def fake_load(cfg):
        return None, OmegaConf.create({"data": {"dataset": "cifar10"}}), tmp_path

    monkeypatch.setattr(dense_probe, "load_for_eval", fake_load)
    with pytest.raises(ConfigError, match="data.dataset='cifar10': the dense probe needs"):
        dense_probe.run(eval_cfg("dense_probe", tmp_path))
