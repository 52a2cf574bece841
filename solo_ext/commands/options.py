"""The option tables the console commands check before the training stack is imported, and
those checks (``commands.mains`` runs them): nothing here imports torch, Lightning or the host."""

from __future__ import annotations

from omegaconf import DictConfig

from solo_ext.common import DISTANCES
from solo_ext.config import (
    BACKBONE_OPTIONS,
    CORE_RUN_OPTIONS,
    IN_CONF,
    Option,
    check_options,
    conf_options,
    require,
)

# the numbers of solo-learn's pretraining keys that solo-ext passes on to torch and Lightning,
# but the three whose choices Lightning registers (``commands.pretrain.RUN_OPTIONS`` adds them):
# checked before the training stack is imported (null: the default)
PRETRAIN_OPTIONS: dict[str, Option] = {
    "max_epochs": Option(None, "int", 1),
    "optimizer.batch_size": Option(None, "int", 1),
    "optimizer.lr": Option(None, "float", 0, low_open=True),
    "log_every_n_steps": Option(50, "int", 1),
    "sync_batchnorm": Option(False, "bool"),
    "check_val_every_n_epoch": Option(1, "int", 1),
    "max_steps": Option(-1, "int", -1),
    "num_sanity_val_steps": Option(2, "int", -1),
    "gradient_clip_val": Option(None, "float", 0, nullable=True),
    "limit_train_batches": Option(1.0, "float", 0, low_open=True),
    "limit_val_batches": Option(1.0, "float", 0),
    "enable_progress_bar": Option(True, "bool"),
    "deterministic": Option(False, "bool", choices=("warn",)),
    "benchmark": Option(None, "bool", nullable=True),
}
# the keys a pretraining config must give
PRETRAIN_REQUIRED = (
    "method",
    "backbone.name",
    "data.dataset",
    "optimizer.name",
    "optimizer.batch_size",
    "optimizer.lr",
    "max_epochs",
    "augmentations",
)


def check_pretrain_early(cfg: DictConfig) -> None:
    """What a pretraining config is refused for before the training stack (Lightning, the host,
    the methods) is imported: a missing key and a declared run or backbone key out of range."""
    require(cfg, *PRETRAIN_REQUIRED)
    check_options(cfg, {**CORE_RUN_OPTIONS, **PRETRAIN_OPTIONS})
    check_options(cfg, BACKBONE_OPTIONS)


# every key solo-ext-knn reads, declared once; the defaults are conf/knn.yaml's
KNN_OPTIONS: dict[str, Option] = conf_options(
    "knn",
    {
        "k": Option(IN_CONF, "int", 1),
        "temperature": Option(IN_CONF, "float", 0, low_open=True),
        "distance": Option(IN_CONF, "str", choices=DISTANCES),
        "batch_size": Option(IN_CONF, "int", 1),
    },
)


def check_knn_early(cfg: DictConfig) -> None:
    """What a ``solo-ext-knn`` config is refused for before the training stack is imported."""
    check_options(cfg, KNN_OPTIONS)


# every key solo-ext-dense-probe reads, declared once; the defaults are conf/dense_probe.yaml's
DENSE_PROBE_OPTIONS: dict[str, Option] = conf_options(
    "dense_probe",
    {
        "max_epochs": Option(IN_CONF, "int", 1),
        "optimizer.lr": Option(IN_CONF, "float", 0, low_open=True),
        "optimizer.weight_decay": Option(IN_CONF, "float", 0),
        "optimizer.batch_size": Option(IN_CONF, "int", 1),
        "num_plot": Option(IN_CONF, "int", 0),
        "seed": Option(IN_CONF, "int", 0),
    },
)


def check_dense_probe_early(cfg: DictConfig) -> None:
    """What a ``solo-ext-dense-probe`` config is refused for before the training stack."""
    check_options(cfg, DENSE_PROBE_OPTIONS)
