"""``metrics.json`` beside a checkpoint, shared by the kNN and linear evaluations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def update_metrics(out_dir: str | Path, new: dict[str, Any]) -> dict[str, Any]:
    """Merges ``new`` into ``<out_dir>/metrics.json`` (keeping other evaluations' keys)."""
    path = Path(out_dir) / "metrics.json"
    metrics = json.loads(path.read_text()) if path.is_file() else {}
    metrics.update(new)
    path.write_text(json.dumps(metrics, indent=2))
    return metrics
