"""Building blocks shared by solo-ext's methods (heads, queues, ...)."""

from solo_ext.modules.heads import build_mlp
from solo_ext.modules.queue import LabeledQueue

__all__ = ["LabeledQueue", "build_mlp"]
