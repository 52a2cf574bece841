"""Start-up hook that makes solo-learn's own scripts see solo-ext's methods.

The wheel installs ``solo_ext_autoload.pth``, which imports this module at interpreter start
(unless ``SOLO_EXT_AUTOLOAD=0``). It only adds a meta-path finder: nothing else is imported until
``solo.methods`` itself is imported, right after which ``solo_ext.register()`` adds solo-ext's
methods to ``solo.methods.METHODS``. So ``python main_pretrain.py method=dscl`` works in an
unmodified solo-learn checkout.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
import warnings

_TARGET = "solo.methods"


def _register_into_solo() -> None:
    host = sys.modules.get("solo_ext.host")
    if host is not None and not getattr(host, "_READY", False):
        # solo_ext.host is importing solo-learn itself; solo-ext's entry points register then.
        return
    try:
        from solo_ext.registry import register

        register()
    except Exception as err:  # never break solo-learn because of the plugin
        warnings.warn(
            f"solo-ext: could not register its methods into solo-learn: {err}", stacklevel=2
        )


class _SoloMethodsHook(importlib.abc.MetaPathFinder):
    """Finds ``solo.methods`` through the other finders and runs the registration after it."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_register(module):
            exec_module(module)
            _register_into_solo()

        loader.exec_module = exec_and_register
        return spec


def install() -> None:
    """Installs the hook once; a no-op when ``SOLO_EXT_AUTOLOAD=0``."""
    if os.environ.get("SOLO_EXT_AUTOLOAD", "1") == "0":
        return
    if any(isinstance(f, _SoloMethodsHook) for f in sys.meta_path):
        return
    if _TARGET in sys.modules:  # imported before the hook: register now
        _register_into_solo()
        return
    sys.meta_path.insert(0, _SoloMethodsHook())


install()
