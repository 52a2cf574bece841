"""Loading a pretrained run (solo-ext's or solo-learn's) and extracting frozen features."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import DataLoader, Dataset

from solo_ext.checkpoint import find_checkpoint
from solo_ext.config import ConfigError
from solo_ext.host import build_backbone


def load_run(
    run_dir: str | Path, ckpt_path: str | Path | None = None
) -> tuple[nn.Module, DictConfig, Path]:
    """Backbone (with the run's weights), config (``args.json``) and checkpoint path of a run
    directory ``<dir>/<method>/<run id>/`` (its newest checkpoint, or ``ckpt_path``)."""
    run_dir = Path(run_dir)
    args_path = run_dir / "args.json"
    if not args_path.is_file():
        raise FileNotFoundError(f"pretrained_checkpoint_dir={str(run_dir)!r}: no args.json")
    with open(args_path) as f:
        cfg = OmegaConf.create(json.load(f))
    ckpt_path = find_checkpoint(run_dir) if ckpt_path is None else Path(ckpt_path)
    backbone = build_backbone(
        cfg.backbone.name, cfg.method, cfg.data.dataset, cfg.backbone.get("kwargs") or {}
    )
    state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    state = state.get("state_dict", state)
    weights = {k[len("backbone.") :]: v for k, v in state.items() if k.startswith("backbone.")}
    if not weights:
        raise ConfigError(f"checkpoint {str(ckpt_path)!r}: no 'backbone.' weights in it")
    missing, unexpected = backbone.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ConfigError(
            f"checkpoint {str(ckpt_path)!r}: does not fit backbone.name={cfg.backbone.name!r} "
            f"({len(missing)} missing, {len(unexpected)} unexpected keys, e.g. "
            f"{(missing or unexpected)[0]!r})"
        )
    return backbone.eval(), cfg, ckpt_path


@torch.no_grad()
def extract_features(
    backbone: nn.Module,
    dataset: Dataset,
    batch_size: int = 256,
    num_workers: int = 0,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Features [N, D] and labels [N] of a dataset of (image, label) under ``backbone.eval()``."""
    device = device or next(backbone.parameters()).device
    was_training = backbone.training
    backbone.eval()
    feats, labels = [], []
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)
    for x, y in loader:
        feats.append(backbone(x.to(device)).float().cpu())
        labels.append(torch.as_tensor(y))
    backbone.train(was_training)
    return torch.cat(feats), torch.cat(labels)
