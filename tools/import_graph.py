"""The import graph of solo-ext between its layers, as a Mermaid flowchart.

    python tools/import_graph.py solo_ext          # the tree as it is
    git archive <commit> solo_ext | tar -x -C /tmp/old
    python tools/import_graph.py /tmp/old/solo_ext   # as it was at <commit>

Every ``import`` and ``from ... import`` of every file (module level and inside functions) is read
with ``ast``; a file belongs to its layer of the stack (``solo_ext/layers.py``, which the
README's Layout shows), and an arrow ``a --> b`` means some file of ``a`` imports some module of
``b`` (its label: how many files do). Arrows that break the stack (an import a layer does not
declare, the core to Lightning or solo-learn) are drawn dashed and listed after the graph.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

# the stack as the package declares it (solo_ext/layers.py; run from a checkout with the
# package importable): the group of a module is its layer
from solo_ext.layers import CORE, layer_of, may_import  # noqa: E402

EXTERNAL = {"lightning": "Lightning", "pytorch_lightning": "Lightning", "solo": "solo-learn"}


def group(module: str) -> str | None:
    """The group of a module name (``solo_ext.x.y`` or a third-party one); None: not drawn."""
    top = module.split(".")[0]
    if top in EXTERNAL:
        return EXTERNAL[top]
    return layer_of(module)


def imports(path: Path, package: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.level:  # relative: resolve against the file's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.add(".".join([*base, node.module]))
            else:
                found.add(node.module)
    return found


def edges(root: Path) -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    for path in sorted(root.rglob("*.py")):
        parts = ("solo_ext", *path.relative_to(root).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        source = group(name)
        targets = {group(m) for m in imports(path, ".".join(parts[:-1]))}
        for target in targets - {None, source}:
            counts[(source, target)] += 1
    return counts


def node(group: str) -> str:
    """A group as a Mermaid node: the third-party ones apart from the layers (solo-learn, the
    package, is not the ``solo_learn`` layer that patches it)."""
    if group in EXTERNAL.values():
        return f'ext_{group.replace("-", "_")}["{group}"]'
    return group


def breaks(source: str, target: str) -> bool:
    if target in EXTERNAL.values():
        return source in CORE
    return target not in may_import(source)


def main(root: str) -> None:
    counts = edges(Path(root))
    print("```mermaid\nflowchart TD")
    for (source, target), n in sorted(counts.items()):
        arrow = "-.->" if breaks(source, target) else "-->"
        print(f"    {node(source)} {arrow}|{n}| {node(target)}")
    print("```")
    wrong = [f"{s} -> {t} ({n} files)" for (s, t), n in sorted(counts.items()) if breaks(s, t)]
    print("\nAgainst the stack: " + ("; ".join(wrong) if wrong else "none"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "solo_ext")
