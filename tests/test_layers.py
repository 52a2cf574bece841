"""The package is a stack, declared once in ``solo_ext/layers.py``: every import of every file is
held to it (each pair of layers, the core's included), the core imports neither a host nor
Lightning, the import-graph tool groups by it and docs/internals.md shows it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import solo_ext
from solo_ext.layers import CORE, LAYERS, layer_of, may_import, render

PACKAGE = Path(solo_ext.__file__).parent
ROOT = PACKAGE.parent
FRAMEWORKS = ("lightning", "pytorch_lightning", "solo")  # solo-learn's package is ``solo``
FILES = sorted(PACKAGE.rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path) -> set[str]:
    """Every absolute import of a file (module level or inside functions); ``from a import b``
    counts ``a`` and, when it is a module, ``a.b``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (the layers test reads absolute ones)"
            found.add(node.module)
            found.update(
                f"{node.module}.{a.name}"
                for a in node.names
                if _is_module(f"{node.module}.{a.name}")
            )
    return found


@pytest.mark.parametrize("path", FILES, ids=_module_name)
def test_every_import_goes_down_the_stack(path):
    layer = layer_of(_module_name(path))
    allowed = may_import(layer)
    wrong = sorted(
        f"{name} ({layer_of(name)})"
        for name in _imports(path)
        if layer_of(name) is not None and layer_of(name) not in allowed
    )
    assert not wrong, f"{_module_name(path)} ({layer}) imports {wrong}; it may import {allowed}"


@pytest.mark.parametrize(
    "path", [p for p in FILES if layer_of(_module_name(p)) in CORE], ids=_module_name
)
def test_the_core_imports_no_host_and_no_lightning(path):
    wrong = sorted(
        n for n in _imports(path) if n.split(".")[0] in FRAMEWORKS or layer_of(n) == "host"
    )
    assert not wrong, f"{_module_name(path)} imports {wrong}: the core imports no host/Lightning"


# importing the whole core at run time (an import by name the walk above cannot see) loads no
# host and no Lightning: tests/test_host.py, in a fresh interpreter with the start-up hook


def test_every_layer_holds_a_file_and_sees_only_layers_below():
    order = [name for name, *_ in LAYERS]
    for name, _, allowed, _ in LAYERS:
        assert all(order.index(a) < order.index(name) for a in allowed), name
        assert any(layer_of(_module_name(p)) == name for p in FILES), name


def test_the_import_graph_tool_groups_by_the_declared_layers():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import import_graph
    finally:
        sys.path.remove(str(ROOT / "tools"))
    for path in FILES:
        name = _module_name(path)
        assert import_graph.group(name) == layer_of(name), name


def test_the_internals_page_shows_the_declared_stack():
    assert render() in (ROOT / "docs" / "internals.md").read_text()
