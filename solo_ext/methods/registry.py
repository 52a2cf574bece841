"""Registration of solo-ext's methods into the active host's ``METHODS``."""

from __future__ import annotations

import importlib
import warnings

# name -> "module:Class": ``load`` imports one method's module; ``register`` imports them all,
# since solo-learn's scripts look a method up by name in ``METHODS``.
SOLO_EXT_METHODS: dict[str, str] = {
    "scl": "solo_ext.methods.scl:SCL",
    "dscl": "solo_ext.methods.dscl:DSCL",
    "pbsd": "solo_ext.methods.pbsd:PBSD",
    "densecl": "solo_ext.methods.densecl:DenseCL",
    "all4one_ct": "solo_ext.methods.all4one:All4OneCT",
    "kcl": "solo_ext.methods.kcl:KCL",
    "tsc": "solo_ext.methods.tsc:TSC",
    "paco": "solo_ext.methods.paco:PaCo",
    "bcl": "solo_ext.methods.bcl:BCL",
}


def load(name: str) -> type:
    module, cls = SOLO_EXT_METHODS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def register() -> dict[str, type]:
    """Adds every solo-ext method to the host's ``METHODS``; returns that dict.

    A name the host already has for another class (solo-learn's own methods) is left alone, with
    a warning: solo-ext never shadows solo-learn.
    """
    from solo_ext.host import METHODS

    for name in SOLO_EXT_METHODS:
        cls = load(name)
        existing = METHODS.get(name)
        if existing is None:
            METHODS[name] = cls
        elif existing is not cls and existing.__module__ != cls.__module__:
            warnings.warn(
                f"solo-ext: method {name!r} already exists in the host; not replaced", stacklevel=2
            )
    return METHODS


def method_transform(cfg) -> object | None:
    """The loader transform a method asks for (PBSD's views), None for the usual crops (and
    for solo-learn's own methods, which ask for none)."""
    from solo_ext.host import METHODS

    hook = getattr(METHODS.get(cfg.get("method")), "pretrain_transform", None)
    return hook(cfg) if hook is not None else None


def options_markdown(name: str) -> str:
    """The README's list of a method's ``method_kwargs`` (its Methods table's last column), from
    the declarations: "those of `<method>`" where another solo-ext method declares a part of
    the keys (each key that differs given again), then each key as
    :func:`solo_ext.config.option_entries` gives it."""
    from solo_ext.config import option_entries

    mine = load(name).METHOD_KWARGS
    within = [
        other
        for other in SOLO_EXT_METHODS
        if other != name and set(load(other).METHOD_KWARGS) <= set(mine)
    ]
    if not within:
        return "; ".join(option_entries(mine))
    parent = max(within, key=lambda other: len(load(other).METHOD_KWARGS))
    inherited = load(parent).METHOD_KWARGS
    changed = {key: option for key, option in mine.items() if inherited.get(key, option) != option}
    added = {key: option for key, option in mine.items() if key not in inherited}
    out = f"those of `{parent}`"
    if changed:
        out += ", but " + "; ".join(option_entries(changed))
    return out + ("; plus " if changed else ", plus ") + "; ".join(option_entries(added))
