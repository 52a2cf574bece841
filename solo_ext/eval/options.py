"""The classifier stage's keys (:mod:`solo_ext.eval.classifier_stage`), declared once for both
entry points; nothing here imports torch, so ``solo-ext-linear`` checks them before the training
stack is imported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import ListConfig

from solo_ext.config import IN_CONF, Option, conf_options

# the decoupled stages (:mod:`solo_ext.eval.decoupled`), on features extracted once
DECOUPLED_STAGES = ("crt", "tau_norm", "lws", "logit_adjust")
# every classifier stage ``solo-ext-linear`` runs: ``balanced_linear`` is the stage below (the
# published one on long-tailed data)
CLASSIFIER_STAGES = ("balanced_linear", *DECOUPLED_STAGES)

# null: decided by the dataset (classifier_stage); the defaults are solo-ext-linear's conf file's
CLASSIFIER_STAGE_OPTIONS: dict[str, Option] = conf_options(
    "linear",
    {
        "backbone_bn": Option(IN_CONF, "str", choices=("train", "eval"), nullable=True),
        "classifier_init": Option(IN_CONF, "str", choices=("normal", "default"), nullable=True),
        "train_augmentation": Option(
            IN_CONF, "str", choices=("pretrain", "published", "solo-learn"), nullable=True
        ),
    },
)


@dataclass(frozen=True)
class StageList(Option):
    """``classifier_stage``: one of :data:`CLASSIFIER_STAGES`, ``all``, or a list of distinct
    stages."""

    def valid(self, value: Any) -> bool:
        if isinstance(value, str):
            return value == "all" or value in CLASSIFIER_STAGES
        if not isinstance(value, (list, tuple, ListConfig)) or not value:
            return False
        names = list(value)
        return all(n in CLASSIFIER_STAGES for n in names) and len(set(names)) == len(names)

    def describe(self) -> str:
        return f"one of {list(CLASSIFIER_STAGES)}, 'all', or a list of them"


def stages_of(value: Any) -> list[str]:
    """The stages a checked ``classifier_stage`` names, in :data:`CLASSIFIER_STAGES` order."""
    names = CLASSIFIER_STAGES if value == "all" else [value] if isinstance(value, str) else value
    return [n for n in CLASSIFIER_STAGES if n in names]


# the decoupled stages' training on the cached features (Kang et al.'s ImageNet-LT stage-2
# configs: SGD, momentum 0.9, weight decay 5e-4, batch 512 at lr 0.2, a cosine decay to 0 per
# epoch; cRT 10 epochs, LWS 5) and their tau choices; the defaults are solo-ext-linear's conf
DECOUPLED_OPTIONS: dict[str, Option] = conf_options(
    "linear",
    {
        "classifier_stage": StageList(IN_CONF, "list"),
        "decoupled.epochs": Option(IN_CONF, "int", 1),
        "decoupled.lws_epochs": Option(IN_CONF, "int", 1),
        "decoupled.batch_size": Option(IN_CONF, "int", 1),
        "decoupled.lr": Option(IN_CONF, "float", 0, low_open=True),
        "decoupled.weight_decay": Option(IN_CONF, "float", 0),
        "decoupled.momentum": Option(IN_CONF, "float", 0, 1, high_open=True),
        "decoupled.held_out_fraction": Option(
            IN_CONF, "float", 0, 1, low_open=True, high_open=True
        ),
        "decoupled.tau_max": Option(IN_CONF, "float", 0),
        "decoupled.tau_steps": Option(IN_CONF, "int", 1),
        "decoupled.logit_adjust_tau": Option(IN_CONF, "float", 0),
    },
)
