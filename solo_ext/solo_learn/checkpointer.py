"""``solo.utils.checkpointer``: atomic checkpoint writes, the run's environment in ``args.json``,
the last validation values in ``metrics.json``, and a resumed solo-ext run continuing in its own
directory.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from solo_ext.solo_learn import parsed
from solo_ext.solo_learn.check import method_of, sets

# the names of the solo-learn module this patch needs (checked before it applies)
NEEDS = (
    method_of("Checkpointer", "initial_setup", "save_args", "save"),
    sets("Checkpointer", "initial_setup", "path", "ckpt_placeholder", "last_ckpt"),
)


def _resumed_dir(checkpointer: Any, trainer: Any) -> Any:
    """The run directory that a solo-ext run resumed from one of this checkpointer's
    checkpoints (``<dir>/<method>/<id>/``) continues in; None for another checkpoint or a
    config of solo-learn's alone. (solo-learn names the directory after the logger's version:
    with wandb the resumed run's id, so it continues there itself; with Lightning's default
    logger a new version, so a new directory.)"""
    from pathlib import Path

    ckpt = getattr(trainer, "ckpt_path", None)
    if not ckpt or not parsed.uses_solo_ext(checkpointer.cfg):
        return None
    run_dir = Path(ckpt).resolve().parent
    return run_dir if run_dir.parent == checkpointer.logdir.resolve() else None


def apply(module: ModuleType) -> None:
    base = module.Checkpointer
    setup = base.initial_setup

    @functools.wraps(setup)
    def initial_setup(self, trainer):
        """solo-learn's run directory, with two additions: every checkpoint write of the run
        is atomic (a temporary file, fsync, rename: a killed write leaves the previous file
        whole), and a solo-ext run resumed from one of its checkpoints continues in that run's
        directory, as solo-ext-pretrain's do (the temporary files of killed writes there are
        removed first)."""
        from pathlib import Path

        from lightning.pytorch.plugins.io import TorchCheckpointIO

        from solo_ext.runs.resume import AtomicSaveIO, remove_stale_temporaries

        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # (not a user's own)
            trainer.strategy.checkpoint_io = AtomicSaveIO()
        setup(self, trainer)
        resumed = _resumed_dir(self, trainer)
        if resumed is not None and resumed != self.path.resolve():
            if trainer.is_global_zero and self.path.is_dir() and not any(self.path.iterdir()):
                self.path.rmdir()  # (the new version's directory, made just now)
            self.path = resumed
            self.ckpt_placeholder = f"{self.cfg.name}-{resumed.name}" + "-ep={}.ckpt"
        if resumed is not None:
            # the checkpoint resumed from is the run's last: replaced by the next one, as in
            # the uninterrupted run (unless checkpoint.keep_prev)
            self.last_ckpt = Path(trainer.ckpt_path)
        if trainer.is_global_zero and getattr(trainer, "ckpt_path", None):
            remove_stale_temporaries(Path(trainer.ckpt_path).parent)

    @functools.wraps(base.save_args)
    def save_args(self, trainer):
        """solo-learn's ``args.json``, written atomically, with the run's environment
        (``environment``: versions, device, precision, processes), as ``solo-ext-pretrain``
        writes it."""
        if not trainer.is_global_zero:
            return
        import json

        from omegaconf import OmegaConf

        from solo_ext.common import atomic_write_text
        from solo_ext.runs.environment import of_trainer

        args = OmegaConf.to_container(self.cfg)  # solo-learn's content, its keys in its order
        args["wandb_run_id"] = getattr(self, "wandb_run_id", None)
        data_format = parsed.RUN.data.get("format") if parsed.RUN is not None else None
        args["environment"] = of_trainer(trainer, data_format)
        text = json.dumps(args, default=lambda o: "<not serializable>")
        atomic_write_text(self.path / "args.json", text)

    validation_end = base.on_validation_end

    @functools.wraps(validation_end)
    def on_validation_end(self, trainer, pl_module):
        """The run's last validation values (``val_*``) in ``metrics.json`` beside its
        checkpoints, whichever logger it has, as ``solo-ext-pretrain`` keeps them."""
        validation_end(self, trainer, pl_module)
        if getattr(self, "path", None) is not None:
            from solo_ext.eval.metrics_file import update_validation

            update_validation(trainer, self.path)

    base.initial_setup = initial_setup
    base.save_args = save_args
    base.on_validation_end = on_validation_end
