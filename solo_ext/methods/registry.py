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
