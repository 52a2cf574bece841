"""Constants and small checks that several layers share (no torch, no config, no host)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from numbers import Integral

# label of an empty queue slot (queues, and the losses that mask such slots)
EMPTY = -1
# (seed, epoch) -> one seed: seed * SEED_STRIDE + epoch; the prime keeps (seed, epoch) and
# (seed + 1, epoch') apart for any realistic epoch count
SEED_STRIDE = 1_000_003


def check_int(key: str, value: object, minimum: int) -> int:
    """``value`` as an int >= ``minimum``, else a ValueError naming ``key`` and the value."""
    # bool is an Integral; a stray True/False from a config is a bug, not a count.
    if not isinstance(value, Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{key}={value!r}: must be an integer >= {minimum}")
    return int(value)


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` with the closest of ``options``, or ``""``."""
    match = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""
