"""The leaderboard's rows (published and measured, never mixed) and their markdown and CSV."""

from __future__ import annotations

import csv
import io
import json
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from solo_ext.data.facts import FEW_THRESHOLD, MANY_THRESHOLD, facts
from solo_ext.data.longtail import shot_groups
from solo_ext.environment import summary
from solo_ext.leaderboard.published import (
    Published,
    augmentation_differences,
    counterpart,
    protocol_defaults,
    protocol_differences,
    stage_differences,
)
from solo_ext.leaderboard.runs import GROUPS, Run, shown

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
    batch: int | None
    protocol: str
    linear_acc1: float | None
    linear_eval: str
    knn_acc1: float | None
    knn_eval: str
    groups_of: str  # the evaluation Many / Medium / Few are from: "linear", "knn" or ""
    groups: dict[str, float | None]
    source: str
    compared_with: str = ""
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

    @property
    def n(self) -> int:
        """How many runs the row's numbers are the mean of (a published row: 0)."""
        return len(self.runs)

    @property
    def flagged(self) -> bool:
        """A measured row whose protocol, epochs or backbone differ from the published."""
        return bool(self.differences)

    @property
    def overall(self) -> float | None:
        """The top-1 its groups belong to: linear, else kNN."""
        return self.knn_acc1 if self.groups_of == "knn" else self.linear_acc1

    @property
    def overall_key(self) -> str:
        return "knn_acc1" if self.groups_of == "knn" else "linear_acc1"


def published_row(p: Published) -> Row:
    groups = {"many": p.many, "medium": p.medium, "few": p.few}
    has_groups = any(v is not None for v in groups.values())
    return Row(
        kind=PUBLISHED,
        dataset=p.dataset,
        method=p.method,
        label=p.label,
        backbone=p.backbone,
        epochs=p.epochs,
        batch=p.batch,
        protocol=p.protocol,
        linear_acc1=p.linear_acc1,
        linear_eval=p.linear_eval,
        knn_acc1=p.knn_acc1,
        knn_eval="",
        groups_of=("linear" if p.linear_acc1 is not None else "knn") if has_groups else "",
        groups=groups,
        source=p.source,
    )


def measured_row(run: Run, published: list[Published]) -> Row:
    """A run's row, compared with its published counterpart (if the data file has one)."""
    diffs = protocol_differences(run.method, run.method_kwargs, run.processes)
    diffs += augmentation_differences(run.method, run.args.get("augmentations"))
    linear, knn = run.linear, run.knn
    if linear is not None and linear.kind == "offline":
        diffs += stage_differences(run.dataset, linear.stage)
    if linear is not None and any(v is not None for v in linear.groups.values()):
        groups_of, groups = "linear", linear.groups
    elif knn is not None and any(v is not None for v in knn.groups.values()):
        groups_of, groups = "knn", knn.groups
    else:
        groups_of, groups = "", dict.fromkeys(GROUPS)
    ref = counterpart(
        published,
        run.dataset,
        run.method,
        run.method_kwargs,
        run.backbone,
        linear.kind if linear else "",
        run.epochs,
    )
    differences = list(diffs)
    if ref is not None and None not in (ref.epochs, run.epochs) and ref.epochs != run.epochs:
        differences.append(f"epochs {run.epochs} (published {ref.epochs})")
    if (
        ref is not None
        and None not in (ref.backbone, run.backbone)
        and ref.backbone != run.backbone
    ):
        differences.append(f"backbone {run.backbone} (published {ref.backbone})")
    evals = [f"{name}: {e.kind}, {e.origin}" + (f" ({e.note})" if e.note else "")
             for name, e in (("linear", linear), ("kNN", knn)) if e is not None]  # fmt: skip
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
        protocol=", ".join(diffs) if diffs else ("as published" if has_protocol else ""),
        linear_acc1=linear.acc1 if linear else None,
        linear_eval=linear.kind if linear else "",
        knn_acc1=knn.acc1 if knn else None,
        knn_eval=knn.kind if knn else "",
        groups_of=groups_of,
        groups=groups,
        source=f"{shown(run.path)}; " + "; ".join(evals),
        compared_with=ref.label if ref is not None else "",
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


NUMBERS = ("linear_acc1", "knn_acc1", *GROUPS)


def _value(row: Row, key: str) -> float | None:
    return row.groups[key] if key in GROUPS else getattr(row, key)


def _mean_row(rows: list[Row]) -> Row:
    """One row of runs that differ in nothing but the seed: each number's mean over the runs
    that have it, and its sample standard deviation (None below two values)."""
    first = rows[0]
    means, spread = {}, {}
    for key in NUMBERS:
        values = [v for v in (_value(r, key) for r in rows) if v is not None]
        means[key] = statistics.fmean(values) if values else None
        spread[key] = statistics.stdev(values) if len(values) > 1 else None
    return replace(
        first,
        label=f"{first.method} {first.names[0]}".strip(),
        linear_acc1=means["linear_acc1"],
        knn_acc1=means["knn_acc1"],
        groups={g: means[g] for g in GROUPS},
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
    folder decides) with its path; with
    ``thresholds_named`` (the runs of that dataset use several shot thresholds, whose numbers
    are not comparable) also its thresholds."""
    name = run.dataset
    train_path = (run.args.get("data") or {}).get("train_path")
    fact = facts(run.dataset)
    if fact.source == "image_folder" and fact.classes is None and train_path:  # (the folder's)
        name += f" {train_path}"
    if thresholds_named:
        many, few = _thresholds(run)
        name += f" (many > {many}, few < {few})"
    return name


def build_tables(
    runs: list[Run], published: list[Published], per_run: bool = False
) -> dict[str, list[Row]]:
    """Dataset -> its rows: the published rows of the dataset (file order), then the measured
    ones (by method, then directory); only datasets with a measured run. The runs of one
    setting (:func:`_setting`) and one evaluation make one row, their mean and spread, unless
    ``per_run``."""
    thresholds: dict[str, set] = {}
    for run in runs:
        thresholds.setdefault(table_of(run), set()).add(_thresholds(run))
    groups: dict[tuple, list[Row]] = {}
    for run in sorted(runs, key=lambda r: (r.dataset, r.method, str(r.path))):
        row = measured_row(run, published)
        evaluation = (row.linear_eval, row.knn_eval, row.groups_of, row.environment,
                      tuple(e.note for e in (run.linear, run.knn) if e is not None))  # fmt: skip
        table = table_of(run, thresholds_named=len(thresholds[table_of(run)]) > 1)
        key = (table, str(run.path) if per_run else _setting(run), evaluation)
        groups.setdefault(key, []).append(row)
    tables: dict[str, list[Row]] = {}
    for (table, _, _), rows in groups.items():
        if table not in tables:
            dataset = rows[0].dataset
            tables[table] = [published_row(p) for p in published if p.dataset == dataset]
        tables[table].append(rows[0] if len(rows) == 1 else _mean_row(rows))
    return dict(sorted(tables.items()))


def _num(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2f}"


def _acc(value: float | None, kind: str, sd: float | None = None) -> str:
    shown = {"online": " (online)", "head": " (head)"}
    spread = f" ± {sd:.2f}" if sd is not None and value is not None else ""
    return _num(value) + spread + (shown.get(kind, "") if value is not None else "")


def _groups_of(row: Row) -> str:
    """The evaluation the Many / Medium / Few are from, with the classes in each group."""
    text = {"knn": "kNN", "": MISSING}.get(row.groups_of, row.groups_of)
    if row.groups_of and row.group_sizes:
        text += " (" + " / ".join(str(row.group_sizes[g]) for g in GROUPS) + " classes)"
    return text


def _runs(row: Row) -> str:
    """Which runs a measured row is: ``run <id>, seed s`` or ``n = 3, seeds 0, 1, 2``."""
    seeds = ", ".join(str(s) for s in row.seeds)
    if row.n == 1:
        return f"run {row.runs[0]}" + (f", seed {seeds}" if row.seeds != [None] else "")
    return f"n = {row.n}, seeds {seeds}"


def _cell(value: object) -> str:
    text = MISSING if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


HEADER = (
    "", "method", "name", "runs", "backbone", "epochs", "batch", "protocol", "linear top-1",
    "kNN top-1",
    "many", "medium", "few", "groups of", "≠ published", "compared with", "environment", "source",
)  # fmt: skip


def markdown(dataset: str, rows: list[Row]) -> str:
    """The dataset's table in markdown, with a legend."""
    lines = [f"## {dataset}", "", "| " + " | ".join(HEADER) + " |", "|---" * len(HEADER) + "|"]
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
            row.batch,
            row.protocol or MISSING,
            _acc(row.linear_acc1, row.linear_eval, row.spread.get("linear_acc1")),
            _acc(row.knn_acc1, row.knn_eval, row.spread.get("knn_acc1")),
            *(_acc(row.groups[g], "", row.spread.get(g)) for g in GROUPS),
            _groups_of(row),
            flag,
            (row.compared_with or MISSING) if measured else "",
            row.environment,
            row.source,
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines += [
        "",
        "Published rows are the numbers as their source gives them (source column; `—`: not "
        "given there); measured rows are read from each run's `metrics.json` and CSV logs. "
        "Runs that differ in nothing but the seed (the same config, evaluation and environment) "
        "make one row: each number is their mean ± the sample standard deviation over the runs "
        "(`runs`: n and the seeds; `--per-run` lists them one by one). "
        "Top-1 and Many / Medium / Few in %; `(online)`: measured during pretraining; `(head)`: "
        "the classifier trained jointly with the loss of a one-stage method (PaCo, GPaCo, BCL), "
        f"which is what their papers report, in place of a linear classifier. {FLAG}: "
        "the run sets protocol options to other than the published protocol (its method's "
        "defaults), or its epochs or backbone differ from the published row it is compared with. "
        "Environment: where a measured run's numbers come from (its `args.json`); a per-seed "
        "number reproduces exactly only in the same environment (the same kind of CPU or GPU "
        "and the same library versions), elsewhere as a mean and spread over seeds.",
    ]
    return "\n".join(lines) + "\n"


CSV_COLUMNS = (
    "kind", "dataset", "method", "label", "names", "n", "seeds", "runs", "backbone", "epochs",
    "batch", "protocol", "linear_acc1", "linear_acc1_sd", "linear_eval", "knn_acc1", "knn_acc1_sd",
    "knn_eval", "many", "many_sd", "medium", "medium_sd", "few", "few_sd", "groups_of",
    "many_classes", "medium_classes", "few_classes", "flagged", "differences", "compared_with",
    "environment", "source",
)  # fmt: skip


def csv_text(rows: list[Row]) -> str:
    """The rows as CSV (numbers as read, unrounded; empty: not given)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        values = {k: getattr(row, k) for k in CSV_COLUMNS if hasattr(row, k)}
        values.update(row.groups)
        values.update({f"{k}_sd": v for k, v in row.spread.items()})
        for key in ("names", "seeds", "runs"):
            values[key] = " ".join(str(v) for v in getattr(row, key))
        values["n"] = row.n if row.kind == MEASURED else ""
        for g in GROUPS:
            values[f"{g}_classes"] = (row.group_sizes or {}).get(g)
        values["flagged"] = str(row.flagged).lower()
        values["differences"] = "; ".join(row.differences)
        writer.writerow({k: "" if v is None else v for k, v in values.items()})
    return out.getvalue()
