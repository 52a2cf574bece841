"""Writes the last column of the methods table of docs/methods.md from the methods' declarations.

    python tools/docs_options.py          # rewrites docs/methods.md in place
    python tools/docs_options.py --check  # exit status 1 when the page differs

Each method's ``method_kwargs`` (key, default, help) are declared once, as ``Option``\\ s in its
``METHOD_KWARGS``; the class docstrings are made from them when the classes are, and this tool
writes the page's list (``tests/test_readme.py`` holds the two equal).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from solo_ext.methods.registry import SOLO_EXT_METHODS, options_markdown

PAGE = Path(__file__).resolve().parent.parent / "docs" / "methods.md"
ROW = re.compile(r"^\| `(?P<name>[a-z0-9_]+)` \| (?P<what>.*) \| (?P<keys>.*) \|$", re.M)


def rewritten(text: str) -> str:
    """``text`` with each method row's last cell made from its declarations."""

    def row(match: re.Match) -> str:
        name = match["name"]
        if name not in SOLO_EXT_METHODS:
            return match[0]
        return f"| `{name}` | {match['what']} | {options_markdown(name)} |"

    return ROW.sub(row, text)


def main() -> None:
    text = PAGE.read_text()
    new = rewritten(text)
    if "--check" in sys.argv[1:]:
        sys.exit(int(new != text))
    PAGE.write_text(new)


if __name__ == "__main__":
    main()
