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


def eval_module(command: str):
    return importlib.import_module(f"solo_ext.commands.{command}")


def test_every_key_is_declared_with_a_valid_default():
    """Each method's ``method_kwargs``, the ``data`` keys and each sampler's keys: every default
    valid, every key with values outside it to try."""
    tables = [METHODS[method].METHOD_KWARGS for method in SOLO_EXT_METHODS]
    for table in [*tables, DATA_KEYS, *SAMPLER_OPTIONS.values()]:
        for key, option in table.items():
            assert isinstance(option, Option), key
            assert option.valid(option.default) and outside(option), key


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


EVAL_COMMANDS = ("knn", "linear", "dense_probe")


def outside_cases(commands: tuple[str, ...], options: dict, prefix: str = "", **given) -> list:
    """(commands, overrides, key, value): each key of ``options`` with each value just outside
    its declaration, given to each of ``commands`` that reads it."""
    return [
        pytest.param(
            commands,
            {**given, prefix + key: value},
            prefix + key,
            value,
            id=f"{'+'.join(commands)}-{prefix}{key}-{value!r}",
        )
        for key, option in options.items()
        for value in outside(option)
    ]


OUTSIDE_CASES = [
    # solo-learn's keys that solo-ext-pretrain hands to torch, Lightning and the host
    *outside_cases(("pretrain",), {**RUN_OPTIONS, **BACKBONE_OPTIONS}),
    # each augmentations entry's keys that solo-ext's pipelines read (crop, scales, colour, ...)
    *outside_cases(("pretrain",), AUGMENTATION_OPTIONS, "augmentations.0."),
    # the data keys, read by every command (given to an evaluation, merged over the run's)
    *outside_cases(("pretrain", *EVAL_COMMANDS), DATA_KEYS),
    # data.sampler, read by solo-ext-pretrain and solo-ext-linear
    *(
        case
        for name, options in SAMPLER_OPTIONS.items()
        for case in outside_cases(
            ("pretrain", "linear"), options, "data.sampler.", **{"data.sampler.name": name}
        )
    ),
    # the evaluation commands' own keys
    *(
        case
        for command in EVAL_COMMANDS
        for case in outside_cases((command,), eval_module(command).OPTIONS)
    ),
]


@pytest.mark.parametrize("commands,given,key,value", OUTSIDE_CASES)
def test_a_key_outside_its_declaration_stops_each_command_that_reads_it(
    commands, given, key, value, tmp_path
):
    """One line naming the key and the value: solo-ext-pretrain's before the run directory
    exists, solo-ext-knn's, -linear's and -dense-probe's before the run is even looked at."""
    shown = list(value) if isinstance(value, list) else value
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for command in commands:
        with pytest.raises(ConfigError) as info:
            if command == "pretrain":
                run(tiny_cfg("scl", tmp_path, **given))
            else:
                eval_module(command).run(eval_cfg(command, run_dir, **given))
        assert str(info.value).startswith(f"{key}={shown!r}: must be "), str(info.value)
        assert "\n" not in str(info.value)
    assert list(tmp_path.rglob("*")) == [run_dir]  # (tiny_cfg's checkpoint.dir: not made)


def refusal_at_start(cfg, tmp_path) -> str:
    """The start's one-line refusal of ``cfg``, before the run directory exists."""
    with pytest.raises(ConfigError) as info:
        run(cfg)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "trained_models").exists()
    return str(info.value)


def test_devices_and_backbone_keywords_stop_the_start(tmp_path):
    """``devices`` is read with the world size (the values outside it in general: the table
    above); ``backbone.kwargs`` beyond solo-ext's own keys go to the backbone's constructor,
    which is tried on the meta device before anything is built."""
    message = refusal_at_start(tiny_cfg("scl", tmp_path, devices="two"), tmp_path)
    assert message.startswith("devices='two': must be a count"), message
    cfg = tiny_cfg("scl", tmp_path)
    cfg.backbone.kwargs = {"widht": 2}
    message = refusal_at_start(cfg, tmp_path)
    assert message.startswith("backbone.kwargs={'widht': 2}: not taken by backbone.name="), message


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
    cfg = tiny_cfg("scl", tmp_path)
    cfg.optimizer.kwargs = kwargs
    message = refusal_at_start(cfg, tmp_path)
    assert message.startswith("optimizer.kwargs=") and refused in message, message
    assert "not taken by optimizer.name='sgd'" in message


def test_a_crop_scale_range_upside_down_stops_the_start(tmp_path):
    cfg = tiny_cfg("scl", tmp_path, **{"augmentations.0.rrc.crop_min_scale": 0.9})
    cfg.augmentations[0].rrc.crop_max_scale = 0.5
    with pytest.raises(ConfigError, match=r"^augmentations.0.rrc.crop_min_scale=0.9: above "):
        parse_cfg(cfg)
