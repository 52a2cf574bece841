"""Long-tail evaluation: top-1/top-5, Many/Medium/Few-shot top-1, per-class CSV and plot.

Groups come from :func:`solo_ext.data.longtail.shot_groups` on the *training* images per class,
the many (> 100) / medium / few (< 20) split of the long-tail literature (Liu et al. 2019).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from solo_ext.data.longtail import SHOT_GROUPS, shot_groups
from solo_ext.facts import FEW_THRESHOLD, MANY_THRESHOLD
from solo_ext.modules.knn import top1_top5_hits

GROUP_COLORS = {"many": "tab:blue", "medium": "tab:orange", "few": "tab:red"}


def _check_inputs(
    scores: torch.Tensor, labels: torch.Tensor, num_classes: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    if scores.ndim != 2:
        raise ValueError(f"scores shape {tuple(scores.shape)}: expected [N, C]")
    num_classes = scores.shape[1] if num_classes is None else num_classes
    if scores.shape[1] != num_classes or num_classes < 1:
        raise ValueError(f"scores shape {tuple(scores.shape)}: expected [N, {num_classes}]")
    if labels.ndim != 1 or labels.shape[0] != scores.shape[0]:
        raise ValueError(f"labels shape {tuple(labels.shape)}: expected [{scores.shape[0]}]")
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise ValueError(f"labels dtype {labels.dtype}: expected an integer dtype")
    if scores.shape[0] == 0:
        raise ValueError("scores has no samples: accuracy is undefined")
    labels = labels.detach().cpu().long()
    bad = labels[(labels < 0) | (labels >= num_classes)]
    if len(bad):
        raise ValueError(f"labels must lie in [0, {num_classes}): got {bad[0].item()}")
    return scores.detach().cpu(), labels


def _check_counts(train_class_counts: Sequence[int], num_classes: int) -> list[int]:
    counts = [int(n) for n in train_class_counts]
    if len(counts) != num_classes:
        raise ValueError(f"len(train_class_counts)={len(counts)}: expected {num_classes} classes")
    return counts


def per_class_accuracy(
    scores: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> torch.Tensor:
    """Top-1 accuracy of each class.

    Args:
        scores: Class scores (logits, probabilities or kNN votes) [N, C].
        labels: True class indices [N], integers in ``[0, C)``.
        num_classes: Number of classes C.

    Returns:
        Float64 tensor [C]: percent of the class's test samples whose arg-max score is the
        class; NaN for a class with no test sample.

    Raises:
        ValueError: On a shape, dtype or label-range mismatch, or when N == 0.
    """
    scores, labels = _check_inputs(scores, labels, num_classes)
    correct = (scores.argmax(dim=1) == labels).double()
    hits = torch.bincount(labels, weights=correct, minlength=num_classes)
    totals = torch.bincount(labels, minlength=num_classes).double()
    return 100.0 * hits / totals  # 0 / 0 = NaN marks a class absent from the test set


def longtail_report(
    scores: torch.Tensor,
    labels: torch.Tensor,
    train_class_counts: Sequence[int],
    many_threshold: int = MANY_THRESHOLD,
    few_threshold: int = FEW_THRESHOLD,
    prefix: str = "",
) -> dict[str, float]:
    """Overall top-1/top-5 and Many/Medium/Few-shot top-1 accuracy.

    The group accuracies are over all test *samples* whose class is in the group
    (sample-weighted); on a balanced test set this equals the mean of the group's per-class
    accuracies, which is what long-tail papers report.

    Args:
        scores: Class scores [N, C].
        labels: True class indices [N].
        train_class_counts: Training images per class, length C; defines the groups.
        many_threshold, few_threshold: Group bounds, as in ``shot_groups``.
        prefix: Prepended to every key (e.g. ``"knn_"``).

    Returns:
        ``{prefix}acc1``, ``{prefix}acc5`` (percent over all samples; top-5 is top-C when
        C < 5), ``{prefix}acc1_{many,medium,few}`` (percent; NaN for a group with no class or
        no test sample) and ``{prefix}num_{many,medium,few}`` (number of classes per group).

    Raises:
        ValueError: On mismatched shapes/lengths, bad labels or thresholds.
    """
    scores, labels = _check_inputs(scores, labels)
    num_classes = scores.shape[1]
    counts = _check_counts(train_class_counts, num_classes)
    groups = shot_groups(counts, many_threshold, few_threshold)
    correct1, correct5 = top1_top5_hits(scores, labels)
    report = {f"{prefix}acc1": 100.0 * correct1.double().mean().item()}
    report[f"{prefix}acc5"] = 100.0 * correct5.double().mean().item()
    for group in SHOT_GROUPS:
        in_group = torch.tensor([g == group for g in groups])[labels]  # [N]
        # The mean of an empty selection is NaN: the documented value for an empty group.
        report[f"{prefix}acc1_{group}"] = 100.0 * correct1[in_group].double().mean().item()
    report.update({f"{prefix}num_{group}": groups.count(group) for group in SHOT_GROUPS})
    return report


def write_per_class_csv(
    path: str | Path,
    per_class_acc: torch.Tensor,
    train_class_counts: Sequence[int],
    test_counts: Sequence[int] | torch.Tensor | None = None,
    class_names: Sequence[str] | None = None,
    many_threshold: int = MANY_THRESHOLD,
    few_threshold: int = FEW_THRESHOLD,
) -> None:
    """Writes one CSV row per class.

    Columns: ``class,name,train_count,group[,test_count],acc1``; ``test_count`` only when
    ``test_counts`` is given, ``name`` empty without ``class_names``, ``acc1`` in percent with
    4 decimals or ``nan`` for a class without test samples.

    Args:
        path: Output CSV file.
        per_class_acc, train_class_counts: Top-1 accuracy (percent) and training images, [C].
        test_counts: Optional test samples per class, length C.
        class_names: Optional class names, length C.
        many_threshold, few_threshold: Group thresholds, as in :func:`longtail_report`.

    Raises:
        ValueError: If a per-class input does not have length C.
    """
    num_classes = len(per_class_acc)
    counts = _check_counts(train_class_counts, num_classes)
    groups = shot_groups(counts, many_threshold, few_threshold)
    for name, values in (("test_counts", test_counts), ("class_names", class_names)):
        if values is not None and len(values) != num_classes:
            raise ValueError(f"len({name})={len(values)}: expected {num_classes} classes")
    header = ["class", "name", "train_count", "group"]
    header += ["test_count"] if test_counts is not None else []
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*header, "acc1"])
        for c in range(num_classes):
            row = [c, class_names[c] if class_names is not None else "", counts[c], groups[c]]
            row += [int(test_counts[c])] if test_counts is not None else []
            writer.writerow([*row, f"{float(per_class_acc[c]):.4f}"])


def plot_per_class_accuracy(
    path: str | Path,
    per_class_acc: torch.Tensor,
    train_class_counts: Sequence[int],
    many_threshold: int = MANY_THRESHOLD,
    few_threshold: int = FEW_THRESHOLD,
    title: str | None = None,
) -> None:
    """Saves a PNG of per-class top-1 accuracy against training images (log x).

    Points are coloured by group; dashed vertical lines mark the thresholds and a dotted
    horizontal line per group the mean of its drawn points (class-averaged, unlike the
    sample-weighted numbers of :func:`longtail_report`). Classes with NaN accuracy or zero
    training images (not placeable on a log axis) are not drawn.

    Args:
        path: Output PNG file.
        per_class_acc, train_class_counts: Top-1 accuracy (percent) and training images, [C].
        many_threshold, few_threshold: Group thresholds, as in :func:`longtail_report`.
        title: Figure title; a default naming C is used when None.
    """
    acc = [float(a) for a in per_class_acc]
    counts = _check_counts(train_class_counts, len(acc))
    groups = shot_groups(counts, many_threshold, few_threshold)
    # A bare Figure on the Agg canvas: no pyplot global state, so nothing to leak or close.
    fig = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(xscale="log")
    ax.tick_params(axis="x", which="minor", labelbottom=False)  # they overlap on short ranges
    drawn = [n > 0 and not math.isnan(a) for n, a in zip(counts, acc)]
    for group in SHOT_GROUPS:
        pts = [(n, a) for n, a, g, k in zip(counts, acc, groups, drawn) if k and g == group]
        if not pts:
            continue
        xs, ys = zip(*pts)
        color, mean = GROUP_COLORS[group], sum(ys) / len(ys)
        ax.scatter(xs, ys, s=18, color=color, label=f"{group} ({len(pts)} classes)", zorder=3)
        ax.axhline(mean, ls=":", lw=1.2, color=color, label=f"{group} mean {mean:.1f}%")
    xs = [n for n in (*counts, many_threshold, few_threshold) if n > 0]
    # Fixed limits: autoscaling from the thresholds alone (no drawable point) is singular.
    ax.set_xlim(min(xs, default=1) / 1.5, max(xs, default=1) * 1.5)
    for threshold in {t for t in (many_threshold, few_threshold) if t > 0}:
        ax.axvline(threshold, color="gray", linestyle="--", linewidth=1)
    ax.set(ylim=(-2, 102), xlabel="training images per class (log)", ylabel="top-1 accuracy (%)")
    ax.set_title(title if title is not None else f"Per-class top-1 accuracy ({len(acc)} classes)")
    ax.grid(True, which="major", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")
    fig.clear()


def save_longtail_eval(
    out_dir: str | Path,
    scores: torch.Tensor,
    labels: torch.Tensor,
    train_class_counts: Sequence[int],
    class_names: Sequence[str] | None = None,
    many_threshold: int = MANY_THRESHOLD,
    few_threshold: int = FEW_THRESHOLD,
    prefix: str = "knn_",
) -> dict[str, float]:
    """Computes the report and writes ``{prefix}per_class.csv`` and ``{prefix}per_class.png``.

    Does not write ``metrics.json``: the caller merges the returned dict with its own keys.

    Args:
        out_dir: Output directory, created if missing.
        class_names: Optional class names, length C, for the CSV.
        prefix: Key and file-name prefix (``"knn_"``, ``"linear_"``).
        scores, labels, train_class_counts, *_threshold: As in :func:`longtail_report`.

    Returns:
        The dict of :func:`longtail_report`.
    """
    thresholds = {"many_threshold": many_threshold, "few_threshold": few_threshold}
    report = longtail_report(scores, labels, train_class_counts, **thresholds, prefix=prefix)
    num_classes = scores.shape[1]
    acc = per_class_accuracy(scores, labels, num_classes)
    test_counts = torch.bincount(labels.detach().cpu().long(), minlength=num_classes)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out / f"{prefix}per_class.csv", out / f"{prefix}per_class.png"
    write_per_class_csv(csv_path, acc, train_class_counts, test_counts, class_names, **thresholds)
    title = f"{prefix.rstrip('_') or 'eval'}: per-class top-1 accuracy ({num_classes} classes)"
    plot_per_class_accuracy(png_path, acc, train_class_counts, **thresholds, title=title)
    return report
