"""One check of solo-ext's keys for both doors: the same config is refused by solo-ext-pretrain's
``parse_cfg`` and by solo-learn's (``main_pretrain.py``'s, through the bridge) in the same one
line, before any work; a config of solo-learn's alone is left to solo-learn's own checks.
solo-learn's door runs where the real solo-learn is importable (skipped elsewhere, saying why).
"""

from __future__ import annotations

import pytest
from test_configs import compose_config

from solo_ext.commands.pretrain import parse_cfg
from solo_ext.config import ConfigError
from solo_ext.host import HOST

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
    if HOST != "solo":
        pytest.skip("main_pretrain.py's parse_cfg needs the real solo-learn importable")
    from solo.args.pretrain import parse_cfg as solo_parse_cfg

    from solo_ext.methods.registry import register

    register()
    return solo_parse_cfg(cfg)


DOORS = {"solo-ext-pretrain": parse_cfg, "main_pretrain.py": solo_learn_parse_cfg}


@pytest.mark.parametrize("door", sorted(DOORS))
@pytest.mark.parametrize("overrides, message", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_both_doors_refuse_alike(door, overrides, message):
    cfg = compose_config("pretrain", "synthetic-lt/dscl", CPU + overrides)
    with pytest.raises(ConfigError) as info:
        DOORS[door](cfg)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_a_config_of_solo_learns_alone_is_left_to_its_checks():
    """A bad ``dali`` key in a config naming nothing of solo-ext: solo-learn's parse_cfg decides
    (it ignores the key), not the bridge."""
    cfg = compose_config("pretrain", "synthetic-lt/dscl", CPU + ["+dali.devise=cpu"])
    cfg.method, cfg.data.dataset = "simclr", "cifar10"
    cfg.data.train_path = cfg.data.val_path = "."
    cfg.method_kwargs = {"proj_hidden_dim": 32, "proj_output_dim": 16, "temperature": 0.2}
    out = solo_learn_parse_cfg(cfg)
    assert out.dali.devise == "cpu"


def every_declared_bad_value():
    """Each declared key's values just outside its declaration (the schema walk of
    test_solo_learn_scripts: every method's method_kwargs, each sampler's keys, the data keys)."""
    from test_solo_learn_scripts import schema_cases

    return schema_cases()


@pytest.mark.skipif(HOST != "solo", reason="needs the real solo-learn importable (both doors)")
def test_every_declared_bad_value_is_refused_in_the_same_words_by_both_doors():
    import copy

    from omegaconf import OmegaConf

    bases = {}
    different = []
    for method, given, key, _ in every_declared_bad_value():
        base = bases.setdefault(method, compose_config("pretrain", f"synthetic-lt/{method}", CPU))
        words = []
        for door in (parse_cfg, solo_learn_parse_cfg):
            cfg = copy.deepcopy(base)
            for k, v in given.items():
                OmegaConf.update(cfg, k, v, force_add=True)
            try:
                door(cfg)
                words.append("<accepted>")
            except ConfigError as err:
                words.append(str(err))
        if words[0] != words[1] or words[0] == "<accepted>":
            different.append((method, key, *words))
    assert not different, different[:5]
