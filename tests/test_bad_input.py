"""The table of malformed inputs: each fails before any training or writing, with one line that
names the key or file and the value, and leaves the checkpoint directory as it was."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import eval_cfg, tiny_cfg
from PIL import Image

from solo_ext.commands import knn
from solo_ext.commands.pretrain import parse_cfg, run
from solo_ext.config import ConfigError


def _folders(root: Path, classes: dict[str, int], bad: str | None = None) -> str:
    """An ImageFolder with ``classes[name]`` small PNGs per class (``bad``: one garbage file)."""
    for name, n in classes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.new("RGB", (8, 8), (i * 40 % 255, 0, 0)).save(root / name / f"{i}.png")
    if bad:
        (root / bad / "broken.png").write_bytes(b"this is not an image")
    return str(root)


def _custom(root: Path, **kw) -> dict:
    train = _folders(root / "train", {"a": 2, "b": 2}, **kw)
    return {"data.dataset": "custom", "data.train_path": train, "data.num_classes": 2}


def _split_file(root: Path) -> dict:
    (root / "ImageNet_LT_train.txt").write_text("train/a/0.jpg 0\nthis line is wrong\n")
    (root / "ImageNet_LT_test.txt").write_text("val/a/0.jpg 0\n")
    return {"data.dataset": "imagenet_lt", "data.train_path": str(root)}


def _checkpoint(root: Path, kind: str) -> dict:
    """A bad file for ``resume_from_checkpoint``: truncated, not a checkpoint, weights only, or
    a training checkpoint of other weights."""
    import torch

    path = root / f"{kind}.ckpt"
    state = {"state_dict": {"backbone.conv1.weight": torch.zeros(2, 3, 1, 1)}}
    training = {**state, "loops": {}, "optimizer_states": [], "epoch": 0}
    if kind == "text":
        path.write_text("not a checkpoint")
    else:
        torch.save(state if kind == "weights" else training, path)
    if kind == "truncated":
        path.write_bytes(path.read_bytes()[:-100])
    return {"resume_from_checkpoint": str(path)}


def _resume_case(kind: str, text: str) -> tuple:
    return (f"resume from {kind}", "scl", lambda root: _checkpoint(root, kind), text)


VIT = {"name": "vit_tiny", "kwargs": {"img_size": 32, "patch_size": 8}}

# (id, method, overrides or a function of a scratch directory giving them, expected text)
CASES = [
    ("unknown method", "scl", {"method": "simclr_typo"}, "method='simclr_typo'"),
    ("unknown backbone", "scl", {"backbone.name": "resnet7"}, "backbone.name='resnet7'"),
    ("unknown dataset", "scl", {"data.dataset": "imagenet_typo"}, "data.dataset='imagenet_typo'"),
    ("unknown sampler", "scl", {"data.sampler": {"name": "sqr"}}, "data.sampler.name='sqr'"),
    ("unknown optimizer", "scl", {"optimizer.name": "sgdd"}, "optimizer.name='sgdd'"),
    ("alpha above 1", "dscl", {"method_kwargs.alpha": 1.5}, "method_kwargs.alpha=1.5"),
    ("negative beta", "dscl", {"method_kwargs.beta": -2.0}, "method_kwargs.beta=-2.0"),
    ("zero temperature", "scl", {"method_kwargs.temperature": 0.0}, "temperature=0.0"),
    ("negative temperature", "densecl", {"method_kwargs.temperature": -0.2}, "temperature=-0.2"),
    ("queue below batch", "scl", {"method_kwargs.queue_size": 4}, "queue_size=4: smaller"),
    ("k above support set", "all4one_ct", {"method_kwargs.k": 65}, "method_kwargs.k=65"),
    ("imbalance below 1", "scl", {"data.imbalance_factor": 0.5}, "imbalance_factor=0.5"),
    (
        "empty class folder",
        "scl",
        lambda r: _custom(r) | {"data.train_path": _folders(r / "e", {"a": 2, "b": 0})},
        "class folder 'b' has no image files",
    ),
    ("unreadable image", "scl", lambda r: _custom(r, bad="a"), "unreadable image"),
    ("bad split file line", "scl", _split_file, "this line is wrong"),
    (
        "num_classes mismatch",
        "scl",
        lambda r: _custom(r) | {"data.num_classes": 5},
        "data.num_classes=5: the data has 2 classes",
    ),
    (
        "box scale above 1",
        "pbsd",
        {"method_kwargs.box_scale": [0.1, 1.5]},
        "method_kwargs.box_scale",
    ),
    ("box scale zero", "pbsd", {"method_kwargs.box_scale": [0.0, 0.5]}, "method_kwargs.box_scale"),
    (
        "crop below patch",
        "scl",
        {"backbone": VIT, "augmentations.0.crop_size": 4},
        "augmentations.0.crop_size=4",
    ),
    (
        "missing data path",
        "scl",
        lambda r: {"data.dataset": "custom", "data.train_path": str(r / "nope")},
        "nope",
    ),
    (
        "typo in method_kwargs",
        "dscl",
        {"method_kwargs.temprature": 0.1},
        "did you mean 'temperature'",
    ),
    ("typo in data.synthetic", "scl", {"data.synthetic.nmax": 5}, "data.synthetic.nmax=5"),
    ("lt_n_max of generated data", "scl", {"data.lt_n_max": 24}, "data.lt_n_max=24: data.dataset"),
    ("unknown schedule", "scl", {"scheduler.name": "cosine_typo"}, "scheduler.name='cosine_typo'"),
    (
        "typo in data.sampler",
        "scl",
        {"data.sampler": {"name": "sqrt", "pwer": 1}},
        "data.sampler.pwer=1",
    ),
    (
        "missing resume checkpoint",
        "scl",
        {"resume_from_checkpoint": "/nope/x.ckpt"},
        "resume_from_checkpoint='/nope/x.ckpt'",
    ),
    _resume_case("truncated", "truncated.ckpt': not a readable checkpoint"),
    _resume_case("text", "text.ckpt': not a readable checkpoint"),
    _resume_case("weights", "weights.ckpt': not a training checkpoint"),
    _resume_case("other", "other.ckpt': does not fit method='scl' ("),
    ("auto_resume hours", "scl", {"auto_resume.max_hours": 0}, "auto_resume.max_hours=0"),
    ("bad_images mode", "scl", {"data.bad_images": "ignore"}, "data.bad_images='ignore'"),
    ("heads not dividing", "all4one_ct", {"method_kwargs.num_heads": 3}, "num_heads=3"),
    ("positions too few", "all4one_ct", {"method_kwargs.pos_len": 3}, "method_kwargs.pos_len=3"),
    ("one large crop for bcl", "bcl", {"augmentations.0.num_crops": 2}, "data.num_large_crops=2"),
    ("paco smoothing", "paco", {"method_kwargs.label_smoothing": 0.1}, "label_smoothing=0.1"),
    ("kcl's key for tsc", "tsc", {"method_kwargs.k_pos": 6}, "method_kwargs.k_pos"),
    ("densecl lambda", "densecl", {"method_kwargs.lambda": 2.0}, "method_kwargs.lambda=2.0"),
]


def _listing(root: Path) -> dict[str, bytes | None]:
    """Every file (with its bytes) and every directory under ``root``."""
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in root.rglob("*")
    }


def test_the_table_is_long_enough():
    assert len(CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_first_in_one_line(case, tmp_path):
    _, method, overrides, text = case
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    if callable(overrides):
        overrides = overrides(scratch)
    ckpt_dir = tmp_path / "trained_models"
    (ckpt_dir / method).mkdir(parents=True)
    (ckpt_dir / method / "earlier-run.txt").write_text("earlier work")
    before = _listing(ckpt_dir)
    cfg = tiny_cfg(method, tmp_path, **overrides)
    with pytest.raises(ConfigError) as info:
        run(cfg)
    message = str(info.value)
    assert text in message, message
    assert "\n" not in message
    assert _listing(ckpt_dir) == before  # nothing written, nothing lost


def test_skip_mode_leaves_unreadable_images_out(tmp_path, capsys):
    overrides = _custom(tmp_path, bad="a") | {
        "data.bad_images": "skip",
        "checkpoint.enabled": False,
        "limit_train_batches": 1,
        "limit_val_batches": 0,
        "optimizer.batch_size": 2,
        "method_kwargs.queue_size": 8,
    }
    run(tiny_cfg("scl", tmp_path, **overrides))
    assert "skipped 1 unreadable image(s)" in capsys.readouterr().out


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eval")
    cfg = tiny_cfg("scl", root, limit_train_batches=1, limit_val_batches=0)
    return Path(run(cfg)["run_dir"])


@pytest.mark.parametrize(
    "given,text",
    [
        ({"backbone.name": "resnet50"}, "backbone.name='resnet50': the checkpoint"),
        ({"method": "dscl"}, "method='dscl': the checkpoint"),
        ({}, None),  # the run's checkpoint truncated
    ],
)
def test_evaluation_refuses_a_checkpoint_it_cannot_read(trained_run, tmp_path, given, text):
    """Of another kind than the config names, or truncated: one line, the run left as it was."""
    run_dir = tmp_path / trained_run.name
    shutil.copytree(trained_run, run_dir)
    (ckpt,) = run_dir.glob("*.ckpt")
    if text is None:
        ckpt.write_bytes(ckpt.read_bytes()[:4096])
        text = f"pretrained_checkpoint_dir={str(ckpt)!r}: not a readable checkpoint"
    before = _listing(run_dir)
    with pytest.raises(ConfigError) as info:
        knn.run(eval_cfg("knn", run_dir, **given))
    assert str(info.value).startswith(text) and "\n" not in str(info.value), str(info.value)
    assert _listing(run_dir) == before


def test_unknown_top_level_key_warns(make_cfg):
    with pytest.warns(
        UserWarning, match="'max_epoch' is not used by solo-ext .did you mean 'max_epochs'"
    ):
        parse_cfg(make_cfg("scl", max_epoch=3))
