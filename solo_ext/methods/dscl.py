"""``dscl``: decoupled supervised contrastive learning (Xuan & Zhang, AAAI 2024), PBSD off.

The ``scl`` method with the DSCL loss (``solo_ext.losses.dscl``): the augmented view keeps the
weight alpha whatever the class size, the same-class positives share 1 - alpha.

Extra config (``method_kwargs``, besides those of ``scl``):
    alpha (float | "scl"): weight of the augmented view in [0, 1]; "scl" gives SCL's weights.
    beta (float): the official code's form, alpha = 1 / (1 + beta); give alpha or beta. When
        neither is given, beta = 8 (the official main.py).
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from solo_ext.config import ConfigError, Option
from solo_ext.losses.dscl import dscl_loss
from solo_ext.methods.scl import SCL
from solo_ext.modules import LabeledQueue

OFFICIAL_BETA = 8.0


class DSCL(SCL):
    LOSS_NAME = "dscl"
    METHOD_KWARGS: dict[str, Option] = {
        **SCL.METHOD_KWARGS,
        "alpha": Option(None, "float", 0, 1, choices=("scl",), nullable=True),
        "beta": Option(None, "float", 0, nullable=True),
    }

    @classmethod
    def fill_method_kwargs(cls, cfg: DictConfig) -> None:
        super().fill_method_kwargs(cfg)
        kw = cfg.method_kwargs
        if kw.alpha is None and kw.beta is None:
            kw.beta = OFFICIAL_BETA

    @classmethod
    def check_method_kwargs(cls, cfg: DictConfig) -> None:
        super().check_method_kwargs(cfg)
        kw = cfg.method_kwargs
        if kw.alpha is not None and kw.beta is not None:
            raise ConfigError(
                f"method_kwargs.alpha={kw.alpha!r}, method_kwargs.beta={kw.beta!r}: give one of "
                "the two, not both"
            )

    def contrastive_loss(
        self, q: torch.Tensor, k: torch.Tensor, labels: torch.Tensor, queue: LabeledQueue
    ) -> torch.Tensor:
        kw = self.cfg.method_kwargs
        return dscl_loss(
            q,
            k,
            queue.keys,
            labels,
            queue.labels,
            alpha=kw.alpha,
            beta=kw.beta,
            temperature=self.temperature,
            num_classes=self.num_classes,
        )
