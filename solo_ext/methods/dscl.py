"""``dscl``: decoupled supervised contrastive learning (Xuan & Zhang, AAAI 2024), PBSD off.

The ``scl`` method with the DSCL loss (``solo_ext.losses.dscl``): the augmented view keeps the
weight alpha whatever the class size, the same-class positives share 1 - alpha.

Its ``method_kwargs``: the class's docstring lists them, from their declarations.
"""

from __future__ import annotations

from omegaconf import DictConfig

from solo_ext.config import ConfigError, Option
from solo_ext.losses.dscl import dscl_loss
from solo_ext.methods.scl import SCL, Criterion

OFFICIAL_BETA = 8.0


class DecoupledLoss(Criterion):
    """DSCL's loss as a part of the supervised step (``dscl``, and ``pbsd`` with its
    distillation): the weights alpha / beta, and the loss of one direction."""

    OPTIONS: dict[str, Option] = {
        "alpha": Option(
            None,
            "float",
            0,
            1,
            choices=("scl",),
            nullable=True,
            help=(
                "weight of the augmented view in [0, 1], whatever the class size (the same-"
                "class positives share 1 - alpha); `scl`: SCL's weights; give alpha or beta"
            ),
        ),
        "beta": Option(
            None,
            "float",
            0,
            nullable=True,
            help=(
                "the official form, alpha = 1 / (1 + beta); when neither is given, beta = 8 "
                "(the official run)"
            ),
        ),
    }

    @classmethod
    def fill(cls, cfg: DictConfig) -> None:
        kw = cfg.method_kwargs
        if kw.alpha is None and kw.beta is None:
            kw.beta = OFFICIAL_BETA

    @classmethod
    def check(cls, cfg: DictConfig) -> None:
        kw = cfg.method_kwargs
        if kw.alpha is not None and kw.beta is not None:
            raise ConfigError(
                f"method_kwargs.alpha={kw.alpha!r}, method_kwargs.beta={kw.beta!r}: give one of "
                "the two, not both"
            )

    def __call__(self, q, k, labels, queue):
        m = self.method
        kw = m.cfg.method_kwargs
        return dscl_loss(
            q,
            k,
            queue.keys,
            labels,
            queue.labels,
            alpha=kw.alpha,
            beta=kw.beta,
            temperature=m.temperature,
            num_classes=m.num_classes,
        )


class DSCL(SCL):
    LOSS_NAME = "dscl"
    CRITERION = DecoupledLoss
