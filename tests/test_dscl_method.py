"""The ``dscl`` method's wiring: its loss is the DSCL loss, and with alpha='scl' it is ``scl``."""

from __future__ import annotations

import pytest

from solo_ext.commands.pretrain import parse_cfg, run


def test_alpha_scl_trains_exactly_like_scl(make_cfg):
    common = {"checkpoint.enabled": False, "limit_train_batches": 2, "limit_val_batches": 0}
    scl = run(make_cfg("scl", **common))["metrics"]
    dscl = run(make_cfg("dscl", **common, **{"method_kwargs.alpha": "scl"}))["metrics"]
    assert dscl["train_dscl_loss"] == pytest.approx(scl["train_scl_loss"], rel=1e-5)


def test_alpha_changes_the_loss(make_cfg):
    common = {"checkpoint.enabled": False, "limit_train_batches": 1, "limit_val_batches": 0}
    low = run(make_cfg("dscl", **common, **{"method_kwargs.alpha": 0.05}))["metrics"]
    high = run(make_cfg("dscl", **common, **{"method_kwargs.alpha": 0.95}))["metrics"]
    assert low["train_dscl_loss"] != pytest.approx(high["train_dscl_loss"], rel=1e-3)


def test_official_beta_by_default(make_cfg):
    cfg = parse_cfg(make_cfg("dscl"))
    assert cfg.method_kwargs.beta == 8.0 and cfg.method_kwargs.alpha is None
