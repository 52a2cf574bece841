"""Writes docs/published-rows.md: the published rows the leaderboard holds (from
``solo_ext/leaderboard/published.csv``) and the rows their sources print that it does not hold.

    python tools/published_rows.py          # rewrites docs/published-rows.md
    python tools/published_rows.py --check  # exit status 1 when the page differs

``tests/test_published_sources.py`` holds the committed page equal to what this writes, each
held number equal to the source text it cites, and each number of the cited tables either held
or listed in :data:`LEFT_OUT` with its reason.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from solo_ext.leaderboard.published import Published, load_published

PAGE = Path(__file__).resolve().parent.parent / "docs" / "published-rows.md"

# "<owner>/<name> <path> (<what>, commit <hash>), <where in it>"; solo-learn's README rows say
# "solo-learn README (commit <hash>), <where>"
CITATION = re.compile(
    r"^(?P<repository>[\w.-]+/[\w.-]+) (?P<path>\S+) "
    r"\((?:(?P<what>[^()]*?), )?commit (?P<commit>[0-9a-f]{7,40})\), (?P<where>.+)$"
)
SOLO_LEARN = re.compile(r"^solo-learn README \(commit (?P<commit>[0-9a-f]{7,40})\), (?P<where>.+)$")


@dataclass(frozen=True)
class Citation:
    """Where a published row's numbers are printed: a file of a repository at a commit."""

    repository: str
    path: str
    commit: str
    where: str  # the table (or paragraph) as the row names it


def citation(source: str) -> Citation | None:
    """The repository, path, commit and table of a row's ``source``; None for a source that
    names no repository file."""
    match = CITATION.match(source)
    if match:
        return Citation(match["repository"], match["path"], match["commit"], match["where"])
    match = SOLO_LEARN.match(source)
    if match:
        return Citation("vturrisi/solo-learn", "README.md", match["commit"], match["where"])
    return None


@dataclass(frozen=True)
class LeftOut:
    """Numbers a source prints that no published row holds, and why.

    ``rows`` and ``columns`` are the source's own labels (a markdown table's row: its cells
    other than the numbers and links, joined by `` | ``); ``*`` is every one.
    """

    repository: str
    path: str
    commit: str
    table: str
    rows: tuple[str, ...]
    columns: tuple[str, ...]
    reason: str


_DSCL = ("SY-Xuan/DSCL", "SP/sp.pdf", "72c823b")
_TSC_SUPP = ("LTH14/targeted-supcon", "supp_release.pdf", "c4f15eb")
_PACO = ("dvlab-research/Parametric-Contrastive-Learning", "README.md", "fe56535")
_NOT_OURS = "not a method of solo-ext"
_ENSEMBLE = "an ensemble of two models, not one run of a method"

LEFT_OUT: tuple[LeftOut, ...] = (
    LeftOut(*_DSCL, "Table 2", ("*",), ("Dataset A", "Dataset B", "Dataset C"),
            "ImageNet subsets the authors drew with a Pareto profile (their Table 1: imbalance "
            "85.7, 9.27 and 1, about 115.8k training images each); the image lists are not "
            "published, so no dataset of the leaderboard is one of them"),
    LeftOut(*_DSCL, "Table 3", ("Balanced Queue", "Re-weighting"), ("*",),
            "SCL with a class-balanced memory queue, and SCL with per-instance loss weights "
            "(Cui et al. 2019): solo-ext's scl has neither option"),
    LeftOut(*_TSC_SUPP, "Table 10", ("LDAM-DRW [4]",), ("*",), _NOT_OURS),
    LeftOut(*_TSC_SUPP, "Table 12", ("CE",), ("*",), _NOT_OURS + " (cross-entropy training)"),
    LeftOut(*_TSC_SUPP, "Table 14", ("*",), ("R#",),
            "the reasonability score R#, not an accuracy"),
    LeftOut(*_TSC_SUPP, "Appendix B, 'Output Dimensions' paragraph", ("TSC",), ("d = 128",),
            "d = 128 is the default output dimension, held by TSC's Table 10 row (79.7, "
            "whose protocol quotes this 79.6): one setting, one row"),
    LeftOut(*_PACO, "Full ImageNet Classification and Out-of-Distribution Robustness",
            ("GPaCo | ViT-B", "GPaCo | ViT-L"), ("*",),
            "fine-tunes MAE-pretrained ViTs (GPaCo/MAE-ViTs): solo-ext's paco starts from "
            "random weights and has no MAE initialisation"),
    LeftOut(*_PACO, "Full ImageNet Classification and Out-of-Distribution Robustness",
            ("CE | ViT-B", "CE | ViT-L", "multi-task | ViT-B"), ("*",), _NOT_OURS),
    LeftOut(*_PACO, "Full ImageNet Classification and Out-of-Distribution Robustness",
            ("GPaCo | ResNet-50",),
            ("ImageNet-C (mCE)", "ImageNet-C (rel. mCE)", "ImageNet-R", "ImageNet-S"),
            "robustness benchmarks the leaderboard has no dataset for (the row's protocol "
            "quotes them)"),
    LeftOut(*_PACO, "CIFAR Classification", ("multi-task | ResNet-50",), ("*",), _NOT_OURS),
    LeftOut(*_PACO, "ImageNet-LT", ("GPaCo | ensemble( 2-ResNeXt-101)",), ("*",), _ENSEMBLE),
    LeftOut(*_PACO, "iNaturalist 2018", ("GPaCo | ensembel(2-ResNet-152)",), ("*",), _ENSEMBLE),
    LeftOut(*_PACO, "Semantic Segmentation", ("*",), ("*",),
            "semantic segmentation (mIoU on ADE20K, COCO-Stuff, Pascal Context, Cityscapes): "
            "not a classification dataset of the leaderboard"),
)  # fmt: skip

# what no repository file prints (so no test can compare it): the papers' own tables
NOT_IN_A_REPOSITORY: tuple[tuple[str, str], ...] = (
    ("scl, dscl, pbsd",
     "DSCL's paper (AAAI 2024, arXiv 2403.06151): its comparison tables (iNaturalist 2018, "
     "Places-LT, CIFAR-LT, the ensemble's 59.7 on ImageNet-LT of the abstract). SY-Xuan/DSCL "
     "holds the supplementary material only (SP/sp.pdf), whose rows are above."),
    ("bcl",
     "BCL's paper (CVPR 2022, arXiv 2207.09052): its ResNet-50 rows (ImageNet-LT, iNaturalist "
     "2018) and CIFAR-LT rows (ResNet-32); the authors' README prints the ResNeXt-50 "
     "ImageNet-LT rows only. The held ResNet-50 ImageNet-LT row (56.0) quotes DSCL's paper's "
     "comparison table: another paper's listing, in no repository, which its source says, "
     "compared with no text."),
    ("paco",
     "PaCo's (ICCV 2021, arXiv 2107.12028) and GPaCo's (TPAMI 2023, arXiv 2209.12400) papers: "
     "CIFAR-LT at imbalance 100, 50 and 10, and Many / Medium / Few where the papers give "
     "them; the README prints top-1 only."),
    ("kcl, tsc",
     "TSC's paper (CVPR 2022, arXiv 2111.13998): the main comparison tables (ImageNet-LT, "
     "iNaturalist 2018, CIFAR-LT), beyond what the supplementary material repeats; KCL's own "
     "paper (Kang et al., ICLR 2021) has no repository of its authors: the KCL rows are TSC's "
     "reimplementation, as TSC's authors report it."),
    ("densecl",
     "DenseCL's README (WXinlong/DenseCL, commit b64bbb6) prints detection and segmentation "
     "transfer (VOC, COCO) only: no classification top-1 on a dataset of the leaderboard."),
)  # fmt: skip

HEADER = """\
# Published rows

Written by `tools/published_rows.py` from `solo_ext/leaderboard/published.csv` and the tool's
list of left-out rows: do not edit by hand (`python tools/published_rows.py` rewrites it;
`tests/test_published_sources.py` fails when it differs).

The leaderboard sets these published rows above the measured ones of their dataset. Each number
is compared with the text of the file it cites by the tests: solo-learn's README rows by
`tests/test_leaderboard.py` (with solo-learn's checkout), the others by
`tests/test_published_sources.py`, against copies of the cited files at the cited commits in
`tests/published_sources/` (the READMEs as they are, the PDFs as `pdftotext -layout` reads
them), which also checks that every number of a cited table is either held here or listed under
"Printed but not held" with its reason.
"""


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|") if text not in (None, "") else "–"


def _number(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.1f}" if round(value, 1) == value else f"{value:.2f}"


def _shots(row: Published) -> str:
    given = (row.many, row.medium, row.few)
    if all(v is None for v in given):
        return "no"
    return " / ".join(_number(v) for v in given)


def _source(cite: Citation | None, source: str) -> tuple[str, str]:
    if cite is None:
        return source, "–"
    return f"`{cite.repository}` `{cite.path}` @ `{cite.commit[:7]}`", cite.where


def page(rows: list[Published] | None = None) -> str:
    """The page's markdown, from ``rows`` (the shipped published file by default)."""
    rows = load_published() if rows is None else rows
    out = [HEADER]

    out += ["## Sources", "", "| repository | path | commit | rows |", "|---|---|---|---|"]
    sources = Counter()
    for row in rows:
        cite = citation(row.source)
        key = (cite.repository, cite.path, cite.commit[:7]) if cite else (row.source, "", "")
        sources[key] += 1
    for (repository, path, commit), n in sources.items():
        if path:
            out.append(f"| `{repository}` | `{path}` | `{commit}` | {n} |")
        else:  # a source in no repository
            out.append(f"| none: {_cell(repository)} | – | – | {n} |")
    out.append("")

    datasets = list(dict.fromkeys(row.dataset for row in rows))
    out += ["## Held rows, per dataset and method", ""]
    out += ["| dataset | method | rows | with Many / Medium / Few |", "|---|---|---|---|"]
    for dataset in datasets:
        mine = [row for row in rows if row.dataset == dataset]
        for method in dict.fromkeys(row.method for row in mine):
            of = [row for row in mine if row.method == method]
            shots = sum(_shots(row) != "no" for row in of)
            out.append(f"| {dataset} | {method} | {len(of)} | {shots} |")
    out.append("")

    for dataset in datasets:
        mine = [row for row in rows if row.dataset == dataset]
        out += [f"### {dataset}", "",
                "| method | label | config | backbone | epochs | evaluation | top-1 "
                "| Many / Medium / Few | source | table |",
                "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for row in mine:
            config = "; ".join(f"{k}={v}" for k, v in row.config.items())
            where, table = _source(citation(row.source), row.source)
            evaluation = row.linear_eval or "not said"
            cells = (row.method, row.label, config, row.backbone, row.epochs, evaluation,
                     _number(row.linear_acc1), _shots(row), where, table)  # fmt: skip
            out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        out.append("")

    out += ["## Printed but not held", "", "### In the files the rows cite (checked by the tests)"]
    out += ["", "| source | table | rows | columns | why not held |", "|---|---|---|---|---|"]
    for left in LEFT_OUT:
        where = f"`{left.repository}` `{left.path}` @ `{left.commit}`"
        labels, columns = (", ".join(x).replace("*", "all") for x in (left.rows, left.columns))
        cells = (where, left.table, labels, columns, left.reason)
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    out += ["", "### Not in a repository (not checked)", "",
            "| methods | what, and where it is printed |", "|---|---|"]  # fmt: skip
    out += [f"| {methods} | {what} |" for methods, what in NOT_IN_A_REPOSITORY]
    return "\n".join(out) + "\n"


def main() -> None:
    text = page()
    if "--check" in sys.argv[1:]:
        sys.exit(int(not PAGE.is_file() or PAGE.read_text() != text))
    PAGE.write_text(text)


if __name__ == "__main__":
    main()
