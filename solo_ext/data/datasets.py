"""Datasets by name (``data.dataset``): checks before any work, builders for train and val."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig
from torch.utils.data import Dataset
from torchvision import datasets as tvd

from solo_ext.config import ConfigError, check_choice, check_range, fill_section
from solo_ext.host import omegaconf_select

DATASETS = ("cifar10", "cifar100", "custom", "synthetic_lt")
NUM_CLASSES = {"cifar10": 10, "cifar100": 100}
SYNTHETIC_DEFAULTS = {"n_max": 200, "val_per_class": 20, "image_size": 32, "seed": 0}
_CIFAR_DIRS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}


def _class_folders(path: str) -> list[str]:
    return sorted(e.name for e in os.scandir(path) if e.is_dir())


def check_data_cfg(cfg: DictConfig, need_val: bool = True) -> DictConfig:
    """Fills ``data`` defaults and checks dataset, paths and ``num_classes`` before any work."""
    data = cfg.data
    check_choice("data.dataset", data.get("dataset"), DATASETS)
    data.train_path = omegaconf_select(cfg, "data.train_path", None)
    data.val_path = omegaconf_select(cfg, "data.val_path", None)
    data.format = omegaconf_select(cfg, "data.format", "image_folder")
    data.num_workers = omegaconf_select(cfg, "data.num_workers", 4)
    data.no_labels = omegaconf_select(cfg, "data.no_labels", False)
    data.fraction = omegaconf_select(cfg, "data.fraction", -1)
    data.download = omegaconf_select(cfg, "data.download", False)
    check_choice("data.format", data.format, ("image_folder",))
    if data.fraction not in (-1, 1, 1.0):
        raise ConfigError(
            f"data.fraction={data.fraction!r}: solo-ext-pretrain trains on whole "
            "datasets; make a subset with a custom ImageFolder instead"
        )
    dataset = data.dataset
    if dataset == "synthetic_lt":
        data.num_classes = omegaconf_select(cfg, "data.num_classes", 20)
        data.imbalance_factor = omegaconf_select(cfg, "data.imbalance_factor", 10.0)
        fill_section(cfg, "data.synthetic", SYNTHETIC_DEFAULTS)
        check_range("data.imbalance_factor", data.imbalance_factor, 1)
        check_range("data.num_classes", data.num_classes, 2)
        return cfg
    paths = [("data.train_path", data.train_path)]
    if need_val and data.val_path is not None:
        paths.append(("data.val_path", data.val_path))
    for key, path in paths:
        if path is None:
            raise ConfigError(f"{key} is missing from the config (data.dataset={dataset!r})")
        if dataset in _CIFAR_DIRS and data.download:
            continue
        if not os.path.isdir(path):
            raise ConfigError(f"{key}={path!r}: no such directory")
        if dataset in _CIFAR_DIRS and not os.path.isdir(os.path.join(path, _CIFAR_DIRS[dataset])):
            raise ConfigError(
                f"{key}={path!r}: no {_CIFAR_DIRS[dataset]}/ inside; set "
                "data.download=true to let torchvision download it"
            )
    if dataset in NUM_CLASSES:
        expected = NUM_CLASSES[dataset]
    else:
        expected = len(_class_folders(data.train_path))
        if expected == 0:
            raise ConfigError(f"data.train_path={data.train_path!r}: no class folders")
    given = omegaconf_select(cfg, "data.num_classes", None)
    if given is not None and given != expected:
        raise ConfigError(f"data.num_classes={given}: the data has {expected} classes")
    data.num_classes = expected
    return cfg


def build_dataset(data: DictConfig, split: str, transform: Callable | None) -> Dataset[Any]:
    """The ``split`` ("train" or "val") of ``data.dataset``, returning (image, label) pairs."""
    path = data.train_path if split == "train" else data.val_path
    if data.dataset == "synthetic_lt":
        from solo_ext.data.synthetic import SyntheticLT

        s = data.synthetic
        return SyntheticLT(
            split,
            num_classes=data.num_classes,
            n_max=s.n_max,
            imbalance_factor=data.imbalance_factor,
            val_per_class=s.val_per_class,
            image_size=s.image_size,
            seed=s.seed,
            transform=transform,
        )
    if data.dataset in ("cifar10", "cifar100"):
        cls = tvd.CIFAR10 if data.dataset == "cifar10" else tvd.CIFAR100
        return cls(path, train=split == "train", transform=transform, download=data.download)
    return tvd.ImageFolder(path, transform=transform)


class IndexedNCrop(Dataset):
    """Wraps a dataset whose transform returns a list of views: items ``(index, views, label)``,
    solo-learn's pretraining batch format."""

    def __init__(self, dataset: Dataset, no_labels: bool = False):
        self.dataset = dataset
        self.no_labels = no_labels

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        views, label = self.dataset[index]
        return index, views, -1 if self.no_labels else label
