"""Bad configs fail before any work with one line naming the key and the value: a required key
missing, and a value refused once the training stack is up (the table of the rest:
tests/test_bad_input.py)."""

from __future__ import annotations

import pytest
from conftest import ROOT
from omegaconf import OmegaConf

from solo_ext.commands.pretrain import parse_cfg
from solo_ext.config import ConfigError


@pytest.mark.parametrize("key", ["method", "backbone.name", "data.dataset", "optimizer.lr"])
def test_missing_required_key(key, make_cfg):
    cfg = make_cfg("scl")
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    del node[leaf]
    with pytest.raises(ConfigError, match=f"^{key} is missing"):
        parse_cfg(cfg)


def test_cli_prints_one_line_and_writes_nothing(tmp_path, command):
    from solo_ext.commands.pretrain import main

    ckpt_dir = tmp_path / "trained_models"
    ckpt_dir.mkdir()
    (ckpt_dir / "keep.txt").write_text("earlier work")
    recipe = [
        "--config-path",
        str(ROOT / "scripts/pretrain/synthetic-lt"),
        "--config-name",
        "scl.yaml",
    ]
    argv = [*recipe, "backbone.name=resnet7", f"checkpoint.dir={ckpt_dir}"]
    code, _, err = command(main, "solo-ext-pretrain", *argv, cwd=tmp_path)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [lines[-1]] and "backbone.name='resnet7'" in lines[-1], err
    assert lines[-1].startswith("solo-ext-pretrain: error: ")
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trained_models"]
