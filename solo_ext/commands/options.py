"""The option tables the console commands check before the training stack is imported, and
those checks (``commands.mains`` runs them): nothing here imports torch, Lightning or the host."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from typing import Any

from omegaconf import DictConfig, ListConfig

from solo_ext.common import DISTANCES
from solo_ext.config import (
    BACKBONE_OPTIONS,
    CORE_RUN_OPTIONS,
    IN_CONF,
    ConfigError,
    Option,
    check_options,
    conf_options,
    require,
    select,
)
from solo_ext.data.options import DATA_KEYS, check_dali_keys
from solo_ext.eval.options import CLASSIFIER_STAGE_OPTIONS, DECOUPLED_OPTIONS
from solo_ext.runs.keys import run_key

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
    the methods) is imported: a missing key, a declared run, backbone or data key out of range,
    an unknown ``dali`` key."""
    require(cfg, *PRETRAIN_REQUIRED)
    check_options(cfg, {**CORE_RUN_OPTIONS, **PRETRAIN_OPTIONS})
    check_options(cfg, BACKBONE_OPTIONS)
    check_dali_keys(cfg)
    check_options(cfg, DATA_KEYS)


# where the evaluation commands run (solo-ext-knn's feature extraction; solo-ext-linear's too,
# and its training): Lightning's accelerator names; the default is each command's conf file's
ACCELERATOR = Option(
    IN_CONF,
    "str",
    choices=("auto", "cpu", "gpu"),
    help="where the features are extracted (and a classifier trained): `gpu`, `cpu`, or "
    "`auto`, the GPU when torch sees one",
)
# the feature extraction's loader: images per batch, and the processes that load them
EXTRACTION_BATCH = Option(IN_CONF, "int", 1, help="images per batch of the feature extraction")
EXTRACTION_WORKERS = Option(
    IN_CONF,
    "int",
    0,
    nullable=True,
    help="data-loading processes of the feature extraction; null: the run's data.num_workers",
)


def check_accelerator(cfg: DictConfig) -> None:
    """``accelerator=gpu`` on a machine where torch sees no GPU stops in one line, before any
    work (torch is imported only to ask)."""
    if select(cfg, "accelerator") == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                "accelerator='gpu': torch sees no GPU on this machine "
                "(torch.cuda.is_available() is False); accelerator=auto or cpu runs on the CPU"
            )


@dataclass(frozen=True)
class KList(Option):
    """``k``: a neighbour count >= 1, or a list of distinct ones (as solo-learn's
    ``main_knn.py`` takes several); the first is reported as ``knn_*``, each further one as
    ``knn_k<k>_*``."""

    def valid(self, value: Any) -> bool:
        one = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1  # noqa: E731
        if isinstance(value, (list, tuple, ListConfig)):
            return bool(value) and all(map(one, value)) and len(set(value)) == len(value)
        return one(value)

    def describe(self) -> str:
        return "an integer >= 1 or a list of distinct ones"


def neighbour_counts(value: Any) -> list[int]:
    """A checked ``k`` as a list (the reported one first)."""
    return [int(v) for v in value] if isinstance(value, (list, tuple, ListConfig)) else [int(value)]


# every key solo-ext-knn reads, declared once; the defaults are conf/knn.yaml's
KNN_OPTIONS: dict[str, Option] = conf_options(
    "knn",
    {
        "k": KList(IN_CONF, "list"),
        "temperature": Option(IN_CONF, "float", 0, low_open=True),
        "distance": Option(IN_CONF, "str", choices=DISTANCES),
        "accelerator": ACCELERATOR,
        "batch_size": EXTRACTION_BATCH,
        "num_workers": EXTRACTION_WORKERS,
    },
)


def check_knn_early(cfg: DictConfig) -> None:
    """What a ``solo-ext-knn`` config is refused for before the training stack is imported
    (``run`` checks it again: it is also called directly)."""
    run_key(cfg)
    check_options(cfg, KNN_OPTIONS)
    check_options(cfg, DATA_KEYS)
    check_accelerator(cfg)


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
    run_key(cfg)
    check_options(cfg, DENSE_PROBE_OPTIONS)
    check_options(cfg, DATA_KEYS)


# solo-learn's ``scheduler.name`` values that the probe follows, stepped once per epoch:
# ``step`` multiplies the lr by 0.1 at each of ``scheduler.lr_decay_steps`` (MultiStepLR);
# ``warmup_cosine`` and ``cosine`` decay it along a cosine to 0 (``warmup_epochs`` not used);
# ``none`` keeps it constant
SCHEDULERS = ("warmup_cosine", "cosine", "step", "none")


@dataclass(frozen=True)
class EpochList(Option):
    """A non-empty list of increasing epochs >= 1 (``scheduler.lr_decay_steps``)."""

    def valid(self, value: Any) -> bool:
        if value is None:
            return self.nullable
        if not isinstance(value, (list, tuple, ListConfig)) or not value:
            return False
        if not all(isinstance(v, Integral) and not isinstance(v, bool) and v >= 1 for v in value):
            return False
        return all(a < b for a, b in zip(value, list(value)[1:]))

    def describe(self) -> str:
        return "a list of increasing epochs >= 1" + (" (or null)" if self.nullable else "")


# the defaults are solo-ext-linear's packaged conf file's
SCHEDULE_OPTIONS: dict[str, Option] = conf_options(
    "linear",
    {
        "optimizer.kwargs.momentum": Option(IN_CONF, "float", 0, 1, high_open=True),
        "scheduler.name": Option(IN_CONF, "str", choices=SCHEDULERS, nullable=True),
        "scheduler.lr_decay_steps": EpochList(IN_CONF, "list", nullable=True),
    },
)


# every key solo-ext-linear reads, declared once; the defaults are conf/linear.yaml's; null: by
# the evaluated data (classifier_stage.STAGE_SCHEDULES)
LINEAR_OPTIONS: dict[str, Option] = {
    **conf_options(
        "linear",
        {
            "max_epochs": Option(IN_CONF, "int", 1, nullable=True),
            "feature_norm": Option(IN_CONF, "bool"),
            "optimizer.name": Option("sgd", "str", choices=("sgd",)),
            "optimizer.lr": Option(IN_CONF, "float", 0, low_open=True, nullable=True),
            "optimizer.weight_decay": Option(IN_CONF, "float", 0, nullable=True),
            "optimizer.batch_size": Option(IN_CONF, "int", 1, nullable=True),
            "dali.device": Option(IN_CONF, "str", choices=("gpu", "cpu"), nullable=True),
            "enable_progress_bar": Option(True, "bool"),
            "seed": Option(IN_CONF, "int", 0),
            "accelerator": ACCELERATOR,
            "devices": Option(IN_CONF, "devices"),
            "features.batch_size": EXTRACTION_BATCH,
            "features.num_workers": EXTRACTION_WORKERS,
        },
    ),
    **SCHEDULE_OPTIONS,
    **CLASSIFIER_STAGE_OPTIONS,
    **DECOUPLED_OPTIONS,
}


def check_step_epochs(cfg: DictConfig) -> None:
    """``scheduler.name: step`` needs the epochs at which it steps the lr down."""
    if select(cfg, "scheduler.name") == "step" and select(cfg, "scheduler.lr_decay_steps") is None:
        raise ConfigError(
            "scheduler.lr_decay_steps is missing (scheduler.name='step' multiplies the lr "
            "by 0.1 at each of these epochs)"
        )


def check_linear_early(cfg: DictConfig) -> None:
    """What a ``solo-ext-linear`` config is refused for before the training stack is imported:
    no run named (or two), a declared key out of range (the data keys given here too), an
    unknown ``dali`` key, ``step`` without its epochs, and a GPU asked for where there is none."""
    run_key(cfg)
    check_options(cfg, LINEAR_OPTIONS)
    check_options(cfg, DATA_KEYS)
    check_dali_keys(cfg)
    check_step_epochs(cfg)
    check_accelerator(cfg)
