"""Datasets by name (``data.dataset``): checks before any work, builders for train and val."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf
from PIL import Image
from torch.utils.data import Dataset
from torchvision import datasets as tvd
from torchvision.datasets.folder import IMG_EXTENSIONS

import solo_ext.facts as F
from solo_ext.config import (
    ConfigError,
    Option,
    check_choice,
    check_options,
    fill_options,
    select,
)
from solo_ext.data import lt_datasets as lt
from solo_ext.data.options import DATA_KEYS, DATA_OPTIONS, LT_OPTIONS, SYNTHETIC_OPTIONS
from solo_ext.data.synthetic import check_synthetic

# the torchvision class of each dataset whose images torchvision reads (by its solo-learn name)
TORCHVISION = {"cifar10": tvd.CIFAR10, "cifar100": tvd.CIFAR100}
LONG_TAILED = F.LONG_TAILED
DATASETS = tuple(F.DATASETS)


def _class_folders(path: str) -> list[str]:
    return sorted(e.name for e in os.scandir(path) if e.is_dir())


def _check_class_folders(key: str, path: str) -> None:
    """Every class folder holds at least one image file (torchvision would stop later)."""
    for name in _class_folders(path):
        folder = os.path.join(path, name)
        if not any(
            f.is_file() and f.name.lower().endswith(IMG_EXTENSIONS) for f in os.scandir(folder)
        ):
            raise ConfigError(f"{key}={path!r}: class folder {name!r} has no image files")


def _image_folder(path: str, mode: str, key: str, transform: Callable | None = None):
    """torchvision's ImageFolder, with the files PIL cannot open handled as ``mode`` says."""
    folder = tvd.ImageFolder(path, transform=transform)
    if mode == "off":
        return folder
    readable = []
    for sample in folder.samples:
        try:
            with Image.open(sample[0]) as img:
                img.size  # noqa: B018  (the header is parsed)
        except (OSError, SyntaxError) as err:
            if mode == "error":
                raise ConfigError(
                    f"{key}={path!r}: unreadable image {sample[0]!r} ({type(err).__name__}); "
                    "set data.bad_images=skip to leave such files out"
                ) from None
            continue
        readable.append(sample)
    skipped = len(folder.samples) - len(readable)
    if skipped:
        print(f"{key}={path!r}: skipped {skipped} unreadable image(s) (data.bad_images=skip)")
        folder.samples = folder.imgs = readable
        folder.targets = [t for _, t in readable]
    return folder


def _torchvision(dataset: str) -> Any:
    """The torchvision dataset class of a dataset whose files torchvision reads, else None."""
    f = F.facts(dataset)
    if f.source == "idx":
        from solo_ext.data.idx import FashionMNISTFolder

        return FashionMNISTFolder
    return TORCHVISION[f.solo_name] if f.source == "torchvision" else None


def lt_head(data: DictConfig) -> int:
    """The head class's images of a long-tailed profile cut from a dataset of fixed size
    (CIFAR, Fashion-MNIST): ``data.lt_n_max``, else every image of a class."""
    return data.get("lt_n_max") or F.facts(data.dataset).images_per_class


def _check_dir(key: str, path: str | None, dataset: str) -> None:
    if path is None:
        raise ConfigError(f"{key} is missing from the config (data.dataset={dataset!r})")
    if not os.path.isdir(path):
        raise ConfigError(f"{key}={path!r}: no such directory")


def _split_file(data: DictConfig, key: str) -> str:
    path = data[key]
    return path if os.path.isabs(path) else os.path.join(data.train_path, path)


def fill_data_cfg(cfg: DictConfig) -> DictConfig:
    """Fills ``data`` defaults and checks dataset, paths, split files and ``num_classes``
    before any work; every error is one line naming the key and the value."""
    data = cfg.data
    check_choice("data.dataset", data.get("dataset"), DATASETS)
    dataset = data.dataset
    check_options(cfg, DATA_KEYS)
    thresholds_given = {
        key: select(cfg, f"data.{key}") for key in ("many_threshold", "few_threshold")
    }
    filled = {"train_path": None, "val_path": None, **DATA_OPTIONS}
    if dataset in LONG_TAILED:
        filled.update(LT_OPTIONS)
    for key, value in filled.items():
        default = value.default if isinstance(value, Option) else value
        data[key] = select(cfg, f"data.{key}", default)
    if dataset in LONG_TAILED and data.imbalance_factor is None:
        data.imbalance_factor = F.facts(dataset).default_imbalance
    per_class = F.facts(dataset).images_per_class
    if dataset in LONG_TAILED and per_class and (data.lt_n_max or 0) > per_class:
        raise ConfigError(
            f"data.lt_n_max={data.lt_n_max}: data.dataset={dataset!r} has {per_class} training "
            "images a class"
        )
    if dataset in LONG_TAILED and not per_class and data.lt_n_max is not None:
        raise ConfigError(  # (a generated set: it would be left unread)
            f"data.lt_n_max={data.lt_n_max}: data.dataset={dataset!r} is generated; its head "
            "class is data.synthetic.n_max"
        )
    check_choice("data.format", data.format, DATA_OPTIONS["format"].choices)
    if data.format == "dali":
        from solo_ext.data.dali import check_dali

        check_dali(cfg)
    if data.fraction not in (-1, 1, 1.0):
        raise ConfigError(
            f"data.fraction={data.fraction!r}: solo-ext trains on whole datasets; "
            "make a subset with solo-ext-make-lt or a custom ImageFolder instead"
        )
    if F.facts(dataset).counts_file:
        thresholds_of_counts_file(data, thresholds_given)
    if data.few_threshold > data.many_threshold:
        raise ConfigError(
            f"data.few_threshold={data.few_threshold}: above "
            f"data.many_threshold={data.many_threshold}"
        )

    f = F.facts(dataset)
    if f.source == "generated":
        expected = select(cfg, "data.num_classes", f.default_classes)
        fill_options(cfg, SYNTHETIC_OPTIONS, "data.synthetic")
        check_synthetic(expected, data.synthetic.n_max, data.imbalance_factor)
    elif f.source == "torchvision":
        expected = f.classes
        data.val_path = data.val_path or data.train_path  # torchvision keeps both splits
        if data.train_path is None:
            raise ConfigError(
                f"data.train_path is missing from the config (data.dataset={dataset!r})"
            )
        for key in ("train_path", "val_path"):
            if data.download:
                continue
            _check_dir(f"data.{key}", data[key], dataset)
            if not os.path.isdir(os.path.join(data[key], f.archive_dir)):
                raise ConfigError(
                    f"data.{key}={data[key]!r}: no {f.archive_dir}/ inside; "
                    "set data.download=true to let torchvision download it"
                )
    elif f.source == "idx":
        expected = f.classes
        data.val_path = data.val_path or data.train_path  # the four files hold both splits
        _check_dir("data.train_path", data.train_path, dataset)
        if not data.download:
            from solo_ext.data.idx import check_idx_folder

            for key in dict.fromkeys(("train_path", "val_path")):
                _check_dir(f"data.{key}", data[key], dataset)
                check_idx_folder(data[key], f"data.{key}")
    elif f.source == "split_files":
        train_file, val_file = f.split_files
        expected = select(cfg, "data.num_classes", f.classes)
        _check_dir("data.train_path", data.train_path, dataset)
        data.val_path = data.val_path or data.train_path
        data.train_split_file = select(cfg, "data.train_split_file", train_file)
        data.val_split_file = select(cfg, "data.val_split_file", val_file)
        for key in ("train_split_file", "val_split_file"):
            lt.read_split_file(_split_file(data, key), data.train_path, expected, f"data.{key}")
    else:  # custom, custom_lt, imagenet100, imagenet: ImageFolders
        _check_dir("data.train_path", data.train_path, dataset)
        if data.val_path is not None:
            _check_dir("data.val_path", data.val_path, dataset)
        expected = len(_class_folders(data.train_path))
        if expected == 0:
            raise ConfigError(f"data.train_path={data.train_path!r}: no class folders")
        fixed = f.classes  # (solo-learn's ImageNet folders have a fixed number)
        if fixed is not None and expected != fixed:
            raise ConfigError(
                f"data.train_path={data.train_path!r}: {expected} class folders, "
                f"data.dataset={dataset!r} has {fixed}"
            )
        for key in ("train_path", "val_path"):
            if data[key] is not None:
                _check_class_folders(f"data.{key}", data[key])
    given = select(cfg, "data.num_classes", None)
    if given is not None and given != expected:
        raise ConfigError(f"data.num_classes={given}: the data has {expected} classes")
    data.num_classes = expected
    return cfg


def build_dataset(data: DictConfig, split: str, transform: Callable | None) -> Dataset[Any]:
    """The ``split`` ("train" or "val") of ``data.dataset``, returning (image, label) pairs.

    Long-tailed datasets also carry ``targets``, ``train_class_counts`` and ``shot_groups``.
    """
    dataset = data.dataset
    path = data.train_path if split == "train" else data.val_path
    thresholds = {"many_threshold": data.many_threshold, "few_threshold": data.few_threshold}
    f = F.facts(dataset)
    if f.source == "generated":
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
            **thresholds,
        )
    if f.source == "split_files":
        return lt.split_file_dataset(
            _split_file(data, "train_split_file"),
            _split_file(data, "val_split_file"),
            data.train_path,
            data.val_path,
            split,
            data.num_classes,
            transform=transform,
            **thresholds,
        )
    if f.source in ("torchvision", "idx"):
        base = _torchvision(dataset)(
            path,
            train=split == "train",
            transform=transform if not f.long_tailed else None,
            download=data.download,
        )
        if not f.long_tailed:
            return base
        targets = [int(t) for t in base.targets]
        return _long_tailed(data, split, base, targets, base.classes, lt_head(data), transform)
    key = "data.train_path" if split == "train" else "data.val_path"
    if f.long_tailed:  # an image folder cut to a long-tailed profile
        base = _image_folder(path, data.bad_images, key)
        n_max = data.lt_n_max
        if n_max is None:  # the largest profile every class of the source can fill
            train_targets = (
                base.targets
                if split == "train"
                else _image_folder(data.train_path, data.bad_images, "data.train_path").targets
            )
            n_max = min(train_targets.count(c) for c in range(data.num_classes))
        return _long_tailed(data, split, base, base.targets, base.classes, n_max, transform)
    return _image_folder(path, data.bad_images, key, transform)


def _long_tailed(
    data: DictConfig,
    split: str,
    base: Dataset,
    targets: list[int],
    classes: list[str],
    n_max: int,
    transform: Callable | None,
) -> Dataset:
    thresholds = {"many_threshold": data.many_threshold, "few_threshold": data.few_threshold}
    if split == "train":
        return lt.subsample_lt(
            base,
            targets,
            classes,
            n_max,
            data.imbalance_factor,
            data.lt_seed,
            transform=transform,
            **thresholds,
        )
    from solo_ext.data.longtail import lt_counts

    counts = lt_counts(n_max, len(classes), data.imbalance_factor)
    return lt.balanced(base, targets, classes, counts, transform=transform, **thresholds)


def _counts_file(data: DictConfig) -> tuple[str, dict[str, Any]] | None:
    """The path and content of the ``counts.json`` that solo-ext-make-lt writes beside an
    image folder's ``train/`` (or inside it); None when there is none."""
    if data.get("train_path") is None:
        return None
    for folder in (data.train_path, os.path.dirname(os.path.abspath(data.train_path))):
        path = os.path.join(folder, "counts.json")
        if not os.path.isfile(path):
            continue
        try:
            with open(path) as f:
                content = json.load(f)
            if not isinstance(content, dict) or not isinstance(content["train_counts"], list):
                raise TypeError("no list of train_counts")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"{path!r}: not a counts.json of solo-ext-make-lt ({err})") from None
        return path, content
    return None


def thresholds_of_counts_file(data: DictConfig, given: dict[str, Any]) -> None:
    """The shot groups of a folder made by solo-ext-make-lt are the file's: its thresholds,
    unless the config sets them; a config whose thresholds differ from the file's says so."""
    found = _counts_file(data)
    if found is None:
        return
    path, content = found
    for key, value in given.items():
        written = content.get(key)
        if written is None:
            continue
        if value is None:
            data[key] = int(written)
        elif value != written:
            print(
                f"solo-ext: data.{key}={value} differs from {path!r}'s {written}: the shot "
                "groups follow the config's",
                flush=True,
            )


def is_long_tailed(data: DictConfig) -> bool:
    """Whether ``data`` (a checked ``data`` section) is long-tailed: a long-tailed dataset, or
    an image folder made by solo-ext-make-lt (its ``counts.json``)."""
    f = F.facts(data.dataset)
    return f.long_tailed or (f.counts_file and _counts_file(data) is not None)


def counts_json(data: DictConfig) -> list[int] | None:
    """Training images per class from the ``counts.json`` that solo-ext-make-lt writes beside an
    image folder's ``train/`` (or inside it); None when there is none."""
    found = _counts_file(data)
    if found is None:
        return None
    path, content = found
    counts = content["train_counts"]
    classes = data.get("num_classes")
    if classes is not None and len(counts) != classes:
        raise ConfigError(
            f"{path!r}: {len(counts)} classes, data.train_path={data.train_path!r} has {classes}"
        )
    return [int(c) for c in counts]


def long_tail_counts(data: DictConfig) -> list[int] | None:
    """Training images per class of a long-tailed ``data`` section checked by
    :func:`fill_data_cfg` (an image folder: its ``counts.json``); None for balanced data.

    CIFAR-LT's and Fashion-MNIST-LT's counts are their profile: nothing is read (or downloaded)
    to know them.
    """
    f = F.facts(data.dataset)
    if f.long_tailed and f.images_per_class is not None:
        from solo_ext.data.longtail import lt_counts

        return lt_counts(lt_head(data), data.num_classes, data.imbalance_factor)
    if f.long_tailed:
        quick = OmegaConf.merge(data, {"bad_images": "off"})  # counting opens no image
        return train_class_counts(build_dataset(quick, "train", None))
    if f.counts_file:
        return counts_json(data)
    return None


def train_class_counts(dataset: Dataset) -> list[int] | None:
    """Training images per class of a dataset built here (None when it does not know)."""
    counts = getattr(dataset, "train_class_counts", None)
    if counts is None and hasattr(dataset, "targets"):
        counts = [0] * len(dataset.classes)
        for t in dataset.targets:
            counts[t] += 1
    return list(counts) if counts is not None else None


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
