"""``pbsd``: DSCL + patch-based self-distillation, the full method of Xuan & Zhang (AAAI 2024).

The supervised step with DSCL's loss (``DecoupledLoss``) and one more part, the
``PatchDistillation`` term: L boxes in each image's first large crop (the query). The teacher is the
query encoder's last feature map ROI-aligned at each box (2x2, torchvision's defaults, then the
mean) through the projector, without gradient; the student is the patch, through the query
encoder (one batch of B per patch index, so BatchNorm sees each index apart, as published) and
the projector; ``pbsd_loss`` compares them over [k_i, queue].

Where the patches come from (``patch_source``):

- ``loader`` (default, the published pipeline): ``PBSDViews`` draws the boxes in the query crop
  after its geometry (crop, flip) and before its colour augmentation, cuts and resizes each to
  ``box_crop_size`` and gives it its own augmentation (flip and the query's colour
  augmentation). It works with every torchvision loader, on both hosts and in solo-learn's
  ``main_pretrain.py``.
- ``device``: the boxes are drawn on the device and cut from the already colour-augmented query
  crop, then augmented per patch on the device (kornia: flip and the query's colour settings).
  An approximation of the published patches (their colour is augmented twice); it is what a
  loader that cannot make them (solo-learn's DALI loader) gets, and the run says so once.

Its ``method_kwargs``: the class's docstring lists them, from their declarations.

ViT and Swin backbones need ``backbone.kwargs.dynamic_img_size: true`` (the patches are smaller
than the crop); the patch side is rounded to a multiple of their patch (Swin's: 4 px), and is at
least 32 px for ConvNeXt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from omegaconf import DictConfig, OmegaConf

from solo_ext.config import (
    BACKBONE_OPTIONS,
    CORE_RUN_OPTIONS,
    ConfigError,
    Option,
    declared,
    select,
)
from solo_ext.data.pbsd_views import PBSDViews
from solo_ext.data.transforms import augmentation_value, crops_of, flip_prob, normalize
from solo_ext.losses.pbsd import pbsd_loss
from solo_ext.methods.base import require_input_size, require_spatial_map
from solo_ext.methods.dscl import DecoupledLoss
from solo_ext.methods.scl import SCL, StepTerm
from solo_ext.modules.patches import (
    DevicePatchAugment,
    crop_boxes,
    roi_pool,
    running_stats_kept,
    sample_boxes,
)


def device_patch_augment(dataset: str, query: DictConfig) -> DevicePatchAugment:
    """The device-side patch augmentation from the query crop's ``augmentations`` entry."""
    value = lambda key: augmentation_value(query, key)  # noqa: E731  (as the loader reads it)
    norm = normalize(dataset, query)
    jitter = tuple(
        value(f"color_jitter.{k}") for k in ("brightness", "contrast", "saturation", "hue")
    )
    return DevicePatchAugment(
        tuple(norm.mean),
        tuple(norm.std),
        flip=flip_prob(query),
        jitter=jitter,
        jitter_prob=value("color_jitter.prob"),
        grayscale=value("grayscale.prob"),
        blur=value("gaussian_blur.prob"),
    )


class PatchDistillation(StepTerm):
    """PBSD's term of the step: the patches' projections (student) against the ROI-pooled
    teacher of the query crop's map, over [k_i, queue], weighted by ``pbsd_weight``."""

    PATCH_SOURCES = ("loader", "device")
    OPTIONS: dict[str, Option] = {
        "pbsd_weight": Option(1.5, "float", 0, help="weight of the distillation term (official)"),
        "num_boxes": Option(5, "int", 1, help="boxes (patches) per image"),
        "box_scale": Option(
            [0.05, 0.6],
            "pair",
            0,
            1,
            low_open=True,
            help="a box's area range, as a fraction of the query crop, in (0, 1]",
        ),
        "box_ratio": Option(
            [0.75, 4 / 3], "pair", 0, low_open=True, help="a box's aspect-ratio range"
        ),
        "box_crop_size": Option(
            None, "int", 8, nullable=True, help="the patches' side; null: 64 px per 224 px of crop"
        ),
        "patch_running_stats": Option(
            True,
            "bool",
            help=(
                "`true`: the patch forwards update BatchNorm's running statistics, as published; "
                "`false`: they keep those of the full views (the batch statistics, and so the "
                "gradients, are the same)"
            ),
        ),
        "patch_source": Option(
            "loader",
            "str",
            choices=PATCH_SOURCES,
            help=(
                "`loader`: the loader cuts the patches after the crop's geometry and before "
                "its colour augmentation and augments each on its own, as published; "
                "`device`: cut on the device from the augmented crop (an approximation; what "
                "DALI runs get)"
            ),
        ),
    }
    NEEDS_FEATURE_MAP = True

    @classmethod
    def check(cls, cfg: DictConfig) -> None:
        kw = cfg.method_kwargs
        kwargs = cfg.backbone.get("kwargs") or {}
        name = str(cfg.backbone.name)
        if name.startswith(("vit", "swin")) and not kwargs.get("dynamic_img_size"):
            raise ConfigError(
                f"backbone.kwargs.dynamic_img_size={kwargs.get('dynamic_img_size')}"
                f": pbsd feeds patches smaller than the crop to {name}; set it to true"
            )
        require_spatial_map(cfg)
        require_input_size(cfg, cls.patch_size(cfg), "patches (method_kwargs.box_crop_size)")
        crops = crops_of(cfg.augmentations)
        if kw.patch_source == "loader" and len(crops) != 2:
            raise ConfigError(
                f"method_kwargs.patch_source='loader' with {len(crops)} crops in augmentations: "
                "the loader's PBSD views are a query and a key crop (2 crops)"
            )

    @classmethod
    def patch_size(cls, cfg: DictConfig) -> int:
        """``box_crop_size``, else 64 px per 224 px of crop; made a size the backbone takes: a
        multiple of a ViT's patch (``backbone.kwargs.patch_size``) or of Swin's (4 px), at least
        32 px for ConvNeXt (its last downsampling needs a 2x2 map)."""
        size = cfg.method_kwargs.box_crop_size
        crop = cfg.augmentations[0].crop_size
        size = size if size is not None else max(8, round(64 * crop / 224))
        name = str(cfg.backbone.name)
        if name.startswith(("vit", "swin")):
            if name.startswith("swin"):
                patch = 4  # solo-learn's Swins: patch_size=4
            else:
                patch = declared(cfg, "backbone.kwargs.patch_size", BACKBONE_OPTIONS)
            size = max(patch, round(size / patch) * patch)
        elif name.startswith("convnext"):
            size = max(32, size)
        return size

    @classmethod
    def fit_to_loader(cls, cfg: DictConfig, data_format: str) -> str | None:
        """DALI's reader cannot make the published patches: a DALI run cuts them on the
        device."""
        default = cls.OPTIONS["patch_source"].default
        source = select(cfg, "method_kwargs.patch_source", default)
        if data_format != "dali" or source != "loader":
            return None
        OmegaConf.update(cfg, "method_kwargs.patch_source", "device", force_add=True)
        return (
            "pbsd with data.format=dali: DALI's reader cannot make the published patches; "
            "they are cut and augmented on the device (method_kwargs.patch_source=device)"
        )

    @classmethod
    def pretrain_transform(cls, cfg: DictConfig) -> Callable | None:
        """The loader's transform of a run: the published PBSD views (None: the usual crops)."""
        kw = cfg.method_kwargs
        if kw.patch_source != "loader":
            return None
        query, key = crops_of(cfg.augmentations)
        return PBSDViews(
            cfg.data.dataset,
            query,
            key,
            kw.num_boxes,
            tuple(kw.box_scale),
            tuple(kw.box_ratio),
            cls.patch_size(cfg),
        )

    def __init__(self, cfg: DictConfig):
        super().__init__()
        self.cfg = cfg
        self._loader_patches: tuple[torch.Tensor, torch.Tensor] | None = None
        self._said_device = False
        self.patch_augment = device_patch_augment(cfg.data.dataset, crops_of(cfg.augmentations)[0])
        # its own stream, so that boxes never shift the data augmentation's random numbers
        seed = int(declared(cfg, "seed", CORE_RUN_OPTIONS))
        self.box_generator = torch.Generator().manual_seed(seed)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["pbsd_box_generator"] = self.box_generator.get_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A resumed run draws the boxes the uninterrupted one would have."""
        if "pbsd_box_generator" in checkpoint:
            self.box_generator.set_state(checkpoint["pbsd_box_generator"])

    def take_from_batch(self, batch: Sequence[Any], num_crops: int) -> Sequence[Any]:
        """Takes the loader's patches and boxes (the last two items of the crops) aside."""
        indexes, crops, targets = batch
        self._loader_patches = None
        if len(crops) == num_crops + 2:
            *crops, patches, boxes = crops
            self._loader_patches = (patches, boxes)
            return [indexes, crops, targets]
        if self.cfg.method_kwargs.patch_source == "loader" and not self._said_device:
            self._said_device = True
            rank_zero_info(
                "pbsd: the loader gave no patches (a DALI loader); they are cut and augmented "
                "on the device (method_kwargs.patch_source=device)"
            )
        return batch

    def device_patches(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Boxes [B, L, 4] drawn on the device and the patches [B, L, 3, s, s] cut from the
        (colour-augmented) crops, then augmented per patch."""
        kw = self.cfg.method_kwargs
        b, _, height, width = images.shape
        boxes = sample_boxes(
            b,
            kw.num_boxes,
            height,
            width,
            tuple(kw.box_scale),
            tuple(kw.box_ratio),
            generator=self.box_generator,
        ).to(images.device)
        size = self.patch_size(self.cfg)
        patches = crop_boxes(images, boxes, size)
        # the augmentation's random numbers from the box generator: the loader's stream stays
        seed = int(torch.randint(2**62, (1,), generator=self.box_generator))
        devices = [images.device] if images.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            patches = self.patch_augment(patches)
        return patches.view(b, kw.num_boxes, *patches.shape[1:]), boxes

    def forward(self, method: SCL, out: dict[str, Any], batch: Sequence[Any]) -> dict:
        kw = self.cfg.method_kwargs
        images = batch[1][0]  # the first large crop, the query
        if self._loader_patches is not None:
            patches, boxes = self._loader_patches
        else:
            patches, boxes = self.device_patches(images)
        keep = () if kw.patch_running_stats else (method.backbone, method.projector)
        with running_stats_kept(*keep):
            with torch.no_grad():  # the teacher side only gives targets
                pooled = roi_pool(out["fmap"][0], boxes, images.shape[-1])
                teacher = F.normalize(method.projector(pooled), dim=-1)
            # one batch of B per patch index, as published: each call's BatchNorm layers see
            # that index's B patches apart (their statistics and running means)
            student = torch.stack(
                [
                    F.normalize(method.projector(method.backbone(method.channels_last(p))), dim=-1)
                    for p in patches.unbind(1)
                ],
                dim=1,
            )
        student = student.flatten(0, 1)  # [B, L, D] -> [B * L, D], box order
        # the key of the image seen from the other large crop, as for the first crop's query
        keys = out["momentum_z"][1]
        queue = method.queue
        loss = pbsd_loss(student, teacher, keys, queue.keys, queue.labels, method.temperature)
        method.log("train_distillation_loss", loss, on_epoch=True, sync_dist=True)
        return {"train_distillation_loss": kw.pbsd_weight * loss}


class PBSD(SCL):
    LOSS_NAME = "pbsd"  # DSCL's loss plus pbsd_weight x the distillation
    CONTRASTIVE_NAME = "dscl"
    CRITERION = DecoupledLoss
    TERMS = (PatchDistillation,)
