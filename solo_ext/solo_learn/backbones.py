"""solo-learn's backbone table (``BaseMethod._BACKBONES``): the CIFAR ResNet-32 beside its own
backbones, and the ``small_image_stem`` keyword on every builder, so that every script of
solo-learn that rebuilds a run's backbone (``main_linear.py`` and ``main_knn.py`` too) builds it
as the run did. Applied when solo-learn is selected as the host (``solo_ext.host``), whether the
start-up hook is on or not.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from solo_ext.common import HostError


def extend(base_method: type) -> dict[str, Callable[..., nn.Module]]:
    """Extends the backbone table of solo-learn's ``BaseMethod`` (once; again is a no-op) and
    returns it."""
    from solo_ext.modules.resnet_cifar import cifar_resnet32
    from solo_ext.modules.stem import add_stem_option

    table = getattr(base_method, "_BACKBONES", None)
    if not isinstance(table, dict):
        raise HostError("solo.methods.base.BaseMethod has no _BACKBONES (its backbone table)")
    table.setdefault("cifar_resnet32", cifar_resnet32)
    add_stem_option(table)  # (a builder that already takes the keyword is left as it is)
    return table
