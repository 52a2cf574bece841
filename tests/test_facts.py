"""The dataset table decides statistics, evaluation resolution and the ResNet stem everywhere,
and the methods that need a spatial feature map refuse a 1x1 one in one line."""

from __future__ import annotations

import json

import pytest
import torch
import torchvision
from omegaconf import OmegaConf
from torchvision import transforms as T

from solo_ext import facts
from solo_ext.commands import make_lt
from solo_ext.commands.pretrain import parse_cfg
from solo_ext.config import ConfigError
from solo_ext.data.datasets import counts_json, long_tail_counts
from solo_ext.data.transforms import build_eval_transform, normalize


@pytest.mark.parametrize("name,base", [("cifar10_lt", "cifar10"), ("cifar100_lt", "cifar100")])
def test_cifar_lt_is_treated_as_the_cifar_it_is(name, base):
    assert tuple(normalize(name).mean) == facts.DATASETS[base].stats[0] == normalize(base).mean
    ops = build_eval_transform(name, 32).transforms
    assert [type(op) for op in ops] == [T.ToTensor, T.Normalize]  # no resize, no centre crop
    assert facts.DATASETS[name].small_image_stem and facts.DATASETS[name].solo_name == base


def test_photographs_are_resized_and_centre_cropped_with_imagenet_statistics():
    ops = build_eval_transform("imagenet_lt", 224).transforms
    assert [type(op) for op in ops[:2]] == [T.Resize, T.CenterCrop]
    assert tuple(ops[-1].mean) == facts.IMAGENET_STATS[0]


def test_every_long_tailed_name_is_solo_ext_only():
    """solo-learn knows no long-tailed name, nor Fashion-MNIST: the patches must add them."""
    assert set(facts.LONG_TAILED) | {"fashion_mnist"} == set(facts.SOLO_EXT_ONLY)
    assert not set(facts.SOLO_EXT_ONLY) & {"cifar10", "cifar100", "imagenet", "custom"}


@pytest.mark.parametrize("name", ["fashion_mnist", "fashion_mnist_lt"])
def test_fashion_mnist_is_evaluated_at_its_28_px_with_the_small_stem(name):
    ops = build_eval_transform(name, 28).transforms
    assert [type(op) for op in ops] == [T.ToTensor, T.Normalize]  # no resize, no centre crop
    assert tuple(ops[-1].mean) == facts.FASHION_MNIST_STATS[0]
    assert facts.DATASETS[name].small_image_stem and facts.DATASETS[name].native_size == 28


@pytest.mark.parametrize(
    "method,backbone,stem,crop,refused",
    [
        ("pbsd", "resnet18", False, 32, True),  # ImageNet stem at 32 px: a 1x1 map
        ("densecl", "resnet18", False, 32, True),
        ("pbsd", "resnet18", True, 32, False),
        ("densecl", "cifar_resnet32", None, 32, False),
        ("densecl", "resnet18", False, 64, False),  # 2x2
        ("dscl", "resnet18", False, 32, False),  # no map needed
    ],
)
def test_dense_methods_refuse_a_1x1_map(method, backbone, stem, crop, refused, make_cfg):
    kwargs = {} if stem is None else {"small_image_stem": stem}
    cfg = make_cfg(
        method,
        **{"backbone": {"name": backbone, "kwargs": kwargs}, "augmentations.0.crop_size": crop},
    )
    if not refused:
        parse_cfg(cfg)
        return
    with pytest.raises(ConfigError) as err:
        parse_cfg(cfg)
    message = str(err.value)
    assert "\n" not in message and "last feature map is 1x1" in message
    for text in (f"backbone.name='{backbone}'", "data.dataset='synthetic_lt'", f"crop_size={crop}"):
        assert text in message


def test_class_counts_of_a_made_lt_folder_come_from_its_counts_json(tmp_path):
    out = tmp_path / "lt"
    make_lt.run(["--dataset", "synthetic_lt", "--num_classes", "4", "--out", str(out)])
    written = json.loads((out / "counts.json").read_text())["train_counts"]
    data = {"dataset": "custom", "train_path": str(out / "train"), "num_classes": 4}
    assert long_tail_counts(OmegaConf.create(data)) == written
    assert counts_json(OmegaConf.create({**data, "train_path": str(tmp_path)})) is None
    with pytest.raises(ConfigError, match="counts.json': 4 classes, data.train_path=.* has 3"):
        counts_json(OmegaConf.create({**data, "num_classes": 3}))


def test_small_image_stem_option_reaches_solo_learn_style_builders():
    from solo_ext.modules.stem import add_stem_option

    registry = {"resnet18": lambda method, **kw: torchvision.models.resnet18(**kw)}
    add_stem_option(registry)
    small = registry["resnet18"]("dscl", small_image_stem=True)
    assert small.conv1.kernel_size == (3, 3) and isinstance(small.maxpool, torch.nn.Identity)
    assert registry["resnet18"]("dscl").conv1.kernel_size == (7, 7)
