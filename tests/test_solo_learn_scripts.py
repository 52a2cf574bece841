"""solo-learn's own, unmodified scripts with solo-ext's methods (only with the real solo-learn).

``main_pretrain.py`` trains a solo-ext method picked by name from ``solo.methods.METHODS`` (the
start-up hook registered it), ``main_linear.py`` evaluates the checkpoint, and solo-ext's kNN
evaluation reads the same solo-learn run directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import METHOD_NAMES, eval_cfg, tiny_cfg
from omegaconf import OmegaConf

from solo_ext import make_lt
from solo_ext.host import HOST

if HOST != "solo":
    pytest.skip("needs the real solo-learn importable", allow_module_level=True)

import solo  # noqa: E402

SOLO_ROOT = Path(os.environ.get("SOLO_LEARN_DIR", Path(solo.__file__).resolve().parents[1]))
if not (SOLO_ROOT / "main_pretrain.py").is_file():
    pytest.skip(
        f"no main_pretrain.py in {SOLO_ROOT} (set SOLO_LEARN_DIR to solo-learn's checkout)",
        allow_module_level=True,
    )

TRAINER = {
    "max_epochs": 1,
    "limit_train_batches": 2,
    "limit_val_batches": 1,
    "num_sanity_val_steps": 0,
    "accelerator": "cpu",
    "devices": "1",
    "enable_progress_bar": False,
    "precision": 32,
    "strategy": "auto",
}
QUIET = {
    "defaults": [
        "_self_",
        {"override hydra/hydra_logging": "disabled"},
        {"override hydra/job_logging": "disabled"},
    ],
    "hydra": {"output_subdir": None, "run": {"dir": "."}},
}


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory) -> Path:
    """A long-tailed subset written by solo-ext-make-lt, which solo-learn reads as ``custom``.

    6 classes: solo-learn's linear model computes acc@5 and needs at least 5.
    """
    root = tmp_path_factory.mktemp("custom") / "synthetic-lt"
    make_lt.run(
        [
            "--dataset",
            "synthetic_lt",
            "--num_classes",
            "6",
            "--imbalance_factor",
            "4",
            "--out",
            str(root),
        ]
    )
    return root


def _solo(script: str, cfg: dict, tmp: Path) -> subprocess.CompletedProcess:
    cfg_dir = tmp / f"cfg-{script}"
    cfg_dir.mkdir()
    (cfg_dir / "run.yaml").write_text(yaml.safe_dump({**QUIET, **cfg}))
    proc = subprocess.run(
        [
            sys.executable,
            str(SOLO_ROOT / script),
            "--config-path",
            str(cfg_dir),
            "--config-name",
            "run.yaml",
        ],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_main_pretrain_then_linear_and_knn(method, image_folder, tmp_path):
    data = {
        "dataset": "custom",
        "train_path": str(image_folder / "train"),
        "val_path": str(image_folder / "val"),
        "format": "image_folder",
        "num_workers": 0,
    }
    # the suite's tiny config, in solo-learn's form: its data, trainer and resume keys
    cfg = OmegaConf.to_container(tiny_cfg(method, tmp_path))
    cfg.update(
        name=f"solo-{method}",
        data=data,
        auto_resume={"enabled": False},
        wandb={"enabled": False},
        **TRAINER,
    )
    _solo("main_pretrain.py", cfg, tmp_path)
    (run_dir,) = (tmp_path / "trained_models" / method).iterdir()
    (ckpt,) = run_dir.glob("*.ckpt")
    assert json.loads((run_dir / "args.json").read_text())["method"] == method

    _solo(
        "main_linear.py",
        {
            "name": f"solo-{method}-linear",
            "pretrained_feature_extractor": str(ckpt),
            "backbone": {"name": "resnet18"},
            "pretrain_method": method,
            "data": data,
            "optimizer": {"name": "sgd", "batch_size": 8, "lr": 0.1, "weight_decay": 0},
            "scheduler": {"name": "step", "lr_decay_steps": [1]},
            "checkpoint": {"enabled": False},
            "auto_resume": {"enabled": False},
            "wandb": {"enabled": False},
            **TRAINER,
        },
        tmp_path,
    )

    from solo_ext import knn

    metrics = knn.run(eval_cfg("knn", run_dir, k=3))
    assert 0 <= metrics["knn_acc1"] <= 100 and metrics["num_val"] == 6 * 20
