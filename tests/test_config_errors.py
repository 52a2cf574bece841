"""Bad configs fail before any work with one line naming the key and the value."""

from __future__ import annotations

import pytest
from conftest import ROOT
from omegaconf import OmegaConf

from solo_ext.commands.pretrain import parse_cfg
from solo_ext.config import ConfigError

CASES = [
    # (override key, value, text the one-line message must contain)
    ("data.imbalance_factor", 0.5, "data.imbalance_factor=0.5"),
    ("method_kwargs.temperature", 0.0, "method_kwargs.temperature=0.0"),
    ("method_kwargs.temprature", 0.1, "method_kwargs.temprature=0.1"),
    ("scheduler.name", "cosine_typo", "scheduler.name='cosine_typo'"),
    ("data.synthetic.nmax", 5, "data.synthetic.nmax=5"),
]


@pytest.mark.parametrize("key,value,text", CASES, ids=[c[0] for c in CASES])
def test_bad_value_names_key_and_value(key, value, text, make_cfg):
    cfg = make_cfg("scl", **{key: value})
    with pytest.raises((ConfigError, ValueError)) as info:
        parse_cfg(cfg)
    message = str(info.value)
    assert text in message and "\n" not in message


def test_typo_suggests_closest_key(make_cfg):
    with pytest.raises(ConfigError, match="did you mean 'temperature'"):
        parse_cfg(make_cfg("scl", **{"method_kwargs.temprature": 0.1}))


@pytest.mark.parametrize("key", ["method", "backbone.name", "data.dataset", "optimizer.lr"])
def test_missing_required_key(key, make_cfg):
    cfg = make_cfg("scl")
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    del node[leaf]
    with pytest.raises(ConfigError, match=f"^{key} is missing"):
        parse_cfg(cfg)


def test_missing_data_path(make_cfg, tmp_path):
    cfg = make_cfg("scl", **{"data.dataset": "custom", "data.train_path": str(tmp_path / "nope")})
    with pytest.raises(ConfigError, match="data.train_path='.*nope': no such directory"):
        parse_cfg(cfg)


def test_cli_prints_one_line_and_writes_nothing(tmp_path, command):
    from solo_ext.commands.pretrain import main

    ckpt_dir = tmp_path / "trained_models"
    ckpt_dir.mkdir()
    (ckpt_dir / "keep.txt").write_text("earlier work")
    code, _, err = command(
        main,
        "solo-ext-pretrain",
        "--config-path",
        str(ROOT / "scripts/pretrain/synthetic-lt"),
        "--config-name",
        "scl.yaml",
        "backbone.name=resnet7",
        f"checkpoint.dir={ckpt_dir}",
        cwd=tmp_path,
    )
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [lines[-1]] and "backbone.name='resnet7'" in lines[-1], err
    assert lines[-1].startswith("solo-ext-pretrain: error: ")
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trained_models"]


@pytest.mark.parametrize(
    "sampler,text",
    [
        ({"name": "instance", "rank": 1}, "data.sampler.rank=1"),
    ],
)
def test_bad_sampler(sampler, text, make_cfg):
    with pytest.raises(ConfigError) as info:
        parse_cfg(make_cfg("scl", **{"data.sampler": sampler}))
    assert text in str(info.value) and "\n" not in str(info.value)
