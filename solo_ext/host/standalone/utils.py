"""Small helpers of solo-learn's contract: config access, gathering, metrics."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf


def omegaconf_select(cfg: DictConfig, key: str, default: Any = None) -> Any:
    """``cfg.<key>`` (dotted), or ``default`` when the key is missing or null."""
    value = OmegaConf.select(cfg, key, default=None)
    return default if value is None else value


def dist_ready() -> bool:
    return dist.is_available() and dist.is_initialized()


class _GatherLayer(torch.autograd.Function):
    """all_gather that keeps the gradient: each rank gets the summed gradient of its own slice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x.contiguous())
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> torch.Tensor:
        all_grads = torch.stack(grads)
        dist.all_reduce(all_grads)
        return all_grads[dist.get_rank()]


def gather(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Concatenates ``x`` from every process along ``dim`` (identity in a single process)."""
    if dist_ready() and dist.get_world_size() > 1:
        return torch.cat(_GatherLayer.apply(x), dim=dim)
    return x


@torch.no_grad()
def accuracy_at_k(
    logits: torch.Tensor, targets: torch.Tensor, top_k: tuple[int, ...] = (1, 5)
) -> list[torch.Tensor]:
    """Top-k accuracies in percent (as solo-learn) of logits [B, C] for targets [B].

    Targets of -1 (unlabelled) are ignored.
    """
    keep = targets != -1
    logits, targets = logits[keep], targets[keep]
    if targets.numel() == 0:
        return [logits.new_zeros(()) for _ in top_k]
    pred = logits.topk(max(top_k), dim=1).indices
    hit = pred.eq(targets[:, None])
    return [hit[:, :k].any(dim=1).float().mean() * 100 for k in top_k]


def weighted_mean(outputs: list[dict], key: str, batch_size_key: str) -> torch.Tensor:
    """Mean of ``key`` over validation batches, weighted by their sizes."""
    total = sum(out[batch_size_key] for out in outputs)
    return sum(out[key] * out[batch_size_key] for out in outputs) / max(total, 1)


def split_weight_decay(param_groups: list[dict]) -> list[dict]:
    """Splits each group so that biases and norm parameters (ndim <= 1) get no weight decay."""
    out = []
    for group in param_groups:
        params = [p for p in group["params"] if p.requires_grad]
        decay = [p for p in params if p.ndim > 1]
        no_decay = [p for p in params if p.ndim <= 1]
        base = {k: v for k, v in group.items() if k != "params"}
        if decay:
            out.append({**base, "params": decay})
        if no_decay:
            name = base.get("name", "group")
            out.append({**base, "name": f"{name}_no_wd", "params": no_decay, "weight_decay": 0.0})
    return out
