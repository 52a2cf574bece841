"""``solo.data.pretrain_dataloader``: ``main_pretrain.py``'s dataset builder builds solo-ext's
datasets, the transforms use the dataset table (and a solo-ext method's own views), and the
training loader draws with the configured sampler (a ``DistributedSampler``, so Lightning does
not re-shard it under DDP).
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from solo_ext.common import announce
from solo_ext.facts import SOLO_EXT_ONLY
from solo_ext.solo_learn import parsed
from solo_ext.solo_learn.check import function

# the names of the solo-learn module this patch needs (checked before it applies)
NEEDS = (
    function("build_transform_pipeline", "dataset", "cfg"),
    function("prepare_datasets", "dataset", "transform"),
    function("prepare_dataloader", "train_dataset", "batch_size", "num_workers"),
)


def _method_transform() -> Any:
    """The loader transform the run's method asks for (PBSD's views of the published
    pipeline), built from the config its class has filled in; None for solo-learn's crops."""
    if parsed.RUN is None or parsed.RUN.cfg is None:
        return None
    from solo_ext.methods.registry import method_transform

    transform = method_transform(parsed.RUN.cfg)
    if transform is not None:
        announce(f"{parsed.RUN.cfg.get('method')}: the loader makes its views: {transform!r}")
    return transform


def _solo_ext_views(dataset: str) -> bool:
    """A solo-ext method's run on a dataset of the table gets solo-ext's views (bilinear crops,
    PIL's blur, as the published code; ``rrc.interpolation`` and ``gaussian_blur.kind`` apply),
    the same as with ``solo-ext-pretrain``; solo-learn's methods keep solo-learn's."""
    from solo_ext.facts import DATASETS
    from solo_ext.methods.registry import SOLO_EXT_METHODS

    method = None if parsed.RUN is None or parsed.RUN.cfg is None else parsed.RUN.cfg.get("method")
    return method in SOLO_EXT_METHODS and dataset in DATASETS


def _epoch_seed(model: Any) -> list[Any]:
    """solo-ext-pretrain's per-epoch seeding (``EpochSeed``: the global RNGs from (seed,
    epoch, rank), the sampler's epoch set when a checkpoint is loaded), which makes a resumed run
    the uninterrupted one, brought by a solo-ext method into main_pretrain.py's Trainer; nothing
    where the entry point has its own or the patches did not build the loader."""
    from solo_ext.runs.resume import EpochSeed

    if parsed.RUN is None or parsed.RUN.loader is None:
        return []
    if any(isinstance(cb, EpochSeed) for cb in getattr(model.trainer, "callbacks", [])):
        return []
    return [EpochSeed(parsed.RUN.cfg.seed, parsed.RUN.loader.sampler, parsed.RUN.loader.generator)]


def apply(module: ModuleType) -> None:
    build_transform, prepare_datasets = module.build_transform_pipeline, module.prepare_datasets
    prepare_dataloader = module.prepare_dataloader

    @functools.wraps(build_transform)
    def build_transform_pipeline(dataset, cfg):
        if _solo_ext_views(dataset):  # the published resampling and blur (solo-ext's views)
            from solo_ext.data.transforms import build_augmentation

            return build_augmentation(dataset, cfg)
        return build_transform(dataset, parsed.with_stats(dataset, cfg))

    @functools.wraps(prepare_datasets)
    def prepare_datasets_(dataset, transform, *args, **kwargs):
        transform = _method_transform() or transform
        if dataset not in SOLO_EXT_ONLY:
            return prepare_datasets(dataset, transform, *args, **kwargs)
        from solo_ext.data.datasets import IndexedNCrop, build_dataset

        data = parsed.run_data(dataset)
        return IndexedNCrop(build_dataset(data, "train", transform), no_labels=data.no_labels)

    @functools.wraps(prepare_dataloader)
    def prepare_dataloader_(train_dataset, batch_size=64, num_workers=4):
        if parsed.RUN is None or parsed.RUN.sampler is None:
            return prepare_dataloader(train_dataset, batch_size, num_workers)
        from solo_ext.methods.base import SCRIPT_CALLBACKS

        if _epoch_seed not in SCRIPT_CALLBACKS:
            SCRIPT_CALLBACKS.append(_epoch_seed)
        parsed.RUN.loader = parsed.train_loader(train_dataset, batch_size, num_workers)
        return parsed.RUN.loader

    module.build_transform_pipeline = build_transform_pipeline
    module.prepare_datasets = prepare_datasets_
    module.prepare_dataloader = prepare_dataloader_
