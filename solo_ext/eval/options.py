"""The classifier stage's keys (:mod:`solo_ext.eval.classifier_stage`), declared once for both
doors; nothing here imports torch, so ``solo-ext-linear`` checks them before the training stack
is imported."""

from __future__ import annotations

from solo_ext.config import IN_CONF, Option, conf_options

# null: decided by the dataset (classifier_stage); the defaults are solo-ext-linear's conf file's
CLASSIFIER_STAGE_OPTIONS: dict[str, Option] = conf_options(
    "linear",
    {
        "backbone_bn": Option(IN_CONF, "str", choices=("train", "eval"), nullable=True),
        "classifier_init": Option(IN_CONF, "str", choices=("normal", "default"), nullable=True),
        "train_augmentation": Option(
            IN_CONF, "str", choices=("published", "solo-learn"), nullable=True
        ),
    },
)
