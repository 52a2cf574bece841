"""A dataset's table as LaTeX for a paper: a booktabs ``tabular`` in a ``table`` float, the
columns of the markdown table's evaluations (one group per evaluation, its metrics below), the
published rows first and marked, then the measured rows, each number as ``$mean \\pm sd$`` over
the seeds of its row (one run: the number alone)."""

from __future__ import annotations

from solo_ext.leaderboard.runs import EVALUATIONS
from solo_ext.leaderboard.table import MEASURED, METRIC_TITLES, PUBLISHED, Row, columns

# LaTeX's special characters in text
SPECIAL = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
}  # fmt: skip
PUBLISHED_MARK = r"$^\dagger$"
FLAG_MARK = r"$^\ast$"
MISSING = "--"
UNSAID = " (?)"


def escape(text: object) -> str:
    """``text`` as LaTeX prints it."""
    return "".join(SPECIAL.get(c, c) for c in str(text))


def number(value: float | None, sd: float | None = None) -> str:
    """``57.70``, ``$57.70 \\pm 0.35$`` (a mean with its sample standard deviation), or
    ``--``: not given."""
    if value is None:
        return MISSING
    return f"{value:.2f}" if sd is None else f"${value:.2f} \\pm {sd:.2f}$"


def _label(row: Row) -> str:
    mark = PUBLISHED_MARK if row.kind == PUBLISHED else (FLAG_MARK if row.flagged else "")
    return escape(row.label) + mark


def latex(dataset: str, rows: list[Row], name: str) -> str:
    """The table of ``dataset`` (its file name ``name``: the label ``tab:<name>`` and the
    markdown table the caption points to)."""
    shown = columns(rows)
    groups: list[tuple[str, int]] = []
    for evaluation, _ in shown:
        if groups and groups[-1][0] == evaluation:
            groups[-1] = (evaluation, groups[-1][1] + 1)
        else:
            groups.append((evaluation, 1))
    head = ["method", "backbone", "epochs", r"GPUs $\times$ batch", "$n$"]
    lines = [
        f"% {dataset}: written by solo-ext-leaderboard; needs \\usepackage{{booktabs}}",
        r"\begin{table}",
        r"\centering",
        f"\\caption{{{escape(dataset)}: top-1, top-5 and Many / Medium / Few accuracy (\\%) "
        f"per evaluation. {PUBLISHED_MARK}: published, as its source reports it; "
        f"{FLAG_MARK}: differs from the published protocol; $n$ runs that differ only in the "
        f"seed, their mean $\\pm$ sample standard deviation; sources and differences in "
        f"{escape(name)}.md.}}",
        f"\\label{{tab:{name}}}",
        f"\\begin{{tabular}}{{ll{'r' * (len(head) - 2 + len(shown))}}}",
        r"\toprule",
    ]
    top = [""] * len(head)
    rules, start = [], len(head) + 1
    for evaluation, width in groups:
        top.append(f"\\multicolumn{{{width}}}{{c}}{{{escape(EVALUATIONS[evaluation])}}}")
        rules.append(f"\\cmidrule(lr){{{start}-{start + width - 1}}}")
        start += width
    lines += [" & ".join(top) + r" \\", " ".join(rules)]
    lines.append(" & ".join([*head, *(METRIC_TITLES[m] for _, m in shown)]) + r" \\")
    for kind in (PUBLISHED, MEASURED):
        block = [r for r in rows if r.kind == kind]
        if not block:
            continue
        lines.append(r"\midrule")
        for row in block:
            cells = [
                _label(row),
                escape(row.backbone or MISSING),
                escape(MISSING if row.epochs is None else row.epochs),
                escape(row.batch_text or MISSING).replace(" x ", r" $\times$ "),
                str(row.n) if kind == MEASURED else "",
            ]
            for evaluation, metric in shown:
                value = row.value(evaluation, metric)
                cell = number(value, row.spread.get(f"{evaluation}_{metric}"))
                unsaid = row.unsaid and evaluation == "linear" and value is not None
                cells.append(cell + (UNSAID if unsaid else ""))
            lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"
