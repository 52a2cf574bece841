"""The README's commands are the ones CI and the tests run, so none of them rots."""

from __future__ import annotations

import re

from conftest import ROOT
from test_cli import MAIN_JOB

README = (ROOT / "README.md").read_text()


def _blocks() -> list[list[str]]:
    return [b.strip().splitlines() for b in re.findall(r"```bash\n(.*?)```", README, re.S)]


def test_two_setup_commands_run_by_ci():
    setup = _blocks()[0]
    assert setup == ['pip install -e ".[test,dali]"', "pytest"]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for command in setup:
        assert command in ci, f".ci/run does not run the README's {command!r}"


def test_main_job_command_is_the_tested_one():
    main_job = _blocks()[1]
    assert main_job == [" ".join(MAIN_JOB)]  # the command test_cli.py runs
    assert (ROOT / "scripts/pretrain/synthetic-lt/pbsd.yaml").is_file()


def test_the_tested_solo_learn_is_the_one_the_bridge_names():
    """The release and commit the README tells users to install are those the bridge's one-line
    error says it is tested with."""
    from solo_ext.solo_learn.check import TESTED_WITH

    release, commit = TESTED_WITH
    assert f"solo-learn {release} at\ncommit `{commit}`" in README
    assert f"git checkout {commit}" in README
