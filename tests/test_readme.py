"""The README's set-up and main-job commands are the ones CI and the tests run, the methods'
options in docs/methods.md are their declarations, and the pages' links name files that exist, so
none of them rots."""

from __future__ import annotations

import re

from conftest import ROOT
from test_cli import MAIN_JOB

README = (ROOT / "README.md").read_text()
METHODS_PAGE = (ROOT / "docs" / "methods.md").read_text()


def _blocks() -> list[list[str]]:
    return [b.strip().splitlines() for b in re.findall(r"```bash\n(.*?)```", README, re.S)]


def _block(name: str) -> list[str]:
    """The README's block marked ``<!-- command: <name> -->``."""
    (body,) = re.findall(rf"<!-- command: {name} -->\n```bash\n(.*?)```", README, re.S)
    return body.strip().splitlines()


def test_two_setup_commands_run_by_ci():
    """The README's first blocks: the install into solo-learn's environment, the development
    set-up (CI runs it), the main job."""
    setup = _block("setup")
    assert _blocks()[:3] == [_block("install-into-solo-learn"), setup, _block("main-job")]
    assert _block("install-into-solo-learn")[0] == "pip install -e ."
    assert setup == ['pip install -e ".[test,dali]"', "pytest"]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    for command in setup:
        assert command in ci, f".ci/run does not run the README's {command!r}"


def test_the_install_states_the_version_floors():
    """The version floors the README says the install may raise are pyproject.toml's."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = [d.split("#")[0].strip().split(">=") for d in project["dependencies"] if ">=" in d]
    stated = re.search(r"solo-ext's version floors: (.*?) \(", " ".join(README.split()))
    assert stated and stated.group(1) == ", ".join(f"{name} {floor}" for name, floor in floors)


def test_main_job_command_is_the_tested_one():
    main_job = _block("main-job")
    assert main_job == [" ".join(MAIN_JOB)]  # the command test_cli.py runs


def test_the_methods_table_lists_the_declared_options():
    """Each method's ``method_kwargs`` in docs/methods.md's table are its declarations (key,
    default, help), as ``tools/docs_options.py`` writes them; the class docstring lists the
    same declarations."""
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import docs_options
    finally:
        sys.path.pop(0)
    from solo_ext.config import option_entries
    from solo_ext.methods.registry import SOLO_EXT_METHODS, load, options_markdown

    rows = {m["name"]: m["keys"] for m in docs_options.ROW.finditer(METHODS_PAGE)}
    assert set(SOLO_EXT_METHODS) <= set(rows), sorted(set(SOLO_EXT_METHODS) - set(rows))
    for name in SOLO_EXT_METHODS:
        assert rows[name] == options_markdown(name), (
            f"docs/methods.md's {name} row differs from its declarations: run tools/docs_options.py"
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


def _relative_links(page) -> list[str]:
    """The link targets of a markdown page that are files of this repository (no URL, no anchor)."""
    targets = re.findall(r"\]\(([^)\s]+)\)", page.read_text())
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:|#", t)]


def test_every_relative_link_of_the_pages_names_a_file_that_exists(tmp_path):
    """The README, docs/ and the zoo's pages link only to files the repository holds (the README
    once linked a zoo page before it was written)."""
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "zoo").glob("*.md")]
    missing = [
        f"{page.relative_to(ROOT)} -> {target}"
        for page in pages
        for target in _relative_links(page)
        if not (page.parent / target).exists()
    ]
    assert not missing, missing
    # the check sees a broken link
    page = tmp_path / "page.md"
    page.write_text("[a](there.md) [b](https://example.org/x.md) [c](#here)")
    assert _relative_links(page) == ["there.md"]
    assert not (tmp_path / "there.md").exists()
