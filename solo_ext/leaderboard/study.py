"""``solo-ext-leaderboard --study``: a study's tables over seeds (the zoo's pages), from the runs
the leaderboard finds (:func:`solo_ext.leaderboard.runs.find_runs`: the same run directories,
copies counted once, what cannot be read skipped in one line) or from the per-seed file this mode
writes.

    solo-ext-leaderboard --study <run roots> [--plot knn.png] [--stages] [--by folder]

Groups the runs by method (DenseCL by its lambda, GPaCo apart from PaCo, All4One's centroid
transformer by its k, the untrained floor apart), or with ``--by folder`` by the folder below the
root that holds them (a study's rows that share a method: PBSD's ablations), and prints kNN top-1
overall / many / medium / few (at k 10 too where measured; a one-stage method's head; DenseCL's
dense probe), mean ± the sample standard deviation over seeds. ``--stages``: the classifier
stages of ``solo-ext-linear classifier_stage=all`` instead, one row per row and stage, then per
seed. ``--entry-points``: each root one method's runs through one entry point, ``solo-ext-*`` or
solo-learn's ``main_pretrain.py`` and ``main_linear.py`` (whose result the leaderboard attaches to
the run), side by side with the gap's standard error and 95 % confidence interval. ``--csv FILE``
also writes every run's values, one line per row and seed; ``--from-csv FILE`` makes the tables
from such a file. ``--compare A:B`` (repeated): for each compared metric, the gap of A's mean over
B's with its 95 % confidence interval, Welch's t-test and its p corrected by Holm's method over
the comparisons; ``--paired A:B`` compares two rows seed by seed (a paired t-test).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from solo_ext.config import ConfigError, one_line_errors
from solo_ext.leaderboard.runs import Run, find_runs
from solo_ext.leaderboard.table import mean_and_spread
from solo_ext.runs.environment import summary

PROG = "solo-ext-leaderboard --study"

KEYS = ("knn_acc1", "knn_acc1_many", "knn_acc1_medium", "knn_acc1_few")
HEADERS = ("kNN top-1", "many", "medium", "few")
# the kNN at k 10 (solo-ext-knn "k=[20,10]"): below the few classes' training images
K10_KEYS = ("knn_k10_acc1", "knn_k10_acc1_many", "knn_k10_acc1_medium", "knn_k10_acc1_few")
K10_HEADERS = ("kNN k 10 top-1", "k 10 many", "k 10 medium", "k 10 few")
DENSE_KEYS = ("dense_miou", "dense_pixel_acc")
DENSE_HEADERS = ("dense mIoU", "pixel acc")
# a one-stage method's reported classifier (PaCo, GPaCo, BCL): its head, trained with the loss
HEAD_KEYS = ("head_acc1", "head_acc1_many", "head_acc1_medium", "head_acc1_few")
HEAD_HEADERS = ("head top-1", "head many", "head medium", "head few")
# solo-ext-linear's classifier stages and the prefix of their metrics.json keys
STAGES = {
    "balanced_linear": "linear_",
    "crt": "linear_crt_",
    "tau_norm": "linear_tau_norm_",
    "lws": "linear_lws_",
    "logit_adjust": "linear_logit_adjust_",
}
GROUPS = ("acc1", "acc1_many", "acc1_medium", "acc1_few")
# a run's values that the per-seed file keeps (the tables read nothing else)
SEED_KEYS = (
    KEYS + K10_KEYS + HEAD_KEYS + DENSE_KEYS
    + tuple(p + g for p in STAGES.values() for g in GROUPS)
    + ("linear_tau_norm_tau", "linear_logit_adjust_tau")
)  # fmt: skip
# the metrics a significance table compares (their overall top-1)
COMPARED = {
    "kNN top-1": "knn_acc1",
    "kNN k 10 top-1": "knn_k10_acc1",
    "balanced_linear": "linear_acc1",
    "crt": "linear_crt_acc1",
    "logit_adjust": "linear_logit_adjust_acc1",
}


def row_name(run: Run, root: Path, by: str) -> str:
    """A run's row: its method (DenseCL with its lambda, whose 0 is its baseline; PaCo with
    ``gpaco`` as GPaCo; All4One's centroid transformer with its k; a run named untrained-* as
    the floor), or with ``by="folder"`` the folder below ``root`` that holds it."""
    if by == "folder":
        return run.path.relative_to(root).parts[0]
    name, kwargs = run.method, run.method_kwargs
    if "lambda" in kwargs:
        name += f" (lambda {kwargs['lambda']})"
    if kwargs.get("gpaco"):
        name = "paco (gpaco)"
    if "centroid_temperature" in kwargs:
        name += f" (k {kwargs['k']})"
    if str(run.args.get("name", "")).startswith("untrained"):
        name = "untrained"
    return name


def collect(*roots: Path, by: str = "method") -> dict[str, list[dict]]:
    """The runs the leaderboard finds under ``roots``, grouped by :func:`row_name`, each its
    seed, data set, environment and ``metrics.json`` values; DSCL's stage of a run evaluated by
    ``main_linear.py`` is the leaderboard's attached result (``entry``: solo-learn's scripts)."""
    runs: dict[str, list[dict]] = defaultdict(list)
    for root in roots:
        found = find_runs([root], [])
        for path, reason in found.skipped:
            print(f"{PROG}: skipped {path}: {reason}", file=sys.stderr)
        for run in found.runs:
            metrics = (
                json.loads(p.read_text()) if (p := run.path / "metrics.json").is_file() else {}
            )
            env = summary(run.environment) or "not recorded"
            item = {"seed": run.args.get("seed"), "environment": env, "dataset": run.dataset}
            item.update(metrics)
            linear = run.evals.get("linear")
            if linear is not None and "linear_acc1" not in metrics:  # main_linear.py's
                item["entry"] = "solo-learn's scripts"
                for group, metric in zip(GROUPS, ("acc1", "many", "medium", "few")):
                    item[STAGES["balanced_linear"] + group] = linear.value(metric)
            runs[row_name(run, root, by)].append(item)
    for items in runs.values():
        items.sort(key=lambda r: (r["seed"] is None, r["seed"]))
    return dict(sorted(runs.items()))


def environments(runs: dict[str, list[dict]]) -> str:
    """Where the runs were made: each recorded environment and how many runs it holds."""
    counts: dict[str, int] = defaultdict(int)
    for items in runs.values():
        for r in items:
            counts[r["environment"]] += 1
    return "\n".join(f"Runs made on: {env} ({n} runs)" for env, n in sorted(counts.items()))


def write_seeds(runs: dict[str, list[dict]], path: Path) -> None:
    """Every run's values (:data:`SEED_KEYS` it has), one line per row and seed, with its data
    set and the environment it ran in: the file the tables and plots can be made from again
    (:func:`read_seeds`)."""
    keys = [k for k in SEED_KEYS if any(k in r for items in runs.values() for r in items)]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["row", "seed", *keys, "dataset", "environment"])
        for row, items in runs.items():
            for r in items:
                values = ["" if r.get(k) is None else f"{r[k]:.4f}".rstrip("0").rstrip(".")
                          for k in keys]  # fmt: skip
                writer.writerow([row, r["seed"], *values, r["dataset"], r["environment"]])


def read_seeds(path: Path) -> dict[str, list[dict]]:
    """The runs of a file :func:`write_seeds` wrote, as :func:`collect` gives them."""
    runs: dict[str, list[dict]] = defaultdict(list)
    with open(path, newline="") as f:
        for line in csv.DictReader(f):
            row, seed, env = line.pop("row"), line.pop("seed"), line.pop("environment")
            run = {"seed": int(seed) if seed.lstrip("-").isdigit() else seed, "environment": env}
            run["dataset"] = line.pop("dataset")
            run.update({k: float(v) for k, v in line.items() if v != ""})
            runs[row].append(run)
    return dict(runs)


def welch(a: list[float], b: list[float]) -> dict[str, float]:
    """Welch's t-test of mean(a) - mean(b) (two-sided): the gap, its standard error
    sqrt(s_a²/n_a + s_b²/n_b), the Welch-Satterthwaite degrees of freedom, t, p and the 95 %
    confidence interval of the gap."""
    from scipy import stats

    result = stats.ttest_ind(a, b, equal_var=False)
    low, high = result.confidence_interval(0.95)
    gap = statistics.mean(a) - statistics.mean(b)
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    return {"gap": gap, "se": se, "df": float(result.df), "t": float(result.statistic),
            "p": float(result.pvalue), "low": float(low), "high": float(high)}  # fmt: skip


def paired(a: list[float], b: list[float]) -> dict[str, float]:
    """The paired t-test of a - b, seed by seed (two-sided): as :func:`welch`, on the
    differences (n - 1 degrees of freedom)."""
    from scipy import stats

    result = stats.ttest_rel(a, b)
    low, high = result.confidence_interval(0.95)
    d = [x - y for x, y in zip(a, b)]
    return {"gap": statistics.mean(d), "se": statistics.stdev(d) / math.sqrt(len(d)),
            "df": float(result.df), "t": float(result.statistic), "p": float(result.pvalue),
            "low": float(low), "high": float(high)}  # fmt: skip


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment of the p-values of one family of tests: the i-th smallest
    p times (m - i + 1) (i from 1), made non-decreasing in that order, at most 1."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adjusted, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def reading(a: str, b: str, test: dict[str, float], p: float) -> str:
    """What a test says, in words: a direction only where Holm's p is below 0.05."""
    if p < 0.05:
        return f"{a} {'>' if test['gap'] > 0 else '<'} {b}"
    return "not separated at this number of seeds"


def significance_table(
    runs: dict[str, list[dict]], comparisons: list[tuple[str, str, bool]]
) -> str:
    """For each metric of :data:`COMPARED` the runs have: each comparison (A, B, paired) as the
    gap of A over B with its 95 % confidence interval, t, its degrees of freedom, p, and p
    adjusted by Holm's method over the comparisons of that metric (one family per metric). A
    comparison with under two seeds a side (two pairs) is listed as not tested and still counts
    in its family, as a p of 1: the correction is over every comparison asked for. A comparison
    whose row has runs but none with the metric (solo-learn's ``main_linear.py`` makes DSCL's
    stage only, not cRT) is not one of that metric's: it is left out of its lines and family."""
    lines = [
        "| metric | A - B | seeds | gap | 95 % CI | t | df | p | p (Holm) | reading |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, key in COMPARED.items():
        rows = []
        for a, b, is_paired in comparisons:
            va = {r["seed"]: r[key] for r in runs.get(a, []) if r.get(key) is not None}
            vb = {r["seed"]: r[key] for r in runs.get(b, []) if r.get(key) is not None}
            if (runs.get(a) and not va) or (runs.get(b) and not vb):
                continue  # a row that does not measure this metric
            test = None
            if is_paired:
                seeds = sorted(set(va) & set(vb), key=str)
                if len(seeds) >= 2:
                    test = paired([va[x] for x in seeds], [vb[x] for x in seeds])
                n = f"{len(seeds)} paired"
            else:
                if len(va) >= 2 and len(vb) >= 2:
                    test = welch(list(va.values()), list(vb.values()))
                n = f"{len(va)} / {len(vb)}"
            rows.append((a, b, is_paired, n, test))
        if not any(r.get(key) is not None for items in runs.values() for r in items):
            continue  # a metric no run has
        ps = [1.0 if test is None else test["p"] for *_, test in rows]
        for (a, b, is_paired, n, test), p in zip(rows, holm(ps)):
            sign = " (paired)" if is_paired else ""
            if test is None:
                lines.append(
                    f"| {label} | `{a}` - `{b}`{sign} | {n} | n/a | n/a | n/a | n/a | n/a | n/a | "
                    "not tested: under two seeds a side |"
                )
                continue
            lines.append(
                f"| {label} | `{a}` - `{b}`{sign} | {n} | {test['gap']:+.1f} | "
                f"[{test['low']:+.1f}, {test['high']:+.1f}] | {test['t']:.2f} | {test['df']:.1f} | "
                f"{test['p']:.3f} | {p:.3f} | {reading(a, b, test, p)} |"
            )
    return "\n".join(lines)


def table(runs: dict[str, list[dict]]) -> str:
    found = {k for items in runs.values() for r in items for k in r}
    keys, headers = KEYS, HEADERS
    if K10_KEYS[0] in found:
        keys, headers = keys + K10_KEYS, headers + K10_HEADERS
    if DENSE_KEYS[0] in found:
        keys, headers = keys + DENSE_KEYS, headers + DENSE_HEADERS
    if HEAD_KEYS[0] in found:
        keys, headers = keys + HEAD_KEYS, headers + HEAD_HEADERS
    lines = ["| method | seeds | " + " | ".join(headers) + " |", "|---" * (len(keys) + 2) + "|"]
    for method, items in runs.items():
        cells = []
        for key in keys:
            values = [r[key] for r in items if r.get(key) is not None]
            if not values:
                cells.append("n/a")
                continue
            cells.append(mean_std(values))
        seeds = ", ".join(str(r["seed"]) for r in items)
        lines.append(f"| `{method}` | {seeds} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def mean_std(values: list[float]) -> str:
    """The mean ± the sample standard deviation; one seed has no spread, so its value alone."""
    mean, std = mean_and_spread(values)
    return f"{mean:.1f}" if std is None else f"{mean:.1f} ± {std:.1f}"


def mean_and_std(values: list[float]) -> tuple[float, float]:
    """A plotted bar: the mean and its whisker (0 for one value; no bar, (0, 0), for none)."""
    if not values:
        return 0.0, 0.0
    mean, std = mean_and_spread(values)
    return mean, std or 0.0


def stage_table(runs: dict[str, list[dict]]) -> str:
    """One row per method and classifier stage: top-1 overall / many / medium / few, mean ± std
    over the runs that have the stage (tau_norm's chosen tau beside it)."""
    lines = [
        "| method | stage | seeds | top-1 | many | medium | few | tau |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, items in runs.items():
        for stage, prefix in STAGES.items():
            have = [r for r in items if r.get(prefix + "acc1") is not None]
            if not have:
                continue
            cells = [mean_std([r[prefix + g] for r in have]) for g in GROUPS]
            taus = [r.get(prefix + "tau") for r in have]
            tau = ", ".join(f"{t:g}" for t in taus) if None not in taus else ""
            seeds = ", ".join(str(r["seed"]) for r in have)
            lines.append(f"| `{method}` | {stage} | {seeds} | " + " | ".join(cells) + f" | {tau} |")
    return "\n".join(lines)


def stage_seeds(runs: dict[str, list[dict]]) -> str:
    """Per seed: each stage's top-1 overall / many / medium / few, one column per method."""
    methods = list(runs)
    lines = ["| seed | stage | " + " | ".join(methods) + " |", "|---" * (len(methods) + 2) + "|"]
    seeds = sorted({r["seed"] for items in runs.values() for r in items}, key=str)
    for seed in seeds:
        for stage, prefix in STAGES.items():
            cells = []
            for method in methods:
                r = next((r for r in runs[method] if r["seed"] == seed), {})
                if r.get(prefix + "acc1") is None:
                    cells.append("")
                    continue
                cells.append(" / ".join(f"{r[prefix + g]:.1f}" for g in GROUPS))
            if any(cells):
                lines.append(f"| {seed} | {stage} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(items: list[dict], key: str) -> tuple[float, float]:
    """A bar of ``key`` over the runs that have it (an empty shot group's value is null)."""
    return mean_and_std([r[key] for r in items if r.get(key) is not None])


def _bar_panels(
    panels: list[tuple[str, list[tuple[float, float]]]],
    methods: list[str],
    xlabel: str,
    title: str,
    path: Path,
    floor: list[float] | None = None,
) -> None:
    """One panel of horizontal bars per metric, one bar (mean, std as its whisker) per method:
    legible for any number of methods. ``floor``: the untrained network's value per panel, a
    dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    height = 1.0 + 0.3 * len(methods)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(2.6 * len(panels) + 1.6, height), sharey=True, squeeze=False
    )
    ys = list(range(len(methods)))
    for j, (ax, (name, cells)) in enumerate(zip(axes[0], panels)):
        ax.barh(ys, [m for m, _ in cells], xerr=[s for _, s in cells], capsize=2, color="tab:blue")
        if floor is not None:
            ax.axvline(floor[j], color="grey", linestyle="--", linewidth=1)
        ax.set_title(name)
        ax.set_xlim(0, 100)
        ax.set_xlabel(xlabel)
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(ys, methods)
    axes[0][0].invert_yaxis()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_stages(runs: dict[str, list[dict]], path: Path) -> None:
    """Top-1 of each classifier stage (one panel per stage), methods ordered by their best stage."""
    # the stages some run has (a run of the decoupled stages alone has no balanced_linear)
    stages = {
        stage: prefix
        for stage, prefix in STAGES.items()
        if any(r.get(prefix + "acc1") is not None for items in runs.values() for r in items)
    }

    best = {
        m: max(_cell(items, p + "acc1")[0] for p in stages.values()) for m, items in runs.items()
    }
    methods = sorted(runs, key=lambda m: -best[m])
    panels = [
        (stage, [_cell(runs[m], prefix + "acc1") for m in methods])
        for stage, prefix in stages.items()
    ]
    floor = (
        [_cell(runs["untrained"], p + "acc1")[0] for p in stages.values()]
        if "untrained" in runs
        else None
    )
    title = "classifier stages: top-1, mean ± std over seeds"
    _bar_panels(
        panels, methods, "top-1 (%)", title + (" (dashed: untrained)" if floor else ""), path, floor
    )


def entry_point_runs(root: Path) -> tuple[str, str, list[dict]]:
    """One method's runs below ``root`` (a folder per seed): its name, its entry point (where
    its DSCL stage came from) and the runs."""
    runs = collect(root)
    if len(runs) != 1:
        raise ConfigError(
            f"--entry-points: {str(root)!r} holds runs of {sorted(runs)}, not of one method"
        )
    ((method, items),) = runs.items()
    entry = "solo-learn's scripts" if any("entry" in r for r in items) else "`solo-ext-*`"
    return method, entry, items


def entry_point_table(roots: list[Path]) -> str:
    """kNN and DSCL's stage per method and entry point (mean ± std over seeds); then per method
    the gap between the entry points' means beside each one's standard deviation."""
    keys = KEYS + tuple(STAGES["balanced_linear"] + g for g in GROUPS)
    lines = [
        "| method | entry point | seeds | "
        + " | ".join(HEADERS)
        + " | `balanced_linear` top-1 | many | medium | few |",
        "|---" * (len(keys) + 3) + "|",
    ]
    by_method: dict[str, list[tuple[str, list[dict]]]] = defaultdict(list)
    for root in roots:
        method, entry, items = entry_point_runs(root)
        by_method[method].append((entry, items))
        cells = [mean_std([r[k] for r in items if r.get(k) is not None]) for k in keys]
        seeds = ", ".join(str(r["seed"]) for r in items)
        lines.append(f"| `{method}` | {entry} | {seeds} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| method | metric | gap of the means | std through `solo-ext-*` | std through solo-learn's"
        " scripts | standard error of the gap | 95 % CI of the gap |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, pair in by_method.items():
        entries = dict(pair)
        if set(entries) != {"`solo-ext-*`", "solo-learn's scripts"}:
            continue
        for key, label in (
            (KEYS[0], "kNN top-1"),
            (STAGES["balanced_linear"] + "acc1", "`balanced_linear` top-1"),
        ):
            cells, samples = [], []
            for entry in ("`solo-ext-*`", "solo-learn's scripts"):
                values = [r[key] for r in entries[entry]]
                samples.append(values)
                cells.append(mean_and_std(values) + (len(values),))
            gap = cells[0][0] - cells[1][0]  # solo-ext-* minus solo-learn's scripts
            # one seed has no spread to compare the gap with
            spreads = [f"{s:.1f}" if n > 1 else "n/a (one seed)" for _, s, n in cells]
            if min(n for *_, n in cells) > 1:
                # the standard error of a difference of two independent means: sqrt(s1²/n1 +
                # s2²/n2), and Welch's confidence interval of the gap
                test = welch(*samples)
                spreads += [f"{test['se']:.1f}", f"[{test['low']:+.1f}, {test['high']:+.1f}]"]
            else:
                spreads += ["n/a", "n/a"]
            lines.append(f"| `{method}` | {label} | {gap:+.1f} | " + " | ".join(spreads) + " |")
    return "\n".join(lines)


def plot(runs: dict[str, list[dict]], path: Path, dataset: str = "synthetic_lt") -> None:
    """kNN top-1 overall / many / medium / few (one panel each), methods ordered by overall."""

    cells = {m: [_cell(items, k) for k in KEYS] for m, items in runs.items()}
    methods = sorted(runs, key=lambda m: -cells[m][0][0])
    groups = ["overall", "many", "medium", "few"]
    panels = [(g, [cells[m][i] for m in methods]) for i, g in enumerate(groups)]
    floor = [c[0] for c in cells["untrained"]] if "untrained" in runs else None
    title = f"kNN top-1 on {dataset}, equal budget, mean ± std over seeds"
    _bar_panels(
        panels,
        methods,
        "kNN top-1 (%)",
        title + (" (dashed: untrained)" if floor else ""),
        path,
        floor,
    )


def parser() -> argparse.ArgumentParser:
    from solo_ext.leaderboard.cli import _Parser

    p = _Parser(prog=PROG, description=__doc__.splitlines()[0].split(": ", 1)[1])
    p.add_argument("roots", type=Path, nargs="*", help="roots of the study's runs")
    p.add_argument("--plot", type=Path, help="also draw the table into this PNG")
    p.add_argument(
        "--by", choices=("method", "folder"), default="method", help="how rows are named"
    )
    p.add_argument("--csv", type=Path, help="also write every run's values to this file")
    p.add_argument("--from-csv", type=Path, help="the runs' values from such a file")
    p.add_argument("--compare", action="append", default=[], metavar="A:B", help="Welch's t")
    p.add_argument("--paired", action="append", default=[], metavar="A:B", help="paired t")
    p.add_argument("--stages", action="store_true", help="the classifier stages' table")
    p.add_argument(
        "--entry-points",
        action="store_true",
        help="each root one method's runs through one entry point: the two side by side",
    )
    return p


def comparisons_of(args: argparse.Namespace, rows: list[str]) -> list[tuple[str, str, bool]]:
    """``--compare`` / ``--paired`` as (A, B, paired); one line for one that is not A:B. A row
    without runs yet (a study under way) is said on stderr and listed as not tested."""
    out = []
    for option, items in (("--compare", args.compare), ("--paired", args.paired)):
        for item in items:
            pair = item.split(":")
            if len(pair) != 2 or not all(pair):
                raise ConfigError(f"{option}={item!r}: expected A:B, two rows")
            for name in (n for n in pair if n not in rows):
                print(f"{PROG}: {option}={item!r}: no runs of {name!r} yet (rows: "
                      f"{', '.join(rows)}): not tested", file=sys.stderr)  # fmt: skip
            out.append((pair[0], pair[1], option == "--paired"))
    return out


def run(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    with one_line_errors(PROG):
        for path in args.roots:
            if not path.is_dir():
                raise ConfigError(f"roots: {str(path)!r}: no such directory")
        if args.entry_points:
            print(entry_point_table(args.roots))
            return
        if (args.from_csv is None) == (not args.roots):
            raise ConfigError("give run roots or --from-csv (one of the two)")
        if args.from_csv is not None and not args.from_csv.is_file():
            raise ConfigError(f"--from-csv={str(args.from_csv)!r}: no such file")
        for option, path in (("--csv", args.csv), ("--plot", args.plot)):
            folder = path.parent if path is not None else None
            if folder is not None and not (folder.is_dir() and os.access(folder, os.W_OK)):
                raise ConfigError(
                    f"{option}={str(path)!r}: {str(folder)!r} is not a writable folder"
                )
        runs = read_seeds(args.from_csv) if args.from_csv else collect(*args.roots, by=args.by)
        if not runs:
            raise ConfigError(
                f"roots: no run with a result under {', '.join(map(str, args.roots))}"
            )
        comparisons = comparisons_of(args, list(runs))
        if args.csv:
            write_seeds(runs, args.csv)
    if comparisons:
        print(significance_table(runs, comparisons))
        print()
    if args.stages:
        print(stage_table(runs))
        print()
        print(stage_seeds(runs))
        print()
        print(environments(runs))
        if args.plot:
            plot_stages(runs, args.plot)
        return
    print(table(runs))
    print()
    print(environments(runs))
    if args.plot:
        datasets = sorted({str(r["dataset"]) for items in runs.values() for r in items})
        plot(runs, args.plot, ", ".join(datasets))
