"""Interleaved timing of several callables: warm-up, then rounds in which each runs once, so
that drifts of the machine (clocks, other load) hit every candidate alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class Measurement:
    """Seconds per call (one per round), the peak memory above the start in MiB (CUDA only;
    None on CPU) and, for training steps, the FLOPs of one step."""

    seconds: list[float] = field(default_factory=list)
    peak_mib: float | None = None
    flops: int | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def quartiles(self) -> tuple[float, float]:
        """(first, third) quartile of the times: the spread around the median."""
        if len(self.seconds) < 2:
            return self.seconds[0], self.seconds[0]
        q1, _, q3 = statistics.quantiles(self.seconds, n=4, method="inclusive")
        return q1, q3


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    candidates: dict[str, Callable[[], object]],
    device: torch.device,
    warmup: int = 1,
    repeats: int = 5,
) -> dict[str, Measurement]:
    """Runs every candidate ``warmup`` times, then ``repeats`` rounds of one call each."""
    results = {name: Measurement() for name in candidates}
    for _ in range(warmup):
        for fn in candidates.values():
            fn()
    for _ in range(repeats):
        for name, fn in candidates.items():
            if device.type == "cuda":
                torch.cuda.empty_cache()
                base = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            results[name].seconds.append(time.perf_counter() - start)
            if device.type == "cuda":
                peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20
                results[name].peak_mib = max(results[name].peak_mib or 0.0, peak)
    return results
