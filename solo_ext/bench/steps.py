"""Training steps: one optimiser step of each method against its baseline, same backbone and
batch, through Lightning's ``fit`` (forward, backward, optimiser, EMA update, queue writes).

The batches are made once and held in memory, so data loading is not measured; a step's time
is the interval between the starts of consecutive steps. Methods run in rounds (a few steps of
each method, then again), so that drifts of the machine hit every method alike.
"""

from __future__ import annotations

import logging
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader

from solo_ext.host import HOST, METHODS

# (method, baseline) -> the label of each and its method_kwargs over the published defaults
PAIRS: list[tuple[tuple[str, str, dict], tuple[str, str, dict]]] = [
    (("dscl", "dscl", {}), ("scl", "scl", {})),
    (("pbsd", "pbsd", {"num_boxes": 5}), ("dscl", "dscl", {})),
    (("densecl", "densecl", {"warmup_steps": 0}), ("densecl lambda=0", "densecl", {"lambda": 0.0})),
]
ALL4ONE_KWARGS = {
    "temperature": 0.2,
    "proj_hidden_dim": 2048,
    "pred_hidden_dim": 4096,
    "proj_output_dim": 256,
    "queue_size": 98304,
}
TINY_KWARGS = {"proj_hidden_dim": 32, "proj_output_dim": 16, "queue_size": 64}


def pairs() -> list[tuple[tuple[str, str, dict], tuple[str, str, dict]]]:
    """The pairs to measure; ``all4one_ct`` against solo-learn's ``all4one`` when the real
    solo-learn is the host."""
    out = list(PAIRS)
    if HOST == "solo" and "all4one" in METHODS:
        out.append(
            (
                ("all4one_ct", "all4one_ct", dict(ALL4ONE_KWARGS)),
                ("solo-learn all4one", "all4one", dict(ALL4ONE_KWARGS)),
            )
        )
    return out


def step_cfg(method: str, kwargs: dict, batch_size: int, device: str, tiny: bool) -> DictConfig:
    """ResNet-18 with CIFAR's small-image stem at 32 px (nothing is loaded: the batches are
    random tensors)."""
    from solo_ext.pretrain import parse_cfg

    aug = {"crop_size": 32, "num_crops": 2}
    method_kwargs = {**(TINY_KWARGS if tiny else {}), **kwargs}
    if tiny and method.startswith("all4one"):
        method_kwargs.update(pred_hidden_dim=32, temperature=0.2)
    cfg = OmegaConf.create(
        {
            "name": f"bench-{method}",
            "method": method,
            "backbone": {"name": "resnet18"},
            "method_kwargs": method_kwargs,
            "momentum": {"base_tau": 0.99, "final_tau": 1.0},  # solo-learn's methods need it
            "data": {
                "dataset": "cifar10",
                "train_path": ".",
                "num_classes": 10,
                "download": True,
                "num_workers": 0,
            },
            "augmentations": [aug],
            "optimizer": {"name": "sgd", "batch_size": batch_size, "lr": 0.1},
            "scheduler": {"name": "warmup_cosine", "warmup_epochs": 0},
            "knn_eval": {"enabled": False},
            "checkpoint": {"enabled": False},
            "max_epochs": 1,
            "accelerator": "gpu" if device == "cuda" else "cpu",
            "devices": 1,
        }
    )
    return parse_cfg(cfg)


class _StepClock(pl.Callback):
    def __init__(self, device: torch.device):
        self.device = device
        self.starts: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.starts.append(time.perf_counter())


@dataclass
class StepResult:
    seconds: list[float] = field(default_factory=list)
    peak_mib: float | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def _batches(n: int, batch_size: int) -> DataLoader:
    """``n`` ready batches ``[indexes, [view 1, view 2], labels]`` (a loader without collation)."""
    gen = torch.Generator().manual_seed(0)
    views = [torch.randn(batch_size, 3, 32, 32, generator=gen) for _ in range(2)]
    labels = torch.randint(0, 10, (batch_size,), generator=gen)
    batches = [[torch.arange(batch_size) + i * batch_size, views, labels] for i in range(n)]
    return DataLoader(batches, batch_size=None)


def time_steps(cfg: DictConfig, steps: int, warmup: int, device: torch.device) -> StepResult:
    """One short fit: ``warmup + steps + 1`` steps, the last ``steps`` intervals are kept."""
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module="lightning")
    torch.manual_seed(0)  # (lightning 2.1, which solo-learn pins, has no quiet seed_everything)
    model = METHODS[cfg.method](cfg).to(memory_format=torch.channels_last)
    clock = _StepClock(device)
    trainer = pl.Trainer(
        accelerator=cfg.accelerator,
        devices=1,
        max_epochs=1,
        precision="bf16-mixed" if device.type == "cuda" else "32-true",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[clock],
    )
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    trainer.fit(model, _batches(warmup + steps + 1, cfg.optimizer.batch_size))
    intervals = [b - a for a, b in zip(clock.starts, clock.starts[1:])][warmup:]
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return StepResult(intervals, peak)


def measure_pairs(
    device: torch.device,
    batch_size: int,
    steps: int,
    warmup: int,
    rounds: int,
    tiny: bool,
    only: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Rows ``{name, candidate, reference, median_s, peak_mib, ...}`` for every pair (or the
    pairs whose method is in ``only``)."""
    rows = []
    for (name, method, kwargs), (base_name, base_method, base_kwargs) in pairs():
        if only and method not in only:
            continue
        cfgs = {
            name: step_cfg(method, kwargs, batch_size, device.type, tiny),
            base_name: step_cfg(base_method, base_kwargs, batch_size, device.type, tiny),
        }
        results = {label: StepResult() for label in cfgs}
        for _ in range(rounds):
            for label, cfg in cfgs.items():
                got = time_steps(cfg.copy(), steps, warmup, device)
                results[label].seconds += got.seconds
                if got.peak_mib is not None:
                    results[label].peak_mib = max(results[label].peak_mib or 0.0, got.peak_mib)
        for label, res in results.items():
            rows.append(
                {
                    "kind": "step",
                    "name": f"{name} vs {base_name}",
                    "shape": f"resnet18 32px B={batch_size}",
                    "candidate": label,
                    "reference": base_name,
                    "median_s": res.median,
                    "peak_mib": res.peak_mib,
                    "images_per_s": 2 * batch_size / res.median,
                }
            )
    return rows
