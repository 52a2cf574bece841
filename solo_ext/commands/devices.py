"""Where the evaluation commands run, as their ``accelerator`` and ``devices`` keys say (the
linear command's training goes to Lightning's Trainer with the same keys)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from lightning.fabric.accelerators import CUDAAccelerator
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
    indices = CUDAAccelerator.parse_devices(-1 if devices == "auto" else devices)
    return CUDAAccelerator.get_parallel_devices(indices)[rank]
