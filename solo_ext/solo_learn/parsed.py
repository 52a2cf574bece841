"""The run as solo-learn's ``parse_cfg`` (or ``main_knn.py``'s ``parse_args_knn``) left it,
for the loaders and models solo-learn builds later without the config, and what the patches
share: the one-line errors of solo-learn's scripts, whether a config uses solo-ext, the training
loader drawing with the run's sampler, a solo-ext dataset's statistics.

solo-learn calls its loaders with a dataset name and a batch size only, so the parsed run is kept
here (:data:`RUN`), set by the argument patches and read by the loader and model patches.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from typing import Any

from solo_ext.facts import SOLO_EXT_ONLY, facts


@dataclass
class Run:
    """The parts of the parsed config that solo-learn's loaders are called without."""

    data: Any  # the checked ``data`` section (DictConfig)
    sampler: dict[str, Any] | None  # build_sampler arguments, None: solo-learn's shuffle
    cfg: Any = None  # the whole config (main_pretrain.py's; the method fills its keys in)
    loader: Any = None  # main_pretrain.py's training loader, when the patches built it
    # main_linear.py with train_augmentation: pretrain: the evaluated run's query view
    stage_view: Any = None


# a solo-ext method's draw in main_pretrain.py without data.sampler (solo-ext-pretrain's too)
DEFAULT_SAMPLER = "instance"


RUN: Run | None = None


def prog() -> str:
    return os.path.basename(sys.argv[0]) or "solo-learn"


# solo-learn's scripts, where a config error of solo-ext's checks is one line and exit status 2
SOLO_LEARN_SCRIPTS = ("main_pretrain.py", "main_linear.py", "main_knn.py", "main_umap.py")


def config_errors(fn):
    """Config errors of solo-ext's checks: in solo-learn's scripts one line on stderr and exit
    status 2; called as a library function (solo-learn's own tests, a user's code), the
    exception itself, as solo-learn's own checks raise theirs."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        from solo_ext.config import one_line_errors

        if prog() not in SOLO_LEARN_SCRIPTS:
            return fn(*args, **kwargs)
        with one_line_errors(prog()):
            return fn(*args, **kwargs)

    return wrapped


def uses_solo_ext(cfg: Any) -> bool:
    """Whether a config names anything of solo-ext's: a method, a dataset, a sampler or a
    classifier-stage key. One that does not is left to solo-learn's own checks."""
    from omegaconf import OmegaConf

    from solo_ext.eval.classifier_stage import CLASSIFIER_STAGE_OPTIONS
    from solo_ext.methods.registry import SOLO_EXT_METHODS

    def given(key: str) -> bool:
        return OmegaConf.select(cfg, key, default=None) is not None

    return (
        OmegaConf.select(cfg, "method", default=None) in SOLO_EXT_METHODS
        or OmegaConf.select(cfg, "pretrain_method", default=None) in SOLO_EXT_METHODS
        or OmegaConf.select(cfg, "data.dataset", default=None) in SOLO_EXT_ONLY
        or given("data.sampler")
        or any(given(key) for key in CLASSIFIER_STAGE_OPTIONS)
        or given("classifier_stage")
        or given("decoupled")
    )


def run_data(dataset: str) -> Any:
    if RUN is None or RUN.data.dataset != dataset:
        raise RuntimeError(
            f"solo-ext: data.dataset={dataset!r} reached solo-learn's loaders without solo-ext's "
            "parse_cfg (is the start-up hook off? SOLO_EXT_AUTOLOAD=0)"
        )
    return RUN.data


def train_loader(dataset: Any, batch_size: int, num_workers: int) -> Any:
    """solo-learn's training loader (batch, workers, pinned memory, drop_last), drawing with the
    run's sampler."""
    import torch
    from torch.utils.data import DataLoader

    from solo_ext.data.samplers import build_sampler, targets_of

    assert RUN is not None and RUN.sampler is not None
    args = dict(RUN.sampler)
    labels = targets_of(dataset)
    if labels is None and args["name"] == DEFAULT_SAMPLER:  # (uniform over images)
        labels = [0] * len(dataset)
    if labels is None:
        raise RuntimeError(f"solo-ext: {type(dataset).__name__} has no labels to sample by")
    sampler = build_sampler(args.pop("name"), labels, **args)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=True,
        drop_last=True,
        # the workers' base seed comes from here (reseeded per epoch by EpochSeed), not from
        # the global RNG, as in solo-ext-pretrain
        generator=torch.Generator().manual_seed(args["seed"]),
    )


def with_stats(dataset: str, cfg: Any) -> Any:
    """An ``augmentations`` entry for solo-learn's builders (which know the statistics of
    their own datasets only) carrying a solo-ext dataset's (a ``custom`` one keeps the entry's
    ``mean`` / ``std`` when it gives them, as solo-learn does)."""
    if dataset not in SOLO_EXT_ONLY:
        return cfg
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(OmegaConf.to_container(cfg))
    mean, std = facts(dataset).stats
    if facts(dataset).stats_from_config:
        mean, std = cfg.get("mean", mean), cfg.get("std", std)
    cfg.mean, cfg.std = list(mean), list(std)
    return cfg


def stage(key: str) -> Any:
    """A classifier-stage key of main_linear.py's run; outside one (a model built without the
    patched parse_cfg), solo-learn's own stage."""
    from solo_ext.eval.classifier_stage import SOLO_LEARN_STAGE

    if RUN is None or RUN.cfg is None or RUN.cfg.get(key) is None:
        return SOLO_LEARN_STAGE[key]
    return RUN.cfg.get(key)
