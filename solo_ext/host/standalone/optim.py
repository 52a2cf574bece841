"""Optimizers and learning-rate schedules of the embedded host (library implementations)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from timm.optim import Lars
from torch.optim.lr_scheduler import LambdaLR, MultiStepLR


def build_lars(
    params,
    lr: float,
    weight_decay: float = 0.0,
    momentum: float = 0.9,
    eta: float = 1e-3,
    clip_lr: bool = False,
    exclude_bias_n_norm: bool = False,
    **kwargs,
) -> torch.optim.Optimizer:
    """timm's LARS with solo-learn's keyword names (eta, clip_lr, exclude_bias_n_norm)."""
    return Lars(
        params,
        lr=lr,
        weight_decay=weight_decay,
        momentum=momentum,
        trust_coeff=eta,
        trust_clip=clip_lr,
        always_adapt=not exclude_bias_n_norm,
        **kwargs,
    )


OPTIMIZERS = {
    "sgd": torch.optim.SGD,
    "lars": build_lars,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
}

SCHEDULERS = ("warmup_cosine", "step", "none")


def warmup_cosine(
    optimizer: torch.optim.Optimizer,
    warmup_steps: float,
    total_steps: float,
    warmup_start_lr: float,
    min_lr: float,
    static_groups: Sequence[int] = (),
) -> LambdaLR:
    """Linear warm-up from ``warmup_start_lr`` to each group's lr, then cosine decay to ``min_lr``.

    Groups in ``static_groups`` keep their lr (solo-learn's ``static_lr``).
    """

    def factor_for(base_lr: float):
        def factor(step: int) -> float:
            if base_lr == 0:
                return 1.0
            if step < warmup_steps:
                lr = warmup_start_lr + (base_lr - warmup_start_lr) * step / warmup_steps
            else:
                span = max(total_steps - warmup_steps, 1)
                progress = min((step - warmup_steps) / span, 1.0)
                lr = min_lr + (base_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))
            return lr / base_lr

        return factor

    lambdas = [
        (lambda _: 1.0) if i in static_groups else factor_for(group["lr"])
        for i, group in enumerate(optimizer.param_groups)
    ]
    return LambdaLR(optimizer, lambdas)


def step_schedule(optimizer: torch.optim.Optimizer, milestones: Sequence[int]) -> MultiStepLR:
    return MultiStepLR(optimizer, milestones=list(milestones), gamma=0.1)
