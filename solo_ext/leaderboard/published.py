"""Published numbers (``published.csv``, shipped with the package) and what a measured run is
compared on: the protocol options of each method whose default is the published protocol, and
the published row a run sits beside."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solo_ext.common import did_you_mean

PUBLISHED_CSV = Path(__file__).with_name("published.csv")

COLUMNS = (
    "dataset", "method", "label", "config", "backbone", "epochs", "batch", "linear_eval",
    "linear_acc1", "knn_acc1", "many", "medium", "few", "protocol", "source",
)  # fmt: skip
# columns a file may have (empty or absent: not given): ``acc5`` the top-5 of ``linear_acc1``,
# ``imbalance_factor`` the training split's largest class count over its smallest, ``stage``
# the classifier stage of an offline number as ``key=value`` pairs (``;``-separated; the keys
# of :data:`STAGE_KEYS`), ``gpus`` the GPUs the published run's ``batch`` was split over (where
# its source says), ``headline`` 1 for the row its paper's main table gives the method (the
# rows the leaderboard shows by default; the others are sweeps, trials, other backbones)
OPTIONAL_COLUMNS = ("acc5", "imbalance_factor", "stage", "gpus", "headline")
# a classifier stage's keys, compared with a measured linear evaluation's (runs.Eval.stage):
# the sampler, epochs, total batch, absolute lr, schedule (cosine / step / constant) with its
# epochs, the BatchNorm mode, the init, the training crops and the loss
STAGE_KEYS = ("sampler", "epochs", "batch", "lr", "schedule", "lr_decay_epochs", "backbone_bn",
              "classifier_init", "train_augmentation", "loss")  # fmt: skip
# "head": a one-stage method's classifier trained with its loss; "": the source does not say
LINEAR_EVALS = ("offline", "online", "head", "")

# method -> its ``method_kwargs`` keys whose METHOD_KWARGS default is the published protocol
# (README: "The published protocols, and the options that differ"); a run that sets one of them
# to another value is flagged
PROTOCOL_OPTIONS: dict[str, tuple[str, ...]] = {
    "scl": ("symmetric", "queue_start", "batch_gather"),
    "dscl": ("symmetric", "queue_start", "batch_gather"),
    "pbsd": ("symmetric", "queue_start", "batch_gather", "patch_source"),
    "densecl": ("symmetric", "queue_start", "warmup_steps", "projector_init"),
    "all4one_ct": ("feature_gather",),
    "kcl": ("symmetric", "queue_start", "batch_gather", "k_pos", "positives"),
    "tsc": (
        "symmetric",
        "queue_start",
        "batch_gather",
        "num_positive",
        "separate_target",
        "target_weight",
        "target_repeat",
    ),  # fmt: skip
    "paco": ("queue_start", "log_prior"),
    "bcl": ("batch_gather",),
}
# what a run made before an option existed ran with, where that was not the published protocol
# (args.json holds every declared key, so a missing one dates the run); other missing keys are
# taken as the default
BEFORE_OPTION: dict[str, Any] = {
    "queue_start": "empty",
    "batch_gather": True,
    "projector_init": "default",
}
# options that change nothing on one process (what is gathered is the process's own batch)
SAME_ON_ONE_PROCESS = ("batch_gather", "feature_gather")

# a solo-ext method -> the method name its published rows carry, where the two differ
COUNTERPARTS = {"all4one_ct": "all4one"}


@dataclass(frozen=True)
class Published:
    """One row of ``published.csv``: a number as published, with its source and protocol."""

    dataset: str
    method: str
    label: str
    config: dict[str, str] = field(default_factory=dict)
    backbone: str | None = None
    epochs: int | None = None
    batch: int | None = None
    linear_eval: str = ""
    linear_acc1: float | None = None
    knn_acc1: float | None = None
    many: float | None = None
    medium: float | None = None
    few: float | None = None
    protocol: str = ""
    source: str = ""
    acc5: float | None = None
    imbalance_factor: float | None = None
    stage: dict[str, str] = field(default_factory=dict)
    gpus: int | None = None
    headline: bool = False


def _number(text: str, kind: type, where: str) -> Any:
    if not text.strip():
        return None
    try:
        return kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"{where}: {text!r} is not {what}") from None


def _config(text: str, where: str) -> dict[str, str]:
    pairs = {}
    for item in filter(None, (p.strip() for p in text.split(";"))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{where}: {item!r} is not key=value")
        pairs[key.strip()] = value.strip()
    return pairs


def load_published(path: str | Path = PUBLISHED_CSV) -> list[Published]:
    """The rows of a published-numbers file, in file order.

    Args:
        path: A CSV file with the columns of :data:`COLUMNS` (``config``: ``key=value`` pairs
            separated by ``;``, the ``method_kwargs`` a row's method was run with where they are
            not the defaults).

    Returns:
        One :class:`Published` per line.

    Raises:
        ValueError: A missing column, an unparsable number, an unknown ``linear_eval`` or
            stage key, or a row without its dataset, method, label or source.
    """
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: no column {missing[0]!r}")
        rows = []
        for line, raw in enumerate(reader, start=2):
            where = f"{path}:{line}"
            for key in ("dataset", "method", "label", "source"):
                if not raw[key].strip():
                    raise ValueError(f"{where}: empty {key!r}")
            if raw["linear_eval"] not in LINEAR_EVALS:
                raise ValueError(f"{where}: linear_eval={raw['linear_eval']!r}")
            if (raw.get("headline") or "") not in ("", "1"):
                raise ValueError(f"{where}: headline={raw['headline']!r} is not 1 or empty")
            numbers = {
                k: _number(raw.get(k) or "", float, f"{where} {k}")
                for k in ("linear_acc1", "knn_acc1", "many", "medium", "few", "acc5",
                          "imbalance_factor")
            }  # fmt: skip
            stage = _config(raw.get("stage") or "", f"{where} stage")
            unknown = [k for k in stage if k not in STAGE_KEYS]
            if unknown:
                raise ValueError(f"{where} stage: {unknown[0]!r} is not one of {STAGE_KEYS}")
            rows.append(
                Published(
                    dataset=raw["dataset"],
                    method=raw["method"],
                    label=raw["label"],
                    config=_config(raw["config"], f"{where} config"),
                    backbone=raw["backbone"] or None,
                    epochs=_number(raw["epochs"], int, f"{where} epochs"),
                    batch=_number(raw["batch"], int, f"{where} batch"),
                    linear_eval=raw["linear_eval"],
                    protocol=raw["protocol"],
                    source=raw["source"],
                    stage=stage,
                    gpus=_number(raw.get("gpus") or "", int, f"{where} gpus"),
                    headline=raw.get("headline") == "1",
                    **numbers,
                )
            )
    return rows


ALL_ROWS = "all"


def choose_rows(published: list[Published], rows: str | None) -> list[Published]:
    """The published rows a table shows: ``None``, each method's headline row (its paper's main
    table); ``all``, every row; else a comma-separated list, each item a method or a row's label
    (its headline rows: ``dscl``, ``gpaco``), ``<method>:all`` (every row of it) or
    ``source=<text>`` (every row whose source names the text: a paper's table, e.g.
    ``source=Table 11``). Raises ValueError naming an item that chooses no row."""
    if rows is None:
        return [p for p in published if p.headline]
    chosen: set[int] = set()
    for item in (i.strip() for i in rows.split(",")):
        if item == ALL_ROWS:
            return list(published)
        name, _, every = item.partition(":")
        if name.startswith("source="):
            text = name.removeprefix("source=").lower()
            found = {i for i, p in enumerate(published) if text in p.source.lower()}
        else:
            found = {
                i
                for i, p in enumerate(published)
                if name.lower() in (p.method, p.label.lower()) and (p.headline or every == ALL_ROWS)
            }
        if not item or not found or every not in ("", ALL_ROWS):
            names = sorted({p.method for p in published} | {p.label.lower() for p in published})
            raise ValueError(
                f"--rows={rows!r}: {item!r} chooses no published row{did_you_mean(name, names)}"
                " (a method, a label, <method>:all, source=<text> or all)"
            )
        chosen |= found
    return [p for i, p in enumerate(published) if i in chosen]


def show_value(value: Any) -> str:
    """A config value as written in a table: JSON for booleans, numbers and null, else text."""
    return value if isinstance(value, str) else json.dumps(value)


def protocol_defaults(method: str) -> dict[str, Any]:
    """The METHOD_KWARGS default of each of ``method``'s :data:`PROTOCOL_OPTIONS` (none for a
    method without protocol options, e.g. solo-learn's own)."""
    keys = PROTOCOL_OPTIONS.get(method, ())
    if not keys:
        return {}
    from solo_ext.methods.registry import (
        load,  # the method's module (and its host): only when needed
    )

    declared = load(method).METHOD_KWARGS
    return {key: declared[key].default for key in keys if key in declared}


# augmentation keys (of each ``augmentations`` entry) whose declared default is the published
# protocol; a run that gives another value is flagged (runs record only the values given)
PROTOCOL_AUGMENTATIONS = ("rrc.interpolation", "gaussian_blur.kind")


def augmentation_differences(method: str, augmentations: Any) -> list[str]:
    """``augmentations.<i>.<key>=value`` for each of :data:`PROTOCOL_AUGMENTATIONS` that an entry
    of a solo-ext method's run sets to other than the published default."""
    if method not in PROTOCOL_OPTIONS or not isinstance(augmentations, list):
        return []
    from solo_ext.data.transforms import AUGMENTATION_OPTIONS

    out = []
    for i, entry in enumerate(augmentations):
        for key in PROTOCOL_AUGMENTATIONS:
            value: Any = entry
            for part in key.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            default = AUGMENTATION_OPTIONS[key].default
            if value is not None and show_value(value) != show_value(default):
                out.append(f"augmentations.{i}.{key}={show_value(value)}")
    return out


def published_stage(dataset: str) -> dict[str, str]:
    """The classifier stage a linear number on ``dataset`` is held to when no published row
    gives one: on a long-tailed dataset DSCL's published stage (the default of both entry points
    there); on a balanced one none (solo-learn's linear configs differ by method)."""
    from solo_ext.eval.classifier_stage import LONG_TAIL_SAMPLER, LONG_TAIL_STAGE, PUBLISHED_STAGE
    from solo_ext.facts import facts

    if not facts(dataset).long_tailed:
        return {}
    batch = LONG_TAIL_STAGE["optimizer.batch_size"]
    schedule = {
        "sampler": LONG_TAIL_SAMPLER,
        "epochs": LONG_TAIL_STAGE["max_epochs"],
        "batch": batch,
        "lr": LONG_TAIL_STAGE["optimizer.lr"] * batch / 256,
        "schedule": LONG_TAIL_STAGE["scheduler.name"],
        "lr_decay_epochs": LONG_TAIL_STAGE["scheduler.lr_decay_steps"],
        **PUBLISHED_STAGE,
        "loss": "ce",
    }
    return {key: stage_text(value) for key, value in schedule.items()}


def stage_text(value: Any) -> str:
    """A stage value as the published file writes it: lists space-separated, whole numbers
    without a decimal point (``[20, 30]``: ``20 30``; ``10.0``: ``10``)."""
    if isinstance(value, (list, tuple)):
        return " ".join(stage_text(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return show_value(value)


# samplers that draw as shuffling does (each image once an epoch)
SHUFFLING = ("shuffle", "instance")


def as_number(value: Any) -> float | None:
    """A number given as a number or as text; None for anything else (booleans included)."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)  # (YAML and the published file give numbers as text too: 5e-4)
    except (TypeError, ValueError):
        return None


def same(a: Any, b: Any) -> bool:
    """Two config values that are the same: numbers to 6 significant digits (an lr scaled by
    the batch), lists item by item, the rest as written."""
    x, y = as_number(a), as_number(b)
    if x is not None and y is not None:
        return math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-12)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(p, q) for p, q in zip(a, b))
    return show_value(a) == show_value(b)


def _same_stage_value(measured: Any, published: str) -> bool:
    text = stage_text(measured)
    return (text in SHUFFLING and published in SHUFFLING) or same(text, published)


def stage_differences(reference: dict[str, str], stage: dict[str, Any]) -> list[str]:
    """``linear <key>=<value> (published <value>)`` for each key of the reference classifier
    stage (a published row's ``stage``, or :func:`published_stage`) that a measured linear
    evaluation's stage has with another value (a key it does not record is not compared)."""
    return [
        f"linear {key}={stage_text(stage[key])} (published {want})"
        for key, want in reference.items()
        if key in stage and not _same_stage_value(stage[key], want)
    ]


def protocol_differences(
    method: str, method_kwargs: dict[str, Any], processes: int | None = None
) -> list[str]:
    """``key=value`` for each protocol option of ``method`` that ``method_kwargs`` (a run's
    ``args.json``) sets to something other than its published default (a key it lacks: the
    :data:`BEFORE_OPTION` value, else the default); on ``processes=1`` those of
    :data:`SAME_ON_ONE_PROCESS` are left out."""
    out = []
    for key, default in protocol_defaults(method).items():
        if processes == 1 and key in SAME_ON_ONE_PROCESS:
            continue
        value = method_kwargs.get(key, BEFORE_OPTION.get(key, default))
        if show_value(value) != show_value(default):
            out.append(f"{key}={show_value(value)}")
    return out


# a measured evaluation -> the ``linear_eval`` of the published numbers it sits beside
PUBLISHED_EVAL = {"linear": "offline", "online": "online", "head": "head"}


def counterpart(
    rows: list[Published],
    dataset: str,
    method: str,
    method_kwargs: dict[str, Any],
    backbone: str | None,
    evaluations: tuple[str, ...] = (),
    epochs: int | None = None,
    imbalance_factor: float | None = None,
) -> Published | None:
    """The published row a measured run is compared with: same dataset and method (or its
    :data:`COUNTERPARTS` name), every ``config`` pair of the row set so in the run, not another
    imbalance factor (both known); among those, the most specific config, then a ``linear_eval``
    of one of the run's ``evaluations`` (:data:`PUBLISHED_EVAL`), then the same backbone, then
    the same epochs, then file order."""
    names = {method, COUNTERPARTS.get(method, method)}
    kinds = {PUBLISHED_EVAL.get(e, e) for e in evaluations}
    found = [
        r
        for r in rows
        if r.dataset == dataset
        and r.method in names
        and all(show_value(method_kwargs.get(k)) == v for k, v in r.config.items())
        and same_imbalance(r.imbalance_factor, imbalance_factor)
    ]
    if not found:
        return None
    return max(
        found,
        key=lambda r: (
            len(r.config),
            r.linear_eval in kinds,
            r.backbone == backbone,
            epochs is not None and r.epochs == epochs,
            -rows.index(r),
        ),
    )


def same_imbalance(a: float | None, b: float | None) -> bool:
    """Two imbalance factors that may be compared: equal to 1 %, or one not known."""
    return a is None or b is None or abs(a - b) <= 0.01 * max(a, b)
