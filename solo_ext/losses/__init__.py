"""Losses as pure functions on tensors (no Lightning, no config)."""

from solo_ext.losses.dscl import dscl_loss
from solo_ext.losses.pbsd import pbsd_loss
from solo_ext.losses.scl import scl_loss

__all__ = ["dscl_loss", "pbsd_loss", "scl_loss"]
