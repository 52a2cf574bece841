"""Learning-rate schedules that solo-learn's ``BaseMethod`` lacks, run the same by both hosts.

``scheduler.name: warmup_step``: the schedule of the official PaCo / GPaCo CIFAR scripts (and
of many long-tail CIFAR recipes), stepped once per epoch. In epoch ``e`` (0-based), with ``W``
= ``scheduler.warmup_epochs`` and the milestones ``scheduler.lr_decay_steps``::

    lr(e) = lr * (e + 1) / W                                   e < W  (linear warm-up)
    lr(e) = lr * gamma ** #{m in lr_decay_steps : m <= e}      e >= W (step decay)

with ``gamma`` = 0.1, as solo-learn's ``step``. A milestone is the first epoch at the
lower lr, as in torch's ``MultiStepLR`` (solo-learn's ``step``), so "x 0.1 after epoch 320"
(1-based) is the milestone 320. The lr changes at epoch boundaries only, so the schedule needs
``scheduler.interval: epoch``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig

from solo_ext.config import ConfigError, select

# the schedules solo-ext adds to the host's ``_SCHEDULERS``
SCHEDULES = ("warmup_step",)
GAMMA = 0.1


def warmup_step_factor(
    epoch: int, warmup_epochs: float, milestones: Sequence[int], gamma: float = GAMMA
) -> float:
    """The lr of epoch ``epoch`` (0-based) as a fraction of the peak lr (module docstring)."""
    if epoch < warmup_epochs:
        return (epoch + 1) / warmup_epochs
    return gamma ** sum(1 for m in milestones if m <= epoch)


def check_schedule(cfg: DictConfig, allowed: Sequence[str]) -> None:
    """``scheduler.name`` among ``allowed`` (the host's and solo-ext's) and, for a solo-ext
    schedule, the keys it reads; one line naming key and value."""
    name = select(cfg, "scheduler.name")
    if name not in allowed:
        raise ConfigError(f"scheduler.name={name!r}: not one of {list(allowed)}")
    if name != "warmup_step":
        return
    interval = select(cfg, "scheduler.interval")
    if interval != "epoch":
        raise ConfigError(
            f"scheduler.interval={interval!r}: scheduler.name='warmup_step' changes the lr once "
            "per epoch; set scheduler.interval=epoch"
        )
    steps = select(cfg, "scheduler.lr_decay_steps")
    if not isinstance(steps, (list, tuple, ListConfig)) or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in steps
    ):
        raise ConfigError(
            f"scheduler.lr_decay_steps={steps!r}: scheduler.name='warmup_step' needs a list of "
            "epochs >= 1 (the first epoch at each lower lr)"
        )
    if list(steps) != sorted(set(steps)):
        raise ConfigError(f"scheduler.lr_decay_steps={list(steps)!r}: not increasing")


def warmup_step(
    optimizer: torch.optim.Optimizer,
    warmup_epochs: float,
    milestones: Sequence[int],
    static: Sequence[bool] = (),
) -> torch.optim.lr_scheduler.LambdaLR:
    """The ``warmup_step`` schedule on every parameter group of ``optimizer`` (a group marked in
    ``static`` keeps its lr, as solo-learn's ``static_lr``); step it once per epoch."""
    steps = list(milestones)

    def factor(epoch: int) -> float:
        return warmup_step_factor(epoch, warmup_epochs, steps)

    lambdas: list[Any] = [
        (lambda _: 1.0) if i < len(static) and static[i] else factor
        for i in range(len(optimizer.param_groups))
    ]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas)
