"""Freed CPU memory kept for the next step: with it, a block above glibc's mmap threshold is
reused without page faults; solo-ext's methods set it when they start to train on CPU, never on
import, and ``SOLO_EXT_KEEP_CPU_MEMORY=0`` turns it off. The setting is the whole process's for
good, so each case runs in a fresh interpreter."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="glibc's malloc thresholds (Linux)"
)

# 64 MiB written, freed and written again: the minor page faults of the last three of 24
# rounds (kept, glibc settles on one block after a few: its aligned blocks grow the heap until
# freed neighbours merge)
FAULTS = """
import json, resource, sys, torch
from solo_ext.modules.cpu_memory import keep_freed_cpu_memory
applied = keep_freed_cpu_memory() if sys.argv[1] == "keep" else False
faults = []
for i in range(24):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(16 * 2**20)  # 64 MiB: above the 32 MiB glibc maps on its own at most
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del x
print(json.dumps({"applied": applied, "faults": faults[-3:]}))
"""


def _run(code: str, *args: str, **env: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _glibc() -> tuple[int, ...]:
    return tuple(int(part) for part in platform.libc_ver()[1].split(".")[:2])


@pytest.mark.skipif(_glibc() < (2, 35), reason="glibc before 2.35 maps blocks above 32 MiB")
def test_a_freed_block_is_reused_without_page_faults():
    kept = _run(FAULTS, "keep")
    assert kept["applied"] is True
    assert max(kept["faults"]) <= 8, kept  # the heap's pages, already mapped
    # glibc's default: mapped again at every round, a fault a page (4 KiB; 2 MiB where
    # transparent huge pages are always on: still 32 for 64 MiB)
    fresh = _run(FAULTS, "default")
    assert min(fresh["faults"]) >= 32, fresh
    off = _run(FAULTS, "keep", SOLO_EXT_KEEP_CPU_MEMORY="0")
    assert off["applied"] is False and min(off["faults"]) >= 32, off


FIT_START = """
import json, sys
sys.path.insert(0, sys.argv[1])
from conftest import tiny_cfg
import solo_ext.modules.cpu_memory as cpu_memory
from solo_ext.commands.pretrain import parse_cfg
from solo_ext.host import METHODS
cfgs = [parse_cfg(tiny_cfg(m, sys.argv[2])) for m in ("bcl", "scl")]  # (registers the methods)
models = [METHODS[cfg.method](cfg) for cfg in cfgs]
# the methods are imported and built: nothing is set yet
on_import = cpu_memory.freed_cpu_memory_kept()
models[0].on_fit_start()
print(json.dumps({"on_import": on_import, "at_fit_start": cpu_memory.freed_cpu_memory_kept()}))
"""


def test_solo_ext_methods_set_it_when_they_start_to_train_on_cpu(tmp_path):
    got = _run(FIT_START, os.path.dirname(__file__), str(tmp_path))
    assert got == {"on_import": False, "at_fit_start": True}
