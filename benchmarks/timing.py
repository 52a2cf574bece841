"""Interleaved timing of several callables: warm-up, then rounds in which each runs once, so
that drifts of the machine (clocks, other load) hit every candidate alike."""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode


@dataclass
class Measurement:
    """Seconds per call (one per round), the peak memory above the start in MiB (on CPU: of
    the tensors the call, or a step's counted call, allocates) and, for training steps, the
    FLOPs (also by operator kind, ``aten::`` name) and the operators dispatched of one step."""

    seconds: list[float] = field(default_factory=list)
    peak_mib: float | None = None
    flops: int | None = None
    ops: int | None = None
    kind_flops: dict[str, int] | None = None

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


class OperatorCount(TorchDispatchMode):
    """While active, the number of operators dispatched (views included): what a step costs the
    host, which bounds it where the device is fast and the batch small."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


class PeakBytes(TorchDispatchMode):
    """While active, the bytes of the CPU storages that operators create and that are still
    alive, and their maximum. A view or an in-place result shares a known storage and adds
    nothing; a storage's bytes are released when its last tensor dies."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.tracked: set[int] = set()

    def _release(self, ptr: int, nbytes: int) -> None:
        self.tracked.discard(ptr)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                continue
            storage = t.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or ptr in self.tracked:
                continue
            self.tracked.add(ptr)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._release, ptr, nbytes)
        return out


def cpu_peak_mib(fn: Callable[[], object]) -> float:
    """Peak memory of the tensors ``fn`` allocates on the CPU, in MiB."""
    with PeakBytes() as tracker:
        fn()
    return tracker.peak / 2**20


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    candidates: dict[str, Callable[[], object]],
    device: torch.device,
    warmup: int = 1,
    repeats: int = 5,
) -> dict[str, Measurement]:
    """Runs every candidate ``warmup`` times, then ``repeats`` rounds of one call each; one more
    untimed call each counts its FLOPs and the operators it dispatches (and, on CPU, measures its
    peak memory)."""
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
    for name, fn in candidates.items():
        with FlopCounterMode(display=False) as flops, OperatorCount() as ops:
            fn()
        results[name].flops, results[name].ops = flops.get_total_flops(), ops.count
        if device.type == "cpu":
            results[name].peak_mib = cpu_peak_mib(fn)
    return results
