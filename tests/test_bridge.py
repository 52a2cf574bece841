"""solo_ext.bridge on stand-ins of solo-learn's modules, so that CI (which cannot install
solo-learn) checks what the bridge adds; tests/test_solo_learn_scripts.py runs the real scripts.
"""

from __future__ import annotations

import sys
import types

import pytest
from conftest import tiny_cfg
from omegaconf import OmegaConf
from torchvision.transforms.functional import to_tensor

from solo_ext import _autoload, bridge
from solo_ext.data.longtail import lt_counts
from solo_ext.data.samplers import build_sampler


@pytest.fixture(autouse=True)
def no_run():
    yield
    bridge.RUN = None


def stand_in_args() -> types.ModuleType:
    """``solo.args.pretrain``'s contract: a dataset list it asserts on, a class-count table,
    and a ``parse_cfg`` that fills the class count from it."""
    module = types.ModuleType("solo.args.pretrain")
    module._SUPPORTED_DATASETS = ["cifar10", "custom"]
    module._N_CLASSES_PER_DATASET = {"cifar10": 10}

    def parse_cfg(cfg):
        assert cfg.data.dataset in module._SUPPORTED_DATASETS
        cfg.data.num_classes = module._N_CLASSES_PER_DATASET.get(cfg.data.dataset, 1)
        return cfg

    module.parse_cfg = parse_cfg
    bridge.patch(module)
    return module


def synthetic_cfg(**data):
    return OmegaConf.create(
        {
            "seed": 3,
            "max_epochs": 2,
            "backbone": {"name": "resnet18"},
            "data": {
                "dataset": "synthetic_lt",
                "num_classes": 5,
                "imbalance_factor": 4,
                "synthetic": {"n_max": 16, "val_per_class": 2},
                **data,
            },
        }
    )


def test_hook_and_bridge_name_the_same_modules():
    assert set(_autoload._BRIDGED) == set(bridge.PATCHES)


def test_parse_cfg_takes_solo_exts_dataset_and_fills_what_the_run_needs():
    module = stand_in_args()
    cfg = module.parse_cfg(synthetic_cfg(sampler={"name": "class_balanced"}))
    assert "synthetic_lt" in module._SUPPORTED_DATASETS
    assert cfg.data.num_classes == 5  # solo-ext's count, not solo-learn's folder count
    assert cfg.data.train_class_counts == lt_counts(16, 5, 4)
    assert cfg.backbone.kwargs.small_image_stem is True
    assert bridge.RUN.sampler == {"name": "class_balanced", "seed": 3}


@pytest.mark.parametrize(
    "data,message",
    [
        ({"sampler": {"name": "clas_balancd"}}, "(did you mean 'class_balanced'?)"),
        ({"sampler": {"name": "sqrt", "powr": 1}}, "data.sampler.powr=1"),
        ({"format": "dali"}, "data.dataset='synthetic_lt' with data.format='dali'"),
        ({"imbalance_factor": 0.5}, "data.imbalance_factor=0.5"),
    ],
)
def test_parse_cfg_errors_are_one_line(data, message, capsys):
    module = stand_in_args()
    with pytest.raises(SystemExit) as stop:
        module.parse_cfg(synthetic_cfg(**data))
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"{bridge._prog()}: error: ") and message in line
    assert bridge.RUN is None


def test_loaders_build_the_dataset_and_draw_with_the_sampler():
    stand_in_args().parse_cfg(synthetic_cfg(sampler={"name": "class_balanced"}))
    module = types.ModuleType("solo.data.pretrain_dataloader")
    module.build_transform_pipeline = lambda dataset, cfg: None
    module.prepare_datasets = lambda *args, **kwargs: pytest.fail("solo-learn's builder")
    module.prepare_dataloader = lambda *args, **kwargs: pytest.fail("solo-learn's shuffle")
    bridge.patch(module)
    dataset = module.prepare_datasets("synthetic_lt", lambda image: [to_tensor(image)])
    index, views, label = dataset[3]
    assert index == 3 and len(views) == 1 and label == dataset.dataset.targets[3]
    loader = module.prepare_dataloader(dataset, batch_size=4, num_workers=0)
    labels = dataset.dataset.targets
    order = list(build_sampler("class_balanced", labels, seed=3))
    drawn = [int(t) for _, _, targets in loader for t in targets]
    assert drawn == [labels[i] for i in order][: len(order) // 4 * 4]


def test_two_after_import_hooks_on_one_module_both_run_once(tmp_path, monkeypatch):
    """solo-ext's hook beside another one (the tests' spy does this to solo-learn's modules):
    each finds the module through the other without recursing, and both callbacks run once,
    before the importer sees the module."""
    (tmp_path / "after_import_probe.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls = []
    hooks = [
        _autoload.AfterImport({"after_import_probe": lambda m, i=i: calls.append((i, m.VALUE))})
        for i in range(2)
    ]
    monkeypatch.setattr(sys, "meta_path", [*hooks, *sys.meta_path])
    monkeypatch.delitem(sys.modules, "after_import_probe", raising=False)
    import after_import_probe  # noqa: F401

    assert sorted(calls) == [(0, 1), (1, 1)]


def test_pbsd_with_dali_cuts_its_patches_on_the_device_and_says_so(capsys, tmp_path):
    module = stand_in_args()
    cfg = tiny_cfg("pbsd", tmp_path)  # whole: the method's own check runs in parse_cfg too
    cfg.data.dataset, cfg.data.format = "custom", "dali"
    module._SUPPORTED_DATASETS.append("custom")
    module.parse_cfg(cfg)
    assert cfg.method_kwargs.patch_source == "device"
    assert "DALI's reader cannot make the published patches" in capsys.readouterr().out


def test_a_bad_method_key_stops_solo_learns_parse_cfg_in_one_line(capsys, tmp_path):
    """solo-learn checks a method's keys only when it builds the model (a traceback); the bridge
    checks a solo-ext method's keys in ``parse_cfg``."""
    module = stand_in_args()
    cfg = tiny_cfg("dscl", tmp_path, **{"method_kwargs.temperature": -1})
    cfg.data.dataset = "custom"
    with pytest.raises(SystemExit) as info:
        module.parse_cfg(cfg)
    assert info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith("error: method_kwargs.temperature=-1: must be a number > 0"), line
