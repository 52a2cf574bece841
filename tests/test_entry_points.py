"""One check of solo-ext's keys for both entry points: the same config is refused by
solo-ext-pretrain's ``parse_cfg`` and by solo-learn's (``main_pretrain.py``'s, through the plugin's
patches) in the same one line, before any work; a config of solo-learn's alone is left to
solo-learn's own checks.
"""

from __future__ import annotations

import copy

import pytest
from conftest import outside
from omegaconf import OmegaConf
from test_configs import compose_config

from solo_ext.commands.pretrain import parse_cfg
from solo_ext.config import ConfigError

CPU = ["accelerator=cpu", "sync_batchnorm=False", "precision=32"]
BAD = [
    (["devices=0"], "devices=0: must be a count"),
    (['devices="0"'], "devices='0': must be a count"),
    (["devices=[]"], "devices=[]: must be a count"),
    (["devices=-2"], "devices=-2: must be a count"),
    (['devices="0,x"'], "devices='0,x': must be a count"),
    (["+dali.devise=cpu"], "dali.devise='cpu': unknown key (did you mean 'device'?)"),
    (["dali.encode_indexes_into_labels=maybe"], "dali.encode_indexes_into_labels='maybe': must be"),
    (["dali.device=tpu"], "dali.device='tpu': must be one of ['cpu', 'gpu']"),
    (
        ["+data.no_labels=true", "+data.sampler.name=class_balanced"],
        "data.sampler.name='class_balanced' with data.no_labels=true: the samplers draw by class",
    ),
]


def solo_learn_parse_cfg(cfg):
    from solo.args.pretrain import parse_cfg as solo_parse_cfg

    from solo_ext.methods.registry import register

    register()
    return solo_parse_cfg(cfg)


ENTRY_POINTS = {"solo-ext-pretrain": parse_cfg, "main_pretrain.py": solo_learn_parse_cfg}
# main_pretrain.py's parse_cfg is the real solo-learn's
ENTRIES = ["solo-ext-pretrain", pytest.param("main_pretrain.py", marks=pytest.mark.solo_learn)]


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("overrides, message", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_both_entry_points_refuse_alike(entry, overrides, message):
    cfg = compose_config("pretrain", "synthetic-lt/dscl", CPU + overrides)
    with pytest.raises(ConfigError) as info:
        ENTRY_POINTS[entry](cfg)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.solo_learn
def test_a_config_of_solo_learns_alone_is_left_to_its_checks():
    """A bad ``dali`` key in a config naming nothing of solo-ext: solo-learn's parse_cfg decides
    (it ignores the key), not the patches."""
    cfg = compose_config("pretrain", "synthetic-lt/dscl", CPU + ["+dali.devise=cpu"])
    cfg.method, cfg.data.dataset = "simclr", "cifar10"
    cfg.data.train_path = cfg.data.val_path = "."
    cfg.method_kwargs = {"proj_hidden_dim": 32, "proj_output_dim": 16, "temperature": 0.2}
    out = solo_learn_parse_cfg(cfg)
    assert out.dali.devise == "cpu"


def declared_cases() -> list[tuple[str, dict, str, object]]:
    """(method, overrides, key, value): each key solo-ext declares (every method's
    ``method_kwargs``, each sampler's ``data.sampler`` keys, its datasets' ``data`` keys) with
    each value just outside its declaration (``conftest.outside``)."""
    from solo_ext.data.options import DATA_KEYS
    from solo_ext.data.samplers import SAMPLER_OPTIONS
    from solo_ext.host import METHODS
    from solo_ext.methods.registry import SOLO_EXT_METHODS, register

    register()
    cases = [
        (method, {f"method_kwargs.{key}": value}, f"method_kwargs.{key}", value)
        for method in sorted(SOLO_EXT_METHODS)
        for key, option in METHODS[method].METHOD_KWARGS.items()
        for value in outside(option)
    ]
    cases += [
        (
            "scl",
            {"data.sampler.name": name, f"data.sampler.{key}": value},
            f"data.sampler.{key}",
            value,
        )
        for name, options in SAMPLER_OPTIONS.items()
        for key, option in options.items()
        for value in outside(option)
    ]
    return cases + [
        ("scl", {key: value}, key, value)
        for key, option in DATA_KEYS.items()
        for value in outside(option)
    ]


# every case through main_pretrain.py; through solo-ext-pretrain the method keys (the data and
# sampler keys' are test_schema.py's, through every command)
DECLARED = [
    pytest.param(entry, *case, id=f"{case[0]}-{case[2]}-{case[3]!r}-{entry}", marks=marks)
    for case in declared_cases()
    for entry, marks in (("solo-ext-pretrain", ()), ("main_pretrain.py", pytest.mark.solo_learn))
    if entry == "main_pretrain.py" or case[2].startswith("method_kwargs.")
]
BASES: dict = {}


@pytest.mark.parametrize("entry, method, given, key, value", DECLARED)
def test_a_value_outside_a_declared_key_is_one_line_naming_both(entry, method, given, key, value):
    """The start refuses it before any work, in one line that begins with the key and the value
    (``<key>=<value>: must be ...``; solo-learn's main_pretrain.py prints it after its name)."""
    base = BASES.setdefault(method, compose_config("pretrain", f"synthetic-lt/{method}", CPU))
    cfg = copy.deepcopy(base)
    for k, v in given.items():
        OmegaConf.update(cfg, k, v, force_add=True)
    with pytest.raises(ConfigError) as info:
        ENTRY_POINTS[entry](cfg)
    shown = list(value) if isinstance(value, list) else value
    assert str(info.value).startswith(f"{key}={shown!r}: must be "), str(info.value)
    assert "\n" not in str(info.value)
