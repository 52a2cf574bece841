"""Training steps: one optimiser step of each method against its baseline, same backbone and
batch, through Lightning's ``fit`` (forward, backward, optimiser, EMA update, queue writes).

The batches are made once and held in memory, so data loading is not measured; a step's time
is the interval between the starts of consecutive steps. Methods run in rounds (a few steps of
each method, then again), so that drifts of the machine hit every method alike.

Each fit's last step (never timed) also runs under ``torch.utils.flop_counter``: the FLOPs of
its matmuls, convolutions and attention, forward and backward. Their ratio is what the method
costs by its arithmetic, whatever the machine; the time ratio over it is the implementation's
overhead. The same step counts the operators it dispatches: where the device outruns the host
(a GPU at a small batch) the time follows their number, not the FLOPs. On CPU it also measures
the peak memory of the tensors the step allocates.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.timing import Measurement, OperatorCount, PeakBytes
from solo_ext.host import HOST, METHODS

# (method, baseline) -> the label of each and its method_kwargs over the published defaults
PAIRS: list[tuple[tuple[str, str, dict], tuple[str, str, dict]]] = [
    (("dscl", "dscl", {}), ("scl", "scl", {})),
    # pbsd's published pipeline: the loader makes the patches (here: ready in memory)
    (("pbsd", "pbsd", {"num_boxes": 5}), ("dscl", "dscl", {})),
    (("densecl", "densecl", {"warmup_steps": 0}), ("densecl lambda=0", "densecl", {"lambda": 0.0})),
    # the long-tail peers against scl (same encoders, queue and step; only the loss differs)
    (("kcl", "kcl", {}), ("scl", "scl", {})),
    # tsc past its KCL epochs: the targets in the contrast set, centroids and matching per step
    (("tsc", "tsc", {"kcl_epochs": 0, "target_steps": 100}), ("scl", "scl", {})),
    # the one-stage peers: PaCo's centres and head, GPaCo's second online pass, BCL's three
    # crops in one pass with its prototypes (no queue)
    (("paco", "paco", {}), ("scl", "scl", {})),
    (("gpaco", "paco", {"gpaco": True}), ("scl", "scl", {})),
    (("bcl", "bcl", {}), ("scl", "scl", {})),
]
ALL4ONE_KWARGS = {
    "temperature": 0.2,
    "proj_hidden_dim": 2048,
    "pred_hidden_dim": 4096,
    "proj_output_dim": 256,
    "queue_size": 98304,
}
TINY_KWARGS = {"proj_hidden_dim": 32, "proj_output_dim": 16, "queue_size": 64}


# what a solo-learn user would pick instead, with the same projector (2048-2048-128, no BN) and
# queue: solo-learn's MoCo v2+ (both directions, a queue per view) against ``dscl`` both ways
# and in its published one direction; solo-learn's in-batch SupCon against ``scl``
PEER_KWARGS = {"proj_hidden_dim": 2048, "proj_output_dim": 128, "temperature": 0.07}
PEER_PAIRS: list[tuple[tuple[str, str, dict], tuple[str, str, dict]]] = [
    (
        ("dscl symmetric", "dscl", {**PEER_KWARGS, "queue_size": 65536, "symmetric": True}),
        ("solo-learn mocov2plus", "mocov2plus", {**PEER_KWARGS, "queue_size": 65536}),
    ),
    (
        ("dscl", "dscl", {**PEER_KWARGS, "queue_size": 65536}),
        ("solo-learn mocov2plus", "mocov2plus", {**PEER_KWARGS, "queue_size": 65536}),
    ),
    (
        ("scl", "scl", {**PEER_KWARGS, "queue_size": 65536}),
        ("solo-learn supcon", "supcon", dict(PEER_KWARGS)),
    ),
]
NO_QUEUE = ("bcl", "supcon")


def pairs() -> list[tuple[tuple[str, str, dict], tuple[str, str, dict]]]:
    """The pairs to measure; with the real solo-learn as the host, also ``all4one_ct`` against
    solo-learn's ``all4one`` and the peers against solo-learn's own methods."""
    out = list(PAIRS)
    if HOST == "solo":
        out += [pair for pair in PEER_PAIRS if pair[1][1] in METHODS]
    if HOST == "solo" and "all4one" in METHODS:
        out.append(
            (
                ("all4one_ct", "all4one_ct", dict(ALL4ONE_KWARGS)),
                ("solo-learn all4one", "all4one", dict(ALL4ONE_KWARGS)),
            )
        )
    return out


SMALL_STEM_MAX_CROP = 64  # up to this crop, ResNets get CIFAR's small-image stem


def step_cfg(
    method: str,
    kwargs: dict,
    batch_size: int,
    device: str,
    tiny: bool,
    backbone: str = "resnet18",
    crop_size: int = 32,
) -> DictConfig:
    """ResNet-18 with CIFAR's small-image stem at 32 px by default (nothing is loaded: the
    batches are random tensors); above 64 px the backbone gets its ImageNet stem."""
    from solo_ext.commands.pretrain import parse_cfg

    aug = {"crop_size": crop_size, "num_crops": 3 if method == "bcl" else 2}
    method_kwargs = {**(TINY_KWARGS if tiny else {}), **kwargs}
    if method in NO_QUEUE:
        method_kwargs.pop("queue_size", None)
    if tiny and method.startswith("all4one"):
        method_kwargs.update(pred_hidden_dim=32, temperature=0.2)
    cfg = OmegaConf.create(
        {
            "name": f"bench-{method}",
            "method": method,
            "backbone": {"name": backbone},
            "method_kwargs": method_kwargs,
            "momentum": {"base_tau": 0.99, "final_tau": 1.0},  # solo-learn's methods need it
            "data": {
                "dataset": "cifar10",
                "train_path": ".",
                "num_classes": 10,
                # the long-tail priors' counts (a 224 px run's dataset is renamed below)
                "train_class_counts": [1] * 10,
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
    cfg = parse_cfg(cfg)
    if crop_size > SMALL_STEM_MAX_CROP:
        # the dataset's name only picks the stem here: hosts give CIFAR names the small one
        cfg.data.dataset = "custom"
    return cfg


def _kind(op: object) -> str:
    """``aten.convolution`` -> ``aten::convolution``: the name of a counted operator."""
    return str(op).replace(".", "::", 1)


class _StepClock(pl.Callback):
    """The start time of every step; the FLOPs, the operators dispatched and (on CPU) the peak
    memory of step ``count_at`` (one whole step: forward, backward and optimiser, counted at the
    dispatcher)."""

    def __init__(self, device: torch.device, count_at: int | None = None):
        self.device = device
        self.starts: list[float] = []
        self.count_at = count_at
        self.modes: list[Any] = []
        self.flops: int | None = None
        self.kind_flops: dict[str, int] | None = None
        self.ops: int | None = None
        self.peak_mib: float | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.starts.append(time.perf_counter())
        if batch_idx == self.count_at:
            self.modes = [FlopCounterMode(display=False), OperatorCount()]
            if self.device.type == "cpu":
                self.modes.append(PeakBytes())
            for mode in self.modes:
                mode.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.modes:
            return
        for mode in reversed(self.modes):
            mode.__exit__(None, None, None)
        counter, op_counter, *peak = self.modes
        self.modes = []
        self.flops, self.ops = counter.get_total_flops(), op_counter.count
        counts = counter.get_flop_counts().get("Global", {})
        self.kind_flops = {_kind(op): int(n) for op, n in counts.items() if n}
        if peak:
            self.peak_mib = peak[0].peak / 2**20


def _batches(n: int, cfg: DictConfig) -> DataLoader:
    """``n`` ready batches ``[indexes, [view 1, view 2, ...], labels]`` (a loader without
    collation);
    for a PBSD run whose loader makes the patches, the views end with its patches and boxes."""
    from solo_ext.modules.patches import sample_boxes

    batch_size, crop_size = cfg.optimizer.batch_size, cfg.augmentations[0].crop_size
    gen = torch.Generator().manual_seed(0)
    shape = (batch_size, 3, crop_size, crop_size)
    views = [torch.randn(*shape, generator=gen) for _ in range(cfg.data.num_large_crops)]
    method = METHODS[cfg.method]
    transform = getattr(method, "pretrain_transform", lambda _: None)(cfg)
    if transform is not None:  # the loader's PBSD views: their patches and boxes
        boxes, size = transform.num_boxes, transform.patch_size
        views.append(torch.randn(batch_size, boxes, 3, size, size, generator=gen))
        views.append(sample_boxes(batch_size, boxes, crop_size, crop_size, generator=gen).round())
    labels = torch.randint(0, 10, (batch_size,), generator=gen)
    batches = [[torch.arange(batch_size) + i * batch_size, views, labels] for i in range(n)]
    return DataLoader(batches, batch_size=None)


def time_steps(
    cfg: DictConfig,
    steps: int,
    warmup: int,
    device: torch.device,
    count_flops: bool = False,
) -> Measurement:
    """One short fit: ``warmup + steps + 1`` steps, the last ``steps`` intervals are kept; with
    ``count_flops`` the last (untimed) step's FLOPs, operators and (on CPU) peak memory too."""
    # quiet for the measurement only: the caller's logging level and warning filters come back
    lightning_log = logging.getLogger("lightning.pytorch")
    level = lightning_log.level
    lightning_log.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module="lightning")
            return _time_steps(cfg, steps, warmup, device, count_flops)
    finally:
        lightning_log.setLevel(level)


def _time_steps(
    cfg: DictConfig,
    steps: int,
    warmup: int,
    device: torch.device,
    count_flops: bool,
) -> Measurement:
    torch.manual_seed(0)  # (lightning 2.1, which solo-learn pins, has no quiet seed_everything)
    model = METHODS[cfg.method](cfg).to(memory_format=torch.channels_last)
    last = warmup + steps  # never timed: counted
    clock = _StepClock(device, last if count_flops else None)
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
    trainer.fit(model, _batches(warmup + steps + 1, cfg))
    intervals = [b - a for a, b in zip(clock.starts, clock.starts[1:])][warmup:]
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        peak = clock.peak_mib
    return Measurement(intervals, peak, clock.flops, clock.ops, clock.kind_flops)


def measure_pairs(
    device: torch.device,
    batch_size: int,
    steps: int,
    warmup: int,
    rounds: int,
    tiny: bool,
    only: list[str] | None = None,
    backbone: str = "resnet18",
    crop_size: int = 32,
    done: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Rows ``{name, candidate, reference, median_s, q1_s, q3_s, gflops, peak_mib, ...}`` for
    every pair (or the pairs whose method or label is in ``only``); ``done`` is given each
    pair's two rows as soon as they are measured. ``images_per_s`` counts training images
    (each in all its views) per second: the batch over a step's time."""
    shape = dict(backbone=backbone, crop_size=crop_size)
    rows = []
    for (name, method, kwargs), (base_name, base_method, base_kwargs) in pairs():
        if only and method not in only and name not in only:
            continue
        cfgs = {
            name: step_cfg(method, kwargs, batch_size, device.type, tiny, **shape),
            base_name: step_cfg(base_method, base_kwargs, batch_size, device.type, tiny, **shape),
        }
        results = {label: Measurement() for label in cfgs}
        for r in range(rounds):
            for label, cfg in cfgs.items():
                # the first round counts the work of its last step
                got = time_steps(cfg.copy(), steps, warmup, device, r == 0)
                results[label].seconds += got.seconds
                results[label].flops = results[label].flops or got.flops
                results[label].ops = results[label].ops or got.ops
                results[label].kind_flops = results[label].kind_flops or got.kind_flops
                if got.peak_mib is not None:
                    results[label].peak_mib = max(results[label].peak_mib or 0.0, got.peak_mib)
        first = len(rows)
        for label, res in results.items():
            rows.append(
                {
                    "kind": "step",
                    "name": f"{name} vs {base_name}",
                    "shape": f"{backbone} {crop_size}px B={batch_size}",
                    "candidate": label,
                    "reference": base_name,
                    "median_s": res.median,
                    "q1_s": res.quartiles[0],
                    "q3_s": res.quartiles[1],
                    "gflops": res.flops / 1e9 if res.flops is not None else None,
                    "ops": res.ops,
                    "peak_mib": res.peak_mib,
                    "images_per_s": batch_size / res.median,
                    # one step's FLOPs by kind of counted operator
                    "kind_gflops": _per_kind(res.kind_flops, 1e-9),
                }
            )
        if done is not None:
            done(rows[first:])
    return rows


def _per_kind(values: dict[str, float] | None, scale: float) -> dict[str, float] | None:
    return None if values is None else {k: v * scale for k, v in sorted(values.items())}
