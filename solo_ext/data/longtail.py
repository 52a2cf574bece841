"""Long-tail class profiles and many/medium/few-shot grouping.

The profile is the exponential one used by the CIFAR-10/100-LT literature (Cui et al. 2019,
Cao et al. 2019): class ``c`` keeps ``floor(n_max * IF ** (-c / (C - 1)))`` images, so class 0
is the head with ``n_max`` images and class ``C - 1`` the tail with ``floor(n_max / IF)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real

from solo_ext.common import check_int
from solo_ext.facts import FEW_THRESHOLD, MANY_THRESHOLD

SHOT_GROUPS: tuple[str, str, str] = ("many", "medium", "few")


def _check_int(name: str, value: object, minimum: int) -> int:
    return check_int(f"data.{name}", value, minimum)


def lt_counts(n_max: int, num_classes: int, imbalance_factor: float) -> list[int]:
    """Images per class for an exponential long-tail profile.

    Args:
        n_max: Images of the head class (class 0), >= 1.
        num_classes: Number of classes C, >= 1.
        imbalance_factor: Ratio head / tail, >= 1 (1 gives a balanced set).

    Returns:
        List of length C; entry c is ``floor(n_max * imbalance_factor ** (-c / (C - 1)))``,
        non-increasing in c, first entry ``n_max``. ``[n_max]`` when C == 1.

    Raises:
        ValueError: If an argument is out of range; the message names it and its value.
    """
    n_max = _check_int("n_max", n_max, 1)
    num_classes = _check_int("num_classes", num_classes, 1)
    # `not >=` also rejects NaN; inf would silently zero every class but the head.
    if (
        not isinstance(imbalance_factor, Real)
        or isinstance(imbalance_factor, bool)
        or not imbalance_factor >= 1
        or math.isinf(imbalance_factor)
    ):
        raise ValueError(f"data.imbalance_factor={imbalance_factor!r}: must be >= 1 and finite")
    if num_classes == 1:
        return [n_max]
    return [
        math.floor(n_max * imbalance_factor ** (-c / (num_classes - 1))) for c in range(num_classes)
    ]


def shot_groups(
    counts: Sequence[int], many_threshold: int = MANY_THRESHOLD, few_threshold: int = FEW_THRESHOLD
) -> list[str]:
    """Many/medium/few-shot label per class, from its number of training images.

    Args:
        counts: Training images per class, length C.
        many_threshold: Classes with strictly more images are "many".
        few_threshold: Classes with strictly fewer images are "few"; the rest
            (``few_threshold <= count <= many_threshold``) are "medium".

    Returns:
        List of length C with entries in ``SHOT_GROUPS``.

    Raises:
        ValueError: If ``few_threshold > many_threshold`` or a count is negative.
    """
    if few_threshold > many_threshold:
        raise ValueError(
            f"data.few_threshold={few_threshold!r}: must be <= data.many_threshold="
            f"{many_threshold!r}"
        )
    groups = []
    for c, n in enumerate(counts):
        if n < 0:
            raise ValueError(f"counts[{c}]={n!r}: must be >= 0")
        if n > many_threshold:
            groups.append("many")
        elif n < few_threshold:
            groups.append("few")
        else:
            groups.append("medium")
    return groups


__all__ = ["SHOT_GROUPS", "lt_counts", "shot_groups"]
