"""``solo.data.dali_dataloader``: with ``data.format=dali`` and a sampler (or a solo-ext dataset),
the DALI data modules of ``main_pretrain.py`` / ``main_linear.py`` read the training images in the
sampler's order (``solo_ext.data.dali``), through solo-learn's own decode and augmentation graph;
``build_transform_pipeline_dali`` gets a solo-ext dataset's statistics.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from solo_ext.config import run_default
from solo_ext.facts import SOLO_EXT_ONLY
from solo_ext.solo_learn import parsed
from solo_ext.solo_learn.check import function, method_of

# the names of the solo-learn module this patch needs (checked before it applies)
NEEDS = (
    function("build_transform_pipeline_dali", "dataset", "cfg", "dali_device"),
    method_of("PretrainDALIDataModule", "setup", "train_dataloader"),
    method_of("ClassificationDALIDataModule", "setup", "train_dataloader"),
)


def _dali_sampled() -> bool:
    """Whether the run's DALI training loader reads in a solo-ext sampler's order: a sampler is
    configured, or the dataset is one of solo-ext's (DALI's file reader cannot read it)."""
    if parsed.RUN is None or parsed.RUN.cfg is None or parsed.RUN.data.get("format") != "dali":
        return False
    return parsed.RUN.sampler is not None or parsed.RUN.data.dataset in SOLO_EXT_ONLY


def _dali_train_loader(datamodule: Any, transforms: Any, kind: str) -> Any:
    """solo-ext's sampled DALI loader for a solo-learn DALI data module: the run's training set
    (a solo-ext dataset, or the class folders solo-learn's reader lists), the run's sampler
    (``instance`` when none: a seeded uniform order), solo-learn's decode-and-augment graph."""
    from torchvision.datasets import ImageFolder

    from solo_ext.data.dali import dali_loader
    from solo_ext.data.datasets import build_dataset
    from solo_ext.data.samplers import build_sampler, targets_of

    assert parsed.RUN is not None
    data = parsed.RUN.data
    if data.dataset in SOLO_EXT_ONLY:
        train_set = build_dataset(data, "train", None)
    else:  # the class folders, sorted, as solo-learn's DALI pipelines list them
        train_set = ImageFolder(str(data.train_path))
    seed = parsed.RUN.cfg.get("seed", run_default("seed"))
    args = dict(parsed.RUN.sampler or {"name": "instance", "seed": seed})
    sampler = build_sampler(args.pop("name"), targets_of(train_set), **args)
    return dali_loader(
        train_set,
        sampler,
        transforms,
        kind=kind,
        batch_size=datamodule.batch_size,
        device=datamodule.dali_device,  # (checked by parse_cfg)
        num_workers=datamodule.num_workers,
        seed=seed,
    )


def _linear_dali_augmentation(dataset: str) -> Any:
    """main_linear.py's DALI training crops as an ``augmentations`` entry for solo-learn's
    ``build_transform_pipeline_dali``: the run's query view, the official stage's ImageNet-LT
    crops, or solo-learn's own linear pipeline's (random resized crop 0.08-1 and flip), at the
    dataset's size, as ``train_augmentation`` says."""
    from solo_ext.eval.classifier_stage import train_augmentation_entry

    augmentation = parsed.stage("train_augmentation")
    view = parsed.RUN.stage_view if parsed.RUN is not None else None
    entry = train_augmentation_entry(dataset, augmentation, view)
    return parsed.with_stats(dataset, entry)


def apply(module: ModuleType) -> None:
    pretrain_base, classification_base = (
        module.PretrainDALIDataModule,
        module.ClassificationDALIDataModule,
    )
    build_transform_dali = module.build_transform_pipeline_dali

    @functools.wraps(build_transform_dali)
    def build_transform_pipeline_dali(dataset, cfg, dali_device):
        return build_transform_dali(dataset, parsed.with_stats(dataset, cfg), dali_device)

    class PretrainDALIDataModule(pretrain_base):
        """solo-learn's; its reader follows the run's sampler when the run has one, or trains
        on a solo-ext dataset (decode and augmentations unchanged)."""

        def __init__(self, *args, train_data_path=None, **kwargs):
            # a dataset without files (synthetic_lt) has no path for solo-learn's Path()
            super().__init__(*args, train_data_path=train_data_path or "", **kwargs)

        def setup(self, stage=None):
            if not _dali_sampled():
                return super().setup(stage)
            self.train_loader = _dali_train_loader(self, self.transforms, "pretrain")

    class ClassificationDALIDataModule(classification_base):
        """solo-learn's; main_linear.py's training loader follows the run's sampler when the
        run has one, or trains on a solo-ext dataset (validation stays main_linear.py's
        torchvision loader)."""

        def __init__(self, dataset, *args, train_data_path=None, val_data_path=None, **kwargs):
            # solo-learn's accepts its own names only; a solo-ext dataset reads as 'custom'
            super().__init__(
                "custom" if dataset in SOLO_EXT_ONLY else dataset,
                *args,
                train_data_path=train_data_path or "",
                val_data_path=val_data_path or "",
                **kwargs,
            )
            self.dataset = dataset

        def setup(self, stage=None):
            if not _dali_sampled():
                return super().setup(stage)
            aug = _linear_dali_augmentation(self.dataset)
            transforms = build_transform_dali(self.dataset, aug, self.dali_device)
            self.train_loader = _dali_train_loader(self, transforms, "classification")

    module.PretrainDALIDataModule = PretrainDALIDataModule
    module.ClassificationDALIDataModule = ClassificationDALIDataModule
    module.build_transform_pipeline_dali = build_transform_pipeline_dali
