"""Long-tailed dataset builders: the kept images, split files, custom_lt and solo-ext-make-lt."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from test_datasets import cifar_folder, ldam_reference, write_images

from solo_ext.commands import make_lt
from solo_ext.config import ConfigError
from solo_ext.data import datasets as ds
from solo_ext.data.longtail import lt_counts
from solo_ext.data.lt_datasets import lt_indices, read_split_file, subsample_lt


def data_cfg(**data):
    return ds.fill_data_cfg(OmegaConf.create({"data": data})).data


def _balanced_targets(num_classes: int, per_class: int, seed: int = 1) -> list[int]:
    targets = np.repeat(np.arange(num_classes), per_class)
    np.random.default_rng(seed).shuffle(targets)  # CIFAR's classes are interleaved
    return targets.tolist()


@pytest.mark.parametrize("num_classes,n_max", [(10, 5000), (100, 500)])
@pytest.mark.parametrize("imbalance_factor", [10, 50, 100])
def test_cifar_lt_profile_and_same_images_as_ldam(num_classes, n_max, imbalance_factor):
    targets = _balanced_targets(num_classes, n_max)
    classes = [str(c) for c in range(num_classes)]
    data = subsample_lt(range(len(targets)), targets, classes, n_max, imbalance_factor, seed=0)
    assert data.class_counts == lt_counts(n_max, num_classes, imbalance_factor)
    assert data.train_class_counts == data.class_counts
    assert min(data.class_counts) >= 1
    assert data.indices == ldam_reference(targets, num_classes, n_max, imbalance_factor)
    assert all(targets[i] == t for i, t in zip(data.indices, data.targets))


def test_kept_images_depend_on_seed_only():
    targets = _balanced_targets(5, 50)
    counts = lt_counts(50, 5, 10)
    assert lt_indices(targets, counts, seed=3) == lt_indices(targets, counts, seed=3)
    assert lt_indices(targets, counts, seed=3) != lt_indices(targets, counts, seed=4)


def test_cifar100_lt_builder_end_to_end(tmp_path, monkeypatch):
    root = cifar_folder(tmp_path, monkeypatch, "cifar10", [10] * 10, head=10)  # n_max 10
    data = data_cfg(dataset="cifar10_lt", train_path=root, imbalance_factor=10)
    train = ds.build_dataset(data, "train", None)
    val = ds.build_dataset(data, "val", None)
    assert train.class_counts == lt_counts(10, 10, 10)
    assert val.train_class_counts == train.class_counts and len(val) == 20
    assert train.shot_groups == ["few"] * 10  # at most 10 images per class
    image, label = train[0]
    assert image.size == (32, 32) and label == train.targets[0]


@pytest.fixture
def split_root(tmp_path) -> Path:
    write_images(tmp_path / "train", {"a": 5, "b": 3, "c": 1})
    write_images(tmp_path / "val", {"a": 2, "b": 2, "c": 2})
    for split in ("train", "val"):
        lines = [
            f"{split}/{c}/{f.name} {i}"
            for i, c in enumerate("abc")
            for f in sorted((tmp_path / split / c).iterdir())
        ]
        (tmp_path / f"ImageNet_LT_{'test' if split == 'val' else split}.txt").write_text(
            "\n".join(lines) + "\n"
        )
    return tmp_path


def test_split_file_dataset(split_root):
    data = data_cfg(
        dataset="imagenet_lt",
        train_path=str(split_root),
        num_classes=3,
        many_threshold=4,
        few_threshold=2,
    )
    train = ds.build_dataset(data, "train", None)
    val = ds.build_dataset(data, "val", None)
    assert train.class_counts == [5, 3, 1] and val.class_counts == [2, 2, 2]
    assert val.train_class_counts == [5, 3, 1]
    assert train.shot_groups == ["many", "medium", "few"]
    image, label = val[5]
    assert image.size == (8, 8) and label == 2


@pytest.mark.parametrize(
    "line,message",
    [
        ("train/a/000.png", "expected 'relative/path label'"),
        ("train/a/000.png x", "expected 'relative/path label'"),
        ("train/a/000.png 7", "label 7 not in [0, 2]"),
    ],
)
def test_split_file_errors_name_file_and_line(split_root, line, message):
    path = split_root / "bad.txt"
    path.write_text(f"train/a/001.png 0\n{line}\n")
    with pytest.raises(ConfigError) as info:
        read_split_file(path, split_root, 3, "data.train_split_file")
    assert str(info.value).startswith(f"{path}:2: ") and message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_split_file(split_root):
    with pytest.raises(ConfigError, match=r"data.train_split_file='.*Places_LT_train.txt': no"):
        data_cfg(dataset="places_lt", train_path=str(split_root))


@pytest.fixture
def folder(tmp_path) -> Path:
    write_images(tmp_path / "src" / "train", {"cat": 10, "dog": 12, "eel": 10})
    write_images(tmp_path / "src" / "val", {"cat": 3, "dog": 3, "eel": 3})
    return tmp_path / "src"


def test_custom_lt(folder):
    train, val = str(folder / "train"), str(folder / "val")
    data = data_cfg(dataset="custom_lt", train_path=train, val_path=val, imbalance_factor=5)
    train = ds.build_dataset(data, "train", None)
    assert train.class_counts == lt_counts(10, 3, 5) == [10, 4, 2]  # n_max = smallest class
    assert ds.build_dataset(data, "val", None).train_class_counts == [10, 4, 2]
    data.lt_n_max = 11
    with pytest.raises(ConfigError, match="data.lt_n_max=11: class 'cat' has 10 images"):
        ds.build_dataset(data, "train", None)


def test_make_lt_links_and_counts(folder, tmp_path):
    out = tmp_path / "lt"
    train, val = str(folder / "train"), str(folder / "val")
    argv = ["--dataset", "custom_lt", "--imbalance_factor", "5", "--out", str(out)]
    summary = make_lt.run([*argv, "--train_path", train, "--val_path", val])
    assert summary["train_counts"] == [10, 4, 2] and summary["val_counts"] == [3, 3, 3]
    assert json.loads((out / "counts.json").read_text())["train_counts"] == [10, 4, 2]
    linked = sorted((out / "train").rglob("*.png"))
    assert len(linked) == 16 and all(p.is_symlink() for p in linked)
    assert all(Path(os.readlink(p)).is_file() for p in linked)
    # an ImageFolder of exactly that subset
    assert [len(list(d.iterdir())) for d in sorted((out / "train").iterdir())] == [10, 4, 2]


def test_make_lt_synthetic_writes_png_and_refuses_non_empty_out(tmp_path, capsys):
    out = tmp_path / "syn"
    argv = ["--dataset", "synthetic_lt", "--num_classes", "4", "--imbalance_factor", "4"]
    summary = make_lt.run([*argv, "--out", str(out)])
    assert summary["train_counts"] == lt_counts(200, 4, 4)
    assert len(list((out / "val").rglob("*.png"))) == 4 * 20
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(SystemExit) as exit_info:
        make_lt.run(["--dataset", "synthetic_lt", "--out", str(out)])
    assert exit_info.value.code == 2
    assert "exists and is not empty; nothing was written" in capsys.readouterr().err
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
