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


def test_the_methods_table_lists_the_declared_options():
    """Each method's ``method_kwargs`` in the README's Methods table are its declarations (key,
    default, help), as ``tools/readme_options.py`` writes them; the class docstring lists the
    same declarations."""
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import readme_options
    finally:
        sys.path.pop(0)
    from solo_ext.config import option_entries
    from solo_ext.methods.registry import SOLO_EXT_METHODS, load, options_markdown

    rows = {m["name"]: m["keys"] for m in readme_options.ROW.finditer(README)}
    assert set(SOLO_EXT_METHODS) <= set(rows), sorted(set(SOLO_EXT_METHODS) - set(rows))
    for name in SOLO_EXT_METHODS:
        assert rows[name] == options_markdown(name), (
            f"README's {name} row differs from its declarations: run tools/readme_options.py"
        )
        options = load(name).METHOD_KWARGS
        assert all(option.help for option in options.values()), name  # every key says what it is
        doc = " ".join(load(name).__doc__.split())
        for entry in option_entries(options):
            assert " ".join(entry.replace("`", "``").split()) in doc, (name, entry)


def test_the_methods_table_follows_a_changed_declaration(monkeypatch):
    """The list is made from the declarations: a default changed there shows in the row."""
    import dataclasses

    from solo_ext.methods.registry import load, options_markdown

    options = load("scl").METHOD_KWARGS
    assert "`temperature` (default 0.07): " in options_markdown("scl")
    monkeypatch.setitem(
        options, "temperature", dataclasses.replace(options["temperature"], default=0.5)
    )
    assert "`temperature` (default 0.5): " in options_markdown("scl")
