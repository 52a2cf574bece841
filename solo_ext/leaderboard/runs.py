"""Measured runs: pretraining run directories (solo-ext's and solo-learn's layout), the
evaluations of each, read from files only (no checkpoint is loaded).

A run has up to five evaluations (:data:`EVALUATIONS`), each with its top-1, top-5 and Many /
Medium / Few, each from one place:

- ``linear``, the offline classifier stage on the frozen backbone: ``metrics.json``'s
  ``linear_*`` (``solo-ext-linear``), else the last validation row of a ``main_linear.py`` run
  whose ``pretrained_feature_extractor`` is a checkpoint of the run;
- ``head``, a one-stage method's (PaCo, GPaCo, BCL) classifier trained with its loss, what their
  papers report: ``metrics.json``'s ``head_*`` (the end of ``solo-ext-pretrain``), else the last
  ``val_head_acc1`` of its CSV log (solo-learn's ``main_pretrain.py``);
- ``online``, the online linear classifier of pretraining (``val_acc1`` in its CSV log);
- ``online_knn``, the online kNN of pretraining (``val_knn_acc1``, ``val_knn_acc1_<group>``);
- ``knn``, the offline kNN: ``metrics.json``'s ``knn_*`` (``solo-ext-knn``, the final kNN of
  ``solo-ext-pretrain``).

The online evaluations (the last validation values) come from ``metrics.json``'s ``val_*``,
which every run keeps there whichever logger it has (``solo-ext-pretrain``, and solo-learn's
scripts with the plugin loaded); else, for a run made without them, its CSV log:
``<run>/logs*/metrics.csv`` (``solo-ext-pretrain``), or for solo-learn's scripts without wandb
Lightning's ``lightning_logs/version_<N>/metrics.csv`` in the directory the script ran in, where
``N`` is the run directory's name (solo-learn names runs by the logger's version). No wandb file
is read.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solo_ext.config import CORE_RUN_OPTIONS, ConfigError, declared, world_size
from solo_ext.eval.options import DECOUPLED_STAGES

GROUPS = ("many", "medium", "few")
METRICS = ("acc1", "acc5", *GROUPS)
# solo-ext-linear's decoupled stages (``classifier_stage``): each its own evaluation
STAGE_TITLES = {"crt": "cRT", "tau_norm": "tau-norm", "lws": "LWS", "logit_adjust": "logit-adj."}
DECOUPLED_EVALS = {f"linear_{stage}": stage for stage in DECOUPLED_STAGES}
# an evaluation -> its title in the tables (in column order)
EVALUATIONS = {
    "linear": "linear",
    **{key: f"linear {STAGE_TITLES[stage]}" for key, stage in DECOUPLED_EVALS.items()},
    "head": "head",
    "online": "online linear",
    "online_knn": "online kNN",
    "knn": "kNN",
}


@dataclass
class Eval:
    """One evaluation's top-1, top-5 and Many / Medium / Few accuracy (percent; None: not
    measured)."""

    acc1: float | None
    groups: dict[str, float | None]
    kind: str  # one of EVALUATIONS
    origin: str  # the file or run it was read from
    note: str = ""  # its settings (epochs, sampler, k)
    # a linear evaluation's classifier stage: sampler, epochs, batch (total), lr (absolute),
    # schedule, lr_decay_epochs, backbone_bn, classifier_init, train_augmentation, loss
    stage: dict[str, Any] = field(default_factory=dict)
    acc5: float | None = None

    def value(self, metric: str) -> float | None:
        """``acc1``, ``acc5`` or a group's top-1."""
        return self.groups.get(metric) if metric in GROUPS else getattr(self, metric)


@dataclass
class Run:
    """A pretraining run with the results found for it."""

    path: Path
    method: str
    dataset: str
    backbone: str | None
    epochs: int | None
    batch: int | None  # over all processes
    processes: int | None
    method_kwargs: dict[str, Any]
    args: dict[str, Any] = field(repr=False)
    evals: dict[str, Eval] = field(default_factory=dict)  # EVALUATIONS key -> its result
    environment: dict[str, Any] | None = None  # args.json's record (None: made before runs had one)


@dataclass
class Found:
    """What a search found: runs, linear runs (solo-learn's) and the directories skipped."""

    runs: list[Run] = field(default_factory=list)
    linear_runs: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    # a run directory found twice (a copy: the same args.json and results), counted once:
    # (the copy, the run it is a copy of)
    copies: list[tuple[Path, Path]] = field(default_factory=list)


def _float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) or math.isinf(number) else number


def _get(mapping: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        if not isinstance(mapping, dict):
            return None
        mapping = mapping.get(key)
    return mapping


def candidate_dirs(root: Path) -> tuple[list[Path], list[Path]]:
    """Run directories under ``root`` (those holding ``args.json``; ``root`` itself if it does),
    and the directories that look like runs but are not: beside a run directory (solo-learn's
    ``<method>/<run id>`` level) or holding a run's files, without ``args.json``."""
    if (root / "args.json").is_file():
        return [root], []
    runs = sorted({p.parent for p in root.rglob("args.json") if p.is_file()})
    run_set = set(runs)

    def in_a_run(path: Path) -> bool:
        return path in run_set or any(parent in run_set for parent in path.parents)

    others = {d for run in runs for d in run.parent.iterdir() if d.is_dir()}
    others |= {p.parent for p in root.rglob("metrics.json")}
    others |= {p.parent.parent for p in root.rglob("logs/metrics.csv")}
    others |= {p.parent for p in root.rglob("*.ckpt")}
    others = {d for d in others if not in_a_run(d) and not any(d in r.parents for r in runs)}
    return runs, sorted(others)


def processes_of(args: dict[str, Any]) -> int | None:
    """The processes a config ran on (devices x nodes); None when it does not say."""
    try:
        return world_size(args)
    except (ConfigError, TypeError, ValueError):
        return None


def total_batch(args: dict[str, Any]) -> int | None:
    """``optimizer.batch_size`` over all processes; None when the config does not say."""
    batch, processes = _get(args, "optimizer.batch_size"), processes_of(args)
    return batch * processes if isinstance(batch, int) and processes else None


def read_args(run_dir: Path) -> dict[str, Any]:
    """``args.json`` as a dict; a ValueError saying why it cannot be read."""
    path = run_dir / "args.json"
    try:
        args = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"args.json is not valid JSON ({err.msg}, line {err.lineno})") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"args.json cannot be read ({type(err).__name__})") from None
    if not isinstance(args, dict):
        raise ValueError(f"args.json holds a {type(args).__name__}, not a config")
    return args


def _last_val_row(path: Path, keys: tuple[str, ...]) -> dict[str, str] | None:
    """The last row of a Lightning CSV log with a value in one of ``keys``."""
    try:
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if any(_float(r.get(k)) is not None for k in keys)]
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    return rows[-1] if rows else None


def _logs_index(path: Path) -> int:
    match = re.fullmatch(r"logs(?:-(\d+))?", path.parent.name)
    return int(match.group(1) or 0) if match else -1


def possible_cwds(run_dir: Path, args: dict[str, Any]) -> list[Path]:
    """The directories a solo-learn script may have run in: the run directory is
    ``<cwd>/<checkpoint.dir>/<method or linear>/<run id>`` when ``checkpoint.dir`` is relative."""
    ckpt_dir = Path(str(declared(args, "checkpoint.dir", CORE_RUN_OPTIONS)))
    base = run_dir.parent.parent
    if ckpt_dir.is_absolute():
        return []
    parts = [p for p in ckpt_dir.parts if p != "."]
    if parts and list(base.parts[-len(parts) :]) == parts:
        for _ in parts:
            base = base.parent
    return [base]


def csv_logs(run_dir: Path, args: dict[str, Any], search: list[Path]) -> Path | None:
    """The run's CSV log: ``<run>/logs*/metrics.csv`` (the newest of a resumed run), or
    ``lightning_logs/version_<run id>/metrics.csv`` under ``default_root_dir``, the script's
    directory, or one of ``search``."""
    own = sorted(run_dir.glob("logs*/metrics.csv"), key=_logs_index)
    if own:
        return own[-1]
    version = run_dir.name if run_dir.name.isdigit() else str(args.get("wandb_run_id") or "")
    if not version.isdigit():
        return None
    cwds = possible_cwds(run_dir, args)
    bases = []
    root = args.get("default_root_dir")
    if isinstance(root, str) and root:
        bases += [Path(root)] if Path(root).is_absolute() else [c / root for c in cwds]
    for base in [*bases, *cwds, *search, Path.cwd()]:
        for logs in (base / "lightning_logs", base):
            path = logs / f"version_{version}" / "metrics.csv"
            if path.is_file():
                return path
    return None


def last_val_row(
    run_dir: Path, args: dict[str, Any], search: list[Path], keys: tuple[str, ...]
) -> tuple[dict[str, Any], Path] | None:
    """The run's last validation values with a value in one of ``keys``, and the file they are
    from: ``metrics.json``'s ``val_*``, else the last such row of its CSV log
    (:func:`csv_logs`)."""
    metrics_path = run_dir / "metrics.json"
    try:
        metrics = json.loads(metrics_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        metrics = None
    if isinstance(metrics, dict) and any(_float(metrics.get(k)) is not None for k in keys):
        return metrics, metrics_path
    log = csv_logs(run_dir, args, search)
    row = _last_val_row(log, keys) if log is not None else None
    return (row, log) if row is not None and log is not None else None


def shown(path: Path) -> str:
    """A path as the tables show it: relative to the current directory when inside it."""
    absolute = Path(os.path.abspath(path))
    cwd = Path.cwd()
    return str(absolute.relative_to(cwd)) if cwd in absolute.parents else str(absolute)


# a linear evaluation made before the classifier-stage keys existed ran solo-learn's probe
STAGE_BEFORE = {
    "backbone_bn": "eval",
    "classifier_init": "default",
    "train_augmentation": "solo-learn",
}
# (both entry points' classifier stages train with cross-entropy)
STAGE_LOSS = "ce"


def _metrics_stage(metrics: dict[str, Any]) -> dict[str, Any]:
    """The classifier stage ``solo-ext-linear`` recorded in ``metrics.json`` (``linear_<key>``;
    the keys a record from before lacks: the stage keys' old values, the rest not known)."""
    stage: dict[str, Any] = {k: str(metrics.get(f"linear_{k}") or old)
                             for k, old in STAGE_BEFORE.items()}  # fmt: skip
    for key in ("sampler", "epochs", "batch", "lr", "schedule", "lr_decay_epochs"):
        if metrics.get(f"linear_{key}") is not None:
            stage[key] = metrics[f"linear_{key}"]
    stage["loss"] = STAGE_LOSS
    return stage


def _args_stage(args: dict[str, Any]) -> dict[str, Any]:
    """The classifier stage of a ``main_linear.py`` run, from its ``args.json`` (solo-learn's
    resolved config: the lr already scaled by the batch)."""
    stage: dict[str, Any] = {k: str(args.get(k) or old) for k, old in STAGE_BEFORE.items()}
    stage["sampler"] = _get(args, "data.sampler.name") or "shuffle"
    if isinstance(args.get("max_epochs"), int):
        stage["epochs"] = args["max_epochs"]
    batch, lr = total_batch(args), _get(args, "optimizer.lr")
    if batch is not None:
        stage["batch"] = batch
    if _float(lr) is not None:
        stage["lr"] = _float(lr)
    from solo_ext.commands.linear_stage import STAGE_SCHEDULE_NAMES

    name = _get(args, "scheduler.name")
    if isinstance(name, str):
        # (solo-learn's warm-up cosine: a warm-up of scheduler.warmup_epochs, not compared)
        stage["schedule"] = schedule = STAGE_SCHEDULE_NAMES.get(name, name)
        steps = _get(args, "scheduler.lr_decay_steps")
        stage["lr_decay_epochs"] = list(steps) if schedule == "step" and steps else []
    stage["loss"] = STAGE_LOSS
    return stage


def _from_metrics(metrics: dict[str, Any], prefix: str, origin: str) -> Eval | None:
    acc1 = _float(metrics.get(f"{prefix}acc1"))
    if acc1 is None:
        return None
    groups = {g: _float(metrics.get(f"{prefix}acc1_{g}")) for g in GROUPS}
    acc5 = _float(metrics.get(f"{prefix}acc5"))
    if prefix == "head_":
        return Eval(acc1, groups, "head", origin, "the head trained with the loss", acc5=acc5)
    if prefix[:-1] in DECOUPLED_EVALS:  # linear_<stage>_: a decoupled stage, on features
        parts = [f"{metrics[f'{prefix}epochs']} ep" if f"{prefix}epochs" in metrics else ""]
        parts.append(str(metrics.get(f"{prefix}sampler") or ""))
        if f"{prefix}tau" in metrics:
            parts.append(f"tau {metrics[f'{prefix}tau']:g}")
        note = ", ".join(filter(None, parts))
        return Eval(acc1, groups, prefix[:-1], origin, note, acc5=acc5)
    if prefix == "linear_":
        parts = [f"{metrics['linear_epochs']} ep" if "linear_epochs" in metrics else ""]
        parts.append(str(metrics.get("linear_sampler") or ""))
        note, stage, kind = ", ".join(filter(None, parts)), _metrics_stage(metrics), "linear"
    else:
        note, stage, kind = (f"k={metrics['knn_k']}" if "knn_k" in metrics else ""), {}, "knn"
    return Eval(acc1, groups, kind, origin, note, stage, acc5)


def _from_row(row: dict[str, Any], prefix: str, kind: str, origin: str, note: str = "") -> Eval:
    groups = {g: _float(row.get(f"{prefix}_{g}")) for g in GROUPS}
    acc5 = _float(row.get(prefix.replace("acc1", "acc5")))
    return Eval(_float(row.get(prefix)), groups, kind, origin, note, acc5=acc5)


def read_run(run_dir: Path, args: dict[str, Any], search: list[Path]) -> Run:
    """A pretraining run's config and its own results (``metrics.json``, its CSV log); a
    ValueError saying why it cannot be read."""
    method, dataset = args.get("method"), _get(args, "data.dataset")
    if not isinstance(method, str) or not isinstance(dataset, str):
        raise ValueError("args.json names no method or no data.dataset")
    metrics: dict[str, Any] = {}
    metrics_path = run_dir / "metrics.json"
    if metrics_path.is_file():
        try:
            metrics = json.loads(metrics_path.read_text())
        except (json.JSONDecodeError, OSError, UnicodeDecodeError):
            raise ValueError("metrics.json is not valid JSON") from None
        if not isinstance(metrics, dict):
            raise ValueError("metrics.json holds no metrics")
    origin = shown(metrics_path)
    evals = {}
    for prefix in ("linear_", *(f"{key}_" for key in DECOUPLED_EVALS), "head_", "knn_"):
        found = _from_metrics(metrics, prefix, origin)
        if found is not None:
            evals[found.kind] = found
    keys = ("val_acc1", "val_knn_acc1", "val_head_acc1")
    logged = last_val_row(run_dir, args, search, keys)
    for key, kind in zip(keys, ("online", "online_knn", "head")):
        if logged is not None and kind not in evals and _float(logged[0].get(key)) is not None:
            evals[kind] = _from_row(logged[0], key, kind, shown(logged[1]))
    epochs = args.get("max_epochs")
    kwargs = args.get("method_kwargs")
    return Run(
        path=run_dir,
        method=method,
        dataset=dataset,
        backbone=_get(args, "backbone.name"),
        epochs=epochs if isinstance(epochs, int) and not isinstance(epochs, bool) else None,
        batch=total_batch(args),
        processes=processes_of(args),
        method_kwargs=kwargs if isinstance(kwargs, dict) else {},
        args=args,
        evals={k: evals[k] for k in EVALUATIONS if k in evals},
        environment=env if isinstance(env := args.get("environment"), dict) else None,
    )


def is_linear_run(args: dict[str, Any]) -> bool:
    """A run of solo-learn's ``main_linear.py``: no method, a pretrained checkpoint."""
    return "method" not in args and bool(args.get("pretrained_feature_extractor"))


def linear_eval(run_dir: Path, args: dict[str, Any], search: list[Path]) -> Eval | None:
    """The last validation result of a ``main_linear.py`` run (its ``metrics.json`` or CSV log)."""
    found = last_val_row(run_dir, args, search, ("val_acc1",))
    if found is None:
        return None
    row = found[0]
    epochs = args.get("max_epochs")
    sampler = _get(args, "data.sampler.name") or "shuffle"
    note = ", ".join(filter(None, [f"{epochs} ep" if epochs else "", str(sampler)]))
    found = _from_row(row, "val_acc1", "linear", shown(run_dir), note)
    found.stage = _args_stage(args)
    return found


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return path.absolute()


def owner_of(linear_dir: Path, args: dict[str, Any], runs: list[Run]) -> Run | None:
    """The pretraining run whose checkpoint a linear run evaluated: its
    ``pretrained_feature_extractor`` resolved (absolute, or against the script's directory or
    the current one); else the one run whose ``<method>/<run id>/<file>`` it ends with."""
    ckpt = Path(str(args["pretrained_feature_extractor"]).strip("'\""))
    where = [ckpt] if ckpt.is_absolute() else [c / ckpt for c in possible_cwds(linear_dir, args)]
    where += [] if ckpt.is_absolute() else [Path.cwd() / ckpt]
    by_dir = {_resolved(r.path): r for r in runs}
    for path in where:
        run = by_dir.get(_resolved(path.parent))
        if run is not None:
            return run
    tail = ckpt.parts[-3:]
    matches = [
        r
        for r in runs
        if len(tail) == 3
        and (r.path.parent.name, r.path.name) == tail[:2]
        and (r.path / tail[2]).is_file()
    ]
    return matches[0] if len(matches) == 1 else None


def find_runs(paths: list[Path], search: list[Path]) -> Found:
    """Every run under ``paths`` with its results; a directory that cannot be read, or holds
    no result, is in ``skipped`` with the reason."""
    found = Found()
    seen: set[Path] = set()
    for root in paths:
        runs, others = candidate_dirs(root)
        for other in others:
            if _resolved(other) not in seen:
                seen.add(_resolved(other))
                found.skipped.append((other, "not a run directory (no args.json)"))
        for run_dir in runs:
            if _resolved(run_dir) in seen:
                continue
            seen.add(_resolved(run_dir))
            try:
                args = read_args(run_dir)
                if is_linear_run(args):
                    found.linear_runs.append((run_dir, args))
                    continue
                run = read_run(run_dir, args, [*search, *paths])
            except ValueError as err:
                found.skipped.append((run_dir, str(err)))
                continue
            found.runs.append(run)
    copies = drop_copies(found)
    found.linear_runs += nearby_linear_runs([*found.runs, *(c for c, _ in copies)], seen)
    attach_linear_runs(found, [*search, *paths], copies)
    kept = []
    for run in found.runs:
        if not run.evals:
            found.skipped.append(
                (run.path, "no result (no metrics.json, no validation row in a CSV log)")
            )
        else:
            kept.append(run)
    found.runs = kept
    return found


def _fingerprint(run: Run) -> str:
    """What makes two run directories one run: the whole ``args.json`` (the seed, the name, the
    run id and the environment included) and every result read from the run's own files."""
    results = {k: [e.note, *(e.value(m) for m in METRICS)] for k, e in run.evals.items()}
    return json.dumps([run.args, results], sort_keys=True, default=str)


def drop_copies(found: Found) -> list[tuple[Run, Run]]:
    """Counts a run found twice (a copied run directory: the same ``args.json`` and results)
    once, the first found; each copy goes to ``found.copies``. Returns (copy, the run kept)
    pairs: a linear run of a copy's checkpoint is the kept run's."""
    first: dict[str, Run] = {}
    kept, copies = [], []
    for run in found.runs:
        original = first.setdefault(_fingerprint(run), run)
        if original is run:
            kept.append(run)
        else:
            copies.append((run, original))
            found.copies.append((run.path, original.path))
    found.runs = kept
    return copies


def nearby_linear_runs(runs: list[Run], seen: set[Path]) -> list[tuple[Path, dict[str, Any]]]:
    """``main_linear.py`` runs not under the paths given but where solo-learn puts them,
    ``<checkpoint dir>/linear/<run id>/`` beside ``<checkpoint dir>/<method>/``, that evaluated
    a checkpoint of one of ``runs`` (others there are left alone)."""
    out = []
    for folder in sorted({run.path.parent.parent / "linear" for run in runs}):
        if not folder.is_dir():
            continue
        for run_dir in sorted(p.parent for p in folder.glob("*/args.json")):
            if _resolved(run_dir) in seen:
                continue
            seen.add(_resolved(run_dir))
            try:
                args = read_args(run_dir)
            except ValueError:
                continue
            if is_linear_run(args) and owner_of(run_dir, args, runs) is not None:
                out.append((run_dir, args))
    return out


def attach_linear_runs(found: Found, search: list[Path], copies: list[tuple[Run, Run]]) -> None:
    """Gives each pretraining run the newest ``main_linear.py`` result of its checkpoints (or
    of its copies' checkpoints: ``copies``, (copy, run) pairs), unless ``metrics.json`` has a
    linear one; a linear run that cannot be attached is skipped."""
    kept_of = {id(copy): run for copy, run in copies}
    candidates = [*found.runs, *(copy for copy, _ in copies)]
    newest: dict[int, tuple[float, Path, Eval]] = {}
    for linear_dir, args in found.linear_runs:
        run = owner_of(linear_dir, args, candidates)
        run = kept_of.get(id(run), run)
        if run is None:
            ckpt = args["pretrained_feature_extractor"]
            found.skipped.append(
                (
                    linear_dir,
                    f"linear run of {ckpt!r}: that pretraining run is not among those found",
                )
            )
            continue
        result = linear_eval(linear_dir, args, search)
        if result is None:
            found.skipped.append(
                (linear_dir, "linear run without a validation row in metrics.json or a CSV log")
            )
            continue
        stamp = (linear_dir / "args.json").stat().st_mtime
        previous = newest.get(id(run))
        if previous is not None and previous[0] > stamp:
            found.skipped.append((linear_dir, f"older linear run of {shown(run.path)}"))
            continue
        if previous is not None:
            found.skipped.append((previous[1], f"older linear run of {shown(run.path)}"))
        newest[id(run)] = (stamp, linear_dir, result)
    for run in found.runs:
        entry = newest.get(id(run))
        if entry is not None and "linear" not in run.evals:
            evals = {**run.evals, "linear": entry[2]}
            run.evals = {k: evals[k] for k in EVALUATIONS if k in evals}
