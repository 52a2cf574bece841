"""Config checks shared by methods and entry points: one-line errors naming key and value."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from solo_ext.common import did_you_mean
from solo_ext.data.facts import SOLO_SMALL_STEM, facts


class ConfigError(ValueError):
    """A bad config key or value; the message is one line naming both."""


def select(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg.<key>`` (dotted), or ``default`` when the key is missing or null (solo-learn's
    "None" string counts as null): one behaviour on both hosts, for the layers below them."""
    value = OmegaConf.select(cfg, key, default=None)
    return default if value is None or value == "None" else value


def check_choice(key: str, value: Any, choices: Iterable[str]) -> None:
    choices = sorted(choices)
    if value not in choices:
        hint = did_you_mean(str(value), choices) if isinstance(value, str) else ""
        raise ConfigError(f"{key}={value!r}: not one of {choices}{hint}")


def check_bool(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r}: must be true or false")


def require(cfg: DictConfig, *keys: str) -> None:
    """Raises for the first key that is missing (absent, null or ``???``)."""
    for key in keys:
        if OmegaConf.select(cfg, key, default=None) is None:
            raise ConfigError(f"{key} is missing from the config")


def fill_section(cfg: DictConfig, section: str, defaults: Mapping[str, Any]) -> DictConfig:
    """Fills ``cfg.<section>`` with ``defaults`` and rejects keys that are not among them.

    A typo such as ``method_kwargs.temprature`` must fail, not silently run with the default.
    """
    current = OmegaConf.select(cfg, section, default=None)
    if current is None:
        OmegaConf.update(cfg, section, {}, force_add=True)
        current = OmegaConf.select(cfg, section)
    for key in current:
        if key not in defaults:
            raise ConfigError(
                f"{section}.{key}={current[key]!r}: unknown key{did_you_mean(str(key), defaults)}; "
                f"valid keys: {sorted(defaults)}"
            )
    for key, value in defaults.items():
        if current.get(key) is None:
            current[key] = value
    return cfg


def check_range(
    key: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """Checks ``low <= value <= high`` (strict with ``low_open`` / ``high_open``)."""
    bad = not isinstance(value, (int, float)) or isinstance(value, bool)
    if not bad and low is not None:
        bad = value <= low if low_open else value < low
    if not bad and high is not None:
        bad = value >= high if high_open else value > high
    if bad:
        lo = "" if low is None else (f"> {low}" if low_open else f">= {low}")
        hi = "" if high is None else (f"< {high}" if high_open else f"<= {high}")
        raise ConfigError(
            f"{key}={value!r}: must be a number {' and '.join(filter(None, [lo, hi]))}"
        )


def world_size(cfg: DictConfig) -> int:
    """Processes of a run: ``devices`` (an int, a list, or solo-learn's "0,1" string) x
    ``num_nodes``."""
    devices = cfg.get("devices", 1)
    if isinstance(devices, int):
        n = max(devices, 1)
    elif isinstance(devices, str):
        n = int(devices) if devices.isdigit() else len(devices.split(","))
    else:
        n = len(devices) if devices is not None else 1
    return n * int(cfg.get("num_nodes") or 1)


def fill_stem_option(cfg: DictConfig) -> None:
    """Sets ``backbone.kwargs.small_image_stem: true`` for a ResNet on a 32 px dataset that
    solo-learn does not know by name (``cifar100_lt``, ``synthetic_lt``, ...), unless given.

    The key travels in ``args.json`` to every script that rebuilds the backbone; solo-learn's
    own CIFAR names are left to solo-learn, so their runs stay loadable without solo-ext.
    """
    name, dataset = str(cfg.backbone.name), str(cfg.data.dataset)
    if not name.startswith("resnet") or dataset in SOLO_SMALL_STEM:
        return
    if not facts(dataset).small_image_stem:
        return
    if OmegaConf.select(cfg, "backbone.kwargs", default=None) is None:
        cfg.backbone.kwargs = {}
    if cfg.backbone.kwargs.get("small_image_stem") is None:
        cfg.backbone.kwargs.small_image_stem = True
