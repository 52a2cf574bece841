"""The plugin's patches (``solo_ext.solo_learn``) on stand-ins of solo-learn's modules, so that CI
(which cannot install solo-learn) checks what the patches add; tests/test_solo_learn_scripts.py runs
the real scripts.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch
from conftest import AUGMENTATION, tiny_cfg
from omegaconf import OmegaConf
from torch import nn
from torchvision import transforms as T

from solo_ext.data.transforms import PILGaussianBlur, build_augmentation
from solo_ext.solo_learn import PATCHES, parsed
from solo_ext.solo_learn import autoload as _autoload
from solo_ext.solo_learn import check as patch_check
from solo_ext.solo_learn.patch import patch


def crop_and_blur(pipeline) -> tuple[T.RandomResizedCrop, bool]:
    """The pipeline's one random resized crop, and whether it blurs with PIL's blur."""
    (crop,) = [t for t in pipeline.transforms if isinstance(t, T.RandomResizedCrop)]
    inner = [getattr(t, "transforms", [None])[0] for t in pipeline.transforms]
    return crop, any(isinstance(t, PILGaussianBlur) for t in inner)


@pytest.fixture(autouse=True)
def no_run():
    yield
    parsed.RUN = None
    assert not patch_check.BROKEN, "a stand-in lacks a need of the patches"


@pytest.fixture(autouse=True)
def as_solo_learns_script():
    """The checks as solo-learn's scripts meet them (one line and exit status 2); called as a
    library function they raise (test_a_library_call_raises_the_config_error)."""
    argv = sys.argv
    sys.argv = ["main_pretrain.py", *argv[1:]]
    yield
    sys.argv = argv


def stand_in_args() -> types.ModuleType:
    """``solo.args.pretrain``'s stand-in (``healthy``), patched."""
    module = healthy("solo.args.pretrain")
    patch(module)
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


def test_every_patch_declares_its_needs_and_how_it_applies():
    """One list (``solo_ext.solo_learn.PATCHES``, import-free) names the patched modules; each
    patch module there declares what it needs and applies itself."""
    import importlib

    assert _autoload.PATCHES is PATCHES
    for target, name in PATCHES.items():
        module = importlib.import_module(f"solo_ext.solo_learn.{name}")
        assert module.NEEDS and callable(module.apply), target
        assert module.NEEDS == patch_check.needs_of(target)


def test_a_library_call_raises_the_config_error(monkeypatch, capsys):
    """Outside solo-learn's scripts (its own tests, a user's code) the patches' checks raise, as
    solo-learn's own checks do; nothing is printed and the process goes on."""
    from solo_ext.config import ConfigError

    monkeypatch.setattr(sys, "argv", ["pytest"])
    module = stand_in_args()
    with pytest.raises(ConfigError, match="did you mean 'class_balanced'"):
        module.parse_cfg(synthetic_cfg(sampler={"name": "clas_balancd"}))
    assert capsys.readouterr().err == ""
    assert parsed.RUN is None


def test_dali_that_cannot_run_here_stops_parse_cfg_in_one_line(capsys, monkeypatch):
    """data.format=dali on a solo-ext dataset: without DALI installed, or on the GPU (solo-learn's
    default DALI device) of a machine without one, one line before anything is built."""
    from solo_ext.data import dali

    module = stand_in_args()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for installed, message in (
        (False, "data.format='dali': NVIDIA DALI is not installed"),
        (True, "dali.device='gpu': no CUDA device here; set dali.device=cpu"),
    ):
        monkeypatch.setattr(dali, "dali_installed", lambda installed=installed: installed)
        with pytest.raises(SystemExit):
            module.parse_cfg(synthetic_cfg(format="dali"))
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"{parsed.prog()}: error: {message}"), line
        assert parsed.RUN is None


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


@pytest.mark.parametrize("route", ["solo-learn's parse_cfg", "solo-ext-pretrain"])
def test_pbsd_with_dali_cuts_its_patches_on_the_device_and_says_so(route, capsys, tmp_path):
    """Through either entry point PBSD on DALI's reader cuts its patches on the device, and
    says so (the method's own check runs in parse_cfg: the config is whole)."""
    if route == "solo-ext-pretrain":
        from solo_ext.commands.pretrain import parse_cfg

        cfg = tiny_cfg("pbsd", tmp_path, **{"data.format": "dali", "dali.device": "cpu"})
        pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    else:
        module = stand_in_args()
        cfg = tiny_cfg("pbsd", tmp_path)
        cfg.data.dataset, cfg.data.format = "custom", "dali"
        module._SUPPORTED_DATASETS.append("custom")
        parse_cfg = module.parse_cfg
    cfg = parse_cfg(cfg) or cfg
    assert cfg.method_kwargs.patch_source == "device"
    assert "DALI's reader cannot make the published patches" in capsys.readouterr().out


# --- the patches check what it patches --------------------------------------------------------


def healthy(name: str) -> types.ModuleType:
    """A stand-in of solo-learn's module ``name`` with every name the patches need of it."""
    module = types.ModuleType(name)
    code = {
        # a dataset list parse_cfg asserts on, a class-count table it fills the count from
        "solo.args.pretrain": "_SUPPORTED_DATASETS = ['cifar10', 'custom']\n"
        "_N_CLASSES_PER_DATASET = {'cifar10': 10}\n"
        "def parse_cfg(cfg):\n"  # (either may be renamed: LOSE)
        "    assert cfg.data.dataset in globals().get('_SUPPORTED_DATASETS', ['cifar10'])\n"
        "    table = globals().get('_N_CLASSES_PER_DATASET', {'cifar10': 10})\n"
        "    cfg.data.num_classes = table.get(cfg.data.dataset, 1)\n"
        "    return cfg\n",
        "solo.args.dataset": "def dataset_args(parser):\n"
        "    parser.add_argument('--dataset', choices=['cifar10'], required=True)\n",
        "solo.args.knn": "import argparse\n"
        "def parse_args_knn():\n"
        "    parser = argparse.ArgumentParser()\n"
        "    parser.add_argument('--dataset', choices=['cifar10'], required=True)\n"
        "    parser.add_argument('--pretrained_checkpoint_dir')\n"
        "    return parser.parse_args()\n",
        "solo.data.pretrain_dataloader": "def build_transform_pipeline(dataset, cfg): pass\n"
        "def prepare_datasets(dataset, transform, train_data_path=None): pass\n"
        "def prepare_dataloader(train_dataset, batch_size=64, num_workers=4): pass\n",
        "solo.data.classification_dataloader": "def prepare_transforms(dataset): pass\n"
        "def prepare_datasets(dataset, T_train, T_val, train_data_path=None): pass\n"
        "def prepare_dataloaders(train_dataset, val_dataset, batch_size=64, num_workers=4): pass\n"
        "def prepare_data(dataset):\n"
        "    T_train, T_val = prepare_transforms(dataset)\n"
        "    return prepare_dataloaders(*prepare_datasets(dataset, T_train, T_val))\n",
        "solo.data.dali_dataloader": "def build_transform_pipeline_dali(dataset, cfg, dali_device):"
        " pass\n"
        "class PretrainDALIDataModule:\n"
        "    def setup(self, stage=None): pass\n"
        "    def train_dataloader(self): pass\n"
        "class ClassificationDALIDataModule(PretrainDALIDataModule): pass\n",
        "solo.methods.linear": "class LinearModel:\n"
        "    def validation_step(self, batch, batch_idx): pass\n"
        "    def on_validation_epoch_end(self): pass\n",
        "solo.utils.checkpointer": CHECKPOINTER,
        "solo.utils.auto_resumer": "class AutoResumer:\n"
        "    def find_checkpoint(self, cfg): return None, None\n",
    }
    code["solo.args.linear"] = code["solo.args.pretrain"]
    exec(code[name], module.__dict__)
    return module


CHECKPOINTER = (
    "class Checkpointer:\n"
    "    def initial_setup(self, trainer):\n"
    "        self.path, self.ckpt_placeholder, self.last_ckpt = None, None, None\n"
    "    def save_args(self, trainer): pass\n"
    "    def save(self, trainer): pass\n"
)


def _drop(name: str):
    return lambda module: delattr(module, name)


def _redefine(source: str):
    return lambda module: exec(source, module.__dict__)


# every need of the patches, and how a solo-learn release could lose it: renamed (gone under its
# name), or changed (other parameters, no choices, calls that no longer pass through the module)
LOSE = {
    "parse_cfg(cfg)": _drop("parse_cfg"),
    "_SUPPORTED_DATASETS": _drop("_SUPPORTED_DATASETS"),
    "_N_CLASSES_PER_DATASET": _drop("_N_CLASSES_PER_DATASET"),
    "dataset_args(parser)": _drop("dataset_args"),
    "dataset_args(parser) adding --dataset with choices": _redefine(
        "def dataset_args(parser): parser.add_argument('--dataset')\n"
    ),
    "parse_args_knn()": _drop("parse_args_knn"),
    "build_transform_pipeline(dataset, cfg)": _drop("build_transform_pipeline"),
    "prepare_datasets(dataset, transform)": _redefine(
        "def prepare_datasets(name, transform): pass\n"
    ),
    "prepare_dataloader(train_dataset, batch_size, num_workers)": _drop("prepare_dataloader"),
    "prepare_transforms(dataset)": _drop("prepare_transforms"),
    "prepare_datasets(dataset, T_train, T_val)": _drop("prepare_datasets"),
    "prepare_dataloaders(train_dataset, val_dataset, batch_size, num_workers)": _drop(
        "prepare_dataloaders"
    ),
    "prepare_data calling prepare_transforms, prepare_datasets, prepare_dataloaders "
    "through the module": _redefine("def prepare_data(dataset, loaders=None): return loaders\n"),
    "build_transform_pipeline_dali(dataset, cfg, dali_device)": _redefine(
        "def build_transform_pipeline_dali(dataset, cfg): pass\n"
    ),
    "PretrainDALIDataModule.setup, train_dataloader": _drop("PretrainDALIDataModule"),
    "ClassificationDALIDataModule.setup, train_dataloader": _redefine(
        "class ClassificationDALIDataModule: pass\n"
    ),
    "LinearModel.validation_step, on_validation_epoch_end": lambda module: delattr(
        module.LinearModel, "on_validation_epoch_end"
    ),
    "Checkpointer.initial_setup, save_args, save": _redefine(
        "class Checkpointer:\n    def save_args(self, trainer): pass\n"
    ),
    "Checkpointer.initial_setup setting path, ckpt_placeholder, last_ckpt": _redefine(
        CHECKPOINTER.replace("self.last_ckpt", "self.last")
    ),
    "AutoResumer.find_checkpoint": _redefine("class AutoResumer: pass\n"),
}
NEEDED = [(module, need.name) for module in PATCHES for need in patch_check.needs_of(module)]


@pytest.fixture
def broken(monkeypatch):
    """A fresh record of what is broken, for this test only."""
    monkeypatch.setattr(patch_check, "BROKEN", {})
    return patch_check.BROKEN


def test_every_need_is_tried_here_and_the_healthy_stand_ins_have_it():
    assert {name for _, name in NEEDED} == set(LOSE)
    for module in PATCHES:
        assert patch_check.missing(healthy(module)) is None, module


def stops_in_one_line(parse_cfg, cfg, capsys, *names: str) -> str:
    with pytest.raises(SystemExit) as stop:
        parse_cfg(cfg)
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    for name in (*names, "solo-learn", "tested with solo-learn 1.0.6, commit 9187ea3"):
        assert name in line, line
    return line


@pytest.mark.parametrize("module_name,need", NEEDED, ids=lambda x: str(x)[:40])
def test_a_missing_name_stops_a_solo_ext_config_and_lets_solo_learns_run(
    module_name, need, broken, capsys
):
    module = healthy(module_name)
    LOSE[need](module)
    assert patch_check.missing(module) == need
    patch(module)
    assert broken == {module_name: f"{module_name} has no {need}"}
    assert "synthetic_lt" not in vars(module).get("_SUPPORTED_DATASETS", [])  # nothing patched
    # the entry point of main_pretrain.py (the broken module itself when it still has one)
    args = module if module_name.startswith("solo.args.") and hasattr(module, "parse_cfg") else None
    if args is None:
        args = healthy(
            "solo.args.linear" if module_name == "solo.args.pretrain" else "solo.args.pretrain"
        )
        patch(args)
    for cfg, used in [
        (synthetic_cfg(), "data.dataset='synthetic_lt'"),
        (
            synthetic_cfg(dataset="cifar10", sampler={"name": "sqrt"}),
            "data.sampler={'name': 'sqrt'}",
        ),
        (OmegaConf.create({"method": "dscl", "data": {"dataset": "cifar10"}}), "method='dscl'"),
    ]:
        stops_in_one_line(args.parse_cfg, cfg, capsys, used, f"{module_name} has no {need}")
    # a config of solo-learn alone runs
    plain = OmegaConf.create(
        {"method": "mocov2plus", "backbone": {"name": "resnet18"}, "data": {"dataset": "cifar10"}}
    )
    if args is module:
        assert args.parse_cfg(plain).data.num_classes == 10


def test_main_knn_stops_before_argparse_rejects_the_dataset(broken, capsys, monkeypatch):
    patch(healthy("solo.args.pretrain"))  # (healthy: not recorded)
    knn = healthy("solo.args.knn")
    dataset = healthy("solo.args.dataset")
    LOSE["dataset_args(parser) adding --dataset with choices"](dataset)
    patch(dataset)
    patch(knn)
    monkeypatch.setattr(sys, "argv", ["main_knn.py", "--dataset", "cifar100_lt"])
    stops_in_one_line(lambda _: knn.parse_args_knn(), None, capsys, "cifar100_lt", "choices")
    monkeypatch.setattr(sys, "argv", ["main_knn.py", "--dataset", "cifar10"])
    assert knn.parse_args_knn().dataset == "cifar10"


def test_methods_that_could_not_register_stop_their_configs(broken, capsys, monkeypatch):
    import solo_ext.methods.registry

    def fails():
        raise ImportError("cannot import name 'gather' from 'solo.utils.misc'")

    monkeypatch.setattr(solo_ext.methods.registry, "register", fails)
    monkeypatch.setitem(sys.modules, "solo_ext.host", types.SimpleNamespace(_READY=True))
    _autoload._register_into_solo()
    args = healthy("solo.args.pretrain")
    patch(args)
    cfg = OmegaConf.create({"method": "pbsd", "data": {"dataset": "cifar10"}})
    stops_in_one_line(args.parse_cfg, cfg, capsys, "method='pbsd'", "'gather'")


def test_a_solo_ext_method_gets_solo_exts_views_in_main_pretrain(tmp_path):
    """solo-learn builds each view with its own pipeline (bicubic crops); a solo-ext method's
    run gets solo-ext's, which follow the published protocol (bilinear crops, PIL's blur) and
    the rrc.interpolation / gaussian_blur.kind keys, as with solo-ext-pretrain."""
    args = stand_in_args()
    loader = healthy("solo.data.pretrain_dataloader")
    loader.build_transform_pipeline = lambda dataset, cfg: "solo-learn's pipeline"
    patch(loader)
    aug = OmegaConf.create({**AUGMENTATION, "gaussian_blur": {"prob": 0.5}})
    cfg = tiny_cfg("dscl", tmp_path)
    cfg.data.dataset = "custom"
    args.parse_cfg(cfg)
    crop, pil_blur = crop_and_blur(loader.build_transform_pipeline("custom", aug))
    assert crop.interpolation == T.InterpolationMode.BILINEAR and pil_blur
    aug.rrc.interpolation = "bicubic"
    crop, _ = crop_and_blur(loader.build_transform_pipeline("custom", aug))
    assert crop.interpolation == T.InterpolationMode.BICUBIC
    # solo-learn's own methods keep solo-learn's pipeline
    plain = OmegaConf.create({"method": "mocov2plus", "data": {"dataset": "custom"}})
    plain.backbone = {"name": "resnet18"}
    args.parse_cfg(plain)
    assert loader.build_transform_pipeline("custom", aug) == "solo-learn's pipeline"


# --- main_linear.py's classifier stage ----------------------------------------------------------


def stand_in_linear_model() -> types.ModuleType:
    """``solo.methods.linear``'s contract as the patches use it: a classifier, a backbone that
    ``training_step`` puts in eval mode before its forward (no gradient), validation hooks."""
    module = types.ModuleType("solo.methods.linear")

    class LinearModel(nn.Module):
        def __init__(self, backbone, loss_func=None, mixup_func=None, cfg=None):
            super().__init__()
            self.backbone, self.classifier, self.finetune = backbone, nn.Linear(512, 100), False

        def training_step(self, batch, batch_idx):
            self.backbone.eval()
            with torch.no_grad():
                feats = self.backbone(batch[0])
            return self.classifier(feats).sum()

        def validation_step(self, batch, batch_idx):
            pass

        def on_validation_epoch_end(self):
            pass

    LinearModel.__module__ = module.__name__  # (defined here, as if in solo-learn's module)
    module.LinearModel = LinearModel
    patch(module)
    return module


def classifier_stage_run(stage_view=None, **stage) -> None:
    data = OmegaConf.create({"dataset": "synthetic_lt"})
    parsed.RUN = parsed.Run(data, None, OmegaConf.create(stage), stage_view=stage_view)


@pytest.mark.parametrize("bn", ["train", "eval"])
def test_main_linears_stage_runs_the_frozen_backbone_in_train_mode_as_published(bn):
    """``backbone_bn: train``: the step's forward updates the backbone's BatchNorm statistics
    as a plain train-mode forward of the same images does; ``eval`` leaves them; the fc starts
    N(0, 0.01) with a zero bias under ``classifier_init: normal``."""
    import copy

    classifier_stage_run(backbone_bn=bn, classifier_init="normal", train_augmentation="published")
    torch.manual_seed(0)
    backbone = nn.Sequential(
        nn.Conv2d(3, 512, 1), nn.BatchNorm2d(512), nn.AdaptiveAvgPool2d(1), nn.Flatten()
    )
    before = copy.deepcopy(backbone)
    model = stand_in_linear_model().LinearModel(backbone, cfg=None)
    assert model.classifier.weight.std().item() == pytest.approx(0.01, rel=0.05)
    assert not model.classifier.bias.any()
    x = torch.randn(8, 3, 4, 4)
    model.training_step((x, None), 0)
    assert "eval" not in vars(backbone)  # the method is the module's own again
    loop = copy.deepcopy(before).train()
    with torch.no_grad():
        loop(x)
    want = loop if bn == "train" else before
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(getattr(backbone[1], name), getattr(want[1], name)), name
    if bn == "train":
        assert not torch.equal(backbone[1].running_mean, before[1].running_mean)


def test_main_linears_stage_trains_on_the_runs_view_or_the_published_crops():
    """main_linear.py's training crops: the run's query view (``pretrain``, what the patches'
    parse_cfg read from the run's args.json), the official stage's crops (``published``), or
    solo-learn's own (``solo-learn``); its validation transform stays solo-learn's."""
    loader = healthy("solo.data.classification_dataloader")
    loader.prepare_transforms = lambda dataset: ("solo-learn's crops", "solo-learn's val")
    patch(loader)
    view = OmegaConf.create({**AUGMENTATION, "num_crops": 1})
    classifier_stage_run(train_augmentation="pretrain", backbone_bn="train", stage_view=view)
    train, val = loader.prepare_transforms("cifar100")
    assert val == "solo-learn's val"
    assert repr(train) == repr(build_augmentation("cifar100", view))
    crop, _ = crop_and_blur(train)
    assert crop.scale == (0.5, 1.0) and crop.size == (32, 32)  # (the view's)
    classifier_stage_run(train_augmentation="published", backbone_bn="train", stage_view=view)
    train, val = loader.prepare_transforms("cifar100")
    assert val == "solo-learn's val"  # (resize 256, centre crop 224 on ImageNet: as published)
    crop, pil_blur = crop_and_blur(train)
    assert crop.scale == (0.08, 1.0) and crop.size == (32, 32) and pil_blur
    classifier_stage_run(train_augmentation="solo-learn", backbone_bn="eval")
    assert loader.prepare_transforms("cifar100") == ("solo-learn's crops", "solo-learn's val")


def test_the_patches_name_no_method():
    """What a method needs from the loader is said by the method's class (fit_to_loader,
    pretrain_transform, SOLO_LEARN_CROPS); the patches branch on no method's name."""
    from solo_ext.methods.registry import SOLO_EXT_METHODS

    for path in Path(parsed.__file__).parent.glob("*.py"):
        source = path.read_text()
        for name in SOLO_EXT_METHODS:
            for quoted in (f'"{name}"', f"'{name}'"):
                assert quoted not in source, (path.name, quoted)
