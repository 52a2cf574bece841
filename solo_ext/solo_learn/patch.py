"""Applies the patch of a freshly executed solo-learn module (the start-up hook calls
:func:`patch`), after checking that the module has every name the patch needs; when one is
missing, records it and leaves the module as it is, but for a guard that stops a config using
solo-ext in one line.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

from solo_ext.solo_learn import PATCHES, parsed
from solo_ext.solo_learn.check import missing, record_broken, stop_if_broken


def guard_only(module: ModuleType) -> None:
    """A module that lacks a need is not patched; its entry points only stop a config that uses
    solo-ext (``parse_cfg``; ``main_knn.py``'s ``parse_args_knn``), with the missing name."""
    if callable(getattr(module, "parse_cfg", None)):
        original = module.parse_cfg

        @functools.wraps(original)
        @parsed.config_errors
        def parse_cfg(cfg):
            stop_if_broken(cfg)
            return original(cfg)

        module.parse_cfg = parse_cfg
    if callable(getattr(module, "parse_args_knn", None)):
        from solo_ext.solo_learn.knn_args import knn_guarded

        module.parse_args_knn = knn_guarded(module.parse_args_knn)


def patch(module: ModuleType) -> None:
    """Applies the patch of ``module`` (a solo-learn module of :data:`PATCHES`, freshly
    executed) once, after checking that the module has every name the patch needs (its
    ``NEEDS``); when one is missing, records it and leaves the module as it is
    (:func:`guard_only`)."""
    if getattr(module, "_solo_ext_patched", False):
        return
    lacking = missing(module)
    if lacking is not None:
        record_broken(module.__name__, f"{module.__name__} has no {lacking}")
        guard_only(module)
    else:
        importlib.import_module(f"solo_ext.solo_learn.{PATCHES[module.__name__]}").apply(module)
    module._solo_ext_patched = True
