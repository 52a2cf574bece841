"""The published rows that cite a file of a repository hold the numbers that file prints.

solo-learn's README rows are compared with its checkout by ``tests/test_leaderboard.py``; every
other cited file is kept in ``tests/published_sources/`` as it was at the cited commit
(``sources.json``: repository, commit, path, git blob id; a README as it is, its blob id
checked here; a PDF as ``pdftotext -layout`` reads it). Each held number is compared with the
cell of the table its row cites (:data:`CELLS`), every number of those tables is either held or
listed with its reason in ``tools/published_rows.py``'s ``LEFT_OUT``, and
``docs/published-rows.md`` is the page that tool writes.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass

import pytest
from conftest import ROOT

from solo_ext.leaderboard.published import Published, load_published

SOURCES = ROOT / "tests" / "published_sources"
MANIFEST = json.loads((SOURCES / "sources.json").read_text())

sys.path.insert(0, str(ROOT / "tools"))
try:
    import published_rows as tool
finally:
    sys.path.pop(0)


@dataclass(frozen=True)
class Printed:
    """One number a source prints: its table (a markdown table: the heading above it), row and
    column, as the source labels them."""

    table: str
    row: str
    column: str
    value: float


NUMBER = r"\d+(?:\.\d+)?"


def _number(cell: str) -> float | None:
    cell = cell.replace("**", "").strip()
    return float(cell) if re.fullmatch(NUMBER, cell) else None


# the columns that name a markdown table's row; the others' numbers are its values
KEY_COLUMNS = ("Method", "Model", "Views", "Epochs", "Dataset")


def markdown_numbers(text: str) -> list[Printed]:
    """Every number of every table of a markdown file, by the heading above the table, its row
    (its key columns' cells joined by `` | ``) and its column."""
    out, heading, header = [], "", None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#"):
            heading, header = line.lstrip("#").strip(), None
        elif line.startswith("|"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            if header is None:
                header = cells
            elif not all(set(cell) <= set(":- ") for cell in cells):
                key = " | ".join(c for h, c in zip(header, cells) if h in KEY_COLUMNS)
                for column, cell in zip(header, cells):
                    value = _number(cell)
                    if column not in KEY_COLUMNS and value is not None:
                        out.append(Printed(heading, key, column, value))
        else:
            header = None
    return out


def reading_order(text: str) -> list[str]:
    """The lines of a ``pdftotext -layout`` text with each two-column page read as its left
    column, then its right (split at the first gutter: a blank column between 40 and 90 with
    text on both sides in several lines)."""
    out = []
    for page in text.split("\f"):
        lines = page.split("\n")
        split = None
        for c in range(40, 90):
            gutter = all(len(line) <= c or line[c] == " " for line in lines)
            both = sum(line[:c].strip() != "" and line[c:].strip() != "" for line in lines)
            if gutter and both >= 5:
                split = c
                break
        if split is None:
            out += lines
        else:
            out += [line[:split].rstrip() for line in lines]
            out += [line[split:].rstrip() for line in lines]
    return out


@dataclass(frozen=True)
class PdfTable:
    """A table of a PDF: its header line's cells (the label column's name first when it has
    one) and its value columns; its rows are the lines under the header with a label and one
    number per column, up to the first line that is not one."""

    name: str
    header: tuple[str, ...]
    columns: tuple[str, ...]


@dataclass(frozen=True)
class PdfProse:
    """Numbers a PDF prints in running text: ``pattern`` over the text with its white space
    collapsed, each named group a (row, column) of the paragraph."""

    name: str
    pattern: str
    cells: dict[str, tuple[str, str]]


def pdf_numbers(text: str, tables: tuple, ignored: tuple[str, ...]) -> list[Printed]:
    """The numbers of ``tables`` (each :class:`PdfTable` or :class:`PdfProse`); every table
    caption of the text is one of them or of ``ignored`` (tables that hold no results)."""
    lines = reading_order(text)
    captions = {f"Table {n}" for n in re.findall(r"(?m)^\s*Table (\d+)[.:]", "\n".join(lines))}
    named = {t.name for t in tables if isinstance(t, PdfTable)}
    assert captions == named | set(ignored), (captions, named, ignored)
    out = []
    for table in tables:
        if isinstance(table, PdfProse):
            match = re.search(table.pattern, " ".join(" ".join(lines).split()))
            assert match, table
            for group, (row, column) in table.cells.items():
                out.append(Printed(table.name, row, column, float(match[group])))
            continue
        head = re.compile(r"^\s*" + r"\s+".join(map(re.escape, table.header)) + r"\s*$")
        (at,) = [i for i, line in enumerate(lines) if head.match(line)]
        near = lines[max(0, at - 12) : at + 14]
        assert any(re.match(rf"^\s*{table.name}[.:]", line) for line in near), table.name
        values = rf"{NUMBER}(?:\s+{NUMBER}){{{len(table.columns) - 1}}}"
        row = re.compile(rf"^\s*(?P<label>\S.*?)\s{{2,}}(?P<values>{values})\s*$")
        rows = 0
        for line in lines[at + 1 :]:
            if not line.strip():
                continue
            match = row.match(line)
            if not match:
                break
            rows += 1
            for column, value in zip(table.columns, match["values"].split()):
                out.append(Printed(table.name, match["label"], column, float(value)))
        assert rows, table.name
    return out


OUTPUT_DIMENSIONS = "Appendix B, 'Output Dimensions' paragraph"
LAMBDAS = ("0.01", "0.05", "0.1", "0.2", "0.3", "0.5", "1", "2", "5", "10")  # TSC's Table 13
PDF_TABLES = {
    ("SY-Xuan/DSCL", "SP/sp.pdf"): (
        (
            PdfTable("Table 2", ("ImageNet-LT", "Dataset A", "Dataset B", "Dataset C"),
                     ("ImageNet-LT", "Dataset A", "Dataset B", "Dataset C")),
            PdfTable("Table 3", ("Settings", "Many", "Medium", "Few", "Overall"),
                     ("Many", "Medium", "Few", "Overall")),
            PdfTable("Table 4", ("Scale Ranges", "Acc"), ("Acc",)),
        ),
        ("Table 1",),  # the datasets' image counts
    ),
    ("LTH14/targeted-supcon", "supp_release.pdf"): (
        (
            PdfTable("Table 10", ("CIFAR-10-LT", "CIFAR-100-LT"), ("CIFAR-10-LT", "CIFAR-100-LT")),
            PdfTable("Table 11", ("Epochs", "200", "400"), ("200", "400")),
            PdfTable("Table 12", ("Methods", "CIFAR-10", "CIFAR-100", "ImageNet"),
                     ("CIFAR-10", "CIFAR-100", "ImageNet")),
            PdfTable("Table 13", LAMBDAS, LAMBDAS),
            PdfTable("Table 14", ("Methods", "Many", "Medium", "Few", "All", "R#"),
                     ("Many", "Medium", "Few", "All", "R#")),
            PdfProse(OUTPUT_DIMENSIONS,
                     rf"TSC is quite robust to small out- ?put dimensions \((?P<a>{NUMBER})% at "
                     rf"d = 3 and (?P<b>{NUMBER})% at d = 128\)",
                     {"a": ("TSC", "d = 3"), "b": ("TSC", "d = 128")}),
            PdfProse(OUTPUT_DIMENSIONS,
                     rf"KCL experiences noticeable performance drop when the output dimension is "
                     rf"small \(only (?P<a>{NUMBER})% at d = 3 and (?P<b>{NUMBER})% at d = 128\)",
                     {"a": ("KCL", "d = 3"), "b": ("KCL", "d = 128")}),
        ),
        (),
    ),
}  # fmt: skip

# each held row (dataset, label) of a cited file -> the cells that hold its numbers: (table, row,
# columns); a column Many / Medium / Few holds that group's number, any other the top-1
SHOTS = ("Many", "Medium", "Few", "Overall")  # DSCL's Table 3
WARMUP = ("Many", "Medium", "Few", "All")  # TSC's Table 14
SCALES = ("[0.05, 0.7]", "[0.05, 0.5]", "[0.1, 0.7]", "[0.1, 0.6]", "[0.1, 0.5]", "[0.15, 0.6]",
          "[0.3, 0.6]", "[1.0, 1.0]")  # fmt: skip
CELLS: dict[tuple[str, str], dict[tuple[str, str], list[tuple[str, str, tuple[str, ...]]]]] = {
    ("SY-Xuan/DSCL", "SP/sp.pdf"): {
        ("imagenet_lt", "SCL"): [("Table 3", "Baseline", SHOTS),
                                 ("Table 2", "Baseline", ("ImageNet-LT",))],
        ("imagenet_lt", "DSCL"): [("Table 3", "DSCL", SHOTS),
                                  ("Table 2", "DSCL", ("ImageNet-LT",))],
        ("imagenet_lt", "SCL + PBSD"): [("Table 2", "PBSD", ("ImageNet-LT",))],
        ("imagenet_lt", "DSCL + PBSD"): [("Table 2", "DSCL + PBSD", ("ImageNet-LT",)),
                                         ("Table 4", "[0.05, 0.6]", ("Acc",))],
        **{("imagenet_lt", f"DSCL + PBSD, patch scale {s}"): [("Table 4", s, ("Acc",))]
           for s in SCALES},
    },
    ("LTH14/targeted-supcon", "supp_release.pdf"): {
        ("imagenet_lt", "KCL"): [("Table 11", "KCL [23]", ("200",))],
        ("imagenet_lt", "KCL, 400 epochs"): [("Table 11", "KCL [23]", ("400",))],
        ("imagenet_lt", "TSC"): [("Table 11", "TSC", ("400",)),
                                 ("Table 14", "w/ warmup", WARMUP)],
        ("imagenet_lt", "TSC, 200 epochs"): [("Table 11", "TSC", ("200",))],
        ("imagenet_lt", "TSC without warm-up"): [("Table 14", "w/o warmup", WARMUP)],
        ("cifar10_lt", "KCL"): [("Table 10", "KCL [23]", ("CIFAR-10-LT",)),
                                (OUTPUT_DIMENSIONS, "KCL", ("d = 128",))],
        ("cifar100_lt", "KCL"): [("Table 10", "KCL [23]", ("CIFAR-100-LT",))],
        ("cifar10_lt", "TSC"): [("Table 10", "TSC", ("CIFAR-10-LT",)),
                                ("Table 13", "ACC (%)", ("0.2",))],
        ("cifar100_lt", "TSC"): [("Table 10", "TSC", ("CIFAR-100-LT",))],
        **{("cifar10_lt", f"TSC, target weight {w}"): [("Table 13", "ACC (%)", (w,))]
           for w in LAMBDAS if w != "0.2"},
        ("cifar10_lt", "TSC, output dimension 3"): [(OUTPUT_DIMENSIONS, "TSC", ("d = 3",))],
        ("cifar10_lt", "KCL, output dimension 3"): [(OUTPUT_DIMENSIONS, "KCL", ("d = 3",))],
        **{(dataset, f"{m} (balanced)"): [("Table 12", row, (column,))]
           for dataset, column in (("cifar10", "CIFAR-10"), ("cifar100", "CIFAR-100"),
                                   ("imagenet", "ImageNet"))
           for m, row in (("KCL", "KCL†"), ("TSC", "TSC"))},
    },
    ("LTH14/targeted-supcon", "README.md"): {
        ("imagenet_lt", f"{m}, trial {n}"): [("Results", m, (f"Trial {n}",))]
        for m in ("KCL", "TSC") for n in range(1, 6)
    },
    ("dvlab-research/Parametric-Contrastive-Learning", "README.md"): {
        (dataset, label): [(table, row, (column,))]
        for dataset, label, table, row, column in (
            ("imagenet_lt", "PaCo", "ImageNet-LT (Imbalance setting)", "PaCo | ResNet-50",
             "Top-1 Acc(%)"),
            ("imagenet_lt", "PaCo (ResNeXt-50)", "ImageNet-LT (Imbalance setting)",
             "PaCo | ResNeXt-50", "Top-1 Acc(%)"),
            ("imagenet_lt", "PaCo (ResNeXt-101)", "ImageNet-LT (Imbalance setting)",
             "PaCo | ResNeXt-101", "Top-1 Acc(%)"),
            ("inat2018", "PaCo", "iNaturalist 2018 (Imbalanced setting)", "PaCo | ResNet-50",
             "Top-1 Acc(%)"),
            ("inat2018", "PaCo (ResNet-152)", "iNaturalist 2018 (Imbalanced setting)",
             "PaCo | ResNet-152", "Top-1 Acc(%)"),
            ("places_lt", "PaCo (ResNet-152)", "Places-LT (Imbalanced setting)",
             "PaCo | ResNet-152", "Top-1 Acc(%)"),
            ("imagenet", "PaCo (full ImageNet)", "Full ImageNet (Balanced setting)",
             "PaCo | ResNet-50", "Top-1 Acc(%)"),
            ("imagenet", "PaCo (full ImageNet, ResNet-101)", "Full ImageNet (Balanced setting)",
             "PaCo | ResNet-101", "Top-1 Acc(%)"),
            ("imagenet", "PaCo (full ImageNet, ResNet-200)", "Full ImageNet (Balanced setting)",
             "PaCo | ResNet-200", "Top-1 Acc(%)"),
            ("imagenet_lt", "GPaCo", "ImageNet-LT", "GPaCo | ResNet-50", "Top-1 Acc(%)"),
            ("imagenet_lt", "GPaCo (ResNeXt-50)", "ImageNet-LT", "GPaCo | ResNeXt-50",
             "Top-1 Acc(%)"),
            ("imagenet_lt", "GPaCo (ResNeXt-101)", "ImageNet-LT", "GPaCo | ResNeXt-101",
             "Top-1 Acc(%)"),
            ("inat2018", "GPaCo", "iNaturalist 2018", "GPaCo | ResNet-50", "Top-1 Acc(%)"),
            ("inat2018", "GPaCo (ResNet-152)", "iNaturalist 2018", "GPaCo | ResNet-152",
             "Top-1 Acc(%)"),
            ("places_lt", "GPaCo (ResNet-152)", "Places-LT", "GPaCo | ResNet-152",
             "Top-1 Acc(%)"),
            ("cifar100", "GPaCo (CIFAR-100, ResNet-50)", "CIFAR Classification",
             "GPaCo | ResNet-50", "Top-1 Acc(%)"),
            ("imagenet", "GPaCo (full ImageNet)",
             "Full ImageNet Classification and Out-of-Distribution Robustness",
             "GPaCo | ResNet-50", "Full ImageNet"),
        )
    },
    ("FlamieZhu/Balanced-Contrastive-Learning", "README.md"): {
        ("imagenet_lt", f"BCL (ResNeXt-50, {views})"): [
            ("ImageNet-LT", f"BCL | {views} | 90 | ResNeXt-50", ("Top-1 Acc(%)",))
        ]
        for views in ("sim-sim", "sim-rand", "rand-rand")
    },
}  # fmt: skip
FIELDS = {"Many": "many", "Medium": "medium", "Few": "few"}


def _manifest(repository: str, path: str) -> dict:
    (entry,) = [e for e in MANIFEST if (e["repository"], e["path"]) == (repository, path)]
    return entry


def printed(repository: str, path: str) -> list[Printed]:
    """Every number of the cited file's results, read from its kept copy."""
    text = (SOURCES / _manifest(repository, path)["text"]).read_text()
    if (repository, path) in PDF_TABLES:
        return pdf_numbers(text, *PDF_TABLES[repository, path])
    return markdown_numbers(text)


def _cited(rows: list[Published]) -> dict[tuple[str, str], list[Published]]:
    by_file: dict[tuple[str, str], list[Published]] = {}
    for row in rows:
        cite = tool.citation(row.source)
        if cite is not None and cite.repository != "vturrisi/solo-learn":
            by_file.setdefault((cite.repository, cite.path), []).append(row)
    return by_file


def test_the_kept_copies_are_the_cited_files():
    """Each kept README is the file at the cited commit (its git blob id); each row cites a
    kept file at the commit it was kept from."""
    for entry in MANIFEST:
        assert re.fullmatch(r"[0-9a-f]{40}", entry["commit"]) and entry["blob"]
        data = (SOURCES / entry["text"]).read_bytes()
        if not entry["path"].endswith(".pdf"):
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            assert blob == entry["blob"], entry["text"]
    for (repository, path), rows in _cited(load_published()).items():
        entry = _manifest(repository, path)
        for row in rows:
            assert entry["commit"].startswith(tool.citation(row.source).commit), row.label


def test_every_row_without_a_repository_file_is_a_marked_third_party_listing():
    loose = [r for r in load_published() if tool.citation(r.source) is None]
    assert [(r.dataset, r.label) for r in loose] == [("imagenet_lt", "BCL")]
    assert all("as that paper lists it" in r.source for r in loose)  # (another paper's listing)


@pytest.mark.parametrize("source", sorted(CELLS), ids=lambda s: f"{s[0]} {s[1]}")
def test_each_held_number_is_the_one_its_source_prints(source):
    """Every number of every row citing the file (top-1, Many / Medium / Few) is the cell of a
    table the row's source names; each row citing the file has its cells here."""
    numbers = {(p.table, p.row, p.column): p.value for p in printed(*source)}
    rows = {(r.dataset, r.label): r for r in _cited(load_published()).get(source, [])}
    assert set(rows) == set(CELLS[source]), set(rows) ^ set(CELLS[source])
    for key, cells in CELLS[source].items():
        row = rows[key]
        where = tool.citation(row.source).where
        checked = set()
        for table, label, columns in cells:
            assert table in where, (key, table, where)
            for column in columns:
                field = FIELDS.get(column, "linear_acc1")
                assert (table, label, column) in numbers, (key, table, label, column)
                assert getattr(row, field) == numbers[table, label, column], (key, column)
                checked.add(field)
        given = {f for f in ("linear_acc1", "many", "medium", "few") if getattr(row, f) is not None}
        assert given <= checked, (key, given - checked)


def _left_out(repository: str, path: str, p: Printed) -> list:
    return [
        left
        for left in tool.LEFT_OUT
        if (left.repository, left.path, left.table) == (repository, path, p.table)
        and ("*" in left.rows or p.row in left.rows)
        and ("*" in left.columns or p.column in left.columns)
    ]


@pytest.mark.parametrize("source", sorted(CELLS), ids=lambda s: f"{s[0]} {s[1]}")
def test_every_number_of_a_cited_file_is_held_or_left_out_with_its_reason(source):
    """No number of the file's results is missing without a reason, none is both held and left
    out, and every left-out entry of the file names numbers it prints."""
    held = {(t, r, c) for cells in CELLS[source].values() for t, r, cs in cells for c in cs}
    used = set()
    for p in printed(*source):
        left = _left_out(*source, p)
        is_held = (p.table, p.row, p.column) in held
        assert is_held != bool(left), (p, "held" if is_held else "neither held nor left out")
        used.update(left)
    mine = [left for left in tool.LEFT_OUT if (left.repository, left.path) == source]
    assert all(left in used for left in mine), [left for left in mine if left not in used]
    assert all(left.reason and _manifest(*source)["commit"].startswith(left.commit)
               for left in mine)  # fmt: skip


def test_every_left_out_entry_is_of_a_kept_file():
    assert {(left.repository, left.path) for left in tool.LEFT_OUT} <= set(CELLS)


def test_the_published_rows_page_is_the_one_the_tool_writes():
    page = (ROOT / "docs" / "published-rows.md").read_text()
    assert page == tool.page(), "docs/published-rows.md differs: run tools/published_rows.py"
    assert all(f"| {row.method} | {row.label} |" in page for row in load_published())
