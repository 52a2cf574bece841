"""Dataset builders on tiny files made here: torchvision's CIFAR format and an ImageFolder."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import fake_cifar
from omegaconf import OmegaConf
from PIL import Image
from torchvision import datasets as tvd

from solo_ext import facts
from solo_ext.commands.pretrain import run
from solo_ext.config import ConfigError
from solo_ext.data.datasets import build_dataset, fill_data_cfg
from solo_ext.data.transforms import build_eval_transform


def cifar_folder(root: Path, monkeypatch, name: str, counts: list[int], head: int = 0) -> str:
    """conftest's CIFAR files (``counts[c]`` training images of class c, 2 test images a class),
    torchvision's checksums skipped; ``head``: ``<name>_lt``'s full class size cut to it."""
    fake_cifar(root, name, counts)
    monkeypatch.setattr(tvd.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(tvd.cifar, "check_integrity", lambda *args, **kwargs: True)
    if head:
        tiny = dataclasses.replace(facts.DATASETS[f"{name}_lt"], images_per_class=head)
        monkeypatch.setitem(facts.DATASETS, f"{name}_lt", tiny)
    return str(root)


def ldam_reference(targets, num_classes, n_max, imbalance_factor, seed=0) -> list[int]:
    """LDAM-DRW's IMBALANCECIFAR selection, re-derived: numpy's global seed, then per class in
    order a shuffle of its indices and the first floor(n_max * (1 / IF) ** (c / (C - 1)))."""
    np.random.seed(seed)
    targets = np.array(targets)
    kept = []
    for c in range(num_classes):
        n = int(n_max * (1 / imbalance_factor) ** (c / (num_classes - 1.0)))
        idx = np.where(targets == c)[0]
        np.random.shuffle(idx)
        kept.extend(idx[:n].tolist())
    return kept


@pytest.mark.parametrize("name,num_classes", [("cifar10", 10), ("cifar100", 100)])
def test_cifar(name, num_classes, tmp_path, monkeypatch):
    root = cifar_folder(tmp_path, monkeypatch, name, [2] * num_classes)
    cfg = OmegaConf.create({"data": {"dataset": name, "train_path": root, "val_path": root}})
    fill_data_cfg(cfg)
    assert cfg.data.num_classes == num_classes
    train = build_dataset(cfg.data, "train", None)
    val = build_dataset(cfg.data, "val", None)
    assert len(train) == len(val) == 2 * num_classes
    image, label = train[3]
    assert image.size == (32, 32) and label == 1


def test_cifar_missing_files_is_one_line(tmp_path):
    cfg = OmegaConf.create({"data": {"dataset": "cifar10", "train_path": str(tmp_path)}})
    with pytest.raises(ConfigError, match="no cifar-10-batches-py/ inside; set data.download"):
        fill_data_cfg(cfg)


def write_images(root: Path, per_class: dict[str, int] | list[int], size: int = 8) -> list:
    """Class folders of random PNG files (lossless): ``per_class[name]`` in folder ``name`` (a
    list: folders ``class<c>``); returns the pixels in the order ImageFolder lists them."""
    if isinstance(per_class, list):
        per_class = {f"class{c}": n for c, n in enumerate(per_class)}
    rng = np.random.default_rng(0)
    pixels = []
    for name, n in sorted(per_class.items()):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            pixels.append(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
            Image.fromarray(pixels[-1]).save(root / name / f"{i:03d}.png")
    return pixels


@pytest.fixture
def image_folder(tmp_path) -> Path:
    write_images(tmp_path / "train", [6, 6, 6], size=40)
    write_images(tmp_path / "val", [2, 2, 2], size=40)
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
