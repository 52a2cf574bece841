"""``python -m solo_ext.leaderboard``: the same as ``solo-ext-leaderboard``."""

from solo_ext.leaderboard.cli import main

main()
