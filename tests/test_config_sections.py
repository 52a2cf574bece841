"""Every shipped config holds every section and key of solo-learn's shipped configs of its kind,
so solo-learn's plain overrides (``auto_resume.enabled=True``, no ``+``) compose with Hydra and
reach both entry points: solo-ext's commands and, with the real solo-learn importable, solo-learn's
own ``parse_cfg``. The keys held at solo-learn's defaults change nothing a config trains.

solo-learn's key paths are read from its shipped configs when its source is here (the pinned
environment: SOLO_LEARN_DIR, or the checkout of the importable ``solo``); otherwise the lists
kept below are used, and where both are here the two must be equal.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import yaml
from conftest import SOLO_LEARN_DIR, stand_in_checkpoint
from omegaconf import OmegaConf
from test_configs import compose_config, configs, data_overrides

from solo_ext.commands import knn, linear
from solo_ext.commands.linear_stage import SGDSchedule
from solo_ext.commands.pretrain import RUN_OPTIONS, parse_cfg
from solo_ext.host import METHODS, BaseMomentumMethod
from solo_ext.host.standalone.optim import LARS
from solo_ext.methods.registry import register
from solo_ext.runs import load as runs

# the key paths of solo-learn's shipped configs: scripts/pretrain/{cifar,imagenet-100}/*.yaml
# with their wandb/ sub-config, and scripts/linear/*/*.yaml; less the keys of one method, one
# backbone or one optimizer (IGNORED_PREFIXES) and the values inside each augmentations entry
SOLO_PRETRAIN_KEYS = frozenset({
    "name", "method", "backbone.name", "augmentations",
    "momentum.base_tau", "momentum.final_tau",  # the momentum methods'
    "data.dataset", "data.train_path", "data.val_path", "data.format", "data.num_workers",
    "optimizer.name", "optimizer.batch_size", "optimizer.lr", "optimizer.classifier_lr",
    "optimizer.weight_decay",
    "scheduler.name", "scheduler.warmup_epochs", "scheduler.min_lr", "scheduler.warmup_start_lr",
    "checkpoint.enabled", "checkpoint.dir", "checkpoint.frequency", "auto_resume.enabled",
    "dali.encode_indexes_into_labels", "wandb.enabled", "wandb.entity", "wandb.project",
    "max_epochs", "devices", "sync_batchnorm", "accelerator", "strategy", "precision",
})  # fmt: skip
SOLO_LINEAR_KEYS = frozenset({
    "name", "pretrained_feature_extractor", "backbone.name", "pretrain_method",
    "data.dataset", "data.train_path", "data.val_path", "data.format", "data.num_workers",
    "optimizer.name", "optimizer.batch_size", "optimizer.lr", "optimizer.weight_decay",
    "scheduler.name", "scheduler.lr_decay_steps",
    "checkpoint.enabled", "checkpoint.dir", "checkpoint.frequency", "auto_resume.enabled",
    "wandb.enabled", "wandb.entity", "wandb.project",
    "max_epochs", "devices", "sync_batchnorm", "accelerator", "strategy", "precision",
})  # fmt: skip
IGNORED_PREFIXES = ("method_kwargs.", "backbone.kwargs.", "optimizer.kwargs.")
# keys of solo-learn's config files that solo-learn's code does not read (one stale file)
STALE_KEYS = frozenset({"augmentations_cfg", "wandb_cfg"})
# optimizer.kwargs by optimizer, at solo-learn's defaults (its parse_cfg fills them): those of
# its configs (LARS's, AdamW's) and the momentum of SGD and LARS; none for Adam
OPTIMIZER_DEFAULTS = {
    "sgd": {"momentum": 0.9},
    "lars": {"momentum": 0.9, "eta": 1e-3, "clip_lr": False, "exclude_bias_n_norm": False},
    "adam": {},
    "adamw": {"betas": [0.9, 0.999]},
}
# keys solo-learn fills with a default when a config lacks them (its parse_cfg, its methods'
# add_and_assert_specific_cfg), held by every shipped config so their overrides need no '+'
PRETRAIN_DEFAULTS = {
    "auto_resume.enabled": False,
    "auto_resume.max_hours": 36,
    "checkpoint.keep_prev": False,
    "dali.device": "gpu",
    "dali.encode_indexes_into_labels": False,
    "performance.disable_channel_last": False,
    "wandb.enabled": False,
    "wandb.entity": None,
    "wandb.project": "solo-learn",
    "wandb.offline": False,
    "seed": 5,
    "resume_from_checkpoint": None,
    "debug_augmentations": False,
    "num_nodes": 1,
    "scheduler.warmup_epochs": 10,
    "scheduler.min_lr": 0.0,
    "scheduler.warmup_start_lr": 3e-5,
}
LINEAR_DEFAULTS = {
    key: PRETRAIN_DEFAULTS[key]
    for key in (
        "auto_resume.enabled", "auto_resume.max_hours", "checkpoint.keep_prev",
        "performance.disable_channel_last", "wandb.enabled", "wandb.entity", "wandb.project",
        "wandb.offline", "seed", "num_nodes",
    )
}  # fmt: skip
DEFAULTS = {"pretrain": PRETRAIN_DEFAULTS, "linear": LINEAR_DEFAULTS}
# a null data path is an absent one (synthetic_lt's data is generated)
NULL_PATHS = {"data.train_path": None, "data.val_path": None}

# the README's overrides for a CPU-only machine (solo-learn's parse_cfg takes len(devices))
CPU = ["accelerator=cpu", 'devices="1"', "sync_batchnorm=False", "precision=32"]


# --- solo-learn's shipped configs ---------------------------------------------------------


SOLO_DIR = SOLO_LEARN_DIR  # solo-learn's checkout (its scripts/ and its source)


def key_paths(node, prefix: str = "") -> set[str]:
    """Dotted paths of a config's leaves (a list, such as ``augmentations``, is one leaf)."""
    paths = set()
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            paths |= key_paths(value, f"{path}.")
        else:
            paths.add(path)
    return paths


def read_solo_learn(pattern: str) -> tuple[set[str], dict[str, set[str]]]:
    """The union of the key paths of solo-learn's configs matching ``pattern`` (each with the
    wandb sub-config its defaults name), and the ``optimizer.kwargs`` keys per optimizer."""
    keys: set[str] = set()
    kwargs: dict[str, set[str]] = {}
    for path in sorted(SOLO_DIR.glob(pattern)):
        raw = yaml.safe_load(path.read_text())
        if not isinstance(raw, dict) or "defaults" not in raw:
            continue  # not a run config
        for entry in raw.pop("defaults"):
            if isinstance(entry, dict) and "wandb" in entry:
                raw["wandb"] = yaml.safe_load((path.parent / "wandb" / entry["wandb"]).read_text())
        raw.pop("hydra", None)
        found = key_paths(raw)
        name = raw["optimizer"]["name"]
        kwargs.setdefault(name, set()).update(
            p.removeprefix("optimizer.kwargs.") for p in found if p.startswith("optimizer.kwargs.")
        )
        keys |= {p for p in found if not p.startswith(IGNORED_PREFIXES)} - STALE_KEYS
    assert keys, f"no configs match {SOLO_DIR / pattern}"
    return keys, kwargs


def solo_learn_keys(kind: str) -> frozenset[str]:
    """solo-learn's key paths of ``kind``: read from its configs when here, else the kept list."""
    if SOLO_DIR is None:
        return SOLO_PRETRAIN_KEYS if kind == "pretrain" else SOLO_LINEAR_KEYS
    if kind == "linear":
        return frozenset(read_solo_learn("scripts/linear/*/*.yaml")[0])
    cifar = read_solo_learn("scripts/pretrain/cifar/*.yaml")[0]
    return frozenset(cifar | read_solo_learn("scripts/pretrain/imagenet-100/*.y*ml")[0])


@pytest.mark.solo_learn
def test_kept_key_lists_are_solo_learns():
    """The lists this file keeps for hosts without solo-learn are those its configs hold now,
    and the keys left out as stale are read nowhere in solo-learn's code."""
    assert solo_learn_keys("pretrain") == SOLO_PRETRAIN_KEYS
    assert solo_learn_keys("linear") == SOLO_LINEAR_KEYS
    for pattern in ("scripts/pretrain/cifar/*.yaml", "scripts/pretrain/imagenet-100/*.y*ml"):
        for name, keys in read_solo_learn(pattern)[1].items():
            assert keys <= set(OPTIMIZER_DEFAULTS[name]), (name, keys)
    sources = [*SOLO_DIR.glob("solo/**/*.py"), *SOLO_DIR.glob("main_*.py")]
    for key in STALE_KEYS:
        read = [p for p in sources if re.search(rf"(?<!\w){key}(?!\w)", p.read_text())]
        assert not read, (key, read)


# --- every section and key ------------------------------------------------------------------


def is_momentum_method(method: str) -> bool:
    register()
    return issubclass(METHODS[method], BaseMomentumMethod)


@pytest.mark.parametrize("kind,name", [(k, n) for k in ("pretrain", "linear") for n in configs(k)])
def test_config_holds_solo_learns_keys(kind, name):
    raw = OmegaConf.to_container(compose_config(kind, name))
    raw.pop("hydra", None)
    have = key_paths(raw)
    want = set(solo_learn_keys(kind)) | set(DEFAULTS[kind])
    if kind == "pretrain" and not is_momentum_method(raw["method"]):
        want -= {"momentum.base_tau", "momentum.final_tau"}
    want |= {f"optimizer.kwargs.{k}" for k in OPTIMIZER_DEFAULTS[raw["optimizer"]["name"]]}
    assert not want - have, f"{name}: no {sorted(want - have)}"


@pytest.mark.parametrize("kind", ["pretrain", "linear"])
def test_keys_solo_learns_configs_lack_hold_its_defaults(kind):
    """The keys held only for their overrides (solo-learn's configs have none of them) are at
    solo-learn's defaults in every shipped config: no recipe sets them."""
    extra = {k: v for k, v in DEFAULTS[kind].items() if k not in solo_learn_keys(kind)}
    assert extra  # (auto_resume.max_hours, checkpoint.keep_prev, wandb.offline, ...)
    for name in configs(kind):
        cfg = compose_config(kind, name)
        for key, value in extra.items():
            assert OmegaConf.select(cfg, key) == value, (name, key)


def test_defaults_are_solo_exts_declared_ones():
    """solo-ext reads each key held at solo-learn's default with that same default."""
    for key, value in PRETRAIN_DEFAULTS.items():
        if key in RUN_OPTIONS:
            assert RUN_OPTIONS[key].default == value, key
    assert RUN_OPTIONS["optimizer.kwargs.momentum"].default == OPTIMIZER_DEFAULTS["sgd"]["momentum"]
    assert linear.OPTIONS["optimizer.kwargs.momentum"].default == 0.9
    lars = inspect.signature(LARS.__init__).parameters
    for key, value in OPTIMIZER_DEFAULTS["lars"].items():
        if key != "momentum":  # (LARS's own is 0; parse_cfg fills solo-learn's 0.9)
            assert lars[key].default == value, key


# --- solo-learn's plain overrides, through both entry points -----------------------------


def paths_for(dataset: str, tmp_path: Path) -> tuple[list[str], str, str]:
    """test_configs' stand-in data for ``dataset``: its other overrides, and the training and
    validation paths (given here as plain overrides)."""
    overrides = data_overrides(dataset, tmp_path)
    keys = ("data.train_path", "data.val_path")
    given = dict(o.split("=", 1) for o in overrides if o.split("=", 1)[0] in keys)
    train = given.get("data.train_path", str(tmp_path))
    rest = [o for o in overrides if o.split("=", 1)[0] not in keys]
    return rest, train, given.get("data.val_path", train)


# solo-learn's plain overrides of keys both kinds of config hold, with the values they set
PLAIN = {
    "auto_resume.enabled": True,
    "auto_resume.max_hours": 12,
    "optimizer.kwargs.momentum": 0.95,
    "checkpoint.dir": "elsewhere",
    "checkpoint.keep_prev": True,
    "wandb.enabled": True,
    "wandb.entity": "me",
    "wandb.project": "lt",
    "wandb.offline": True,
    "performance.disable_channel_last": True,
    "seed": 7,
}


def plain_pretrain(cfg_name: str, tmp_path: Path) -> tuple[list[str], dict]:
    """solo-learn's plain overrides, for a pretraining config, with the values they set."""
    raw = compose_config("pretrain", cfg_name)
    rest, train, val = paths_for(raw.data.dataset, tmp_path)
    ckpt = tmp_path / "last.ckpt"
    ckpt.touch()
    values = {
        **PLAIN,
        "data.train_path": train,
        "data.val_path": val,
        "checkpoint.dir": str(tmp_path / "runs"),
        "checkpoint.frequency": 2,
        "dali.device": "cpu",
        "debug_augmentations": True,
        "resume_from_checkpoint": str(ckpt),
        "scheduler.warmup_epochs": 2,
        "scheduler.min_lr": 0.001,
    }
    if raw.optimizer.name == "lars":
        values["optimizer.kwargs.eta"] = 0.01
    return rest + [f"{k}={v}" for k, v in values.items()], values


def assert_values(cfg, values: dict) -> None:
    for key, value in values.items():
        assert OmegaConf.select(cfg, key) == value, key


def solo_learn_pretrain(cfg):
    """solo-learn's parse_cfg, then the method's defaults as its model fills them."""
    from solo.args.pretrain import parse_cfg as solo_parse_cfg

    cfg = solo_parse_cfg(cfg)
    return register()[cfg.method].add_and_assert_specific_cfg(cfg)  # (scheduler, performance)


# solo-ext-pretrain's parse_cfg and, with the real solo-learn, main_pretrain.py's
PRETRAIN_ENTRIES = [
    pytest.param(parse_cfg, id="solo-ext-pretrain"),
    pytest.param(solo_learn_pretrain, id="main_pretrain.py", marks=pytest.mark.solo_learn),
]


@pytest.mark.parametrize("entry", PRETRAIN_ENTRIES)
@pytest.mark.parametrize("name", configs("pretrain"))
def test_plain_overrides_reach_pretraining(name, entry, tmp_path):
    overrides, values = plain_pretrain(name, tmp_path)
    cfg = entry(compose_config("pretrain", name, CPU + overrides))
    assert cfg.method == {"gpaco": "paco"}.get(Path(name).name, Path(name).name)
    assert_values(cfg, values)


class Reached(Exception):
    """The evaluation got as far as reading the run: every check of the config is behind it."""


@pytest.fixture
def stop_at_the_run(monkeypatch):
    def load_run(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(runs, "load_run", load_run)


def plain_linear(name: str, tmp_path: Path) -> tuple[list[str], dict]:
    rest, train, val = paths_for(compose_config("linear", name).data.dataset, tmp_path)
    ckpt = stand_in_checkpoint(tmp_path)
    values = {**PLAIN, "data.train_path": train, "data.val_path": val}
    overrides = rest + [f"{k}={v}" for k, v in values.items()]
    return overrides + [f"pretrained_feature_extractor={ckpt}"], values


@pytest.mark.parametrize("name", configs("linear"))
def test_plain_overrides_reach_solo_ext_linear(name, tmp_path, stop_at_the_run, monkeypatch):
    # the recipes that ask for the GPU pass their checks where torch sees one
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    overrides, values = plain_linear(name, tmp_path)
    cfg = compose_config("linear", name, overrides)
    with pytest.raises(Reached):
        linear.run(cfg)
    assert_values(cfg, values)
    assert SGDSchedule.from_cfg(cfg).momentum == 0.95


@pytest.mark.parametrize("name", configs("knn"))
def test_plain_data_paths_reach_solo_ext_knn(name, tmp_path, stop_at_the_run):
    """solo-ext-knn's configs (solo-learn's main_knn.py takes flags, not configs) take the data
    paths plain; left null, the run's are used."""
    paths = [f"data.train_path={tmp_path}", f"data.val_path={tmp_path}"]
    cfg = compose_config("knn", name, [f"pretrained_checkpoint_dir={tmp_path}", *paths])
    with pytest.raises(Reached):
        knn.run(cfg)
    assert cfg.data.train_path == cfg.data.val_path == str(tmp_path)


@pytest.mark.parametrize("given", [False, True])
def test_knn_configs_null_paths_are_the_runs(given, tmp_path, monkeypatch):
    from torch import nn

    pre = {"method": "scl", "backbone": {"name": "resnet18"}, "data": {"dataset": "synthetic_lt"}}
    pre["data"].update(train_path="/run/train", val_path="/run/val", num_classes=4)
    ckpt = tmp_path / "last.ckpt"
    monkeypatch.setattr(runs, "load_run", lambda *a: (nn.Identity(), OmegaConf.create(pre), ckpt))
    overrides = [f"pretrained_checkpoint_dir={tmp_path}"]
    if given:
        overrides += ["data.train_path=/here/train", "data.val_path=/here/val"]
    _, pre_cfg, _ = runs.load_for_eval(compose_config("knn", "synthetic-lt/scl", overrides))
    where = "/here" if given else "/run"
    assert (pre_cfg.data.train_path, pre_cfg.data.val_path) == (f"{where}/train", f"{where}/val")


@pytest.mark.solo_learn
@pytest.mark.parametrize("name", configs("linear"))
def test_plain_overrides_reach_solo_learns_linear_parse_cfg(name, tmp_path):
    from solo.args.linear import parse_cfg as solo_parse_cfg

    overrides, values = plain_linear(name, tmp_path)
    cfg = solo_parse_cfg(compose_config("linear", name, CPU + overrides))
    assert cfg.data.sampler.name == "class_balanced"  # (every linear recipe's)
    assert_values(cfg, values)


# --- held at solo-learn's defaults: nothing a config trains changes --------------------------

ABSENT = object()


def strip_defaults(cfg, defaults: dict) -> list[str]:
    """Deletes the keys of ``cfg`` that hold their default (and sections left empty), as the
    configs were without them; returns the deleted keys."""
    gone = []
    for key, value in defaults.items():
        if OmegaConf.select(cfg, key, default=ABSENT) == value:
            *parents, leaf = key.split(".")
            section = OmegaConf.select(cfg, ".".join(parents)) if parents else cfg
            del section[leaf]
            gone.append(key)
            while parents and not OmegaConf.select(cfg, ".".join(parents)):
                *parents, leaf = parents
                del (OmegaConf.select(cfg, ".".join(parents)) if parents else cfg)[leaf]
    return gone


def fill(cfg, defaults: dict, keys: list[str]) -> list[str]:
    """Sets each of ``keys`` that ``cfg`` lacks to its default; returns those set."""
    filled = [k for k in keys if OmegaConf.select(cfg, k, default=ABSENT) is ABSENT]
    for key in filled:
        OmegaConf.update(cfg, key, defaults[key], force_add=True)
    return filled


def pretrain_defaults(cfg) -> dict:
    kwargs = OPTIMIZER_DEFAULTS[cfg.optimizer.name]
    return {
        **PRETRAIN_DEFAULTS,
        **NULL_PATHS,
        **{f"optimizer.kwargs.{k}": v for k, v in kwargs.items()},
    }


def with_and_without_defaults(kind: str, name: str, overrides: list[str], entry):
    """``entry point`` (a parse_cfg) on the config as shipped and without the keys it holds at their
    defaults; returns both results, the deleted keys, and those the entry point does not fill."""
    full = compose_config(kind, name, overrides)
    stripped = compose_config(kind, name, overrides)
    defaults = pretrain_defaults(full) if kind == "pretrain" else {**LINEAR_DEFAULTS, **NULL_PATHS}
    if kind == "linear":
        defaults["optimizer.kwargs.momentum"] = OPTIMIZER_DEFAULTS["sgd"]["momentum"]
    OmegaConf.set_struct(stripped, False)
    gone = strip_defaults(stripped, defaults)
    full, stripped = entry(full), entry(stripped)
    not_filled = fill(stripped, defaults, gone)
    return OmegaConf.to_container(full), OmegaConf.to_container(stripped), gone, not_filled


@pytest.mark.parametrize("entry", PRETRAIN_ENTRIES)
@pytest.mark.parametrize("name", configs("pretrain"))
def test_keys_at_defaults_change_nothing_in_pretraining(name, entry, tmp_path):
    """Without them each entry point fills the same values itself (solo-learn: its parse_cfg,
    then the method's defaults as its model does): the values held are solo-learn's defaults."""
    dataset = compose_config("pretrain", name).data.dataset
    overrides = CPU + data_overrides(dataset, tmp_path)
    full, stripped, gone, not_filled = with_and_without_defaults("pretrain", name, overrides, entry)
    assert "auto_resume.max_hours" in gone and "optimizer.kwargs.momentum" in gone
    assert full == stripped
    if entry is solo_learn_pretrain:
        from solo.args import pretrain as solo_args

        # solo-learn leaves a lacking data.train_path lacking, and the dali section too where
        # DALI is not installed (it fills that section only when it can import its DALI loader);
        # everything else it fills
        unfilled = {"data.train_path"}
        if not solo_args._dali_available:
            unfilled |= {k for k in gone if k.startswith("dali.")}
        assert set(not_filled) <= unfilled, not_filled


@pytest.mark.solo_learn
@pytest.mark.parametrize("name", configs("linear"))
def test_keys_at_defaults_change_nothing_in_solo_learns_linear_parse_cfg(name, tmp_path):
    from solo.args.linear import parse_cfg as solo_parse_cfg

    ckpt = stand_in_checkpoint(tmp_path)
    dataset = compose_config("linear", name).data.dataset
    overrides = CPU + data_overrides(dataset, tmp_path) + [f"pretrained_feature_extractor={ckpt}"]
    full, stripped, gone, not_filled = with_and_without_defaults(
        "linear", name, overrides, solo_parse_cfg
    )
    assert full == stripped
    # (performance: filled by solo-learn's linear model when it is built)
    assert set(not_filled) <= {"data.train_path", "performance.disable_channel_last"}, not_filled


@pytest.mark.solo_learn
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZER_DEFAULTS))
def test_optimizer_defaults_are_solo_learns(optimizer, tmp_path):
    """What solo-learn's parse_cfg fills into an empty ``optimizer.kwargs`` per optimizer."""
    from solo.args.pretrain import parse_cfg as solo_parse_cfg

    overrides = CPU + [f"optimizer.name={optimizer}", "~optimizer.kwargs"]
    cfg = solo_parse_cfg(compose_config("pretrain", "synthetic-lt/dscl", overrides))
    assert OmegaConf.to_container(cfg.optimizer.kwargs) == OPTIMIZER_DEFAULTS[optimizer]
