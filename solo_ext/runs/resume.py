"""Exact resumption and safe writes.

- :class:`EpochSeed`: the global RNGs (torch, numpy, random) are reseeded from ``(seed, epoch)``
  and the process's rank when each training epoch starts, and, when a checkpoint is loaded, for
  the epoch it resumes at, together with the sampler's epoch (Lightning creates the first
  iterator of a fit before it calls ``set_epoch``). So a run resumed from an epoch-end
  checkpoint draws the same batches, augmentations and dropout masks as the uninterrupted run.
- :func:`find_auto_resume`: solo-learn's ``auto_resume``: the newest readable checkpoint under
  ``checkpoint.dir`` whose ``args.json`` matches the run's settings, within ``max_hours``; an
  unreadable one (truncated, foreign) is passed over in one line (:func:`newest_readable`).
- :class:`AtomicSaveIO` / :class:`AtomicCheckpointIO`: checkpoints through
  ``solo_ext.common.atomic_write`` (a temporary file in the same directory, fsync, then
  ``os.replace``); an interrupted write leaves the previous file whole, and its temporary file
  is removed when the run resumes (:func:`remove_stale_temporaries`).

Both entry points use them: ``solo-ext-pretrain`` directly, solo-learn's ``main_pretrain.py``
through the patches (its ``Checkpointer`` and ``AutoResumer``).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.io import TorchCheckpointIO
from omegaconf import DictConfig, OmegaConf

from solo_ext.common import SEED_STRIDE, announce, atomic_write, temporaries_of
from solo_ext.config import run_default, select
from solo_ext.runs.checkpoint import unreadable


class AtomicSaveIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, through a temporary file and a rename; reading is
    Lightning's own (solo-learn's runs resume through it unchanged)."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError(f"storage_options={storage_options!r}: not supported")
        atomic_write(path, lambda f: torch.save(checkpoint, f), "wb")


class AtomicCheckpointIO(AtomicSaveIO):
    """:class:`AtomicSaveIO`, reading the full training checkpoints of solo-ext's runs."""

    def load_checkpoint(self, path, map_location=None, weights_only=None, **kwargs) -> dict:
        """A full training checkpoint of this run (optimizer, loops, callbacks), so not the
        weights-only unpickler that torch >= 2.6 defaults to (lightning 2.1, which solo-learn
        pins, does not ask for it)."""
        return torch.load(path, map_location=map_location, weights_only=bool(weights_only))


def remove_stale_temporaries(run_dir: str | Path) -> list[Path]:
    """Removes the temporary files that killed writes left in a run directory (a run resumed
    there is the only writer); returns them."""
    removed = []
    for tmp in temporaries_of(run_dir):
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def newest_readable(ckpts: Iterable[str | Path], key: str = "auto_resume") -> Path | None:
    """The first of ``ckpts`` (newest first) that holds a training state to resume from; each
    unreadable one is said in one line and passed over."""
    for ckpt in map(Path, ckpts):
        reason = unreadable(ckpt)
        if reason is None:
            return ckpt
        announce(f"{key}: passing over {str(ckpt)!r}: {reason}")
    return None


def by_age(paths: Iterable[Path]) -> list[Path]:
    """Newest first (modification time, then the name: ``-ep=N`` of one second)."""
    return sorted(paths, key=lambda p: (os.path.getmtime(p), p.name), reverse=True)


def _resumed_epoch(checkpoint: dict) -> int:
    """The epoch a fit from ``checkpoint`` trains first: the processed epochs (Lightning's own
    count for the samplers' epoch; an epoch-end checkpoint has processed its epoch)."""
    loops = checkpoint.get("loops", {}).get("fit_loop", {})
    try:
        return int(loops["epoch_progress"]["current"]["processed"])
    except (KeyError, TypeError):
        return int(checkpoint.get("epoch", -1)) + 1


def epoch_seed(seed: int, epoch: int, rank: int = 0) -> int:
    """The seed of ``(seed, epoch)`` on process ``rank``: the first process's is the one of a
    single-process run; each other process gets its own, so that the processes of a
    distributed run draw their own augmentations (with one seed, the two halves of a 2-process
    batch would be cropped, flipped and jittered alike)."""
    value = (seed * SEED_STRIDE + epoch) % 2**63
    if rank:
        value = (value * 6364136223846793005 + rank) % 2**63  # an LCG step: another stream
    return value


class EpochSeed(Callback):
    """Reseeds the global RNGs per epoch (and process); sets the sampler's epoch on
    resumption.

    The loader's ``generator`` (the workers' base seed) and the sampler are set for the resumed
    epoch when the checkpoint is loaded, because Lightning creates the first iterator of a fit
    before the epoch starts; the global RNGs are seeded again when the epoch starts, so that
    whatever ran in between (the sanity check's validation, a loader drawing its seed) changes
    nothing."""

    def __init__(self, seed: int, sampler: Any = None, generator: torch.Generator | None = None):
        self.seed, self.sampler, self.generator = int(seed), sampler, generator
        self._resumed_at: int | None = None

    def reseed(self, epoch: int, rank: int = 0, generator: bool = True) -> None:
        value = epoch_seed(self.seed, epoch, rank)
        torch.manual_seed(value)
        if generator and self.generator is not None:  # the loader's: the workers' base seed
            self.generator.manual_seed(value)
        random.seed(value)
        np.random.seed(value % 2**32)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        epoch = _resumed_epoch(checkpoint)
        self.reseed(epoch, trainer.global_rank)
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        self._resumed_at = epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        # the resumed epoch's iterator exists already, made with the generator seeded at load
        resumed = self._resumed_at == trainer.current_epoch
        self._resumed_at = None
        self.reseed(trainer.current_epoch, trainer.global_rank, generator=not resumed)


# solo-learn's AutoResumer compares these settings
SHOULD_MATCH = (
    "name",
    "backbone",
    "method",
    "data.dataset",
    "max_epochs",
    "optimizer.name",
    "optimizer.batch_size",
    "optimizer.lr",
    "optimizer.weight_decay",
    "wandb.project",
    "wandb.entity",
    "pretrained_feature_extractor",
)


def find_auto_resume(cfg: DictConfig) -> Path | None:
    """The newest readable ``.ckpt`` below ``<checkpoint.dir>/<method>`` younger than
    ``auto_resume.max_hours`` whose ``args.json`` matches ``cfg`` on :data:`SHOULD_MATCH`."""
    root = Path(cfg.checkpoint.dir) / cfg.method
    max_age = (
        float(select(cfg, "auto_resume.max_hours", run_default("auto_resume.max_hours"))) * 3600
    )
    now = time.time()
    candidates = []
    for ckpt in root.glob("*/*.ckpt") if root.is_dir() else []:
        args_file = ckpt.parent / "args.json"
        age = now - ckpt.stat().st_mtime
        if age < max_age and args_file.is_file():
            candidates.append((ckpt.stat().st_mtime, ckpt, args_file))
    for _, ckpt, args_file in sorted(candidates, reverse=True):
        try:
            args = OmegaConf.create(json.loads(args_file.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
        if all(OmegaConf.select(args, k) == OmegaConf.select(cfg, k) for k in SHOULD_MATCH):
            if newest_readable([ckpt]) is not None:
                return ckpt
    return None
