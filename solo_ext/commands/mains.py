"""The console commands' ``main()`` functions, importing nothing of the training stack: Hydra
answers ``--help`` and ``--cfg job``, and the early config checks refuse a bad value in one line,
before Lightning, torchmetrics, the host or the methods are imported (each command's module is
imported to run it)."""

from __future__ import annotations

from solo_ext.commands.entry import hydra_entry
from solo_ext.commands.options import (
    check_dense_probe_early,
    check_knn_early,
    check_linear_early,
    check_pretrain_early,
)

pretrain = hydra_entry(
    "solo-ext-pretrain", "solo_ext.commands.pretrain:run", early=check_pretrain_early
)
linear = hydra_entry(
    "solo-ext-linear", "solo_ext.commands.linear:run", "linear", check_linear_early
)
knn = hydra_entry("solo-ext-knn", "solo_ext.commands.knn:run", "knn", check_knn_early)
dense_probe = hydra_entry(
    "solo-ext-dense-probe",
    "solo_ext.commands.dense_probe:run",
    "dense_probe",
    check_dense_probe_early,
)
