"""The console commands (``solo-ext-pretrain``, ``-linear``, ``-knn``, ``-dense-probe``,
``-make-lt``; the leaderboard has a package of its own) and what they share
(``entry``). Each also runs as ``python -m solo_ext.<command>``."""
