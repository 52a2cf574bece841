"""The import graph of solo-ext between its layers, as a Mermaid flowchart.

    python tools/import_graph.py solo_ext          # the tree as it is
    git archive <commit> solo_ext | tar -x -C /tmp/old
    python tools/import_graph.py /tmp/old/solo_ext   # as it was at <commit>

Every ``import`` and ``from ... import`` of every file (module level and inside functions) is read
with ``ast``; a file belongs to the group of its place in the stack (the README's Layout), and an
arrow ``a --> b`` means some file of ``a`` imports some module of ``b`` (its label: how many
files do). Arrows that break the stack (the core to the host or to Lightning, the host to the
evaluation) are drawn dashed and listed after the graph.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

# group of a module, by the longest matching prefix (relative to the package)
GROUPS = {
    "common": "bottom",
    "losses": "bottom",
    "modules": "bottom",
    "config": "core",
    "data.facts": "facts",  # the dataset table: the one part of data the host reads
    "data": "core",
    "eval": "core",
    "run_backbone": "core",  # the run's backbone into an evaluation config
    "host": "host",
    "methods": "methods",
}
EXTERNAL = {"lightning": "Lightning", "pytorch_lightning": "Lightning", "solo": "solo-learn"}
CORE = {"bottom", "facts", "core"}


def group(module: str) -> str | None:
    """The group of a module name (``solo_ext.x.y`` or a third-party one); None: not drawn."""
    top = module.split(".")[0]
    if top in EXTERNAL:
        return EXTERNAL[top]
    if top != "solo_ext":
        return None
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in GROUPS:
            return GROUPS[".".join(parts[:n])]
    return "commands"


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


def breaks(source: str, target: str) -> bool:
    up = target in {"host", "methods", "commands", "Lightning", "solo-learn"}
    return (source in CORE and up) or (source == "host" and target in {"core", "methods"})


def main(root: str) -> None:
    counts = edges(Path(root))
    print("```mermaid\nflowchart TD")
    for (source, target), n in sorted(counts.items()):
        arrow = "-.->" if breaks(source, target) else "-->"
        print(f"    {source.replace('-', '_')} {arrow}|{n}| {target.replace('-', '_')}")
    print("```")
    wrong = [f"{s} -> {t} ({n} files)" for (s, t), n in sorted(counts.items()) if breaks(s, t)]
    print("\nAgainst the stack: " + ("; ".join(wrong) if wrong else "none"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "solo_ext")
