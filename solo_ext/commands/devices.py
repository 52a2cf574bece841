"""Where the evaluation commands run, as their ``accelerator`` and ``devices`` keys say (the
linear command's training goes to Lightning's Trainer with the same keys)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from omegaconf import OmegaConf


def eval_device(
    accelerator: str = "auto", devices: int | str | Sequence[int] = 1, rank: int = 0
) -> torch.device:
    """The device an evaluation runs on for its ``accelerator`` (``cpu``, ``gpu``, or ``auto``:
    the GPU when torch sees one): the CPU, or the GPU of local process ``rank`` among those
    Lightning's parse of ``devices`` names (``1``: the first; ``[2, 3]``; ``"0,1"``; ``-1`` and
    ``auto``: all)."""
    if accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if OmegaConf.is_config(devices):
        devices = OmegaConf.to_container(devices)
    return torch.device("cuda", gpu_indices(devices)[rank])


def gpu_indices(devices: int | str | Sequence[int]) -> list[int]:
    """The GPU indices ``devices`` names, as Lightning reads the key: a count (the first n;
    ``-1``: all), a list of indices, a string of them (``"0,1"``; one number: a count), or
    ``auto`` (all)."""
    if devices in ("auto", -1, "-1"):
        return list(range(torch.cuda.device_count()))
    if isinstance(devices, str):
        parts = [p for p in devices.split(",") if p.strip()]
        if len(parts) == 1 and not devices.strip().endswith(","):
            return list(range(int(parts[0])))
        return [int(p) for p in parts]
    if isinstance(devices, int):
        return list(range(devices))
    return [int(d) for d in devices]
