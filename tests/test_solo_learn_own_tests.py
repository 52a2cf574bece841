"""solo-learn's own tests give the same results with solo-ext's start-up hook on and off
(``SOLO_EXT_AUTOLOAD=0``): the plugin changes nothing solo-learn does with a config that uses
nothing of solo-ext. Runs where solo-learn's source (its ``tests/``) is here: the environment
with solo-learn's pinned requirements and ``SOLO_LEARN_DIR``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NEEDS_SOLO_LEARN, SOLO_LEARN_DIR

SOLO_DIR = str(SOLO_LEARN_DIR)

pytestmark = [pytest.mark.solo_learn, pytest.mark.early(minutes=12)]


def environment(hook: bool) -> dict[str, str]:
    # (one core each: the suite's other workers run beside)
    env = {**os.environ, "SOLO_EXT_AUTOLOAD": "1" if hook else "0", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SOLO_DIR, env.get("PYTHONPATH")]))
    return env


def start(hook: bool, where: Path) -> subprocess.Popen:
    """The whole of solo-learn's tests/, with the hook on or off, started in the folder ``where``
    (what they write goes there; their output into ``where / "log"``). Those that download a
    dataset fail alike on a machine with no network, hook on or off, and are compared too."""
    where.mkdir()
    with open(where / "log", "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider"]
            + [str(Path(SOLO_DIR) / "tests"), "--rootdir", SOLO_DIR],
            cwd=where,
            env=environment(hook),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def outcomes(run: subprocess.Popen, where: Path) -> dict[str, str]:
    """Each of solo-learn's tests (node id) -> passed / failed / error / skipped."""
    run.wait(timeout=1800)
    log = (where / "log").read_text()
    outcome = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)", re.MULTILINE)
    found = {test: result.lower() for result, test in outcome.findall(log)}
    tail = log[-2000:]
    assert found, f"no outcome read from solo-learn's tests:\n{tail}"
    # a collection error (a package solo-learn's tests import is missing) stops pytest before any
    # test runs: both runs would then agree on that one error and compare nothing
    assert "Interrupted" not in log, f"solo-learn's tests did not run:\n{tail}"
    assert "passed" in found.values(), f"none of solo-learn's tests passed:\n{tail}"
    return found


def hook_registers(hook: bool) -> bool:
    code = "import solo.methods as m; print('dscl' in m.METHODS)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=environment(hook), capture_output=True, text=True
    )
    return out.stdout.strip().endswith("True")


def test_solo_learns_own_tests_pass_alike_with_and_without_the_plugin(tmp_path):
    if not (SOLO_LEARN_DIR / "tests" / "args").is_dir():
        pytest.skip(f"{NEEDS_SOLO_LEARN}'s own tests/ (its checkout at {SOLO_LEARN_DIR} has none)")
    assert hook_registers(True) and not hook_registers(False)  # the hook is what differs
    # one after the other (some of solo-learn's tests hold GBs), each in a folder of its own
    # (solo-learn's tests write where they run)
    on = outcomes(start(True, tmp_path / "on"), tmp_path / "on")
    off = outcomes(start(False, tmp_path / "off"), tmp_path / "off")
    assert set(on) == set(off), sorted(set(on) ^ set(off))
    broken = sorted(t for t, result in off.items() if result == "passed" and on[t] != "passed")
    assert not broken, f"pass without solo-ext, fail with it: {broken}"
    mended = sorted(t for t, result in on.items() if result == "passed" and off[t] != "passed")
    assert not mended, f"the plugin changes solo-learn's results (pass only with it): {mended}"
