"""Summarises pretraining runs into a markdown table (mean +- std over seeds) and a plot.

    python zoo/summarize.py <checkpoint dir> [<dir> ...] [--plot zoo/synthetic-lt.png] [--stages]

Reads ``<dir>/<method>/<run id>/metrics.json`` and ``args.json`` of every run below the
directories, groups the runs by method, and prints kNN top-1 overall / many / medium / few (and,
for one-stage methods, the same of their head; for DenseCL its dense probe). With ``--stages``,
the classifier stages of ``solo-ext-linear classifier_stage=all`` instead: one row per method and
stage, then the same per seed (``--plot`` then draws top-1 and few-shot per stage).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from solo_ext.runs.environment import summary

KEYS = ("knn_acc1", "knn_acc1_many", "knn_acc1_medium", "knn_acc1_few")
HEADERS = ("kNN top-1", "many", "medium", "few")
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


def collect(*roots: Path) -> dict[str, list[dict]]:
    """Runs grouped by method (and DenseCL's lambda, which makes its baseline)."""
    runs: dict[str, list[dict]] = defaultdict(list)
    for metrics_path in sorted(p for root in roots for p in root.rglob("metrics.json")):
        args = json.loads((metrics_path.parent / "args.json").read_text())
        metrics = json.loads(metrics_path.read_text())
        name = args["method"]
        kwargs = args.get("method_kwargs", {})
        if "lambda" in kwargs:  # densecl: lambda 0 is its baseline
            name += f" (lambda {kwargs['lambda']})"
        if kwargs.get("gpaco"):  # paco with gpaco: true is GPaCo
            name = "paco (gpaco)"
        if "centroid_temperature" in kwargs:  # all4one_ct: compared over k
            name += f" (k {kwargs['k']})"
        if str(args.get("name", "")).startswith("untrained"):  # the floor: no training
            name = "untrained"
        env = summary(args.get("environment")) or "not recorded"
        dataset = args.get("data", {}).get("dataset")
        runs[name].append({"seed": args.get("seed"), "environment": env, "dataset": dataset})
        runs[name][-1].update(metrics)
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


def table(runs: dict[str, list[dict]]) -> str:
    found = {k for items in runs.values() for r in items for k in r}
    keys, headers = KEYS, HEADERS
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


def mean_and_std(values: list[float]) -> tuple[float, float]:
    """The mean and sample standard deviation (0 for one value, (0, 0) for none)."""
    if not values:
        return 0.0, 0.0
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def mean_std(values: list[float]) -> str:
    """The mean ± the sample standard deviation; one seed has no spread, so its value alone."""
    mean, std = mean_and_std(values)
    return f"{mean:.1f}" if len(values) == 1 else f"{mean:.1f} ± {std:.1f}"


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

    def cell(items: list[dict], key: str) -> tuple[float, float]:
        return mean_and_std([r[key] for r in items if r.get(key) is not None])

    best = {
        m: max(cell(items, p + "acc1")[0] for p in stages.values()) for m, items in runs.items()
    }
    methods = sorted(runs, key=lambda m: -best[m])
    panels = [
        (stage, [cell(runs[m], prefix + "acc1") for m in methods])
        for stage, prefix in stages.items()
    ]
    floor = (
        [cell(runs["untrained"], p + "acc1")[0] for p in stages.values()]
        if "untrained" in runs
        else None
    )
    title = "classifier stages: top-1, mean ± std over seeds"
    _bar_panels(
        panels, methods, "top-1 (%)", title + (" (dashed: untrained)" if floor else ""), path, floor
    )


def plot(runs: dict[str, list[dict]], path: Path, dataset: str = "synthetic_lt") -> None:
    """kNN top-1 overall / many / medium / few (one panel each), methods ordered by overall."""
    cells = {m: [mean_and_std([r[k] for r in items]) for k in KEYS] for m, items in runs.items()}
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("roots", type=Path, nargs="+")
    p.add_argument("--plot", type=Path)
    p.add_argument("--stages", action="store_true", help="the classifier stages' table")
    args = p.parse_args()
    runs = collect(*args.roots)
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


if __name__ == "__main__":
    main()
