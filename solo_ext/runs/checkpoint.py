"""solo-learn's checkpoint layout: ``<dir>/<method>/<run id>/<name>-<run id>-ep=N.ckpt`` plus
``args.json`` (the full config), so solo-learn's ``main_linear.py`` / ``main_knn.py`` load them."""

from __future__ import annotations

import json
import os
import random
import string
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from omegaconf import DictConfig, OmegaConf
from torch import nn

from solo_ext.common import atomic_write_text
from solo_ext.config import ConfigError
from solo_ext.runs.environment import of_trainer


def new_run_id(logdir: str | Path) -> str:
    """``offline-xxxxxxxx`` not yet used under ``logdir`` (solo-learn's name for local runs)."""
    existing = set(os.listdir(logdir)) if os.path.isdir(logdir) else set()
    rng = random.SystemRandom()
    while True:
        chars = rng.sample(string.ascii_lowercase, 4) + rng.sample(string.digits, 4)
        rng.shuffle(chars)
        run_id = "offline-" + "".join(chars)
        if run_id not in existing:
            return run_id


class ArgsWriter(Callback):
    """Writes ``args.json`` into the run directory when fitting starts (global rank zero): the
    config, and the environment of the run (``environment``)."""

    def __init__(self, cfg: DictConfig, run_dir: str | Path, run_id: str | None = None):
        self.cfg, self.run_dir, self.run_id = cfg, Path(run_dir), run_id

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            args = OmegaConf.to_container(self.cfg, resolve=True)
            args["wandb_run_id"] = self.run_id
            # where the run's numbers come from (versions, device, precision, processes)
            args["environment"] = of_trainer(trainer, OmegaConf.select(self.cfg, "data.format"))
            text = json.dumps(args, indent=2, default=lambda o: "<not serializable>")
            atomic_write_text(self.run_dir / "args.json", text)


def checkpoint_callbacks(cfg: DictConfig, run_dir: str | Path, run_id: str) -> list[Callback]:
    """Lightning's ModelCheckpoint with solo-learn's file names, plus the ``args.json`` writer."""
    ckpt = ModelCheckpoint(
        dirpath=str(run_dir),  # a str: checkpoints stay loadable with weights_only
        filename=f"{cfg.name}-{run_id}-ep={{epoch}}",
        auto_insert_metric_name=False,
        every_n_epochs=cfg.checkpoint.frequency,
        save_top_k=-1 if cfg.checkpoint.keep_prev else 1,
        monitor=None,
        save_on_train_epoch_end=True,
    )
    return [ArgsWriter(cfg, run_dir, run_id), ckpt]


def find_checkpoint(run_dir: str | Path, key: str = "pretrained_checkpoint_dir") -> Path:
    """The newest ``.ckpt`` in a run directory (``key`` named it: the error names it)."""
    ckpts = sorted(Path(run_dir).glob("*.ckpt"), key=os.path.getmtime)
    if not ckpts:
        raise FileNotFoundError(f"{key}={str(run_dir)!r}: no .ckpt file")
    return ckpts[-1]


def unreadable(path: str | Path) -> str | None:
    """Why a run cannot resume from the checkpoint file ``path`` (missing, truncated, foreign,
    no training state), or None when it can."""
    try:
        read_checkpoint("checkpoint", path, training=True)
    except ConfigError as err:
        return str(err).split(": ", 1)[-1]
    return None


def read_checkpoint(key: str, path: str | Path, training: bool = False) -> dict:
    """The checkpoint file that ``key`` names, read without its tensors' bytes (memory-mapped);
    a missing, truncated or foreign file, or (``training``) one without the training state to
    resume from, stops in one line naming the key and the file."""
    where = f"{key}={str(path)!r}"
    if not Path(path).is_file():
        raise ConfigError(f"{where}: no such file")
    try:
        ckpt = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except Exception as err:  # torch's reader, the unpickler: every way a file is not one
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"{where}: not a readable checkpoint ({reason})") from None
    if not isinstance(ckpt, dict):
        raise ConfigError(f"{where}: not a checkpoint (holds a {type(ckpt).__name__})")
    if training and not {"state_dict", "loops", "optimizer_states"} <= set(ckpt):
        raise ConfigError(f"{where}: not a training checkpoint (no optimizer or loop state)")
    return ckpt


def check_fits(key: str, path: str | Path, ckpt: dict, model: nn.Module, what: str) -> None:
    """The checkpoint's weights are those of ``model``: same names, same shapes."""
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in ckpt.get("state_dict", ckpt).items()}
    missing, unexpected = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    resized = sorted(k for k in set(want) & set(got) if want[k] != got[k])
    if missing or unexpected or resized:
        example = (missing or unexpected or resized)[0]
        raise ConfigError(
            f"{key}={str(path)!r}: does not fit {what} ({len(missing)} missing, "
            f"{len(unexpected)} unexpected, {len(resized)} resized weights, e.g. {example!r})"
        )
