"""The package is a stack: the core (losses, modules, data, eval, config, common) imports neither
the host nor Lightning nor anything above it; the host builds on the bottom of the core only (no
evaluation, no methods); the methods and the commands sit on top."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import solo_ext

PACKAGE = Path(solo_ext.__file__).parent
CORE = ("solo_ext.common", "solo_ext.config", "solo_ext.losses", "solo_ext.modules")
CORE += ("solo_ext.data", "solo_ext.eval", "solo_ext.run_backbone")
BOTTOM = ("solo_ext.common", "solo_ext.losses", "solo_ext.modules")  # below data and config
FRAMEWORKS = ("lightning", "pytorch_lightning", "solo")  # solo-learn's package is ``solo``


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules_under(prefix: str) -> list[Path]:
    base = PACKAGE.parent / prefix.replace(".", "/")
    return sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]


def _imports(path: Path) -> set[str]:
    """Every absolute import of a file, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (the layers test reads absolute ones)"
            found.add(node.module)
    return found


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _layer_files(prefixes: tuple[str, ...]) -> list[Path]:
    return [path for prefix in prefixes for path in _modules_under(prefix)]


@pytest.mark.parametrize("path", _layer_files(CORE), ids=_module_name)
def test_core_imports_only_core(path):
    wrong = sorted(
        name
        for name in _imports(path)
        if _within(name, FRAMEWORKS) or (_within(name, ("solo_ext",)) and not _within(name, CORE))
    )
    assert not wrong, f"{_module_name(path)} imports {wrong}: the core imports no host/Lightning"


@pytest.mark.parametrize("path", _layer_files(BOTTOM), ids=_module_name)
def test_losses_and_modules_import_only_the_bottom(path):
    wrong = sorted(
        n for n in _imports(path) if _within(n, ("solo_ext",)) and not _within(n, BOTTOM)
    )
    assert not wrong, f"{_module_name(path)} imports {wrong}: losses and modules are the bottom"


@pytest.mark.parametrize("path", _layer_files(("solo_ext.host",)), ids=_module_name)
def test_host_builds_on_the_bottom_only(path):
    allowed = BOTTOM + ("solo_ext.host", "solo_ext.data.facts")
    wrong = sorted(
        n for n in _imports(path) if _within(n, ("solo_ext",)) and not _within(n, allowed)
    )
    assert not wrong, f"{_module_name(path)} imports {wrong}: the host sits on the bottom only"


def test_importing_the_whole_core_loads_no_host_and_no_lightning():
    """What the static walk cannot see (an import by name at run time) shows in sys.modules."""
    names = [_module_name(p) for p in _layer_files(CORE)]
    code = (
        "import importlib, json, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        f"top = {FRAMEWORKS!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in top\n"
        "                        or m.startswith('solo_ext.host'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    assert len(names) > 20  # the walk found the package
