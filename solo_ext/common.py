"""Constants, small checks and the safe file write that several layers share (no torch, no
config, no host)."""

from __future__ import annotations

import difflib
import os
import tempfile
from collections.abc import Callable, Iterable
from numbers import Integral
from pathlib import Path
from typing import Any

# label of an empty queue slot (queues, and the losses that mask such slots)
EMPTY = -1
# (seed, epoch) -> one seed: seed * SEED_STRIDE + epoch; the prime keeps (seed, epoch) and
# (seed + 1, epoch') apart for any realistic epoch count
SEED_STRIDE = 1_000_003
# the kNN vote's distances (solo-learn's names)
DISTANCES = ("cosine", "euclidean")


class HostError(ImportError):
    """The requested host cannot be used (defined below the host, so that a host that fails to
    import can still be reported in one line)."""


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


def first_process() -> bool:
    """Whether this is a run's first process (DDP's children, which re-run the script, and the
    other nodes' processes are not), by the launcher's environment."""
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"


def announce(message: str) -> None:
    """``solo-ext: <message>`` once per run: on the first process only (the processes of a
    distributed run, and DDP's children that re-run the script, say nothing)."""
    if first_process():
        print(f"solo-ext: {message}", flush=True)


# atomic_write's temporary file of <name>: .<name>.<random>.tmp beside it
TEMPORARY = (".", ".tmp")


def temporaries_of(directory: str | Path) -> list[Path]:
    """The temporary files of :func:`atomic_write` in ``directory`` (those of killed writes,
    when no write is under way)."""
    start, end = TEMPORARY
    if not os.path.isdir(directory):
        return []
    return sorted(
        p for p in Path(directory).iterdir() if p.name.startswith(start) and p.name.endswith(end)
    )


def atomic_write(path: str | Path, write: Callable[[Any], None], mode: str) -> None:
    """Writes through a temporary file in the same directory and a rename: an interrupted write
    leaves the previous file whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    start, end = TEMPORARY
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{start}{path.name}.", suffix=end)
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file and a rename."""
    atomic_write(path, lambda f: f.write(text), "w")
