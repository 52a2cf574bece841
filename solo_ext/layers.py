"""The package's stack, declared once: ``tests/test_layers.py`` holds every import to it,
``tools/import_graph.py`` groups the import graph by it, and docs/internals.md shows
:func:`render` of it (a test compares them). Data: nothing of the package is imported here.

Each layer lists its modules (prefixes relative to the package; a module belongs to the layer
with the longest matching prefix, the commands take the rest) and the layers it may import
(itself always). The core (``facts`` up to ``run_backbone``) imports neither the host nor
Lightning; the host sees only the bottom, the dataset facts and the config's declarations (the
defaults of solo-learn's base class).
"""

from __future__ import annotations

import textwrap

# bottom first: (name, modules, layers it may import besides itself, what it holds)
LAYERS: tuple[tuple[str, tuple[str, ...], tuple[str, ...], str], ...] = (
    (
        "bottom",
        ("common", "losses", "modules", "layers"),
        (),
        "losses/ (pure functions), modules/ (heads, queues, support set, ResNet-32, the "
        "small-image stem, patch pooling, the kNN vote), common.py, layers.py",
    ),
    ("facts", ("facts",), ("bottom",), "facts.py: every fact about a dataset name"),
    ("config", ("config",), ("bottom", "facts"), "config.py: options, checks, run defaults"),
    (
        "data",
        ("data",),
        ("bottom", "facts", "config"),
        "data/ (datasets, samplers, transforms, DALI, PBSD views)",
    ),
    (
        "eval",
        ("eval",),
        ("bottom", "facts", "config", "data"),
        "eval/ (long-tail report, kNN, head, shot groups, dense probe metrics)",
    ),
    (
        "run_backbone",
        ("runs.backbone",),
        ("bottom", "config"),
        "runs/backbone.py: a run's backbone into an evaluation config",
    ),
    (
        "host",
        ("host", "solo_learn.backbones"),
        ("bottom", "facts", "config"),
        "host/ (solo-learn when importable, else standalone/), solo_learn/backbones.py (the "
        "patch of solo-learn's backbone table that the host applies)",
    ),
    (
        "methods",
        ("methods",),
        ("bottom", "facts", "config", "data", "eval", "host"),
        "methods/ (one file per method, the registry)",
    ),
    (
        "runs",
        ("runs",),
        ("bottom", "facts", "config", "data", "run_backbone", "host"),
        "runs/ (a run loaded for evaluation, checkpoints, resume, the recorded environment)",
    ),
    (
        "solo_learn",
        ("solo_learn",),
        ("bottom", "facts", "config", "data", "eval", "run_backbone", "host", "methods", "runs"),
        "solo_learn/ (the start-up hook, the patches of solo-learn's modules, their needs)",
    ),
    (
        "commands",
        ("",),
        ("bottom", "facts", "config", "data", "eval", "run_backbone", "host", "methods", "runs"),
        "commands/ (the console commands and their entry plumbing), leaderboard/, and the "
        "python -m forms (pretrain.py knn.py linear.py make_lt.py dense_probe.py)",
    ),
)
# the layers that import neither a host nor Lightning
CORE = ("bottom", "facts", "config", "data", "eval", "run_backbone")


def layer_of(module: str) -> str | None:
    """The layer of ``solo_ext.<...>`` (None for a module outside the package)."""
    parts = module.split(".")
    if parts[0] != "solo_ext":
        return None
    rest = ".".join(parts[1:])
    best, length = "commands", -1
    for name, prefixes, _, _ in LAYERS:
        for prefix in prefixes:
            hit = prefix == "" or rest == prefix or rest.startswith(prefix + ".")
            if hit and len(prefix) > length:
                best, length = name, len(prefix)
    return best


def may_import(layer: str) -> tuple[str, ...]:
    """The layers ``layer`` may import: itself and those it declares."""
    for name, _, allowed, _ in LAYERS:
        if name == layer:
            return (name, *allowed)
    raise KeyError(layer)


def render() -> str:
    """The stack as docs/internals.md shows it, top first."""
    width = max(len(name) for name, *_ in LAYERS)
    indent = " " * (width + 2)
    lines = []
    for name, _, allowed, holds in reversed(LAYERS):
        sees = ", ".join(allowed) or "nothing else"
        text = f"{holds}; imports: {sees}"
        wrapped = textwrap.wrap(text, 98 - len(indent))
        lines.append(f"{name:<{width}}  {wrapped[0]}")
        lines += [indent + line for line in wrapped[1:]]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render())
