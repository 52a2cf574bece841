"""The leaderboard's plot: per dataset, bars of top-1 overall / many / medium / few for every
row (each row's own evaluation: its linear classifier or head, else its kNN), the spread over
seeds as error bars, published rows hatched; a value of 0 is drawn as a mark on the axis."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from solo_ext.eval.longtail import GROUP_COLORS
from solo_ext.leaderboard.runs import GROUPS
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


def plot(dataset: str, rows: list[Row], path: str | Path) -> None:
    """Writes ``path`` (PNG): one group of bars per row, in table order; a missing value has
    no bar, a value of 0 a mark on the axis."""
    fig = Figure(figsize=(max(6.0, 1.1 * len(rows) + 2), 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / len(BARS)
    for i, row in enumerate(rows):
        keys = [row.overall_key, *GROUPS]
        values = [row.overall, *(row.groups[g] for g in GROUPS)]
        for j, (name, key, value) in enumerate(zip(BARS, keys, values)):
            if value is None:
                continue
            x = i + (j - (len(BARS) - 1) / 2) * width
            sd = row.spread.get(key)
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
    ax.set_title(
        f"{dataset}: top-1 of each row's evaluation (linear or head, else kNN), overall and "
        "per shot group; error bars: sd over seeds",
        fontsize=9,
    )
    handles = [Patch(color=c, label=n) for n, c in BARS.items()]
    if n_published:
        handles.append(
            Patch(facecolor="dimgray", hatch=HATCH, edgecolor="white", label="published")
        )
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(path, dpi=100, bbox_inches="tight")
