"""The keys that name the pretrained run an evaluation command reads, checked before the
training stack is imported (nothing here imports torch)."""

from __future__ import annotations

from typing import Any

from solo_ext.config import ConfigError, select

# solo-ext's key: the run directory (its args.json and newest checkpoint)
RUN_DIR_KEY = "pretrained_checkpoint_dir"
# solo-learn's key (its linear configs'): the checkpoint file; solo-ext also takes the directory
CHECKPOINT_KEY = "pretrained_feature_extractor"


def run_key(cfg: Any) -> tuple[str, str]:
    """The key that names the run in ``cfg`` and its value: ``pretrained_checkpoint_dir`` or
    ``pretrained_feature_extractor``; neither, or both, stops in one line."""
    run_dir, ckpt = select(cfg, RUN_DIR_KEY), select(cfg, CHECKPOINT_KEY)
    if run_dir is None and ckpt is None:
        raise ConfigError(
            f"{RUN_DIR_KEY} is missing: give the pretrained run's directory, "
            f"{RUN_DIR_KEY}=trained_models/<method>/<run id>"
        )
    if run_dir is not None and ckpt is not None:
        raise ConfigError(
            f"{RUN_DIR_KEY}={str(run_dir)!r} and {CHECKPOINT_KEY}={str(ckpt)!r}: give one of "
            "them (the run directory, or its checkpoint)"
        )
    return (RUN_DIR_KEY, str(run_dir)) if run_dir is not None else (CHECKPOINT_KEY, str(ckpt))
