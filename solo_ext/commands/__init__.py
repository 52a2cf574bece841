"""The console commands (``solo-ext-pretrain``, ``-linear``, ``-knn``, ``-dense-probe``,
``-make-lt``; the leaderboard and the bench have packages of their own) and what they share
(``entry``). Each also runs as ``python -m solo_ext.<command>``."""
