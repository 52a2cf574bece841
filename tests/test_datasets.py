"""Dataset builders on tiny files made here: torchvision's CIFAR format and an ImageFolder."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image
from torchvision import datasets as tvd

from solo_ext.commands.pretrain import run
from solo_ext.config import ConfigError
from solo_ext.data.datasets import build_dataset, fill_data_cfg
from solo_ext.data.transforms import build_eval_transform


def _fake_cifar(root: Path, name: str, n_per_file: int = 6) -> None:
    """CIFAR's python pickles with random pixels (torchvision's layout, checksums skipped)."""
    cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
    folder = root / cls.base_folder
    folder.mkdir(parents=True)
    label_key = "labels" if name == "cifar10" else "fine_labels"
    num_classes = 10 if name == "cifar10" else 100
    rng = np.random.default_rng(0)
    for file_name, _ in cls.train_list + cls.test_list:
        batch = {
            "data": rng.integers(0, 255, (n_per_file, 3072), dtype=np.uint8),
            label_key: [i % num_classes for i in range(n_per_file)],
        }
        with open(folder / file_name, "wb") as f:
            pickle.dump(batch, f)
    meta_key = cls.meta["key"]
    with open(folder / cls.meta["filename"], "wb") as f:
        pickle.dump({meta_key: [f"c{i}" for i in range(10 if name == "cifar10" else 100)]}, f)


@pytest.mark.parametrize("name,num_classes", [("cifar10", 10), ("cifar100", 100)])
def test_cifar(name, num_classes, tmp_path, monkeypatch):
    _fake_cifar(tmp_path, name)
    monkeypatch.setattr(tvd.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(tvd.cifar, "check_integrity", lambda *args, **kwargs: True)
    cfg = OmegaConf.create(
        {"data": {"dataset": name, "train_path": str(tmp_path), "val_path": str(tmp_path)}}
    )
    fill_data_cfg(cfg)
    assert cfg.data.num_classes == num_classes
    train = build_dataset(cfg.data, "train", None)
    val = build_dataset(cfg.data, "val", None)
    n_train = len(tvd.CIFAR10.train_list if name == "cifar10" else tvd.CIFAR100.train_list)
    assert len(train) == 6 * n_train and len(val) == 6
    image, label = train[3]
    assert image.size == (32, 32) and label == 3


def test_cifar_missing_files_is_one_line(tmp_path):
    cfg = OmegaConf.create({"data": {"dataset": "cifar10", "train_path": str(tmp_path)}})
    with pytest.raises(ConfigError, match="no cifar-10-batches-py/ inside; set data.download"):
        fill_data_cfg(cfg)


@pytest.fixture
def image_folder(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("val", 2)):
        for c in range(3):
            folder = tmp_path / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return tmp_path


def test_custom_image_folder_pretrain(image_folder, make_cfg):
    """The online classifier's val_acc1 / val_loss are those of the trained model on the val
    folder's images, recomputed here: the files read in class-folder order, class ``c`` for
    ``class<c>``, both val batches (4 + 2 images) weighted by their size."""
    cfg = make_cfg(
        "scl",
        **{
            "data": {
                "dataset": "custom",
                "train_path": str(image_folder / "train"),
                "val_path": str(image_folder / "val"),
                "num_workers": 0,
            },
            "optimizer.batch_size": 4,
            "limit_val_batches": 2,  # all 6 val images
        },
    )
    cfg.data.num_classes = None  # counted from the class folders
    result = run(cfg)
    args = (Path(result["run_dir"]) / "args.json").read_text()
    assert '"num_classes": 3' in args

    transform = build_eval_transform("custom", 32)
    files = sorted((image_folder / "val").glob("class*/*.png"))
    images = torch.stack([transform(Image.open(f).convert("RGB")) for f in files])
    labels = torch.tensor([int(f.parent.name.removeprefix("class")) for f in files])
    assert labels.tolist() == [0, 0, 1, 1, 2, 2]
    model = result["model"].eval()
    with torch.no_grad():
        logits = model.classifier(model.backbone(images))
    acc1 = 100 * (logits.argmax(dim=1) == labels).double().mean().item()
    loss = torch.nn.functional.cross_entropy(logits, labels).item()
    assert result["metrics"]["val_acc1"] == pytest.approx(acc1, abs=1e-3)
    # the loss also sees the labels when every image gets the same prediction
    assert result["metrics"]["val_loss"] == pytest.approx(loss, rel=1e-4)


def test_two_runs_in_one_process_log_two_wandb_runs(make_cfg, monkeypatch, tmp_path):
    """wandb logs offline; a Hydra multirun trains its jobs in one process: each run ends its
    wandb run, so the next one logs into a run of its own, in its own directory (Lightning's
    WandbLogger would reuse a live one)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb = {"wandb": {"enabled": True, "offline": True, "project": "solo-ext-test"}}
    run_dirs = [Path(run(make_cfg("scl", seed=seed, **wandb))["run_dir"]) for seed in (0, 1)]
    assert run_dirs[0] != run_dirs[1]
    for run_dir in run_dirs:
        (log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
        assert log.name == f"run-{run_dir.name}.wandb"  # the run's own id
