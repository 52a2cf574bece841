"""Every fact about a dataset name lives in ``solo_ext/facts.py``: no other module compares a
value with a dataset's name or reads one off its suffix."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import solo_ext
from solo_ext.facts import DATASETS, SOLO_EXT_ONLY, facts

PACKAGE = Path(solo_ext.__file__).parent
FILES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "facts.py")


def _names_compared(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                found += [
                    v.value
                    for v in values
                    if isinstance(v, ast.Constant) and isinstance(v.value, str)
                    and v.value in DATASETS
                ]  # fmt: skip
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("endswith", "removesuffix", "startswith") and any(
                isinstance(a, ast.Constant) and a.value in ("_lt", "cifar", "imagenet")
                for a in node.args
            ):
                found.append(f".{node.func.attr}({ast.unparse(node.args[0])})")
    return found


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_branches_on_a_dataset_name(path):
    found = _names_compared(ast.parse(path.read_text()))
    assert not found, f"{path.relative_to(PACKAGE)} compares with {found}: read a fact instead"


def test_the_facts_say_what_the_names_did():
    assert SOLO_EXT_ONLY == (
        "cifar10_lt", "cifar100_lt", "fashion_mnist", "fashion_mnist_lt", "imagenet_lt",
        "places_lt", "inat2018", "custom_lt", "synthetic_lt",
    )  # fmt: skip
    assert [n for n, f in DATASETS.items() if f.source == "generated"] == ["synthetic_lt"]
    assert {n: f.images_per_class for n, f in DATASETS.items() if f.images_per_class} == {
        "cifar10": 5000, "cifar100": 500, "cifar10_lt": 5000, "cifar100_lt": 500,
        "fashion_mnist": 6000, "fashion_mnist_lt": 6000,
    }  # fmt: skip
    assert {n for n, f in DATASETS.items() if f.balanced} == {
        "cifar10", "cifar100", "imagenet100", "imagenet", "fashion_mnist",
    }  # fmt: skip
    assert facts("synthetic_lt").default_imbalance == 10 and facts("imagenet_lt").long_tailed
    assert all(f.default_imbalance == 100 for n, f in DATASETS.items()
               if f.long_tailed and n != "synthetic_lt")  # fmt: skip
