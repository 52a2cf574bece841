"""Config checks shared by methods and entry points: one-line errors naming key and value."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import textwrap
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from solo_ext.common import DISTANCES, HostError, did_you_mean
from solo_ext.facts import SOLO_SMALL_STEM, facts


class ConfigError(ValueError):
    """A bad config key or value; the message is one line naming both."""


class MissingKeyError(ConfigError):
    """A key the config must give is missing (``key``: which)."""

    def __init__(self, key: str):
        super().__init__(f"{key} is missing from the config")
        self.key = key


# Errors a user can fix from the message alone: printed as one line, no traceback.
USER_ERRORS = (ConfigError, HostError, FileNotFoundError)


@contextlib.contextmanager
def one_line_errors(prog: str) -> Iterator[None]:
    """Turns user errors into ``<prog>: error: <message>`` on stderr and exit status 2."""
    try:
        yield
    except USER_ERRORS as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None


def select(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg.<key>`` (dotted), or ``default`` when the key is missing or null (solo-learn's
    "None" string counts as null): one behaviour on both hosts, for the layers below them. A
    plain dict (a run's ``args.json``) is read the same way."""
    if isinstance(cfg, dict):
        cfg = OmegaConf.create(cfg)
    value = OmegaConf.select(cfg, key, default=None)
    return default if value is None or value == "None" else value


def check_choice(key: str, value: Any, choices: Iterable[str]) -> None:
    choices = sorted(choices)
    if value not in choices:
        hint = did_you_mean(str(value), choices) if isinstance(value, str) else ""
        raise ConfigError(f"{key}={value!r}: not one of {choices}{hint}")


def require(cfg: DictConfig, *keys: str) -> None:
    """Raises for the first key that is missing (absent, null or ``???``)."""
    for key in keys:
        if OmegaConf.select(cfg, key, default=None) is None:
            raise MissingKeyError(key)


@dataclass(frozen=True)
class Option:
    """One config key, declared: its default, its kind and its bounds. A method declares its
    ``method_kwargs`` as ``{key: Option}``; both hosts and every entry point fill and check the
    section from that one table (``fill_options`` / ``check_options``).

    ``kind``: ``"int"``, ``"float"``, ``"bool"``, ``"str"`` (one of ``choices``), ``"text"``
    (any string: a path, a name), ``"pair"`` (``[low, high]``, both inside the bounds) or
    ``"devices"`` (Lightning's: a count, -1 for all, ``auto``, a list of indices or a string
    of them, ``"0,1"``). A
    number kind may also take one of ``choices`` (DSCL's ``alpha: scl``). ``nullable``: None
    is a valid value (a default decided later).
    """

    default: Any
    kind: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()
    nullable: bool = False
    help: str = ""  # what the key does, in a few words (docstrings and the README list it)

    def bounds(self) -> str:
        lo = "" if self.low is None else (f"> {self.low}" if self.low_open else f">= {self.low}")
        hi = (
            "" if self.high is None else (f"< {self.high}" if self.high_open else f"<= {self.high}")
        )
        return " and ".join(filter(None, [lo, hi]))

    def describe(self) -> str:
        """What a valid value is, in words (the end of the one-line error)."""
        if self.kind == "bool":
            text = "true or false" + (f" or one of {sorted(self.choices)}" if self.choices else "")
        elif self.kind == "str":
            text = f"one of {sorted(self.choices)}"
        elif self.kind == "text":
            text = "a string"
        elif self.kind == "devices":
            text = "a count (-1: all), 'auto', a list of device indices or a string of them"
        else:
            noun = {
                "int": "an integer",
                "float": "a number",
                "pair": "[low, high] with low <= high, each",
            }
            text = " ".join(filter(None, [noun[self.kind], self.bounds()]))
            if self.choices:
                text += f" or one of {sorted(self.choices)}"
        return text + (" (or null)" if self.nullable else "")

    def _number_inside(self, value: Any, integer: bool = False) -> bool:
        if isinstance(value, bool) or not isinstance(value, Integral if integer else Real):
            return False
        if not math.isfinite(value):  # nan and inf are never a setting
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def valid(self, value: Any) -> bool:
        if value is None:
            return self.nullable
        if isinstance(value, str) and value in self.choices:
            return True
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "text":
            return isinstance(value, str)
        if self.kind == "devices":
            return device_count(value) is not None
        if self.kind == "str" and isinstance(value, Integral) and not isinstance(value, bool):
            return str(value) in self.choices  # a choice spelt as a number (precision=32)
        if self.kind == "pair":
            if not isinstance(value, (list, tuple, ListConfig)) or len(value) != 2:
                return False
            low, high = value
            return self._number_inside(low) and self._number_inside(high) and low <= high
        return self.kind != "str" and self._number_inside(value, integer=self.kind == "int")

    def check(self, key: str, value: Any) -> None:
        if not self.valid(value):
            shown = list(value) if isinstance(value, ListConfig) else value
            hint = did_you_mean(value, self.choices) if isinstance(value, str) else ""
            raise ConfigError(f"{key}={shown!r}: must be {self.describe()}{hint}")


def shown(value: Any) -> str:
    """A default as a config file writes it (``true``, ``0.07``, ``[0.05, 0.6]``, `random`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, str):
        return f"`{value}`"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    return str(value)


def option_entries(options: Mapping[str, Option]) -> list[str]:
    """One entry per key, from its declaration: "`key` (default <value>): <help>" (Markdown; a
    null default, decided later, is said by the help)."""
    out = []
    for key, option in options.items():
        default = "" if option.default is None else f" (default {shown(option.default)})"
        out.append(f"`{key}`{default}: {option.help}" if option.help else f"`{key}`{default}")
    return out


def options_docstring(options: Mapping[str, Option], section: str = "method_kwargs") -> str:
    """The list of ``options`` for a docstring (what :func:`option_entries` says, in reST)."""
    lines = [f"Config (``{section}``, from the declarations):"]
    for entry in option_entries(options):
        text = entry.replace("`", "``")
        lines += textwrap.wrap(
            text, 92, initial_indent="    ", subsequent_indent="        ", break_on_hyphens=False
        )
    return "\n".join(lines)


# the keys solo-learn's ``BaseMethod`` / ``BaseMomentumMethod`` fill, with solo-learn's defaults:
# the embedded host fills them from here (a test holds solo-learn's own to them)
HOST_OPTIONS: dict[str, Option] = {
    "optimizer.exclude_bias_n_norm_wd": Option(False, "bool"),
    "scheduler.interval": Option("step", "str", choices=("step", "epoch")),
    "scheduler.warmup_epochs": Option(10, "float", 0),
    "scheduler.min_lr": Option(0.0, "float", 0),
    "scheduler.warmup_start_lr": Option(3e-5, "float", 0),
    "momentum.base_tau": Option(0.99, "float", 0, 1),
    "momentum.final_tau": Option(1.0, "float", 0, 1),
    "momentum.classifier": Option(False, "bool"),
    "knn_eval.enabled": Option(False, "bool"),
    "knn_eval.k": Option(20, "int", 1),
    "knn_eval.distance_func": Option("euclidean", "str", choices=DISTANCES),
    "performance.disable_channel_last": Option(False, "bool"),
    "accumulate_grad_batches": Option(1, "int", 1),
}
# the crop counts: solo-learn's parse_cfg counts them from ``augmentations`` (so does
# solo-ext-pretrain); a method built from a config without them (the embedded host) takes these
CROP_OPTIONS: dict[str, Option] = {
    "data.num_large_crops": Option(2, "int", 1),
    "data.num_small_crops": Option(0, "int", 0),
}

# the run's keys whose defaults the modules under the commands read too (the patches, the
# resumer, the embedded host), declared here once; solo-ext-pretrain's RUN_OPTIONS takes them
# in. The defaults are solo-learn's.
CORE_RUN_OPTIONS: dict[str, Option] = {
    **HOST_OPTIONS,
    "seed": Option(5, "int", 0),
    "devices": Option(1, "devices"),
    "optimizer.classifier_lr": Option(0.1, "float", 0, low_open=True),
    "optimizer.weight_decay": Option(0.0, "float", 0),
    "optimizer.kwargs.momentum": Option(0.9, "float", 0, 1, high_open=True),
    "checkpoint.enabled": Option(True, "bool"),
    "checkpoint.dir": Option("trained_models", "text"),
    "checkpoint.frequency": Option(1, "int", 1),
    "checkpoint.keep_prev": Option(False, "bool"),
    "auto_resume.enabled": Option(False, "bool"),
    "auto_resume.max_hours": Option(36, "float", 0, low_open=True),
    "wandb.enabled": Option(False, "bool"),
    "wandb.entity": Option(None, "text", nullable=True),
    "wandb.project": Option("solo-learn", "text"),
    "wandb.offline": Option(False, "bool"),
    "num_nodes": Option(1, "int", 1),
    "debug_augmentations": Option(False, "bool"),
}


# what solo-ext reads of ``backbone.kwargs`` (the rest goes to the backbone's constructor)
BACKBONE_OPTIONS: dict[str, Option] = {
    "backbone.kwargs.small_image_stem": Option(False, "bool"),
    "backbone.kwargs.patch_size": Option(16, "int", 1),
}


def declared(cfg: Any, key: str, options: Mapping[str, Option]) -> Any:
    """``cfg.<key>``, or the default ``options`` declare for it when missing or null."""
    return select(cfg, key, options[key].default)


class _InConf:
    """The default of an option that its command's packaged conf file states."""

    def __repr__(self) -> str:
        return "<in the packaged conf file>"


# the default of an evaluation command's option: the value ``solo_ext/conf/<command>.yaml``
# gives it (that file is the default's one home; :func:`conf_options` reads it)
IN_CONF: Any = _InConf()
_ABSENT = object()


def packaged_conf(command: str) -> DictConfig:
    """The packaged defaults of an evaluation command, ``solo_ext/conf/<command>.yaml``."""
    return OmegaConf.load(Path(__file__).parent / "conf" / f"{command}.yaml")


def conf_options(command: str, options: Mapping[str, Option]) -> dict[str, Option]:
    """``options`` with each ``IN_CONF`` default read from the command's packaged conf file.

    A key that the file states must be declared ``IN_CONF``, and an ``IN_CONF`` key must be in
    the file: a default written in both places stops the import.
    """
    conf = packaged_conf(command)
    out = {}
    for key, option in options.items():
        value = OmegaConf.select(conf, key, default=_ABSENT)
        if (value is _ABSENT) == (option.default is IN_CONF):
            where = "is not in" if value is _ABSENT else "is in"
            raise RuntimeError(
                f"solo_ext/conf/{command}.yaml: {key!r} {where} the file but its declaration "
                f"says {option.default!r}: one home for a default"
            )
        if value is not _ABSENT:
            value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            option = dataclasses.replace(option, default=value)
        out[key] = option
    return out


def run_default(key: str) -> Any:
    """The declared default of one of the run's keys (:data:`CORE_RUN_OPTIONS`)."""
    return CORE_RUN_OPTIONS[key].default


def fill_options(
    cfg: DictConfig, options: Mapping[str, Option], section: str | None = None
) -> DictConfig:
    """The one fill: each key of ``options`` that ``cfg`` leaves out (or null) set to its
    declared default, sections made as needed; keys declared without a default are left alone.

    With ``section``, the keys are those of ``cfg.<section>`` (a method's ``method_kwargs``): each
    one is there afterwards, null where its default is decided later, and a key there that
    ``options`` does not declare is refused: a typo such as ``method_kwargs.temprature`` must
    fail, not silently run with the default.
    """
    if section is not None:
        given = OmegaConf.select(cfg, section, default=None)
        for key in given or {}:
            if key not in options:
                raise ConfigError(
                    f"{section}.{key}={given[key]!r}: unknown key"
                    f"{did_you_mean(str(key), options)}; valid keys: {sorted(options)}"
                )
        if given is None:
            OmegaConf.update(cfg, section, {}, force_add=True)
    prefix = "" if section is None else f"{section}."
    for key, option in options.items():
        if select(cfg, prefix + key) is None and (option.default is not None or section):
            OmegaConf.update(cfg, prefix + key, option.default, force_add=True)
    return cfg


def check_options(
    cfg: DictConfig, options: Mapping[str, Option], section: str | None = None
) -> None:
    """The one check, in one line naming key and value: each key of ``options`` that ``cfg``
    sets (not null) against its option; with ``section`` (filled before), every key of
    ``cfg.<section>``, null included (valid only where the option is ``nullable``)."""
    prefix = "" if section is None else f"{section}."
    for key, option in options.items():
        value = OmegaConf.select(cfg, prefix + key, default=None)
        if value is not None or section is not None:
            option.check(prefix + key, value)


def device_count(devices: Any) -> int | None:
    """The processes per node that a ``devices`` value asks for (-1 and 'auto' count as one
    here), or None when it is not one Lightning takes."""
    if isinstance(devices, bool):
        return None
    if isinstance(devices, int):  # (0 processes is no run: Lightning refuses it)
        return max(devices, 1) if devices >= 1 or devices == -1 else None
    if devices in ("auto", "-1"):
        return 1
    if isinstance(devices, str):
        parts = [p.strip() for p in devices.split(",") if p.strip()]
        if devices.isdigit():
            return int(devices) or None
        return len(parts) if parts and all(p.isdigit() for p in parts) else None
    if (
        isinstance(devices, (list, tuple, ListConfig))
        and len(devices) > 0
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices)
    ):
        return len(devices)
    return None


def world_size(cfg: DictConfig) -> int:
    """Processes of a run: ``devices`` (an int, a list, or solo-learn's "0,1" string) x
    ``num_nodes``."""
    devices = declared(cfg, "devices", CORE_RUN_OPTIONS)
    count = device_count(devices)
    if count is None:  # (where no start checked it before: solo-learn's own scripts)
        CORE_RUN_OPTIONS["devices"].check("devices", devices)
    return count * int(declared(cfg, "num_nodes", CORE_RUN_OPTIONS))


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
