"""Every config under scripts/ composes by the name the search-path plugin gives it
(``cifar100-lt/dscl``, ``dscl.yaml``), with its own augmentation files, and passes solo-ext's
checks as shipped; the linear configs run; the plugin serves each script its configs.

With the real solo-learn importable, tests/test_solo_learn_scripts.py passes the same configs
through solo-learn's own ``parse_cfg`` and scripts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, tiny_cfg
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from solo_ext import knn, linear
from solo_ext.data.datasets import SPLIT_FILE_DATASETS
from solo_ext.pretrain import parse_cfg, run

SCRIPTS = ROOT / "scripts"


def configs(kind: str) -> list[str]:
    """Config names as Hydra finds them on the plugin's search path (``scripts/<kind>``)."""
    root = SCRIPTS / kind
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.glob("*.yaml")) + sorted(
        str(p.relative_to(root).with_suffix("")) for p in root.glob("*/*.yaml")
    )


def compose_config(kind: str, name: str, overrides: list[str] = ()):
    with initialize_config_dir(config_dir=str(SCRIPTS / kind), version_base="1.2"):
        return compose(config_name=name, overrides=list(overrides))


def data_overrides(dataset: str, root: Path) -> list[str]:
    """Points a config at tiny stand-ins for data that is not on this machine (existing keys
    only: the configs are otherwise used as shipped)."""
    if dataset.startswith("cifar"):
        return ["++data.download=true"]  # skips the folder check; nothing is downloaded here
    if dataset in SPLIT_FILE_DATASETS:
        _, train_file, val_file = SPLIT_FILE_DATASETS[dataset]
        for name in (train_file, val_file):
            (root / name).write_text("train/a/0.jpg 0\n")
        return [f"data.train_path={root}"]
    if dataset in ("custom", "custom_lt", "imagenet100"):
        for split in ("train", "val"):
            for c in range(100):
                (root / split / f"class{c:03d}").mkdir(parents=True)
                (root / split / f"class{c:03d}" / "0.jpg").touch()  # not read by parse_cfg
        return [f"data.train_path={root / 'train'}", f"data.val_path={root / 'val'}"]
    return []


def test_every_dataset_config_has_a_short_name_and_solo_learns_keys():
    pretrain = configs("pretrain")
    methods = {Path(n).name for n in pretrain if "/" in n}
    assert methods == {"scl", "dscl", "pbsd", "densecl", "all4one_ct"}
    assert methods <= set(pretrain)  # python main_pretrain.py --config-name <method>.yaml
    for kind in ("pretrain", "linear"):
        for path in (SCRIPTS / kind).glob("*/*.yaml"):
            raw = OmegaConf.load(path)
            for key in ("strategy", "devices", "accelerator", "precision", "wandb.enabled"):
                assert OmegaConf.select(raw, key) is not None, f"{path}: no {key}"
            assert raw.data.format == "image_folder", path
            assert path.read_text().startswith("# @package _global_\n"), path


def test_augmentation_files_are_solo_exts_own():
    """A config copied into a solo-learn config folder must not pick up solo-learn's
    ``augmentations/symmetric.yaml`` silently: solo-ext's files have names of their own."""
    for path in SCRIPTS.glob("pretrain/*/augmentations/*.yaml"):
        assert path.name.startswith("ext_"), path
    for path in SCRIPTS.glob("pretrain/*/*.yaml"):
        defaults = yaml.safe_load(path.read_text())["defaults"]
        augs = [
            d["augmentations"] for d in defaults if isinstance(d, dict) and "augmentations" in d
        ]
        assert len(augs) == 1 and (path.parent / "augmentations" / augs[0]).is_file(), path


@pytest.mark.parametrize("name", configs("pretrain"))
def test_pretrain_config(name: str, tmp_path):
    dataset = compose_config("pretrain", name).data.dataset
    cfg = parse_cfg(compose_config("pretrain", name, data_overrides(dataset, tmp_path)))
    assert cfg.method == Path(name).name
    assert cfg.data.num_large_crops == 2
    assert cfg.backbone.name in ("resnet18", "cifar_resnet32", "resnet50")
    assert len(cfg.augmentations) >= 1  # its own augmentation file, at the global package


def test_short_names_are_the_dataset_configs():
    for method in ("scl", "dscl", "pbsd", "densecl", "all4one_ct"):
        folder = "cifar" if method in ("densecl", "all4one_ct") else "cifar100-lt"
        short = compose_config("pretrain", f"{method}.yaml")
        assert short == compose_config("pretrain", f"{folder}/{method}")
    assert compose_config("linear", "dscl.yaml") == compose_config("linear", "cifar100-lt/dscl")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    return Path(run(tiny_cfg("scl", tmp_path_factory.mktemp("configs")))["run_dir"])


@pytest.mark.parametrize("name", configs("linear"))
def test_linear_config_keys(name: str):
    """solo-learn's linear keys (main_linear.py reads them) and solo-ext-linear's own."""
    cfg = compose_config("linear", name)
    defaults = OmegaConf.load(ROOT / "solo_ext" / "conf" / "linear.yaml")
    unknown = set(cfg) - set(defaults) - set(linear.SOLO_LINEAR_KEYS)
    assert unknown == {"pretrained_feature_extractor"}, unknown
    assert OmegaConf.is_missing(cfg, "pretrained_feature_extractor")
    assert cfg.data.sampler.name == "class_balanced"


def test_linear_config_runs_with_solo_ext_linear(tiny_run):
    (ckpt,) = tiny_run.glob("*.ckpt")
    cfg = compose_config(
        "linear",
        "synthetic-lt/dscl",
        # Hydra's grammar needs the quotes: solo-learn's checkpoint names hold '='
        [f"pretrained_feature_extractor='{ckpt}'", "max_epochs=1", "backbone.name=resnet18"],
    )
    OmegaConf.update(cfg, "data.num_classes", 4)  # the tiny run's data
    OmegaConf.update(cfg, "data.synthetic.n_max", 24)
    metrics = linear.run(cfg)
    assert 0 <= metrics["linear_acc1"] <= 100 and metrics["linear_sampler"] == "class_balanced"


@pytest.mark.parametrize("name", configs("knn"))
def test_knn_config_runs(name: str, tiny_run):
    defaults = OmegaConf.load(ROOT / "solo_ext" / "conf" / "knn.yaml")
    cfg = compose_config("knn", name, [f"pretrained_checkpoint_dir={tiny_run}"])
    assert not set(cfg) - set(defaults), "keys solo-ext-knn does not read"
    assert 0 <= knn.run(cfg)["knn_acc1"] <= 100


def test_search_path_plugin_serves_each_script_its_configs():
    from hydra.core.plugins import Plugins
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    from hydra_plugins.solo_ext_configs import SoloExtSearchPathPlugin, configs_for

    assert SoloExtSearchPathPlugin in Plugins.instance().discover(SearchPathPlugin)
    assert configs_for("/x/solo-learn/main_pretrain.py") == SCRIPTS / "pretrain"
    assert configs_for("main_linear.py") == SCRIPTS / "linear"
    assert configs_for("solo-ext-pretrain") == SCRIPTS / "pretrain"
    assert configs_for("my_own_app.py") is None  # other Hydra applications are left alone


def test_config_name_without_config_path(tmp_path):
    """The plugin at work in a real Hydra application, from a directory with no configs."""
    exe = Path(sys.executable).parent / "solo-ext-pretrain"
    cmd = [str(exe), "--config-name", "synthetic-lt/dscl", "--cfg", "job"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["method"] == "dscl" and cfg["augmentations"][0]["crop_size"] == 32
    off = subprocess.run(
        cmd,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SOLO_EXT_AUTOLOAD": "0"},
    )
    assert off.returncode != 0 and "synthetic-lt/dscl" in off.stderr
