"""Momentum (EMA) encoders with the cosine tau schedule of BYOL / solo-learn."""

from __future__ import annotations

import math

import torch
from torch import nn


@torch.no_grad()
def initialize_momentum_params(online: nn.Module, momentum: nn.Module) -> None:
    """Copies ``online``'s parameters into ``momentum`` and freezes them."""
    for p, mp in zip(online.parameters(), momentum.parameters(), strict=True):
        mp.data.copy_(p.data)
        mp.requires_grad = False


class MomentumUpdater:
    """EMA update ``m <- tau * m + (1 - tau) * p`` with tau annealed from base to final by a cosine.

    Args:
        base_tau: tau at step 0, in [0, 1].
        final_tau: tau at the last step, in [base_tau, 1].
    """

    def __init__(self, base_tau: float = 0.996, final_tau: float = 1.0):
        if not 0 <= base_tau <= 1:
            raise ValueError(f"momentum.base_tau={base_tau}: must be in [0, 1]")
        if not 0 <= final_tau <= 1 or final_tau < base_tau:
            raise ValueError(f"momentum.final_tau={final_tau}: must be in [base_tau, 1]")
        self.base_tau = base_tau
        self.cur_tau = base_tau
        self.final_tau = final_tau

    @torch.no_grad()
    def update(self, online: nn.Module, momentum: nn.Module) -> None:
        params = list(online.parameters())
        mparams = list(momentum.parameters())
        torch._foreach_lerp_(mparams, params, 1.0 - self.cur_tau)

    def update_tau(self, cur_step: int, max_steps: int) -> None:
        progress = min(cur_step / max(max_steps, 1), 1.0)
        self.cur_tau = (
            self.final_tau
            - (self.final_tau - self.base_tau) * (math.cos(math.pi * progress) + 1) / 2
        )
