"""Every method's ``method_kwargs`` are declared once (``METHOD_KWARGS``: default, kind, bounds);
the start checks each key against its declaration, and a value just outside stops it with one
line naming the key and the value, on the active host."""

from __future__ import annotations

import importlib

import pytest
from conftest import eval_cfg, tiny_cfg

from solo_ext.config import ConfigError, Option
from solo_ext.host import METHODS
from solo_ext.pretrain import RUN_OPTIONS, parse_cfg, run
from solo_ext.registry import SOLO_EXT_METHODS, register

register()
CASES = [
    (method, key, value)
    for method in SOLO_EXT_METHODS
    for key, option in METHODS[method].METHOD_KWARGS.items()
    for value in option.invalid_examples()
]


def test_every_key_is_declared_with_a_valid_default():
    for method in SOLO_EXT_METHODS:
        for key, option in METHODS[method].METHOD_KWARGS.items():
            assert isinstance(option, Option), (method, key)
            assert option.valid(option.default), (method, key)
            assert option.invalid_examples(), (method, key)  # every key can be tried


@pytest.mark.parametrize("method,key,value", CASES, ids=[f"{m}-{k}-{v!r}" for m, k, v in CASES])
def test_a_value_outside_its_declaration_stops_the_start(method, key, value, make_cfg):
    cfg = make_cfg(method, **{f"method_kwargs.{key}": value})
    with pytest.raises(ConfigError) as info:
        parse_cfg(cfg)
    message = str(info.value)
    shown = list(value) if isinstance(value, list) else value
    assert message.startswith(f"method_kwargs.{key}={shown!r}: must be "), message
    assert "\n" not in message


@pytest.mark.parametrize("method", sorted(SOLO_EXT_METHODS))
def test_the_declared_defaults_fill_what_the_config_leaves_out(method, make_cfg):
    cfg = make_cfg(method)
    given = dict(cfg.method_kwargs)
    cfg = parse_cfg(cfg)
    for key, option in METHODS[method].METHOD_KWARGS.items():
        want = given.get(key, option.default)
        if want is not None:
            assert cfg.method_kwargs[key] == want, (method, key)
        assert option.valid(cfg.method_kwargs[key]), (method, key)


def test_dscl_alpha_and_beta_together(make_cfg):
    cfg = make_cfg("dscl", **{"method_kwargs.alpha": 0.2, "method_kwargs.beta": 3.0})
    with pytest.raises(ConfigError, match=r"^method_kwargs.alpha=0.2, method_kwargs.beta=3.0: "):
        parse_cfg(cfg)


RUN_CASES = [
    (key, value) for key, option in RUN_OPTIONS.items() for value in option.invalid_examples()
]


@pytest.mark.parametrize("key,value", RUN_CASES, ids=[f"{k}-{v!r}" for k, v in RUN_CASES])
def test_a_run_key_outside_its_declaration_stops_the_start(key, value, tmp_path):
    """solo-learn's keys that solo-ext-pretrain hands to torch, Lightning and the host: a bad
    number is one line naming it, before the run directory exists."""
    ckpt_dir = tmp_path / "trained_models"
    cfg = tiny_cfg("scl", tmp_path, **{key: value, "checkpoint.dir": str(ckpt_dir)})
    with pytest.raises(ConfigError) as info:
        run(cfg)
    message = str(info.value)
    assert message.startswith(f"{key}={value!r}: must be "), message
    assert "\n" not in message
    assert not ckpt_dir.exists()


EVAL_CASES = [
    (command, key, value)
    for command in ("knn", "linear", "dense_probe")
    for key, option in importlib.import_module(f"solo_ext.{command}").OPTIONS.items()
    for value in option.invalid_examples()
]


@pytest.mark.parametrize(
    "command,key,value", EVAL_CASES, ids=[f"{c}-{k}-{v!r}" for c, k, v in EVAL_CASES]
)
def test_an_evaluation_key_outside_its_declaration_stops_it(command, key, value, tmp_path):
    """solo-ext-knn, -linear and -dense-probe check every key they read, before the run is
    even looked at."""
    module = importlib.import_module(f"solo_ext.{command}")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(ConfigError) as info:
        module.run(eval_cfg(command, run_dir, **{key: value}))
    message = str(info.value)
    assert message.startswith(f"{key}={value!r}: must be "), message
    assert "\n" not in message
    assert list(tmp_path.rglob("*")) == [run_dir]
