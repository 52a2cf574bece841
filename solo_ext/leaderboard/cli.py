"""``solo-ext-leaderboard``'s command line: check the arguments, find the runs, write the tables."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from solo_ext.common import atomic_write_text
from solo_ext.config import ConfigError, one_line_errors

PROG = "solo-ext-leaderboard"


class _Parser(argparse.ArgumentParser):
    """argparse with its errors in one line (``<prog>: error: ...``, exit status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Tables of measured runs beside published numbers: per dataset, "
        "<out>/<dataset>.md, .csv, .tex (LaTeX, booktabs) and .png; the markdown is also "
        "printed.",
    )
    p.add_argument(
        "paths", nargs="+", type=Path, help="run directories, or roots to search (trained_models/)"
    )
    p.add_argument(
        "--study",
        action="store_true",
        help="a study's tables over seeds instead (the zoo's pages: rows by method or folder, "
        "Welch's t with Holm's correction, the per-seed CSV): see --study --help",
    )
    p.add_argument(
        "--out", type=Path, default=Path("leaderboard"), help="output directory (./leaderboard)"
    )
    p.add_argument(
        "--logs",
        type=Path,
        action="append",
        default=[],
        help="a directory holding solo-learn's lightning_logs/ (default: where each "
        "script ran, the paths given and the current directory); repeatable",
    )
    p.add_argument(
        "--per-run",
        action="store_true",
        help="one row per run (with its name and seed), instead of one per setting: the mean "
        "and spread over the seeds of runs that differ in nothing else",
    )
    p.add_argument(
        "--published",
        type=Path,
        default=None,
        help="the published-numbers CSV (default: the one shipped with solo-ext)",
    )
    p.add_argument(
        "--rows",
        default=None,
        help="the published rows shown (default: each method's headline row, its paper's main "
        "table): 'all', or a comma-separated list of methods or labels (their headline rows, "
        "e.g. dscl,scl,gpaco), <method>:all (every row of it), source=<text> (every row whose "
        "source names it, e.g. 'source=Table 11')",
    )
    return p


def check_writable(out: Path) -> None:
    """``--out`` is a directory that exists and is writable, or can be made."""
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"--out={str(out)!r}: {str(existing)!r} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--out={str(out)!r}: {str(existing)!r} is not writable")


def check_args(args: argparse.Namespace) -> None:
    """Every path exists and the output directory can be written; else one line."""
    for path in args.paths:
        if not path.exists():
            raise ConfigError(f"paths: {str(path)!r}: no such file or directory")
        if not path.is_dir():
            raise ConfigError(f"paths: {str(path)!r}: not a directory (a run directory or root)")
    for path in args.logs:
        if not path.is_dir():
            raise ConfigError(f"--logs={str(path)!r}: no such directory")
    if args.published is not None and not args.published.is_file():
        raise ConfigError(f"--published={str(args.published)!r}: no such file")
    check_writable(args.out)


def _safe(name: str) -> str:
    """A table's file name: its name with each run of other characters than letters, digits,
    ``-`` and ``.`` as one ``_`` (``custom /data/a (many > 10, few < 5)``:
    ``custom_data_a_many_10_few_5``)."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", name).strip("_") or "dataset"


def run(argv: list[str] | None = None) -> dict[str, list] | None:
    """The command: returns dataset -> its rows (see :func:`build_tables`); with ``--study``
    the study mode (:mod:`solo_ext.leaderboard.study`), which prints its tables."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--study" in argv:
        from solo_ext.leaderboard import study

        return study.run([a for a in argv if a != "--study"])
    args = parser().parse_args(argv)
    with one_line_errors(PROG):
        check_args(args)
        from solo_ext.leaderboard.published import PUBLISHED_CSV, choose_rows, load_published
        from solo_ext.leaderboard.runs import find_runs

        source = args.published or PUBLISHED_CSV
        try:
            published = load_published(source)
        except (ValueError, OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"--published={str(source)!r}: {err}") from None
        try:
            chosen = choose_rows(published, args.rows)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        found = find_runs(args.paths, args.logs)
        for path, reason in found.skipped:
            print(f"{PROG}: skipped {path}: {reason}", file=sys.stderr)
        for copy, original in found.copies:
            print(
                f"{PROG}: counted once: {copy} is a copy of {original} (the same args.json, "
                "seed and results)",
                file=sys.stderr,
            )
        if not found.runs:
            shown = ", ".join(repr(str(p)) for p in args.paths)
            raise ConfigError(f"paths: no run with a result found under {shown}")
        return write(found.runs, published, args.out, per_run=args.per_run, shown=chosen)


def write(
    runs: list, published: list, out: Path, per_run: bool = False, shown: list | None = None
) -> dict[str, list]:
    """Writes ``<out>/<dataset>.{md,csv,tex,png}`` for every dataset and prints the markdown:
    the published rows of ``shown`` (default: all) above the runs, each run compared with its
    counterpart among all of ``published``."""
    from solo_ext.leaderboard.latex import latex
    from solo_ext.leaderboard.plot import plot
    from solo_ext.leaderboard.table import MEASURED, build_tables, csv_text, markdown

    tables = build_tables(runs, published, per_run=per_run, shown=shown)
    out.mkdir(parents=True, exist_ok=True)
    for dataset, rows in tables.items():
        name = _safe(dataset)
        text = markdown(dataset, rows)
        atomic_write_text(out / f"{name}.md", text)
        atomic_write_text(out / f"{name}.csv", csv_text(rows))
        atomic_write_text(out / f"{name}.tex", latex(dataset, rows, name))
        # the plot: the measured rows and the published rows they are compared with
        compared = {r.compared for r in rows if r.kind == MEASURED}
        plotted = [r for r in rows if r.kind == MEASURED or (r.label, r.linear_eval) in compared]
        plot(dataset, plotted, out / f"{name}.png")
        print(text)
    print(f"wrote {len(tables)} table(s) ({', '.join(tables)}) to {out}/: .md, .csv, .tex, .png")
    return tables


def main() -> None:
    run()
