"""Each default has one home: the declarations (``Option`` tables) are what the commands fill in,
and the packaged conf files of the evaluation commands say the same."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from solo_ext.config import CORE_RUN_OPTIONS, run_default
from solo_ext.pretrain import RUN_OPTIONS, parse_cfg

ROOT = Path(__file__).resolve().parents[1]
# keys parse_cfg changes after filling them (solo-learn's linear scaling of the learning rates)
SCALED = ("optimizer.lr", "optimizer.classifier_lr")


def minimal_cfg(tmp_path):
    """A run config with only what parse_cfg requires."""
    return OmegaConf.create(
        {
            "method": "scl",
            "backbone": {"name": "resnet18"},
            "data": {"dataset": "synthetic_lt", "num_classes": 4},
            "optimizer": {"name": "sgd", "batch_size": 256, "lr": 0.1},
            "scheduler": {"name": "warmup_cosine"},
            "max_epochs": 1,
            "augmentations": [{"crop_size": 32, "num_crops": 2}],
            "method_kwargs": {"queue_size": 256},
            "checkpoint": {"dir": str(tmp_path)},
        }
    )


def test_parse_cfg_fills_every_declared_default(tmp_path):
    cfg = parse_cfg(minimal_cfg(tmp_path))
    filled = []
    for key, option in RUN_OPTIONS.items():
        if option.default is None or key in SCALED or key == "checkpoint.dir":
            continue
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None:  # (Lightning's own keys are filled by Lightning, not here)
            assert value == option.default, key
            filled.append(key)
    assert set(CORE_RUN_OPTIONS) - {"checkpoint.dir", "wandb.entity", *SCALED} <= set(filled)
    # batch 256: the scaled learning rates are the given ones
    assert cfg.optimizer.classifier_lr == run_default("optimizer.classifier_lr")


def test_solo_ext_pretrain_takes_in_the_core_declarations():
    for key, option in CORE_RUN_OPTIONS.items():
        assert RUN_OPTIONS[key] is option, key


@pytest.mark.parametrize("command", ["knn", "linear", "dense_probe"])
def test_the_evaluation_conf_files_say_what_the_declarations_say(command):
    import importlib

    options = importlib.import_module(f"solo_ext.{command}").OPTIONS
    conf = OmegaConf.load(ROOT / "solo_ext" / "conf" / f"{command}.yaml")
    compared = 0
    for key, option in options.items():
        value = OmegaConf.select(conf, key, default=None)
        if value is None or option.default is None:
            continue
        shown = list(value) if OmegaConf.is_list(value) else value
        assert shown == option.default or shown == list(option.default or ()), key
        compared += 1
    assert compared >= 3, command
