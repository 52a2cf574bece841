"""``solo-ext-leaderboard``: measured runs beside published numbers, one table per dataset.

    solo-ext-leaderboard trained_models/ [more run directories or roots] --out leaderboard

Finds the pretraining runs under the paths (solo-ext's and solo-learn's layout: ``args.json``
beside the checkpoints) and the linear / kNN results of each (``metrics.json``, solo-learn's
``main_linear.py`` runs, the CSV logs; :mod:`solo_ext.leaderboard.runs`), and writes for
each dataset ``<out>/<dataset>.md``, ``.csv``, ``.tex`` and ``.png``: method, backbone, epochs,
total batch, the protocol options that differ from the published protocol, one column group
per evaluation, beside the published rows of that dataset (``published.csv``, with source and
protocol), which are marked and listed apart. A measured row whose protocol options, epochs or
backbone differ from the published row it is compared with is flagged. A directory that cannot
be read or holds no result is skipped with one line naming it; a run directory found twice (a
copy) counts once. Its user documentation: ``docs/leaderboard.md``.
"""

from __future__ import annotations

from solo_ext.leaderboard.cli import main, run

__all__ = ["main", "run"]
