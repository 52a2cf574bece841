"""The embedded host: a small implementation of solo-learn's method contract.

Used when solo-learn is not importable (CI, a fresh machine). ``METHODS`` starts empty; solo-ext
registers its methods into it like into ``solo.methods.METHODS``.
"""

from solo_ext.host.standalone.backbones import BACKBONES
from solo_ext.host.standalone.base import BaseMethod, BaseMomentumMethod
from solo_ext.host.standalone.momentum import MomentumUpdater, initialize_momentum_params
from solo_ext.host.standalone.utils import gather, omegaconf_select

METHODS: dict[str, type] = {"base": BaseMethod}

__all__ = [
    "BACKBONES",
    "METHODS",
    "BaseMethod",
    "BaseMomentumMethod",
    "MomentumUpdater",
    "gather",
    "initialize_momentum_params",
    "omegaconf_select",
]
