"""``solo.data.classification_dataloader``: ``main_linear.py``'s and ``main_knn.py``'s
datasets, transforms and training loader, as for pretraining.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from solo_ext.facts import SOLO_EXT_ONLY, facts
from solo_ext.solo_learn import parsed
from solo_ext.solo_learn.check import calls_globals, function

# the names of the solo-learn module this patch needs (checked before it applies)
NEEDS = (
    function("prepare_transforms", "dataset"),
    function("prepare_datasets", "dataset", "T_train", "T_val"),
    function("prepare_dataloaders", "train_dataset", "val_dataset", "batch_size", "num_workers"),
    calls_globals("prepare_data", "prepare_transforms", "prepare_datasets", "prepare_dataloaders"),
)


def _eval_transforms(dataset: str) -> tuple[Any, Any]:
    """Train / val transforms of a dataset solo-learn has no pipeline for (``synthetic_lt``):
    those of solo-learn's CIFAR at the dataset's own size and statistics."""
    from torchvision import transforms as T

    f = facts(dataset)
    norm = T.Normalize(*f.stats)
    train = T.Compose(
        [
            T.RandomResizedCrop(size=f.native_size, scale=(0.08, 1.0)),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            norm,
        ]
    )
    return train, T.Compose([T.ToTensor(), norm])


def apply(module: ModuleType) -> None:
    # prepare_data calls these three through the module's globals, so it follows the patches
    prepare_transforms = module.prepare_transforms
    prepare_datasets, prepare_dataloaders = module.prepare_datasets, module.prepare_dataloaders

    @functools.wraps(prepare_transforms)
    def prepare_transforms_(dataset):
        if dataset not in SOLO_EXT_ONLY:
            train, val = prepare_transforms(dataset)
        else:
            solo_name = facts(dataset).solo_name
            train, val = prepare_transforms(solo_name) if solo_name else _eval_transforms(dataset)
        augmentation = parsed.stage("train_augmentation")
        if augmentation != "solo-learn":  # main_linear.py's classifier stage
            from solo_ext.eval.classifier_stage import stage_train_transform

            train = stage_train_transform(dataset, augmentation, parsed.RUN.stage_view)
        return train, val

    @functools.wraps(prepare_datasets)
    def prepare_datasets_(dataset, T_train, T_val, *args, **kwargs):
        if dataset not in SOLO_EXT_ONLY:
            return prepare_datasets(dataset, T_train, T_val, *args, **kwargs)
        from solo_ext.data.datasets import build_dataset

        data = parsed.run_data(dataset)
        has_val = data.val_path is not None or facts(data.dataset).source != "image_folder"
        val = build_dataset(data, "val", T_val) if has_val else None
        return build_dataset(data, "train", T_train), val

    @functools.wraps(prepare_dataloaders)
    def prepare_dataloaders_(train_dataset, val_dataset, batch_size=64, num_workers=4):
        if (parsed.RUN is None or parsed.RUN.sampler is None) and val_dataset is not None:
            return prepare_dataloaders(train_dataset, val_dataset, batch_size, num_workers)
        from torch.utils.data import DataLoader

        if parsed.RUN is not None and parsed.RUN.sampler is not None:
            train = parsed.train_loader(train_dataset, batch_size, num_workers)
        else:
            train = DataLoader(
                train_dataset, batch_size, shuffle=True, num_workers=num_workers, drop_last=True
            )
        val = None
        if val_dataset is not None:
            val = DataLoader(val_dataset, batch_size, num_workers=num_workers, pin_memory=True)
        return train, val

    module.prepare_transforms = prepare_transforms_
    module.prepare_datasets = prepare_datasets_
    module.prepare_dataloaders = prepare_dataloaders_
