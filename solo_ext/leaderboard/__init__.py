"""``solo-ext-leaderboard``: measured runs beside published numbers, one table per dataset.

    solo-ext-leaderboard trained_models/ [more run directories or roots] --out leaderboard

Finds the pretraining runs under the paths (solo-ext's and solo-learn's layout: ``args.json``
beside the checkpoints) and the linear / kNN results of each (``metrics.json``, solo-learn's
``main_linear.py`` runs, the CSV logs; :mod:`solo_ext.leaderboard.runs`), and writes for each
dataset ``<out>/<dataset>.md``, ``.csv`` and ``.png``: method, backbone, epochs, total batch, the
protocol options that differ from the published protocol, linear and kNN top-1 and Many / Medium
/ Few, beside the published rows of that dataset (``published.csv``, with source and protocol),
which are marked and listed apart. A measured row whose protocol options, epochs or backbone
differ from the published row it is compared with is flagged. A directory that cannot be read
or holds no result is skipped with one line naming it.
"""

from __future__ import annotations

from solo_ext.leaderboard.cli import main, run

__all__ = ["main", "run"]
