"""Every config under scripts/ composes with Hydra and passes the checks; the evaluation
configs also run on a tiny pretrained run."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT, tiny_cfg
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from solo_ext import knn, linear
from solo_ext.data.datasets import SPLIT_FILE_DATASETS
from solo_ext.pretrain import parse_cfg, run


def _configs(kind: str) -> list[Path]:
    return sorted(p for p in (ROOT / "scripts" / kind).glob("*/*.yaml"))


def _compose(path: Path, overrides: list[str] = ()):
    with initialize_config_dir(config_dir=str(path.parent), version_base="1.2"):
        return compose(config_name=path.name, overrides=list(overrides))


def _ids(paths):
    return [f"{p.parent.name}/{p.name}" for p in paths]


def _data_overrides(dataset: str, root: Path) -> list[str]:
    """Points a config at tiny stand-ins for data that is not on this machine."""
    if dataset.startswith("cifar"):
        return ["+data.download=true"]  # skips the path check; nothing is downloaded here
    if dataset in SPLIT_FILE_DATASETS:
        _, train_file, val_file = SPLIT_FILE_DATASETS[dataset]
        for name in (train_file, val_file):
            (root / name).write_text("train/a/0.jpg 0\n")
        return [f"data.train_path={root}"]
    if dataset in ("custom", "custom_lt"):
        for split in ("train", "val"):
            for c in range(100):
                (root / split / f"class{c:03d}").mkdir(parents=True)
                (root / split / f"class{c:03d}" / "0.jpg").touch()  # not read by parse_cfg
        return [f"data.train_path={root / 'train'}", f"data.val_path={root / 'val'}"]
    return []


@pytest.mark.parametrize("path", _configs("pretrain"), ids=_ids(_configs("pretrain")))
def test_pretrain_config(path: Path, tmp_path):
    dataset = OmegaConf.load(path).data.dataset
    cfg = parse_cfg(_compose(path, _data_overrides(dataset, tmp_path)))
    assert cfg.method == path.stem
    assert cfg.data.num_large_crops == 2 and cfg.backbone.name in (
        "resnet18",
        "resnet32",
        "resnet50",
    )


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    return Path(run(tiny_cfg("scl", tmp_path_factory.mktemp("configs")))["run_dir"])


EVAL_CONFIGS = _configs("linear") + _configs("knn")


@pytest.mark.parametrize(
    "path",
    EVAL_CONFIGS,
    ids=[f"{p.parts[-3]}/{i}" for p, i in zip(EVAL_CONFIGS, _ids(EVAL_CONFIGS))],
)
def test_eval_config_runs(path: Path, tiny_run):
    kind = path.parts[-3]
    defaults = OmegaConf.load(ROOT / "solo_ext" / "conf" / f"{kind}.yaml")
    cfg = _compose(path, [f"pretrained_checkpoint_dir={tiny_run}"])
    unknown = set(cfg) - set(defaults)
    assert not unknown, f"keys the CLI does not read: {unknown}"
    if kind == "linear":
        cfg.max_epochs, cfg.accelerator = 1, "cpu"
        metrics = linear.run(cfg)
    else:
        metrics = knn.run(cfg)
    assert 0 <= metrics[f"{kind}_acc1"] <= 100
