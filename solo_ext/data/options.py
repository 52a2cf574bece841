"""The keys of ``data`` that solo-ext reads, declared once (the datasets, DALI and both entry points
check a given value against them)."""

from __future__ import annotations

from omegaconf import DictConfig

import solo_ext.facts as F
from solo_ext.common import did_you_mean
from solo_ext.config import ConfigError, Option, check_options, select

BAD_IMAGE_MODES = ("error", "skip", "off")

# ``data.synthetic`` of synthetic_lt, declared once: the config's defaults and the constructor's
SYNTHETIC_OPTIONS: dict[str, Option] = {
    "n_max": Option(200, "int", 1),
    "val_per_class": Option(20, "int", 1),
    "image_size": Option(32, "int", 8),
    "seed": Option(0, "int", 0),
}

# the keys of ``data`` that solo-ext reads, declared once: filled from here and checked against
# their declaration when given, whatever the dataset (paths and split files are checked on disk)
DATA_OPTIONS: dict[str, Option] = {
    "format": Option("image_folder", "str", choices=("image_folder", "dali")),
    "num_workers": Option(4, "int", 0),
    "no_labels": Option(False, "bool"),
    # solo-learn's subset of a dataset: solo-ext trains on whole ones (-1 or 1)
    "fraction": Option(-1, "float", -1, 1),
    "download": Option(False, "bool"),
    "many_threshold": Option(F.MANY_THRESHOLD, "int", 1),
    "few_threshold": Option(F.FEW_THRESHOLD, "int", 0),
    # image folders: files PIL cannot open stop the start ("error"), are left out and counted
    # ("skip"), or are not looked for ("off")
    "bad_images": Option("error", "str", choices=BAD_IMAGE_MODES),
    "num_classes": Option(None, "int", 2, nullable=True),  # None: the data decides
}
# the keys of the long-tailed datasets (imbalance_factor None: 100, synthetic_lt 10; lt_n_max,
# the head class's images: None, all of a class (CIFAR, Fashion-MNIST) or, for custom_lt, the
# largest profile every class of the source can fill)
LT_OPTIONS: dict[str, Option] = {
    "imbalance_factor": Option(None, "float", 1, nullable=True),
    "lt_seed": Option(0, "int", 0),
    "lt_n_max": Option(None, "int", 1, nullable=True),
}
# all of them by their dotted key from the config's root (what a command checks when given)
DATA_KEYS: dict[str, Option] = {
    **{f"data.{key}": option for key, option in {**DATA_OPTIONS, **LT_OPTIONS}.items()},
    **{f"data.synthetic.{key}": option for key, option in SYNTHETIC_OPTIONS.items()},
}

# solo-learn's ``dali`` section as solo-ext reads it (the default is solo-learn's)
DALI_OPTIONS: dict[str, Option] = {
    "dali.device": Option("gpu", "str", choices=("gpu", "cpu")),
    # solo-learn's (its DALI loaders put the sample index into the label)
    "dali.encode_indexes_into_labels": Option(False, "bool"),
}


def check_dali_keys(cfg: DictConfig) -> None:
    """Every key under ``dali`` declared and valid, whether or not DALI reads the data (both
    entry points, before any work): one line naming the key and the value."""
    section = select(cfg, "dali")
    if section is None:
        return
    if not isinstance(section, DictConfig):
        raise ConfigError(f"dali={section!r}: must be a section (dali.device: gpu or cpu)")
    known = [key.split(".", 1)[1] for key in DALI_OPTIONS]
    for key in section:
        if key not in known:
            raise ConfigError(
                f"dali.{key}={section[key]!r}: unknown key{did_you_mean(str(key), known)}; "
                f"valid keys: {known}"
            )
    check_options(cfg, DALI_OPTIONS)
