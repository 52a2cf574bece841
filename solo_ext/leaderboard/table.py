"""The leaderboard's rows (published and measured, never mixed) and their markdown and CSV."""

from __future__ import annotations

import csv
import io
import json
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from solo_ext.data.longtail import shot_groups
from solo_ext.facts import FEW_THRESHOLD, MANY_THRESHOLD, facts
from solo_ext.leaderboard.published import (
    Published,
    augmentation_differences,
    counterpart,
    protocol_defaults,
    protocol_differences,
    published_stage,
    same_imbalance,
    stage_differences,
)
from solo_ext.leaderboard.recipe import recipe_differences
from solo_ext.leaderboard.runs import DECOUPLED_EVALS, EVALUATIONS, GROUPS, METRICS, Run, shown
from solo_ext.runs.environment import summary

PUBLISHED, MEASURED = "published", "measured"
MISSING = "—"
FLAG = "⚑"


@dataclass
class Row:
    """One line of a dataset's table: a published number or a measured run."""

    kind: str  # PUBLISHED or MEASURED
    dataset: str
    method: str
    label: str
    backbone: str | None
    epochs: int | None
    batch: int | None  # the total, over all GPUs
    protocol: str
    # "<evaluation>_<metric>" (runs.EVALUATIONS x runs.METRICS) -> the number; absent: none
    values: dict[str, float | None]
    source: str
    # a published number whose source does not say whether it is the online or the offline
    # classifier's (in the linear columns, marked)
    unsaid: bool = False
    imbalance_factor: float | None = None
    linear_eval: str = ""  # a published row's (published.LINEAR_EVALS)
    compared_with: str = ""
    # a measured row's published counterpart: its label and linear_eval (a label alone may
    # stand for an online and an offline row)
    compared: tuple[str, str] | None = None
    differences: list[str] = field(default_factory=list)
    environment: str = ""  # a measured run's: host, torch, device, precision, processes
    # a measured row's runs (directory names), their seeds and names; several: the mean of
    # runs that differ in nothing but the seed, with the sample standard deviation in spread
    runs: list[str] = field(default_factory=list)
    seeds: list[Any] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    spread: dict[str, float | None] = field(default_factory=dict)
    # classes per shot group (many, medium, few) of a measured run, from its training counts
    group_sizes: dict[str, int] | None = None
    gpus: int | None = None  # the processes the batch was split over (None: not said)

    @property
    def batch_text(self) -> str | None:
        """``GPUs x per-GPU batch`` (``2 x 128``); the total alone where the GPUs are not said."""
        if self.batch is None:
            return None
        if self.gpus and self.batch % self.gpus == 0:
            return f"{self.gpus} x {self.batch // self.gpus}"
        return str(self.batch)

    @property
    def n(self) -> int:
        """How many runs the row's numbers are the mean of (a published row: 0)."""
        return len(self.runs)

    @property
    def flagged(self) -> bool:
        """A measured row whose protocol, epochs or backbone differ from the published."""
        return bool(self.differences)

    def value(self, evaluation: str, metric: str = "acc1") -> float | None:
        return self.values.get(f"{evaluation}_{metric}")

    @property
    def evaluations(self) -> list[str]:
        """The evaluations the row has a number of, in column order."""
        return [e for e in EVALUATIONS if any(self.value(e, m) is not None for m in METRICS)]


# a published row's ``linear_eval`` -> the evaluation columns its numbers go in
EVALUATION_OF = {"offline": "linear", "online": "online", "head": "head", "": "linear"}


def published_row(p: Published) -> Row:
    evaluation = EVALUATION_OF[p.linear_eval]
    values = {f"{evaluation}_acc1": p.linear_acc1, f"{evaluation}_acc5": p.acc5}
    values["knn_acc1"] = p.knn_acc1
    # Many / Medium / Few belong to the top-1 given (the classifier's, else the kNN's)
    groups_of = evaluation if p.linear_acc1 is not None else "knn"
    values.update({f"{groups_of}_{g}": getattr(p, g) for g in GROUPS})
    return Row(
        kind=PUBLISHED,
        dataset=p.dataset,
        method=p.method,
        label=p.label,
        backbone=p.backbone,
        epochs=p.epochs,
        batch=p.batch,
        gpus=p.gpus,
        protocol=p.protocol,
        values={k: v for k, v in values.items() if v is not None},
        source=p.source,
        unsaid=p.linear_eval == "" and p.linear_acc1 is not None,
        imbalance_factor=p.imbalance_factor,
        linear_eval=p.linear_eval,
    )


def imbalance_of(run: Run) -> float | None:
    """A run's imbalance factor: its long-tailed profile's (``data.imbalance_factor``), else
    its training counts' largest over smallest; None for a dataset of published split files
    (their lists fix it: one benchmark) and where nothing says."""
    data = run.args.get("data") or {}
    if facts(run.dataset).source == "split_files":
        return None
    factor = data.get("imbalance_factor")
    if isinstance(factor, (int, float)) and not isinstance(factor, bool):
        return float(factor)
    counts = data.get("train_class_counts")
    if isinstance(counts, list) and counts and all(isinstance(c, int) and c > 0 for c in counts):
        return max(counts) / min(counts)
    return None


def measured_row(run: Run, published: list[Published]) -> Row:
    """A run's row, compared with its published counterpart (if the data file has one)."""
    diffs = protocol_differences(run.method, run.method_kwargs, run.processes)
    diffs += augmentation_differences(run.method, run.args.get("augmentations"))
    ref = counterpart(
        published,
        run.dataset,
        run.method,
        run.method_kwargs,
        run.backbone,
        tuple(run.evals),
        run.epochs,
        imbalance_of(run),
    )
    differences = list(diffs)  # (the protocol column: the named options)
    linear = run.evals.get("linear")
    if linear is not None:
        reference = ref.stage if ref is not None and ref.stage else published_stage(run.dataset)
        differences += stage_differences(reference, linear.stage)
    # a decoupled stage's column is not the stage a published linear number used
    published_eval = ref.linear_eval if ref is not None else ""
    for key in (k for k in run.evals if k in DECOUPLED_EVALS):
        stage = DECOUPLED_EVALS[key]
        was = "the balanced linear stage" if published_eval in ("offline", "") else published_eval
        differences.append(f"{EVALUATIONS[key]}: classifier stage {stage} (published: {was})")
    differences += recipe_differences(run)
    if ref is not None and None not in (ref.epochs, run.epochs) and ref.epochs != run.epochs:
        differences.append(f"epochs {run.epochs} (published {ref.epochs})")
    if (
        ref is not None
        and None not in (ref.backbone, run.backbone)
        and ref.backbone != run.backbone
    ):
        differences.append(f"backbone {run.backbone} (published {ref.backbone})")
    evals = [f"{EVALUATIONS[k]}: {e.origin}" + (f" ({e.note})" if e.note else "")
             for k, e in run.evals.items()]  # fmt: skip
    values = {f"{k}_{m}": e.value(m) for k, e in run.evals.items() for m in METRICS}
    has_protocol = bool(protocol_defaults(run.method))
    return Row(
        kind=MEASURED,
        dataset=run.dataset,
        method=run.method,
        label=f"{run.method} {run.path.name}",
        runs=[run.path.name],
        seeds=[run.args.get("seed")],
        names=[str(run.args.get("name") or "")],
        group_sizes=group_sizes(run),
        backbone=run.backbone,
        epochs=run.epochs,
        batch=run.batch,
        gpus=run.processes,
        protocol=", ".join(diffs) if diffs else ("as published" if has_protocol else ""),
        values={k: v for k, v in values.items() if v is not None},
        source=f"{shown(run.path)}; " + "; ".join(evals),
        imbalance_factor=imbalance_of(run),
        compared_with=ref.label if ref is not None else "",
        compared=(ref.label, ref.linear_eval) if ref is not None else None,
        differences=differences,
        environment=summary(run.environment) or "not recorded",
    )


# what may differ between the runs of one row: the seed (and what follows it) and bookkeeping
NOT_COMPARED = ("seed", "name", "wandb_run_id", "environment", "checkpoint", "auto_resume",
                "resume_from_checkpoint", "wandb")  # fmt: skip


def _setting(run: Run) -> str:
    """The run's config without what :data:`NOT_COMPARED` lists (a sampler seeded by the run's
    seed too): runs with the same setting differ in nothing but the seed."""
    args = {k: v for k, v in run.args.items() if k not in NOT_COMPARED}
    sampler = (args.get("data") or {}).get("sampler")
    if isinstance(sampler, dict) and sampler.get("seed") == run.args.get("seed"):
        args["data"] = {**args["data"], "sampler": {**sampler, "seed": "<the run's seed>"}}
    return json.dumps(args, sort_keys=True, default=str)


def mean_and_spread(values: list[float]) -> tuple[float, float | None]:
    """The mean of seeds' values and their sample standard deviation (None below two values):
    every table's mean ± spread, the leaderboard's and its study mode's."""
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None


def _mean_row(rows: list[Row]) -> Row:
    """One row of runs that differ in nothing but the seed: each number's mean over the runs
    that have it, and its sample standard deviation (None below two values)."""
    first = rows[0]
    means, spread = {}, {}
    for key in sorted({k for r in rows for k in r.values}):
        values = [r.values[key] for r in rows if r.values.get(key) is not None]
        means[key], spread[key] = mean_and_spread(values)
    return replace(
        first,
        label=f"{first.method} {first.names[0]}".strip(),
        values=means,
        spread=spread,
        runs=[name for r in rows for name in r.runs],
        seeds=[seed for r in rows for seed in r.seeds],
        names=sorted({name for r in rows for name in r.names}),
        source=f"{len(rows)} runs: " + " | ".join(r.source for r in rows),
    )


def _thresholds(run: Run) -> tuple[int, int]:
    data = run.args.get("data") or {}
    many, few = data.get("many_threshold"), data.get("few_threshold")
    return (MANY_THRESHOLD if many is None else many, FEW_THRESHOLD if few is None else few)


def group_sizes(run: Run) -> dict[str, int] | None:
    """Classes per shot group of the run's training counts (``data.train_class_counts``) and
    thresholds; None when its ``args.json`` has no counts."""
    counts = (run.args.get("data") or {}).get("train_class_counts")
    if not isinstance(counts, list) or not all(isinstance(c, int) for c in counts):
        return None
    try:
        labels = shot_groups(counts, *_thresholds(run))
    except ValueError:
        return None
    return {g: labels.count(g) for g in GROUPS}


def table_of(run: Run, thresholds_named: bool = False) -> str:
    """The table a run goes into: its dataset, an image folder's (``custom``, whose classes the
    folder decides) with its path, a long-tailed profile at another imbalance factor than the
    dataset's default with it (a benchmark of its own); with ``thresholds_named`` (the runs of
    that dataset use several shot thresholds, whose numbers are not comparable) also its
    thresholds."""
    name = run.dataset
    train_path = (run.args.get("data") or {}).get("train_path")
    fact = facts(run.dataset)
    if fact.source == "image_folder" and fact.classes is None and train_path:  # (the folder's)
        name += f" {train_path}"
    factor = imbalance_of(run)
    if fact.default_imbalance is not None and not same_imbalance(fact.default_imbalance, factor):
        name += f" (imbalance {factor:g})"
    if thresholds_named:
        many, few = _thresholds(run)
        name += f" (many > {many}, few < {few})"
    return name


def build_tables(
    runs: list[Run],
    published: list[Published],
    per_run: bool = False,
    shown: list[Published] | None = None,
) -> dict[str, list[Row]]:
    """Table -> its rows: the published rows of ``shown`` (default: all of ``published``) of the
    dataset at the runs' imbalance factor (file order), then the measured ones (by method, then
    directory), each compared with its counterpart among ``published``; only tables with a
    measured run. The runs of one setting (:func:`_setting`) and the same evaluations make one
    row, their mean and spread, unless ``per_run``."""
    thresholds: dict[str, set] = {}
    for run in runs:
        thresholds.setdefault(table_of(run), set()).add(_thresholds(run))
    groups: dict[tuple, list[Row]] = {}
    factors: dict[str, float | None] = {}
    for run in sorted(runs, key=lambda r: (r.dataset, r.method, str(r.path))):
        row = measured_row(run, published)
        evaluation = (row.environment, *((k, e.note, json.dumps(e.stage, sort_keys=True))
                                         for k, e in run.evals.items()))  # fmt: skip
        table = table_of(run, thresholds_named=len(thresholds[table_of(run)]) > 1)
        factors[table] = imbalance_of(run)
        key = (table, str(run.path) if per_run else _setting(run), evaluation)
        groups.setdefault(key, []).append(row)
    tables: dict[str, list[Row]] = {}
    for (table, _, _), rows in groups.items():
        if table not in tables:
            dataset = rows[0].dataset
            tables[table] = [published_row(p) for p in (published if shown is None else shown)
                             if p.dataset == dataset
                             and same_imbalance(p.imbalance_factor, factors[table])]  # fmt: skip
        tables[table].append(rows[0] if len(rows) == 1 else _mean_row(rows))
    return dict(sorted(tables.items()))


def _num(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2f}"


def _acc(value: float | None, sd: float | None = None, unsaid: bool = False) -> str:
    spread = f" ± {sd:.2f}" if sd is not None and value is not None else ""
    return _num(value) + spread + (" (?)" if unsaid and value is not None else "")


METRIC_TITLES = {"acc1": "top-1", "acc5": "top-5", "many": "many", "medium": "medium",
                 "few": "few"}  # fmt: skip


def columns(rows: list[Row]) -> list[tuple[str, str]]:
    """The (evaluation, metric) columns a table shows: those with a number in one of its rows,
    evaluation by evaluation (:data:`EVALUATIONS`' order)."""
    return [(e, m) for e in EVALUATIONS for m in METRICS
            if any(r.value(e, m) is not None for r in rows)]  # fmt: skip


def _classes(row: Row) -> str:
    """The classes in each shot group of a measured row (many / medium / few)."""
    if not row.group_sizes:
        return MISSING
    return " / ".join(str(row.group_sizes[g]) for g in GROUPS)


def _runs(row: Row) -> str:
    """Which runs a measured row is: ``run <id>, seed s`` or ``n = 3, seeds 0, 1, 2``."""
    seeds = ", ".join(str(s) for s in row.seeds)
    if row.n == 1:
        return f"run {row.runs[0]}" + (f", seed {seeds}" if row.seeds != [None] else "")
    return f"n = {row.n}, seeds {seeds}"


def _cell(value: object) -> str:
    text = MISSING if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


HEAD = ("", "method", "name", "runs", "backbone", "epochs", "GPUs x batch", "protocol")
TAIL = ("≠ published", "compared with", "environment", "source")
CLASSES = "classes (many / medium / few)"


def markdown(dataset: str, rows: list[Row]) -> str:
    """The dataset's table in markdown, with a legend: one column group per evaluation that a
    row has (top-1, then top-5 and Many / Medium / Few where one is given)."""
    shown_columns = columns(rows)
    with_groups = any(m in GROUPS for _, m in shown_columns)
    header = [*HEAD, *(f"{EVALUATIONS[e]} {METRIC_TITLES[m]}" for e, m in shown_columns)]
    header += [CLASSES] if with_groups else []
    header += TAIL
    lines = [f"## {dataset}", "", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for row in rows:
        measured = row.kind == MEASURED
        flag = f"{FLAG} " + "; ".join(row.differences) if row.flagged else ""
        cells = [
            row.kind,
            f"`{row.method}`" if measured else row.label,
            ", ".join(row.names) if measured else "",
            _runs(row) if measured else "",
            row.backbone,
            row.epochs,
            row.batch_text,
            row.protocol or MISSING,
        ]
        cells += [
            _acc(row.value(e, m), row.spread.get(f"{e}_{m}"), row.unsaid and e == "linear")
            for e, m in shown_columns
        ]
        cells += [_classes(row) if measured else ""] if with_groups else []
        cells += [flag, (row.compared_with or MISSING) if measured else "", row.environment,
                  row.source]  # fmt: skip
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines += [
        "",
        "Published rows are the numbers as their source gives them (source column; `—`: not "
        "given there); measured rows are read from each run's `metrics.json` (else its CSV "
        "log). "
        "Runs that differ in nothing but the seed (the same config, evaluations and environment) "
        "make one row: each number is their mean ± the sample standard deviation over the runs "
        "(`runs`: n and the seeds; `--per-run` lists them one by one). "
        "GPUs x batch: the processes of the run and the batch of each (a published row's where "
        "its source says; else its total batch). "
        "Accuracy in %, one column group per evaluation: `linear`, the offline classifier stage "
        "on the frozen backbone (`solo-ext-linear`, `main_linear.py`); `head`, the classifier "
        "trained jointly with the loss of a one-stage method (PaCo, GPaCo, BCL), what their "
        "papers report; `online linear` and `online kNN`, measured during pretraining; `kNN`, "
        "the offline kNN of the final backbone. `(?)`: the source does not say whether the "
        "number is the online or the offline classifier's. Many / Medium / Few belong to the "
        "evaluation they stand under; classes: the classes in each group of the run's training "
        f"counts. {FLAG}: the run differs from the published protocol (its method's protocol "
        "options, its classifier stage against the published row's or the long-tail stage, "
        "a pretraining key against the shipped recipe), or its epochs or backbone differ from "
        "the published row it is compared with. "
        "Environment: where a measured run's numbers come from (its `args.json`); a per-seed "
        "number reproduces exactly only in the same environment (the same kind of CPU or GPU "
        "and the same library versions), elsewhere as a mean and spread over seeds.",
    ]
    return "\n".join(lines) + "\n"


CSV_COLUMNS = (
    "kind", "dataset", "method", "label", "names", "n", "seeds", "runs", "backbone", "epochs",
    "batch", "gpus", "imbalance_factor", "protocol",
    *(f"{e}_{m}{sd}" for e in EVALUATIONS for m in METRICS for sd in ("", "_sd")),
    "unsaid", "many_classes", "medium_classes", "few_classes", "flagged", "differences",
    "compared_with", "environment", "source",
)  # fmt: skip


def csv_text(rows: list[Row]) -> str:
    """The rows as CSV, every evaluation's columns (numbers as read, unrounded; empty: not
    given)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        values = {k: getattr(row, k) for k in CSV_COLUMNS if hasattr(row, k)}
        values.update(row.values)
        values.update({f"{k}_sd": v for k, v in row.spread.items()})
        for key in ("names", "seeds", "runs"):
            values[key] = " ".join(str(v) for v in getattr(row, key))
        values["n"] = row.n if row.kind == MEASURED else ""
        for g in GROUPS:
            values[f"{g}_classes"] = (row.group_sizes or {}).get(g)
        values["flagged"] = str(row.flagged).lower()
        values["unsaid"] = str(row.unsaid).lower()
        values["differences"] = "; ".join(row.differences)
        writer.writerow({k: "" if v is None else v for k, v in values.items()})
    return out.getvalue()
