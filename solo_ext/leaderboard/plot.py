"""The leaderboard's plot: per dataset one panel per evaluation (linear, head, online linear,
online kNN, kNN: those a row has), bars of top-1 overall / many / medium / few for every row
that has it, the spread over seeds as error bars, published rows hatched; a value of 0 is drawn
as a mark on the axis."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from solo_ext.eval.longtail import GROUP_COLORS
from solo_ext.leaderboard.runs import EVALUATIONS, GROUPS
from solo_ext.leaderboard.table import PUBLISHED, Row

BARS = {"overall": "dimgray", **GROUP_COLORS}
HATCH = "//"


def _label(row: Row) -> str:
    if row.kind == PUBLISHED:
        return f"{row.label}\n(published)"
    name = ", ".join(n for n in row.names if n)
    lines = [row.method, name, f"n = {row.n}" if row.n > 1 else f"run {row.runs[0]}"]
    lines.append(f"{row.epochs} ep" if row.epochs else "")
    if row.flagged:
        lines.append("≠ published")
    return "\n".join(line for line in lines if line)


def _panel(ax, evaluation: str, rows: list[Row]) -> None:
    width = 0.8 / len(BARS)
    for i, row in enumerate(rows):
        for j, (name, metric) in enumerate(zip(BARS, ("acc1", *GROUPS))):
            value = row.value(evaluation, metric)
            if value is None:
                continue
            x = i + (j - (len(BARS) - 1) / 2) * width
            sd = row.spread.get(f"{evaluation}_{metric}")
            ax.bar(
                x,
                value,
                width,
                color=BARS[name],
                hatch=HATCH if row.kind == PUBLISHED else None,
                edgecolor="white" if row.kind == PUBLISHED else None,
                yerr=sd,
                capsize=2 if sd is not None else 0,
                error_kw={"elinewidth": 0.8},
            )
            if value == 0:  # (a bar of height 0 would look like a missing value)
                ax.plot([x], [0], marker="^", color=BARS[name], markersize=5, clip_on=False)
    n_published = sum(r.kind == PUBLISHED for r in rows)
    if 0 < n_published < len(rows):
        ax.axvline(n_published - 0.5, color="black", linewidth=0.8, linestyle=":")
    ax.set_xticks(range(len(rows)), [_label(r) for r in rows], fontsize=7)
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_ylim(0, 100)
    ax.set_ylabel("top-1 (%)")
    ax.set_title(f"{EVALUATIONS[evaluation]}", fontsize=9)


def plot(dataset: str, rows: list[Row], path: str | Path) -> None:
    """Writes ``path`` (PNG): a panel per evaluation, one group of bars per row that has it,
    in table order; a missing value has no bar, a value of 0 a mark on the axis."""
    evaluations = [e for e in EVALUATIONS if any(e in r.evaluations for r in rows)]
    panels = [(e, [r for r in rows if e in r.evaluations]) for e in evaluations]
    widest = max((len(p) for _, p in panels), default=1)
    fig = Figure(figsize=(max(6.0, 1.1 * widest + 2), 4.2 * max(1, len(panels))))
    FigureCanvasAgg(fig)
    axes = fig.subplots(max(1, len(panels)), 1, squeeze=False)[:, 0]
    for ax, (evaluation, panel_rows) in zip(axes, panels):
        _panel(ax, evaluation, panel_rows)
    fig.suptitle(
        f"{dataset}: top-1 of each evaluation, overall and per shot group; error bars: sd over "
        "seeds",
        fontsize=10,
    )
    handles = [Patch(color=c, label=n) for n, c in BARS.items()]
    if any(r.kind == PUBLISHED for r in rows):
        handles.append(
            Patch(facecolor="dimgray", hatch=HATCH, edgecolor="white", label="published")
        )
    axes[0].legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
