"""The console commands' ``main()`` functions, importing nothing of the training stack: Hydra
answers ``--help`` and ``--cfg job``, and the early config checks refuse a bad value in one line,
before Lightning, torchmetrics, the host or the methods are imported (each command's module is
imported to run it)."""

from __future__ import annotations

from solo_ext.commands.entry import Help, hydra_entry
from solo_ext.commands.options import (
    check_dense_probe_early,
    check_knn_early,
    check_linear_early,
    check_pretrain_early,
)

RUN = "pretrained_checkpoint_dir=<run dir>"

pretrain = hydra_entry(
    "solo-ext-pretrain",
    "solo_ext.commands.pretrain:run",
    early=check_pretrain_early,
    help_info=Help(
        "self-supervised pretraining with a recipe (solo-learn's main_pretrain.py: the same "
        "configs and overrides); the run goes to checkpoint.dir/<method>/<run id>.",
        (
            "solo-ext-pretrain --config-name <dataset>/<method> [key=value ...]",
            "e.g. solo-ext-pretrain --config-name cifar100-lt/dscl max_epochs=10",
        ),
        recipes="pretrain",
        example="cifar100-lt/dscl",
    ),
)
linear = hydra_entry(
    "solo-ext-linear",
    "solo_ext.commands.linear:run",
    "linear",
    check_linear_early,
    Help(
        "a linear classifier on a pretrained run's frozen backbone (DSCL's classifier stage on "
        "long-tailed data), on the GPU when there is one (accelerator=auto).",
        (
            f"solo-ext-linear {RUN} [key=value ...]  (the defaults below)",
            f"solo-ext-linear --config-name <dataset>/<method> {RUN} [key=value ...]",
            "e.g. solo-ext-linear --config-name cifar100-lt/dscl "
            "pretrained_checkpoint_dir=trained_models/dscl/<run id>",
        ),
        recipes="linear",
        example="cifar100-lt/dscl",
    ),
)
knn = hydra_entry(
    "solo-ext-knn",
    "solo_ext.commands.knn:run",
    "knn",
    check_knn_early,
    Help(
        "weighted kNN accuracy of a pretrained run's frozen features, extracted on the GPU "
        "when there is one (accelerator=auto).",
        (
            f"solo-ext-knn {RUN} [key=value ...]  (the defaults below)",
            f"solo-ext-knn --config-name <dataset>/<method> {RUN} [key=value ...]",
            "e.g. solo-ext-knn --config-name cifar100-lt/scl "
            "pretrained_checkpoint_dir=trained_models/scl/<run id>",
        ),
        recipes="knn",
        example="cifar100-lt/scl",
    ),
)
dense_probe = hydra_entry(
    "solo-ext-dense-probe",
    "solo_ext.commands.dense_probe:run",
    "dense_probe",
    check_dense_probe_early,
    Help(
        "a linear 1x1 probe of a pretrained run's last feature map on synthetic_lt's "
        "per-pixel labels (mIoU, pixel accuracy).",
        (
            f"solo-ext-dense-probe {RUN} [key=value ...]  (the defaults below)",
            "e.g. solo-ext-dense-probe pretrained_checkpoint_dir=trained_models/densecl/<run id>",
            "No recipes: a config of your own with --config-path <folder> --config-name <name>.",
        ),
    ),
)
