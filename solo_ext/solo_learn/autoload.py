"""Start-up hook that makes solo-learn's own scripts see the whole plugin.

The wheel installs ``solo_ext_autoload.pth``, which imports this module at interpreter start
(unless ``SOLO_EXT_AUTOLOAD=0``). It only adds a meta-path finder: nothing else is imported until
one of a few solo-learn modules is. Right after ``solo.methods`` is executed,
``solo_ext.register()`` adds solo-ext's methods to ``solo.methods.METHODS``; right after its
argument and data modules are, this package's patches apply to them (samplers,
long-tailed datasets, the dataset table), before any script binds their names. So
``python main_pretrain.py method=dscl data.sampler.name=class_balanced`` works in an unmodified
solo-learn checkout.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Callable
from types import ModuleType

from solo_ext.solo_learn import METHODS_MODULE as _TARGET
from solo_ext.solo_learn import PATCHES


def _register_into_solo() -> None:
    host = sys.modules.get("solo_ext.host")
    if host is not None and not getattr(host, "_READY", False):
        # solo_ext.host is importing solo-learn itself; solo-ext's entry points register then.
        return
    try:
        from solo_ext.methods.registry import register

        register()
    except Exception as err:  # never break solo-learn's own configs because of the plugin
        _broken(_TARGET, f"solo-ext's methods could not be registered ({err})")


def _patch_module(module) -> None:
    try:
        from solo_ext.solo_learn.patch import patch

        patch(module)
    except Exception as err:  # never break solo-learn's own configs because of the plugin
        _broken(module.__name__, f"{module.__name__} could not be extended ({err})")


def _broken(module: str, what: str) -> None:
    """Records what cannot work: a config that uses solo-ext then stops in one line naming it
    (in ``parse_cfg``); one that does not runs, undisturbed."""
    from solo_ext.solo_learn.check import record_broken

    record_broken(module, what)


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callbacks[name](module)`` right after the module ``name`` has been executed, before
    the statement that imported it binds any of its names. Finds the module through the other
    finders; imports nothing itself."""

    def __init__(self, callbacks: dict[str, Callable[[ModuleType], None]]):
        self.callbacks = callbacks
        self._finding: set[str] = set()  # another AfterImport may ask this one back

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.callbacks or fullname in self._finding:
            return None
        self._finding.add(fullname)
        try:
            spec = self._others_spec(fullname, path, target)
        finally:
            self._finding.discard(fullname)
        if spec is None:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module, callback = loader.exec_module, self.callbacks[fullname]

        def exec_then(module):
            exec_module(module)
            callback(module)

        loader.exec_module = exec_then
        return spec

    def _others_spec(self, fullname, path, target):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None


class _SoloExtHook(AfterImport):
    """solo-ext's: the registration after ``solo.methods``, the patches after the others."""

    def __init__(self):
        super().__init__(
            {_TARGET: lambda module: _register_into_solo(), **dict.fromkeys(PATCHES, _patch_module)}
        )


def install() -> None:
    """Installs the hook once; a no-op when ``SOLO_EXT_AUTOLOAD=0``."""
    if os.environ.get("SOLO_EXT_AUTOLOAD", "1") == "0":
        return
    if any(isinstance(f, _SoloExtHook) for f in sys.meta_path):
        return
    for name in PATCHES:  # imported before the hook: extend now
        if name in sys.modules:
            _patch_module(sys.modules[name])
    if _TARGET in sys.modules:
        _register_into_solo()
    sys.meta_path.insert(0, _SoloExtHook())


install()
