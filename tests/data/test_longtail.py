"""Tests of the exponential long-tail profile and the many/medium/few-shot split."""

import math

import pytest

from solo_ext.data.longtail import lt_counts, shot_groups

CASES = [(200, 20, 10.0), (500, 10, 100.0), (5000, 100, 50.0), (1000, 3, 2.5), (37, 7, 3.0)]


@pytest.mark.parametrize(("n_max", "num_classes", "imbalance_factor"), CASES)
def test_lt_counts_is_the_exponential_profile(n_max, num_classes, imbalance_factor):
    expected = []
    for c in range(num_classes):
        expected.append(math.floor(n_max * imbalance_factor ** (-c / (num_classes - 1))))
    counts = lt_counts(n_max, num_classes, imbalance_factor)
    assert counts == expected
    assert all(isinstance(n, int) for n in counts)
    assert counts[0] == n_max
    assert counts[-1] == math.floor(n_max / imbalance_factor)
    assert all(a >= b for a, b in zip(counts, counts[1:]))


def test_lt_counts_cifar100_lt_reference_values():
    # CIFAR-100-LT with IF=100 (Cao et al. 2019): 500 head, 5 tail, 10847 images in total.
    counts = lt_counts(500, 100, 100)
    assert (counts[0], counts[-1], sum(counts)) == (500, 5, 10847)


def test_lt_counts_degenerate_profiles():
    assert lt_counts(42, 1, 10.0) == [42]
    assert lt_counts(42, 5, 1.0) == [42] * 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"imbalance_factor": 0.5}, "data.imbalance_factor=0.5: must be >= 1"),
        ({"imbalance_factor": 0.999}, "data.imbalance_factor=0.999"),
        ({"imbalance_factor": float("nan")}, "data.imbalance_factor=nan"),
        ({"imbalance_factor": float("inf")}, "data.imbalance_factor=inf"),
        ({"n_max": 0}, "data.n_max=0"),
        ({"num_classes": 0}, "data.num_classes=0"),
        ({"num_classes": 2.0}, "data.num_classes=2.0"),
    ],
)
def test_lt_counts_rejects_bad_arguments(kwargs, message):
    args = {"n_max": 100, "num_classes": 10, "imbalance_factor": 10.0, **kwargs}
    with pytest.raises(ValueError, match=r"^[^\n]*$") as err:
        lt_counts(**args)
    assert message in str(err.value)


def test_shot_groups_boundaries_are_exact():
    counts = [1000, 101, 100, 50, 20, 19, 0]  # many above 100, few below 20 (the defaults)
    assert shot_groups(counts) == ["many"] * 2 + ["medium"] * 3 + ["few"] * 2
    assert shot_groups([11, 10, 5, 4], 10, 5) == ["many", "medium", "medium", "few"]


def test_shot_groups_rejects_inverted_thresholds():
    with pytest.raises(ValueError, match="data.few_threshold=50"):
        shot_groups([10], many_threshold=20, few_threshold=50)
