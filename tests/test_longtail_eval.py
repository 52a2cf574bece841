"""Long-tail evaluation: per-class / Many-Medium-Few accuracy, per-class CSV and plot."""

from __future__ import annotations

import csv
import math
import struct

import pytest
import torch

from solo_ext.eval.longtail import (
    longtail_report,
    per_class_accuracy,
    plot_per_class_accuracy,
    save_longtail_eval,
    write_per_class_csv,
)

# Groups: many, many, medium (100 is not > 100), medium, medium (20 is not < 20), few.
COUNTS = [500, 150, 100, 50, 20, 5]
# (label, prediction, label in the top 5): wrong predictions put the label at rank 2 (in the
# top 5) or rank 6 (out of it), see `_scores`.
TABLE = [
    (0, 0, True), (0, 0, True), (0, 0, True), (0, 1, True),  # 3/4
    (1, 1, True), (1, 2, False),  # 1/2
    (2, 2, True), (2, 2, True), (2, 0, True),  # 2/3
    (3, 3, True), (3, 4, True),  # 1/2
    (4, 0, False),  # 0/1
    (5, 5, True), (5, 0, True), (5, 1, False),  # 1/3
]  # fmt: skip
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _scores(table: list[tuple[int, int, bool]], num_classes: int) -> tuple[torch.Tensor, ...]:
    scores = torch.zeros(len(table), num_classes)
    for i, (label, pred, in_top5) in enumerate(table):
        scores[i, pred] = 1.0
        if label != pred:  # the other classes tie at 0, so 0.5 is rank 2 and -1 is rank C
            scores[i, label] = 0.5 if in_top5 else -1.0
    return scores, torch.tensor([label for label, _, _ in table])


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    return struct.unpack(">II", data[16:24])  # IHDR width, height


def test_report_matches_hand_computation():
    scores, labels = _scores(TABLE, 6)
    r = longtail_report(scores, labels, COUNTS, prefix="knn_")
    assert set(r) == {
        f"knn_{k}"
        for k in ["acc1", "acc5", "acc1_many", "acc1_medium", "acc1_few"]
        + ["num_many", "num_medium", "num_few"]
    }
    # Correct: 3 + 1 + 2 + 1 + 0 + 1 = 8 of 15.
    assert r["knn_acc1"] == pytest.approx(100 * 8 / 15)
    # Top 5: the 8 correct plus the 4 wrong ones flagged True = 12 of 15.
    assert r["knn_acc5"] == pytest.approx(100 * 12 / 15)
    # Many (classes 0, 1): (3 + 1) / (4 + 2) = 2/3, sample-weighted (the class mean is 62.5).
    assert r["knn_acc1_many"] == pytest.approx(100 * 2 / 3)
    # Medium (classes 2, 3, 4): (2 + 1 + 0) / (3 + 2 + 1) = 1/2.
    assert r["knn_acc1_medium"] == pytest.approx(50.0)
    # Few (class 5): 1/3.
    assert r["knn_acc1_few"] == pytest.approx(100 / 3)
    assert (r["knn_num_many"], r["knn_num_medium"], r["knn_num_few"]) == (2, 3, 1)
    expected = torch.tensor([3 / 4, 1 / 2, 2 / 3, 1 / 2, 0, 1 / 3], dtype=torch.float64) * 100
    torch.testing.assert_close(per_class_accuracy(scores, labels, 6), expected)


def test_per_class_matches_loop_reference_and_nan_for_absent_class():
    gen = torch.Generator().manual_seed(0)
    num_classes = 7
    scores = torch.randn(300, num_classes, generator=gen)
    labels = torch.randint(0, num_classes, (300,), generator=gen)
    labels[labels == 3] = 4  # class 3 has no test sample
    got = per_class_accuracy(scores, labels, num_classes)
    preds = scores.argmax(dim=1).tolist()
    for c in range(num_classes):
        hits = [p == c for p, y in zip(preds, labels.tolist()) if y == c]
        if c == 3:
            assert not hits and math.isnan(got[c])
        else:
            assert got[c].item() == pytest.approx(100 * sum(hits) / len(hits))


@pytest.mark.parametrize("num_classes", [1, 2, 3, 4])
def test_top5_capped_at_num_classes(num_classes):
    scores = torch.randn(20, num_classes, generator=torch.Generator().manual_seed(1))
    labels = torch.arange(20) % num_classes
    r = longtail_report(scores, labels, [50] * num_classes)
    assert r["acc5"] == 100.0
    assert r["acc1"] <= 100.0


def test_thresholds_are_honoured_at_the_boundaries():
    # 101 > 100 is many; 100 and 20 are medium; 19 < 20 is few. With both at 19, 19 is medium.
    table = [(0, 0, True), (1, 1, True), (1, 0, True), (2, 0, True), (3, 3, True)]
    scores, labels = _scores(table, 4)
    r = longtail_report(scores, labels, [101, 100, 20, 19])
    assert (r["num_many"], r["num_medium"], r["num_few"]) == (1, 2, 1)
    assert (r["acc1_many"], r["acc1_few"]) == (100.0, 100.0)
    assert r["acc1_medium"] == pytest.approx(100 / 3)  # classes 1, 2: 1 of 3 samples
    custom = longtail_report(
        scores, labels, [101, 100, 20, 19], many_threshold=19, few_threshold=19
    )
    assert (custom["num_many"], custom["num_medium"], custom["num_few"]) == (3, 1, 0)


def test_empty_group_gives_nan():
    scores, labels = _scores(TABLE, 6)
    r = longtail_report(scores, labels, [1000] * 6)
    assert (r["num_many"], r["num_medium"], r["num_few"]) == (6, 0, 0)
    assert r["acc1_many"] == pytest.approx(r["acc1"])
    assert math.isnan(r["acc1_medium"]) and math.isnan(r["acc1_few"])


def test_csv_has_one_row_per_class(tmp_path):
    scores, labels = _scores(TABLE, 6)
    acc = per_class_accuracy(scores, labels, 6)
    acc[5] = math.nan
    names = [f"cls{c}" for c in range(6)]
    path = tmp_path / "per_class.csv"
    write_per_class_csv(path, acc, COUNTS, test_counts=[4, 2, 3, 2, 1, 3], class_names=names)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["class", "name", "train_count", "group", "test_count", "acc1"]
    assert [r["class"] for r in rows] == [str(c) for c in range(6)]
    assert [r["name"] for r in rows] == names
    assert [int(r["train_count"]) for r in rows] == COUNTS
    assert [r["group"] for r in rows] == ["many", "many", "medium", "medium", "medium", "few"]
    assert [int(r["test_count"]) for r in rows] == [4, 2, 3, 2, 1, 3]
    assert [float(r["acc1"]) for r in rows[:5]] == pytest.approx([75, 50, 200 / 3, 50, 0], abs=1e-4)
    assert math.isnan(float(rows[5]["acc1"]))
    write_per_class_csv(path, acc, COUNTS)  # optional columns: no test_count, empty names
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["class", "name", "train_count", "group", "acc1"]
    assert len(rows) == 6 and all(r["name"] == "" for r in rows)


@pytest.mark.parametrize(
    "acc, counts",
    [
        ([75.0, 50.0, 66.7, 50.0, 0.0, 33.3], COUNTS),
        ([math.nan, 80.0, math.nan, 10.0], [500, 400, 300, 200]),  # NaNs, one group
        ([math.nan, math.nan], [5, 0]),  # nothing drawable
    ],
    ids=["groups", "nan-one-group", "nothing"],
)
def test_plot_writes_a_png(tmp_path, acc, counts):
    path = tmp_path / "plot.png"
    plot_per_class_accuracy(path, torch.tensor(acc), counts, title="t")
    assert _png_size(path) == (700, 450)
    assert path.stat().st_size > 5_000


def test_save_longtail_eval_writes_csv_and_png(tmp_path):
    scores, labels = _scores(TABLE, 6)
    out = tmp_path / "eval"
    r = save_longtail_eval(out, scores, labels, COUNTS, prefix="linear_")
    assert r == longtail_report(scores, labels, COUNTS, prefix="linear_")
    assert sorted(p.name for p in out.iterdir()) == ["linear_per_class.csv", "linear_per_class.png"]
    with open(out / "linear_per_class.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["test_count"]) for r in rows] == [4, 2, 3, 2, 1, 3]
    assert _png_size(out / "linear_per_class.png") == (700, 450)


S, Y = _scores(TABLE, 6)


@pytest.mark.parametrize(
    "call",
    [
        lambda: longtail_report(S[0], Y, COUNTS),  # scores not 2-D
        lambda: longtail_report(S, Y[:-1], COUNTS),  # labels length
        lambda: longtail_report(S, Y.float(), COUNTS),  # labels dtype
        lambda: longtail_report(S, torch.where(Y == 5, 6, Y), COUNTS),  # label >= C
        lambda: longtail_report(S, torch.where(Y == 5, -1, Y), COUNTS),  # negative label
        lambda: longtail_report(S, Y, COUNTS[:-1]),  # len(train_class_counts) != C
        lambda: longtail_report(S, Y, COUNTS, many_threshold=10, few_threshold=20),
        lambda: longtail_report(S[:0], Y[:0], COUNTS),  # no samples
        lambda: per_class_accuracy(S, Y, 5),  # num_classes != C
        lambda: plot_per_class_accuracy("unused.png", torch.zeros(6), COUNTS[:-1]),
    ],
)
def test_bad_inputs_raise_one_line_value_errors(call):
    with pytest.raises(ValueError) as info:
        call()
    assert "\n" not in str(info.value) and str(info.value)


def test_bad_csv_inputs_raise(tmp_path):
    acc = torch.zeros(6)
    for kwargs in [{"class_names": ["a"] * 5}, {"test_counts": [1] * 7}]:
        with pytest.raises(ValueError, match=r"^len\(\w+\)=\d+: expected 6 classes$"):
            write_per_class_csv(tmp_path / "x.csv", acc, COUNTS, **kwargs)
    assert not (tmp_path / "x.csv").exists()


def test_shot_group_accuracy_over_batches_equals_the_whole_report():
    """The streaming metric of solo-learn's linear model against ``longtail_report`` on the
    same scores, fed in uneven batches."""
    from solo_ext.eval.shot_accuracy import ShotGroupAccuracy

    g = torch.Generator().manual_seed(0)
    counts = [150, 120, 60, 30, 10, 5]
    labels = torch.randint(0, 6, (50,), generator=g)
    scores = torch.randn(50, 6, generator=g) + 2 * torch.nn.functional.one_hot(labels, 6)
    metric = ShotGroupAccuracy(counts)
    for lo, hi in ((0, 7), (7, 30), (30, 50)):
        metric.update(scores[lo:hi], labels[lo:hi])
    got = {k: float(v) for k, v in metric.compute(prefix="").items()}
    want = longtail_report(scores, labels, counts)
    for group in ("many", "medium", "few"):
        assert got[group] == pytest.approx(want[f"acc1_{group}"])
