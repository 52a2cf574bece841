"""Freed CPU memory kept in the process for the next step (glibc's malloc only).

glibc serves a block above its mmap threshold (which grows with the blocks freed, up to
32 MiB on 64-bit) from a fresh mapping and returns it to the system when freed. A training step
on CPU whose activations are larger (ResNet-18 at 32 px: 16 MiB a layer per 64 images, so 48
MiB for BCL's three crops in one batch) maps them again at every step and pays a page fault per
4 KiB page on the first write: on 2 CPU cores this was a quarter of BCL's step, and the batch
norm and ReLU backward passes ran 3x slower. Raising the mmap and trim thresholds keeps the
freed blocks in the heap, where the next step reuses them.

This changes the whole process, for the rest of its life: solo-ext's methods apply it when they
start to train on CPU (never on import, so a solo-learn run that uses nothing of solo-ext is
untouched); ``SOLO_EXT_KEEP_CPU_MEMORY=0`` turns it off. Its cost: the process keeps up to
``TRIM_THRESHOLD`` of freed memory instead of returning it. glibc before 2.35 takes an mmap
threshold of 32 MiB at most: there the blocks above it are still mapped afresh.
"""

from __future__ import annotations

import ctypes
import os
import platform

MMAP_THRESHOLD = 1 << 30  # blocks up to 1 GiB come from the heap
# glibc before 2.35 refuses an mmap threshold above half its heap size (32 MiB on 64-bit)
OLD_GLIBC_MMAP_THRESHOLD = 4 * 1024 * 1024 * ctypes.sizeof(ctypes.c_long)
TRIM_THRESHOLD = 1 << 30  # freed memory kept at the top of the heap before it is returned
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
ENV = "SOLO_EXT_KEEP_CPU_MEMORY"

_applied = False


def keep_freed_cpu_memory() -> bool:
    """Sets glibc's mmap and trim thresholds once per process; True when they are set (now or
    before), False where this is not glibc or ``SOLO_EXT_KEEP_CPU_MEMORY=0``."""
    global _applied
    if _applied:
        return True
    if os.environ.get(ENV, "1") == "0" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # the mmap threshold first (setting either freezes glibc's own moving threshold); mallopt
    # returns 1 when it took the value
    if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) or mallopt(
        _M_MMAP_THRESHOLD, OLD_GLIBC_MMAP_THRESHOLD
    ):
        _applied = bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _applied


def freed_cpu_memory_kept() -> bool:
    """Whether :func:`keep_freed_cpu_memory` has set the thresholds in this process."""
    return _applied
