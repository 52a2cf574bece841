"""Long-tailed datasets: CIFAR-10/100-LT, the split-file benchmarks (ImageNet-LT, Places-LT,
iNaturalist 2018) and any ImageFolder subsampled to the exponential profile.

Every dataset here is a :class:`LongTailDataset`: items ``(image, label)`` plus the metadata the
long-tail evaluation needs (training counts per class, shot group of every class).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset
from torchvision.datasets.folder import default_loader

from solo_ext.config import ConfigError
from solo_ext.data.longtail import lt_counts, shot_groups
from solo_ext.facts import FEW_THRESHOLD, MANY_THRESHOLD


class LongTailDataset(Dataset):
    """``base[indices[i]]`` with its own transform and the long-tail metadata.

    Args:
        base: a dataset of (PIL image, label) with no transform of its own.
        indices: the items of ``base`` that this split keeps.
        targets: the label of every kept item.
        classes: class names, in label order.
        train_class_counts: training images per class (the profile; also on the val split).
    """

    def __init__(
        self,
        base: Dataset,
        indices: Sequence[int],
        targets: Sequence[int],
        classes: Sequence[str],
        train_class_counts: Sequence[int],
        many_threshold: int = MANY_THRESHOLD,
        few_threshold: int = FEW_THRESHOLD,
        transform: Callable | None = None,
    ):
        self.base, self.indices = base, list(indices)
        self.targets = [int(t) for t in targets]
        self.classes = list(classes)
        self.train_class_counts = [int(c) for c in train_class_counts]
        self.class_counts = np.bincount(self.targets, minlength=len(self.classes)).tolist()
        self.shot_groups = shot_groups(self.train_class_counts, many_threshold, few_threshold)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        image, _ = self.base[self.indices[i]]
        return (self.transform(image) if self.transform else image), self.targets[i]

    def path_of(self, i: int) -> str | None:
        """File behind item i, for datasets stored as files (None for in-memory ones)."""
        base = self.base
        if hasattr(base, "samples"):
            return base.samples[self.indices[i]][0]
        return None


def lt_indices(targets: Sequence[int], counts: Sequence[int], seed: int) -> list[int]:
    """The kept items: for class c in order, a seeded shuffle of its items, the first counts[c].

    With ``seed = 0`` and CIFAR's targets this keeps the same images as LDAM-DRW's
    ``IMBALANCECIFAR10/100`` (Cao et al., NeurIPS 2019), the subsets CIFAR-LT papers report on.
    """
    targets = np.asarray(targets)
    rng = np.random.RandomState(seed)
    keep: list[int] = []
    for c, n in enumerate(counts):
        idx = np.where(targets == c)[0]
        rng.shuffle(idx)
        keep.extend(idx[:n].tolist())
    return keep


class _Files(Dataset):
    """(path, label) pairs loaded with PIL; ``samples`` as in torchvision's ImageFolder."""

    def __init__(self, samples: list[tuple[str, int]]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        return default_loader(path), label


def read_split_file(
    path: str | Path, root: str | Path, num_classes: int, key: str
) -> list[tuple[str, int]]:
    """Parses a published split file, one ``relative/path label`` per line.

    Raises:
        ConfigError: one line naming the file and line for a missing file, a malformed line or
            a label outside [0, num_classes).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{key}={str(path)!r}: no such split file")
    samples = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
                raise ConfigError(
                    f"{path}:{number}: expected 'relative/path label', got {line.strip()!r}"
                )
            label = int(parts[1])
            if not 0 <= label < num_classes:
                raise ConfigError(
                    f"{path}:{number}: label {label} not in [0, {num_classes - 1}] "
                    f"(data.num_classes={num_classes})"
                )
            samples.append((os.path.join(root, parts[0]), label))
    if not samples:
        raise ConfigError(f"{key}={str(path)!r}: the split file lists no image")
    return samples


def split_file_dataset(
    train_file: str | Path,
    val_file: str | Path,
    train_root: str | Path,
    val_root: str | Path,
    split: str,
    num_classes: int,
    many_threshold: int = MANY_THRESHOLD,
    few_threshold: int = FEW_THRESHOLD,
    transform: Callable | None = None,
) -> LongTailDataset:
    """A split of ImageNet-LT / Places-LT / iNaturalist 2018 from its published file lists."""
    train = read_split_file(train_file, train_root, num_classes, "data.train_split_file")
    train_counts = np.bincount([y for _, y in train], minlength=num_classes).tolist()
    samples = (
        train
        if split == "train"
        else read_split_file(val_file, val_root, num_classes, "data.val_split_file")
    )
    return LongTailDataset(
        _Files(samples),
        range(len(samples)),
        [y for _, y in samples],
        [str(c) for c in range(num_classes)],
        train_counts,
        many_threshold,
        few_threshold,
        transform,
    )


def subsample_lt(
    base: Dataset,
    targets: Sequence[int],
    classes: Sequence[str],
    n_max: int,
    imbalance_factor: float,
    seed: int,
    many_threshold: int = MANY_THRESHOLD,
    few_threshold: int = FEW_THRESHOLD,
    transform: Callable | None = None,
) -> LongTailDataset:
    """The exponential profile ``floor(n_max * IF^(-c / (C - 1)))`` of a balanced dataset."""
    counts = lt_counts(n_max, len(classes), imbalance_factor)
    available = np.bincount(np.asarray(targets), minlength=len(classes))
    short = [c for c, n in enumerate(counts) if available[c] < n]
    if short:
        c = short[0]
        raise ConfigError(
            f"data.lt_n_max={n_max}: class {classes[c]!r} has {available[c]} "
            f"images, the profile asks for {counts[c]}"
        )
    keep = lt_indices(targets, counts, seed)
    return LongTailDataset(
        base,
        keep,
        [targets[i] for i in keep],
        classes,
        counts,
        many_threshold,
        few_threshold,
        transform,
    )


def balanced(
    base: Dataset,
    targets: Sequence[int],
    classes: Sequence[str],
    train_class_counts: Sequence[int],
    many_threshold: int = MANY_THRESHOLD,
    few_threshold: int = FEW_THRESHOLD,
    transform: Callable | None = None,
) -> LongTailDataset:
    """A whole (balanced) evaluation split, carrying the training profile for the split metrics."""
    return LongTailDataset(
        base,
        range(len(targets)),
        targets,
        classes,
        train_class_counts,
        many_threshold,
        few_threshold,
        transform,
    )
