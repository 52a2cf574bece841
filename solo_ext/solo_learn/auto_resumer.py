"""``solo.utils.auto_resumer``: the newest readable checkpoint of the run solo-learn picks."""

from __future__ import annotations

import functools
from types import ModuleType

from solo_ext.common import announce
from solo_ext.solo_learn import parsed
from solo_ext.solo_learn.check import method_of

# the names of the solo-learn module this patch needs (checked before it applies)
NEEDS = (method_of("AutoResumer", "find_checkpoint"),)


def apply(module: ModuleType) -> None:
    base = module.AutoResumer
    find = base.find_checkpoint

    @functools.wraps(find)
    def find_checkpoint(self, cfg):
        """solo-learn's choice of run; of its checkpoints the newest readable one: an
        unreadable file (truncated by a kill before writes were atomic, foreign) is passed
        over in one line, and a run without a readable checkpoint starts anew. solo-learn's
        pick comes first for a config of solo-learn's alone (it takes the first file it
        lists), the newest for a solo-ext one."""
        from pathlib import Path

        from solo_ext.runs.resume import by_age, newest_readable

        found, run_id = find(self, cfg)
        if found is None:
            return found, run_id
        found = Path(found)
        others = by_age(p for p in found.parent.glob("*.ckpt") if p != found)
        order = by_age([found, *others]) if parsed.uses_solo_ext(cfg) else [found, *others]
        chosen = newest_readable(order)
        if chosen is None:
            announce(f"auto_resume: no readable checkpoint in {str(found.parent)!r}: starting anew")
            return None, None
        return chosen, run_id

    base.find_checkpoint = find_checkpoint
