"""Optimizers and learning-rate schedules of the embedded host (library implementations)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.optim.lr_scheduler import LambdaLR, MultiStepLR


class LARS(torch.optim.Optimizer):
    """SGD with LARS's layer-wise trust ratio (You et al. 2017), as solo-learn's ``LARS``.

    Per parameter: g <- eta * |p| / (|g| + wd |p| + eps) * (g + wd p) when both norms are
    non-zero (else g as it is, without decay), the ratio divided by lr and capped at 1 with
    ``clip_lr``; with ``exclude_bias_n_norm`` 1-D parameters (biases, norm weights) are neither
    scaled nor decayed; then PyTorch's SGD momentum. timm's ``Lars`` differs (it decides the
    adaptation per group, from its weight decay, and decays zero-gradient parameters), so the
    embedded host keeps solo-learn's rule here.
    """

    def __init__(
        self,
        params,
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        eta: float = 1e-3,
        eps: float = 1e-8,
        clip_lr: bool = False,
        exclude_bias_n_norm: bool = False,
    ):
        for name, value in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
            if value < 0:
                raise ValueError(f"{name}={value}: must be >= 0")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("nesterov=True: needs a momentum and zero dampening")
        defaults = dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            eta=eta,
            eps=eps,
            clip_lr=clip_lr,
            exclude_bias_n_norm=exclude_bias_n_norm,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            wd, momentum = group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                d_p = p.grad
                if p.ndim != 1 or not group["exclude_bias_n_norm"]:
                    p_norm, g_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(d_p)
                    if p_norm != 0 and g_norm != 0:
                        ratio = group["eta"] * p_norm / (g_norm + p_norm * wd + group["eps"])
                        if group["clip_lr"]:
                            ratio = torch.clamp(ratio / group["lr"], max=1.0)
                        d_p = d_p.add(p, alpha=wd).mul_(ratio)
                if momentum != 0:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        buf = state["momentum_buffer"] = d_p.detach().clone()
                    else:
                        buf = state["momentum_buffer"]
                        buf.mul_(momentum).add_(d_p, alpha=1 - group["dampening"])
                    d_p = d_p.add(buf, alpha=momentum) if group["nesterov"] else buf
                p.add_(d_p, alpha=-group["lr"])
        return loss


OPTIMIZERS = {
    "sgd": torch.optim.SGD,
    "lars": LARS,
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
    """Linear warm-up from ``warmup_start_lr`` to each group's lr, then cosine decay to ``min_lr``,
    as solo-learn's ``LinearWarmupCosineAnnealingLR`` computes it: step 0 at
    ``warmup_start_lr``, step ``s < warmup_steps`` at ``start + s (lr - start) /
    (warmup_steps - 1)`` (so the last warm-up step is already at the lr), then
    ``min_lr + (lr - min_lr) (1 + cos(pi (s - warmup_steps) / (total_steps - warmup_steps))) / 2``.

    Groups in ``static_groups`` keep their lr (solo-learn's ``static_lr``).
    """

    def factor_for(base_lr: float):
        def factor(step: int) -> float:
            if base_lr == 0:
                return 1.0
            if step == 0 and warmup_steps > 0:
                lr = warmup_start_lr
            elif step < warmup_steps:
                lr = warmup_start_lr + (base_lr - warmup_start_lr) * step / (warmup_steps - 1)
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
