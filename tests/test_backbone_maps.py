"""The last feature map of every backbone solo-learn ships (and ``cifar_resnet32``), and the dense
methods (``densecl``, ``pbsd``) training on each.

The map rules are tested on the backbone classes themselves (torchvision's ResNet, timm's
ConvNeXt, Swin and ViT in small configurations; solo-learn's WideResNet and PoolFormer where
solo-learn is importable): the map's shape, and that it is the tensor the backbone pools. One
training step of each dense method per backbone runs only where the real solo-learn is the host
(it builds them by name).
"""

from __future__ import annotations

import pytest
import timm
import torch
import torchvision
from omegaconf import OmegaConf
from torch import nn

from solo_ext.commands.pretrain import parse_cfg
from solo_ext.host import BACKBONES, METHODS
from solo_ext.methods.pbsd import PatchDistillation
from solo_ext.modules.feature_maps import feature_map, last_feature_map
from solo_ext.modules.resnet_cifar import cifar_resnet32


def _map_and_feats(
    backbone: nn.Module, size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fmap, feats = feature_map(backbone.eval(), x)
    return x, fmap, feats


def _assert_pooled(backbone: nn.Module, size: int, shape: tuple[int, ...]) -> torch.Tensor:
    """The map has ``shape`` and its spatial mean is the backbone's pooled features."""
    _, fmap, feats = _map_and_feats(backbone, size)
    assert tuple(fmap.shape) == shape
    torch.testing.assert_close(fmap.mean(dim=(2, 3)), feats, rtol=1e-5, atol=1e-6)
    return fmap


def test_torchvision_resnet_last_stage():
    backbone = torchvision.models.resnet18()
    backbone.fc = nn.Identity()
    _assert_pooled(backbone, 64, (2, 512, 2, 2))


def test_cifar_resnet_last_stage():
    _assert_pooled(cifar_resnet32(), 32, (2, 64, 8, 8))


def test_convnext_last_stage_is_forward_features():
    backbone = timm.models.convnext.ConvNeXt(
        depths=(1, 1, 1, 1), dims=(8, 16, 24, 32), num_classes=0
    ).eval()
    x, fmap, feats = _map_and_feats(backbone, 64)
    assert tuple(fmap.shape) == (2, 32, 2, 2)
    with torch.no_grad():
        # its head pools, then applies its LayerNorm: the features are the head of this map
        torch.testing.assert_close(fmap, backbone.forward_features(x))
        torch.testing.assert_close(backbone.forward_head(fmap), feats)


def _swin(**kwargs) -> nn.Module:
    return timm.models.swin_transformer.SwinTransformer(
        patch_size=4,
        window_size=4,
        embed_dim=8,
        depths=(1, 1, 1, 1),
        num_heads=(1, 1, 1, 1),
        num_classes=0,
        **kwargs,
    )


def test_swin_last_stage_tokens_as_a_map():
    # the final norm's NHWC tokens, permuted: at 64 px, 16x16 patches merged to 2x2
    fmap = _assert_pooled(_swin(img_size=64), 64, (2, 64, 2, 2))
    assert fmap.stride(1) == 1  # a view of the NHWC tokens, not a copy
    # dynamic_img_size: any multiple of the patch, the map of the input's grid
    _assert_pooled(_swin(img_size=64, dynamic_img_size=True), 96, (2, 64, 3, 3))


@pytest.mark.parametrize("dynamic,size,grid", [(False, 32, 4), (True, 48, 6)])
@pytest.mark.parametrize("reg_tokens", [0, 2])
def test_vit_patch_tokens_after_the_final_norm(dynamic, size, grid, reg_tokens):
    backbone = timm.models.vision_transformer.VisionTransformer(
        img_size=32,
        patch_size=8,
        embed_dim=16,
        depth=1,
        num_heads=1,
        num_classes=0,
        reg_tokens=reg_tokens,
        dynamic_img_size=dynamic,
    ).eval()
    x, fmap, feats = _map_and_feats(backbone, size)
    assert tuple(fmap.shape) == (2, 16, grid, grid) and feats.shape == (2, 16)
    with torch.no_grad():
        tokens = backbone.forward_features(x)[:, 1 + reg_tokens :]  # class and register tokens
    torch.testing.assert_close(fmap.flatten(2).transpose(1, 2), tokens)


@pytest.mark.solo_learn
def test_wide_resnet_after_the_final_bn_and_relu():
    from solo import backbones

    _assert_pooled(backbones.wide_resnet28w2("densecl"), 32, (2, 128, 8, 8))


@pytest.mark.solo_learn
def test_poolformer_after_the_final_norm():
    from solo import backbones

    _assert_pooled(backbones.poolformer_s12("densecl"), 64, (2, 512, 2, 2))


def _plain(method: str = "", **kwargs) -> nn.Module:
    """A backbone without a known map (a host's backbone builder's signature)."""
    backbone = nn.Sequential(nn.Conv2d(3, 16, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    backbone.num_features = 16
    return backbone


def test_a_backbone_without_a_known_map_stops_in_one_line():
    with pytest.raises(ValueError, match=r"^backbone Sequential: no feature-map access") as err:
        with last_feature_map(_plain()):
            pass
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("method", ["densecl", "pbsd"])
def test_the_dense_methods_refuse_it_before_training(method, make_cfg, monkeypatch):
    monkeypatch.setitem(BACKBONES, "plain_sequential", _plain)
    cfg = make_cfg(method, **{"backbone": {"name": "plain_sequential"}})
    with pytest.raises(ValueError, match=r"backbone Sequential: no feature-map access") as err:
        parse_cfg(cfg)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "name,kwargs,box_crop_size,want",
    [
        ("vit_tiny", {"patch_size": 8}, None, 16),  # 18 px (64 per 224 of 64 px), to 8 px patches
        ("swin_tiny", {}, None, 16),  # a multiple of Swin's 4 px patch
        ("swin_tiny", {}, 13, 12),
        ("convnext_tiny", {}, None, 32),  # its last downsampling needs a 2x2 map
        ("convnext_tiny", {}, 48, 48),
        ("poolformer_s12", {}, None, 18),  # any size
    ],
)
def test_pbsd_patches_are_a_size_the_backbone_takes(name, kwargs, box_crop_size, want):
    cfg = OmegaConf.create(
        {
            "backbone": {"name": name, "kwargs": kwargs},
            "augmentations": [{"crop_size": 64}],
            "method_kwargs": {"box_crop_size": box_crop_size},
        }
    )
    assert PatchDistillation.patch_size(cfg) == want


# --- one training step of each dense method on each backbone (the real solo-learn) -------------

# the smallest variant of each family at (about) the smallest crop whose last map is not 1x1
CASES = {
    "resnet18": ({}, 32),  # the small-image stem (a 32 px dataset): 5x5
    "wide_resnet28w2": ({}, 32),  # 8x8
    "vit_tiny": ({"img_size": 32, "patch_size": 8, "dynamic_img_size": True}, 32),  # 4x4
    "swin_tiny": ({"img_size": 48, "dynamic_img_size": True, "drop_path_rate": 0.0}, 48),  # 2x2
    "convnext_tiny": ({}, 64),  # 2x2 (1x1 at 48 px)
    "poolformer_s12": ({}, 48),  # 2x2
}


BATCH = 2  # images per crop (BatchNorm's least; the suite runs on 2 CPU cores)


class _Trainer:
    global_step = 0


# what gets no gradient by design: solo-learn's WideResNet computes bn1 of a block that changes
# the width and then uses its input instead (FixMatch's network); ConvNeXt's head LayerNorm
# comes after the pooling, so the map alone does not reach it
UNUSED = ("block2.layer.0.bn1.", "block3.layer.0.bn1.")
AFTER_POOLING = ("head.norm.",)


@pytest.mark.solo_learn
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("method", ["densecl", "pbsd"])
def test_one_training_step(method, name, make_cfg, monkeypatch):
    torch.manual_seed(0)
    kwargs, crop = CASES[name]
    overrides = {
        "backbone": {"name": name, "kwargs": kwargs},
        "augmentations.0.crop_size": crop,
        "performance.disable_channel_last": True,  # (on CPU, channels-last is the slower)
    }
    if method == "densecl":  # the dense term alone: the backbone learns through its map only
        overrides["method_kwargs.lambda"] = 1.0
    else:  # the patches cut on the device (the step gets no loader patches here)
        overrides.update({"method_kwargs.patch_source": "device", "method_kwargs.num_boxes": 1})
    cfg = parse_cfg(make_cfg(method, **overrides))  # (registers the methods)
    model = METHODS[method](cfg).train()
    monkeypatch.setattr(type(model), "trainer", property(lambda self: _Trainer()))
    gen = torch.Generator().manual_seed(0)
    crops = [torch.randn(BATCH, 3, crop, crop, generator=gen) for _ in range(2)]
    batch = [torch.arange(BATCH), crops, torch.randint(0, 4, (BATCH,), generator=gen)]
    loss = model.training_step(batch, 0)
    assert torch.isfinite(loss)
    loss.backward()
    # every parameter the forward uses gets a gradient (with densecl: through the map)
    skip = UNUSED + (AFTER_POOLING if method == "densecl" else ())
    params = [(n, p) for n, p in model.backbone.named_parameters() if not n.startswith(skip)]
    missing = [n for n, p in params if p.grad is None or not p.grad.any()]
    assert len(params) > 0.95 * len(list(model.backbone.parameters())) and not missing, missing


@pytest.mark.solo_learn
def test_swin_needs_its_input_size(make_cfg):
    swin = {"name": "swin_tiny", "kwargs": {}}
    cfg = make_cfg("densecl", **{"backbone": swin, "augmentations.0.crop_size": 64})
    with pytest.raises(ValueError, match=r"set backbone.kwargs.img_size=64") as err:
        parse_cfg(cfg)
    assert "\n" not in str(err.value)
    swin = {"name": "swin_tiny", "kwargs": {"img_size": 64}}
    cfg = make_cfg("pbsd", **{"backbone": swin, "augmentations.0.crop_size": 64})
    with pytest.raises(ValueError, match=r"^backbone.kwargs.dynamic_img_size=None: pbsd feeds"):
        parse_cfg(cfg)
