"""``solo-ext-linear``'s classifier stage on a tiny pretraining run: the published stage (DSCL's
``equal_lincls.py``: images through the frozen backbone, its BatchNorm statistics following the
stage, the fc N(0, 0.01), the run's own query view) by default on a long-tailed dataset, the
features path on a balanced one; solo-learn's schedules (``step``, cosine) on both paths;
one-line errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from conftest import RESNET18, eval_cfg, stand_in_checkpoint, tiny_cfg
from omegaconf import OmegaConf

from solo_ext.commands import linear
from solo_ext.commands.linear_stage import train_transform
from solo_ext.commands.pretrain import run as pretrain
from solo_ext.config import ConfigError
from solo_ext.data.datasets import build_dataset
from solo_ext.data.samplers import ClassBalancedSampler
from solo_ext.data.transforms import build_eval_transform
from solo_ext.eval.classifier_stage import (
    BALANCED_STAGE,
    CLASSIFIER_STAGE_OPTIONS,
    LONG_TAIL_STAGE,
    published_stage,
    stage_train_transform,
)
from solo_ext.runs.load import load_run

BATCH, LR = 16, 0.4  # lr per 256 images: 0.025 at this batch
STEP = {"scheduler.name": "step", "scheduler.lr_decay_steps": [2, 3]}


class Recorder(pl.Callback):
    """What the stage saw: the lr at each epoch's start, every input batch, the fc at the start,
    the training loader's transform and sampler, and the module's state at the end."""

    def __init__(self) -> None:
        self.lrs: list[float] = []
        self.inputs: list[torch.Tensor] = []
        self.fc: tuple[torch.Tensor, torch.Tensor] | None = None
        self.loader: Any = None
        self.end_state: dict[str, torch.Tensor] = {}

    def on_train_start(self, trainer, pl_module) -> None:
        self.loader = trainer.train_dataloader
        layer = pl_module.fc if hasattr(pl_module, "fc") else pl_module.head[-1]
        self.fc = (layer.weight.detach().clone(), layer.bias.detach().clone())

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.inputs.append(batch[0].detach().clone())

    def on_train_end(self, trainer, pl_module) -> None:
        self.end_state = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    # ResNet-18: the classifier's 512 inputs (its init's statistics are read off 2048 weights)
    cfg = tiny_cfg("scl", tmp_path_factory.mktemp("stage"), backbone=RESNET18)
    return Path(pretrain(cfg)["run_dir"])


def stage_run(run_dir: Path, **given) -> tuple[dict[str, Any], Recorder]:
    """solo-ext-linear's defaults on ``run_dir``, a batch of 16 (3 steps an epoch), + ``given``."""
    keys = {"optimizer.batch_size": BATCH, "optimizer.lr": LR, "enable_progress_bar": False}
    recorder = Recorder()
    metrics = linear.run(eval_cfg("linear", run_dir, **{**keys, **given}), callbacks=[recorder])
    return metrics, recorder


@pytest.fixture(scope="module")
def published(tiny_run) -> tuple[dict[str, Any], Recorder]:
    """The defaults on synthetic_lt (long-tailed: the published stage), class-balanced, step."""
    return stage_run(tiny_run, max_epochs=4, **STEP, **{"data.sampler.name": "class_balanced"})


@pytest.fixture(scope="module")
def frozen_bn(tiny_run) -> tuple[dict[str, Any], Recorder]:
    """Images through the backbone with its statistics frozen, PyTorch's fc."""
    return stage_run(tiny_run, max_epochs=1, backbone_bn="eval", classifier_init="default")


def bn_buffers(state: dict[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    """The BatchNorm statistics of a state dict (keys under ``prefix``, the prefix cut)."""
    ends = ("running_mean", "running_var", "num_batches_tracked")
    return {
        k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix) and k.endswith(ends)
    }


def test_long_tailed_default_is_the_published_stage(published):
    metrics, recorder = published
    assert metrics["linear_backbone_bn"] == "train"
    assert metrics["linear_train_augmentation"] == "pretrain"
    assert metrics["linear_classifier_init"] == "normal"
    assert metrics["linear_sampler"] == "class_balanced"
    assert isinstance(recorder.loader.sampler, ClassBalancedSampler)
    assert recorder.inputs[0].shape[1:] == (3, 32, 32)  # images, not features
    assert 0 <= metrics["linear_acc1"] <= metrics["linear_acc5"] <= 100


def test_defaults_follow_the_dataset():
    for dataset, want, images in [
        ("synthetic_lt", ("train", "normal", "pretrain"), True),
        ("imagenet_lt", ("train", "normal", "pretrain"), True),
        ("cifar10", ("eval", "default", "solo-learn"), False),
        ("imagenet", ("eval", "default", "solo-learn"), False),
    ]:
        cfg = OmegaConf.create({})
        linear.fill_stage(cfg, OmegaConf.create({"dataset": dataset}))
        assert tuple(cfg[k] for k in CLASSIFIER_STAGE_OPTIONS) == want, dataset
        assert published_stage(cfg) is images, dataset
        # the published stage's schedule on long-tailed data; conf/linear.yaml's otherwise
        schedule = {k: OmegaConf.select(cfg, k) for k in LONG_TAIL_STAGE}
        assert schedule == (LONG_TAIL_STAGE if images else BALANCED_STAGE), dataset
    cfg = OmegaConf.create({"backbone_bn": "eval", "max_epochs": 3})  # given keys are kept
    linear.fill_stage(cfg, OmegaConf.create({"dataset": "synthetic_lt"}))
    assert (cfg.backbone_bn, cfg.train_augmentation) == ("eval", "pretrain")
    assert (cfg.max_epochs, cfg.scheduler.name) == (3, "step")


def made_folder(root: Path, counts: list[int], many: int, few: int) -> Path:
    """An image folder as solo-ext-make-lt writes it: train/ and val/ class folders (empty files:
    nothing here opens an image) and counts.json with the shot groups of ``many`` / ``few``."""
    for split, sizes in (("train", counts), ("val", [2] * len(counts))):
        for c, n in enumerate(sizes):
            folder = root / split / f"{c:03d}"
            folder.mkdir(parents=True)
            for i in range(n):
                (folder / f"{i}.png").touch()
    groups = ["many" if n > many else "few" if n < few else "medium" for n in counts]
    summary = {"train_counts": counts, "shot_groups": groups}
    summary.update(many_threshold=many, few_threshold=few)
    (root / "counts.json").write_text(json.dumps(summary))
    return root


def test_a_folder_made_by_make_lt_is_long_tailed_with_the_files_groups(tmp_path, capsys):
    from solo_ext.data.datasets import fill_data_cfg, is_long_tailed

    counts = [30, 25, 20, 12, 10, 8, 6, 5, 4, 3]  # file's groups at 15 / 5: 2 many, 6 medium, 2 few
    root = made_folder(tmp_path / "lt", counts, many=15, few=5)
    data = {"dataset": "custom", "train_path": str(root / "train"), "val_path": str(root / "val")}
    data = {**data, "bad_images": "off"}
    cfg = fill_data_cfg(OmegaConf.create({"data": data}))
    assert (cfg.data.many_threshold, cfg.data.few_threshold) == (15, 5)  # the file's
    assert is_long_tailed(cfg.data)
    assert capsys.readouterr().out == ""
    stage = OmegaConf.create({})
    linear.fill_stage(stage, cfg.data)
    assert (stage.backbone_bn, stage.scheduler.name) == ("train", "step")
    assert linear.stage_sampler(OmegaConf.create({}), cfg.data) == "class_balanced"
    # thresholds the config sets win, and a run says in one line that they differ from the file's
    cfg = fill_data_cfg(OmegaConf.create({"data": {**data, "many_threshold": 100}}))
    assert (cfg.data.many_threshold, cfg.data.few_threshold) == (100, 5)
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "data.many_threshold=100" in out and "15" in out
    # the same folder without its counts.json: an ordinary balanced-protocol image folder
    (root / "counts.json").unlink()
    cfg = fill_data_cfg(OmegaConf.create({"data": data}))
    assert not is_long_tailed(cfg.data)
    assert (cfg.data.many_threshold, cfg.data.few_threshold) == (100, 20)
    assert linear.stage_sampler(OmegaConf.create({}), cfg.data) is None


def test_bare_linear_on_long_tailed_data_is_the_published_stage(tiny_run):
    """No sampler or schedule given (only the epochs, batch and lr, for time): class-balanced
    sampling and the step schedule of the published stage, recorded as such."""
    metrics, recorder = stage_run(tiny_run, max_epochs=2)
    assert metrics["linear_sampler"] == "class_balanced"
    assert isinstance(recorder.loader.sampler, ClassBalancedSampler)
    lr = LR * BATCH / 256  # (given) scaled by the batch
    assert recorder.lrs == pytest.approx([lr, lr])  # the step schedule: x 0.1 only from epoch 20
    assert (metrics["linear_epochs"], metrics["linear_backbone_bn"]) == (2, "train")


@pytest.mark.parametrize("path", ["images", "features"])
def test_step_schedule_per_epoch(path, published, tiny_run):
    if path == "images":
        _, recorder = published
    else:
        features = {"backbone_bn": "eval", "train_augmentation": "solo-learn"}
        _, recorder = stage_run(tiny_run, max_epochs=4, **STEP, **features)
        assert recorder.inputs[0].dim() == 2  # features
    lr = LR * BATCH / 256
    assert recorder.lrs == pytest.approx([lr, lr, lr / 10, lr / 100], rel=1e-12)


def test_cosine_schedule_stepped_per_epoch(tiny_run):
    """The balanced datasets' default (test_defaults_follow_the_dataset), named here: synthetic_lt
    is long-tailed, whose default is the step schedule."""
    features = {"backbone_bn": "eval", "train_augmentation": "solo-learn"}
    _, recorder = stage_run(
        tiny_run, max_epochs=3, **features, **{"scheduler.name": "warmup_cosine"}
    )
    lr = LR * BATCH / 256
    want = [lr * (1 + math.cos(math.pi * e / 3)) / 2 for e in range(3)]
    assert recorder.lrs == pytest.approx(want, rel=1e-9)


def test_backbone_bn_train_updates_the_statistics_as_train_mode_does(published, tiny_run):
    """The stage's BatchNorm statistics are those of the pretrained backbone run in train mode
    over the very batches the stage saw; its weights stay the pretrained ones."""
    _, recorder = published
    pretrained = load_run(tiny_run)[0]
    before = bn_buffers(pretrained.state_dict())
    after = bn_buffers(recorder.end_state, "backbone.")
    assert before.keys() == after.keys() and before
    assert any(not torch.equal(before[k], after[k]) for k in before if "running" in k)
    assert len(recorder.inputs) == 4 * 3  # 4 epochs of 3 full batches of 16 (54 images)
    replay = load_run(tiny_run)[0].train()
    with torch.no_grad():
        for x in recorder.inputs:
            replay(x)
    want = bn_buffers(replay.state_dict())
    for key in want:
        torch.testing.assert_close(after[key], want[key], rtol=1e-6, atol=1e-7, msg=key)
    weights = {k: v for k, v in pretrained.state_dict().items() if k not in before}
    for key, value in weights.items():
        assert torch.equal(recorder.end_state[f"backbone.{key}"], value), key


def test_test_uses_the_stage_statistics_in_eval_mode(published, tiny_run):
    """The reported accuracy is that of the trained fc on the backbone with the statistics the
    stage left, in eval mode, on the validation split as stored (synthetic_lt: 32 px)."""
    metrics, recorder = published
    backbone, pre, _ = load_run(tiny_run)
    state = recorder.end_state
    backbone.load_state_dict({k[len("backbone.") :]: v for k, v in state.items() if "fc." not in k})
    val = build_dataset(pre.data, "val", build_eval_transform("synthetic_lt"))
    x, y = zip(*(val[i] for i in range(len(val))))
    with torch.no_grad():
        scores = backbone.eval()(torch.stack(x)) @ state["fc.weight"].T + state["fc.bias"]
    hits = (scores.argmax(1) == torch.tensor(y)).double()
    assert metrics["linear_acc1"] == pytest.approx(100 * hits.mean().item(), abs=1e-6)


def test_backbone_bn_eval_keeps_the_statistics(frozen_bn, tiny_run):
    metrics, recorder = frozen_bn
    assert (metrics["linear_backbone_bn"], metrics["linear_classifier_init"]) == ("eval", "default")
    assert metrics["linear_train_augmentation"] == "pretrain"  # images still
    before = bn_buffers(load_run(tiny_run)[0].state_dict())
    after = bn_buffers(recorder.end_state, "backbone.")
    assert before.keys() == after.keys() and before
    for key in before:
        assert torch.equal(before[key], after[key]), key


def test_classifier_init_normal_and_default(published, frozen_bn):
    weight, bias = published[1].fc
    assert weight.shape == (4, 512)  # ResNet-18's 512 features, 4 classes: 2048 weights
    assert abs(weight.std().item() - 0.01) < 0.001 and abs(weight.mean().item()) < 0.001
    assert torch.equal(bias, torch.zeros(4))
    weight, bias = frozen_bn[1].fc  # PyTorch's: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), bias too
    bound = 1 / math.sqrt(512)
    assert weight.abs().max() <= bound and bias.abs().max() <= bound
    assert abs(weight.std().item() - bound / math.sqrt(3)) < 0.1 * bound / math.sqrt(3)
    assert bias.abs().min() > 0


def test_train_augmentation_gives_the_loader_its_transform(published, tiny_run):
    """``pretrain`` (the default): the first crop of the run's own pretraining (its transform as
    pretraining built it); ``published``: the official stage's ImageNet-LT crops at the data's
    size; ``solo-learn``: a random resized crop and a flip."""
    from solo_ext.data.transforms import build_pretrain_transform

    run_cfg = OmegaConf.create(json.loads((tiny_run / "args.json").read_text()))
    (query, _), *_ = build_pretrain_transform("synthetic_lt", run_cfg.augmentations).pipelines
    transform = published[1].loader.dataset.transform
    assert repr(transform) == repr(query)
    fixed = stage_run(tiny_run, max_epochs=1, train_augmentation="published")[1]
    fixed = fixed.loader.dataset.transform
    assert repr(fixed) == repr(stage_train_transform("synthetic_lt", "published"))
    assert repr(fixed) != repr(transform)  # (the run's view is not the official one)
    assert "scale=(0.08, 1.0)" in repr(fixed) and "scale=(0.5, 1.0)" in repr(transform)
    _, recorder = stage_run(tiny_run, max_epochs=1, train_augmentation="solo-learn")
    transform = recorder.loader.dataset.transform
    assert repr(transform) == repr(train_transform("synthetic_lt", "solo-learn"))
    assert "RandomResizedCrop" in repr(transform) and "ColorJitter" not in repr(transform)


def test_a_run_without_its_query_view_stops_in_one_line(tiny_run, tmp_path):
    """``train_augmentation: pretrain`` on a run whose ``args.json`` has no ``augmentations``:
    one line naming the key and the value, before the stage trains."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    args = json.loads((run / "args.json").read_text())
    del args["augmentations"]
    (run / "args.json").write_text(json.dumps(args))
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    with pytest.raises(ConfigError) as info:
        stage_run(run, max_epochs=1)
    message = str(info.value)
    assert message.startswith("train_augmentation='pretrain': ") and "\n" not in message
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before  # nothing written


@pytest.mark.solo_learn
def test_main_linear_takes_a_made_folder_as_long_tailed_with_the_files_groups(tmp_path):
    """The same through solo-learn's main_linear.py (its parse_cfg, through the plugin's patches):
    the published stage, class-balanced sampling and the file's shot groups."""
    from solo.args.linear import parse_cfg as solo_parse_cfg
    from test_configs import compose_config

    root = made_folder(tmp_path / "lt", [30, 25, 20, 12, 10, 8, 6, 5, 4, 3], many=15, few=5)
    ckpt = stand_in_checkpoint(tmp_path)
    overrides = [
        "data.dataset=custom",
        f"data.train_path={root / 'train'}",
        f"data.val_path={root / 'val'}",
        "~data.sampler",
        "~backbone_bn",
        "~classifier_init",
        "~train_augmentation",
        f"pretrained_feature_extractor={ckpt}",
        "accelerator=cpu",
        'devices="1"',
    ]
    cfg = solo_parse_cfg(compose_config("linear", "cifar100-lt/dscl", overrides))
    assert (cfg.data.many_threshold, cfg.data.few_threshold) == (15, 5)
    assert cfg.data.sampler.name == "class_balanced"
    assert (cfg.backbone_bn, cfg.classifier_init, cfg.train_augmentation) == (
        "train",
        "normal",
        "pretrain",
    )
