"""Every key solo-ext reads is declared once (an ``Option``: default, kind, bounds): each method's
``method_kwargs`` (``METHOD_KWARGS``), solo-learn's keys that solo-ext-pretrain passes on
(``RUN_OPTIONS``), the ``data`` keys (``DATA_KEYS``), each sampler's ``data.sampler`` keys
(``SAMPLER_OPTIONS``) and the evaluation commands' keys (``OPTIONS``). The start checks each given
key against its declaration, and a value just outside stops it with one line naming the key and
the value, before anything is written, on the active host (``method_kwargs`` through both entry
points: tests/test_entry_points.py)."""

from __future__ import annotations

import importlib

import pytest
from conftest import eval_cfg, outside, tiny_cfg

from solo_ext.commands.pretrain import RUN_OPTIONS, parse_cfg, run
from solo_ext.config import BACKBONE_OPTIONS, ConfigError, Option
from solo_ext.data.options import DATA_KEYS
from solo_ext.data.samplers import SAMPLER_OPTIONS
from solo_ext.data.transforms import AUGMENTATION_OPTIONS
from solo_ext.host import METHODS
from solo_ext.methods.registry import SOLO_EXT_METHODS, register

register()


def test_every_key_is_declared_with_a_valid_default():
    for method in SOLO_EXT_METHODS:
        for key, option in METHODS[method].METHOD_KWARGS.items():
            assert isinstance(option, Option), (method, key)
            assert option.valid(option.default), (method, key)
            assert outside(option), (method, key)  # every key can be tried


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
    (key, value)
    for key, option in {**RUN_OPTIONS, **BACKBONE_OPTIONS}.items()
    for value in outside(option)
]


@pytest.mark.parametrize("key,value", RUN_CASES, ids=[f"{k}-{v!r}" for k, v in RUN_CASES])
def test_a_run_key_outside_its_declaration_stops_the_start(key, value, tmp_path):
    """solo-learn's keys that solo-ext-pretrain hands to torch, Lightning and the host: a bad
    number is one line naming it, before the run directory exists."""
    ckpt_dir = tmp_path / "trained_models"
    cfg = tiny_cfg("scl", tmp_path, **{"checkpoint.dir": str(ckpt_dir), key: value})
    with pytest.raises(ConfigError) as info:
        run(cfg)
    message = str(info.value)
    assert message.startswith(f"{key}={value!r}: must be "), message
    assert "\n" not in message
    assert not ckpt_dir.exists()


EVAL_CASES = [
    (command, key, value)
    for command in ("knn", "linear", "dense_probe")
    for key, option in importlib.import_module(f"solo_ext.commands.{command}").OPTIONS.items()
    for value in outside(option)
]


@pytest.mark.parametrize(
    "command,key,value", EVAL_CASES, ids=[f"{c}-{k}-{v!r}" for c, k, v in EVAL_CASES]
)
def test_an_evaluation_key_outside_its_declaration_stops_it(command, key, value, tmp_path):
    """solo-ext-knn, -linear and -dense-probe check every key they read, before the run is
    even looked at."""
    module = importlib.import_module(f"solo_ext.commands.{command}")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(ConfigError) as info:
        module.run(eval_cfg(command, run_dir, **{key: value}))
    message = str(info.value)
    assert message.startswith(f"{key}={value!r}: must be "), message
    assert "\n" not in message
    assert list(tmp_path.rglob("*")) == [run_dir]


def assert_one_line(err: ConfigError, key: str, value) -> None:
    message = str(err)
    shown = list(value) if isinstance(value, list) else value
    assert message.startswith(f"{key}={shown!r}: must be "), message
    assert "\n" not in message


DATA_CASES = [(key, value) for key, option in DATA_KEYS.items() for value in outside(option)]
SAMPLER_CASES = [
    (name, key, value)
    for name, options in SAMPLER_OPTIONS.items()
    for key, option in options.items()
    for value in outside(option)
]


def test_every_data_and_sampler_key_is_declared_with_a_valid_default():
    options = [
        *DATA_KEYS.values(),
        *(o for opts in SAMPLER_OPTIONS.values() for o in opts.values()),
    ]
    for option in options:
        assert option.valid(option.default) and outside(option), option


@pytest.mark.parametrize("key,value", DATA_CASES, ids=[f"{k}-{v!r}" for k, v in DATA_CASES])
def test_a_data_key_outside_its_declaration_stops_every_command(key, value, tmp_path):
    """Through solo-ext-pretrain (before the run directory exists) and the three evaluation
    commands (before the run is read: ``data`` given there is merged over the run's)."""
    ckpt_dir = tmp_path / "trained_models"
    with pytest.raises(ConfigError) as info:
        run(tiny_cfg("scl", tmp_path, **{key: value, "checkpoint.dir": str(ckpt_dir)}))
    assert_one_line(info.value, key, value)
    assert not ckpt_dir.exists()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for command in ("knn", "linear", "dense_probe"):
        module = importlib.import_module(f"solo_ext.commands.{command}")
        with pytest.raises(ConfigError) as info:
            module.run(eval_cfg(command, run_dir, **{key: value}))
        assert_one_line(info.value, key, value)
    assert list(tmp_path.rglob("*")) == [run_dir]


@pytest.mark.parametrize(
    "name,key,value", SAMPLER_CASES, ids=[f"{n}-{k}-{v!r}" for n, k, v in SAMPLER_CASES]
)
def test_a_sampler_key_outside_its_declaration_stops_pretraining_and_the_probe(
    name, key, value, tmp_path
):
    """``data.sampler`` is read by solo-ext-pretrain and solo-ext-linear."""
    ckpt_dir = tmp_path / "trained_models"
    given = {"data.sampler.name": name, f"data.sampler.{key}": value}
    with pytest.raises(ConfigError) as info:
        run(tiny_cfg("scl", tmp_path, **given, **{"checkpoint.dir": str(ckpt_dir)}))
    assert_one_line(info.value, f"data.sampler.{key}", value)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(ConfigError) as info:
        importlib.import_module("solo_ext.commands.linear").run(
            eval_cfg("linear", run_dir, **given)
        )
    assert_one_line(info.value, f"data.sampler.{key}", value)
    assert list(tmp_path.rglob("*")) == [run_dir]


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("devices", "two", "devices='two': must be a count (-1: all), 'auto', a list of"),
        ("devices", [0, -1], "devices=[0, -1]: must be a count"),
        ("backbone.kwargs.widht", 2, "backbone.kwargs={'widht': 2}: not taken by backbone.name="),
    ],
)
def test_devices_and_backbone_keywords_stop_the_start(key, value, message, tmp_path):
    """``devices`` is read with the world size; ``backbone.kwargs`` beyond solo-ext's own keys go
    to the backbone's constructor, which is tried on the meta device before anything is built."""
    ckpt_dir = tmp_path / "trained_models"
    cfg = tiny_cfg("scl", tmp_path, **{"checkpoint.dir": str(ckpt_dir), key: value})
    if key.startswith("backbone"):
        cfg.backbone.kwargs = {"widht": 2}
    with pytest.raises(ConfigError) as info:
        run(cfg)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value) and not ckpt_dir.exists()


@pytest.mark.parametrize("value", [1, "1", "auto", [0], "0,", -1])
def test_the_usual_spellings_of_devices_are_taken(value, tmp_path):
    cfg = parse_cfg(tiny_cfg("scl", tmp_path, devices=value))
    assert cfg.devices == value


@pytest.mark.parametrize("method", sorted(SOLO_EXT_METHODS))
def test_a_start_checks_each_declared_key_once(method, make_cfg, monkeypatch):
    """A config value meets its declaration once on its way through the start (no layer
    re-checks what another checked)."""
    checked: list[str] = []
    original = Option.check

    def counting(self, key, value):
        checked.append(key)
        return original(self, key, value)

    monkeypatch.setattr(Option, "check", counting)
    parse_cfg(make_cfg(method))
    twice = sorted({key for key in checked if checked.count(key) > 1})
    assert not twice, twice
    assert {f"method_kwargs.{k}" for k in METHODS[method].METHOD_KWARGS} <= set(checked)


@pytest.mark.parametrize(
    "kwargs,refused",
    [({"nesterovv": True}, "nesterovv"), ({"dampening": 0.5, "nesterov": True}, "dampening")],
)
def test_optimizer_keywords_are_tried_before_the_start(kwargs, refused, tmp_path):
    """``optimizer.kwargs`` go to torch's optimizer: one it does not take (a misspelt keyword,
    or nesterov with dampening, which SGD refuses) stops the start in one line."""
    ckpt_dir = tmp_path / "trained_models"
    cfg = tiny_cfg("scl", tmp_path, **{"checkpoint.dir": str(ckpt_dir)})
    cfg.optimizer.kwargs = kwargs
    with pytest.raises(ConfigError) as info:
        run(cfg)
    message = str(info.value)
    assert message.startswith("optimizer.kwargs=") and refused in message, message
    assert "not taken by optimizer.name='sgd'" in message and "\n" not in message
    assert not ckpt_dir.exists()


AUG_CASES = [
    (f"augmentations.0.{key}", value)
    for key, option in AUGMENTATION_OPTIONS.items()
    for value in outside(option)
]


@pytest.mark.parametrize("key,value", AUG_CASES, ids=[f"{k}-{v!r}" for k, v in AUG_CASES])
def test_an_augmentation_key_outside_its_declaration_stops_the_start(key, value, tmp_path):
    """Each ``augmentations`` entry's keys that solo-ext's pipelines read (crop, scale range,
    colour, blur, flip): one line naming the entry's key, before the run directory exists."""
    ckpt_dir = tmp_path / "trained_models"
    with pytest.raises(ConfigError) as info:
        run(tiny_cfg("scl", tmp_path, **{key: value, "checkpoint.dir": str(ckpt_dir)}))
    assert_one_line(info.value, key, value)
    assert not ckpt_dir.exists()


def test_a_crop_scale_range_upside_down_stops_the_start(tmp_path):
    cfg = tiny_cfg("scl", tmp_path, **{"augmentations.0.rrc.crop_min_scale": 0.9})
    cfg.augmentations[0].rrc.crop_max_scale = 0.5
    with pytest.raises(ConfigError, match=r"^augmentations.0.rrc.crop_min_scale=0.9: above "):
        parse_cfg(cfg)
