"""Every config under scripts/ composes with Hydra and passes the pretraining checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT
from hydra import compose, initialize_config_dir

from solo_ext.pretrain import parse_cfg

CONFIGS = sorted(p for p in (ROOT / "scripts" / "pretrain").glob("*/*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[f"{p.parent.name}/{p.name}" for p in CONFIGS])
def test_config_is_valid(path: Path, tmp_path):
    with initialize_config_dir(config_dir=str(path.parent), version_base="1.2"):
        cfg = compose(config_name=path.name)
    cfg = parse_cfg(cfg)
    assert cfg.method == path.stem
    assert cfg.data.num_large_crops >= 2
