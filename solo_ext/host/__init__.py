"""The one place that decides which host solo-ext's methods run on.

- ``solo``: a current solo-learn is importable (``solo.methods.base.BaseMethod`` exists); methods
  subclass its ``BaseMethod`` / ``BaseMomentumMethod`` and register into ``solo.methods.METHODS``.
- ``standalone``: the embedded host ``solo_ext.host.standalone``, same contract, used when
  solo-learn is absent (CI, a fresh machine).

``SOLO_EXT_HOST=standalone|solo`` forces one. Method code imports only from here.
"""

from __future__ import annotations

import os

from solo_ext.common import HostError


def _solo_available() -> tuple[bool, str]:
    try:
        from solo.methods.base import BaseMethod  # noqa: F401
    except ImportError as err:
        return False, str(err)
    return True, ""


def _select() -> str:
    forced = os.environ.get("SOLO_EXT_HOST", "").strip().lower()
    if forced not in ("", "auto", "solo", "standalone"):
        raise HostError(f"SOLO_EXT_HOST={forced!r}: must be 'solo', 'standalone' or unset")
    if forced == "standalone":
        return "standalone"
    ok, why = _solo_available()
    if forced == "solo" and not ok:
        raise HostError(f"SOLO_EXT_HOST=solo but solo-learn is not importable: {why}")
    return "solo" if ok else "standalone"


HOST: str = _select()

if HOST == "solo":
    from solo.methods import METHODS
    from solo.methods.base import BaseMethod, BaseMomentumMethod
    from solo.utils.misc import gather, omegaconf_select
    from solo.utils.momentum import initialize_momentum_params

    from solo_ext.solo_learn.backbones import extend

    BACKBONES = extend(BaseMethod)  # the CIFAR ResNet-32 and backbone.kwargs.small_image_stem
else:
    from solo_ext.host.standalone import (
        BACKBONES,
        METHODS,
        BaseMethod,
        BaseMomentumMethod,
        gather,
        initialize_momentum_params,
        omegaconf_select,
    )

from solo_ext.host.standalone.backbones import build_backbone as _build_backbone  # noqa: E402
from solo_ext.host.standalone.backbones import (  # noqa: E402  (pure torch, host-independent)
    feature_dim,
)


def build_backbone(name: str, method: str = "", dataset: str = "", kwargs=None):
    """A headless backbone of the active host, built as its ``BaseMethod`` builds one."""
    return _build_backbone(name, method, dataset, kwargs, BACKBONES)


_READY = True

__all__ = [
    "BACKBONES",
    "HOST",
    "METHODS",
    "BaseMethod",
    "build_backbone",
    "feature_dim",
    "BaseMomentumMethod",
    "HostError",
    "gather",
    "initialize_momentum_params",
    "omegaconf_select",
]
