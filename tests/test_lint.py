"""ruff (lint, import order, format) at line length 100 over the package, the Hydra plugin, the
tests, the tools and the benchmarks, with the ruff version the test extra pins."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

_BESIDE = Path(sys.executable).parent / "ruff"  # the venv's ruff, even if it is not on PATH
RUFF = str(_BESIDE) if _BESIDE.exists() else shutil.which("ruff")


@pytest.mark.parametrize("args", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff(args):
    assert RUFF, "ruff is part of the test extra: pip install -e '.[test]'"
    proc = subprocess.run(
        [RUFF, *args, "solo_ext", "hydra_plugins", "tests", "tools", "benchmarks"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
