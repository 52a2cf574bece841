"""``metrics.json`` beside a checkpoint, shared by the kNN and linear evaluations and by the
runs' last validation values (``val_*``), whichever logger a run has."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from solo_ext.common import atomic_write_text


def _jsonable(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def update_metrics(out_dir: str | Path, new: dict[str, Any]) -> dict[str, Any]:
    """Merges ``new`` into ``<out_dir>/metrics.json`` (keeping other evaluations' keys);
    NaN (e.g. the accuracy of an empty shot group) is written as null."""
    path = Path(out_dir) / "metrics.json"
    metrics = json.loads(path.read_text()) if path.is_file() else {}
    metrics.update({k: _jsonable(v) for k, v in new.items()})
    atomic_write_text(path, json.dumps(metrics, indent=2))
    return metrics


def update_validation(trainer: Any, out_dir: str | Path) -> None:
    """After a validation (not the sanity check), global rank zero merges the run's last
    validation values (Lightning's ``val_*`` callback metrics) into ``<out_dir>/metrics.json``:
    a run logged with wandb has them there as one logged to CSV does, and the leaderboard reads
    them from there."""
    if trainer.sanity_checking or not trainer.is_global_zero:
        return
    values = {k: float(v) for k, v in trainer.callback_metrics.items()
              if k.startswith("val_") and getattr(v, "numel", lambda: 1)() == 1}  # fmt: skip
    if values:
        update_metrics(out_dir, values)
