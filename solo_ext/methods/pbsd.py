"""``pbsd``: DSCL + patch-based self-distillation, the full method of Xuan & Zhang (AAAI 2024).

On top of ``dscl``: L random boxes in each image's first large crop; the teacher is the query
encoder's last feature map ROI-pooled at each box (2x2 ROI-align, then the mean) through the
projector; the student is the box cut from the crop and resized, through the query encoder and
projector; ``pbsd_loss`` compares them over [k_i, queue]. Boxes, cuts and the student forward are
batched on the device, so any loader works (solo-learn's DALI loaders included).

Extra config (``method_kwargs``, besides those of ``dscl``):
    pbsd_weight (float): weight of the PBSD loss. Default 1.5 (official).
    num_boxes (int): boxes per image. Default 5.
    box_scale (list[float]): area range of a box, as a fraction of the crop, in (0, 1].
        Default [0.05, 0.6].
    box_ratio (list[float]): aspect-ratio range. Default [0.75, 1.3333].
    box_crop_size (int | None): side of the student crops; default 64 px per 224 px of crop.
ViT backbones need ``backbone.kwargs.dynamic_img_size: true`` (the student crops are smaller).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from solo_ext.config import ConfigError, check_range
from solo_ext.losses.pbsd import pbsd_loss
from solo_ext.methods.base import require_spatial_map
from solo_ext.methods.dscl import DSCL
from solo_ext.modules.feature_maps import feature_map
from solo_ext.modules.patches import crop_boxes, roi_pool, sample_boxes


class PBSD(DSCL):
    METHOD_KWARGS: dict[str, Any] = {
        **DSCL.METHOD_KWARGS,
        "pbsd_weight": 1.5,
        "num_boxes": 5,
        "box_scale": [0.05, 0.6],
        "box_ratio": [0.75, 4 / 3],
        "box_crop_size": None,
    }

    @classmethod
    def check_method_kwargs(cls, cfg: DictConfig) -> None:
        super().check_method_kwargs(cfg)
        kw = cfg.method_kwargs
        check_range("method_kwargs.pbsd_weight", kw.pbsd_weight, 0)
        check_range("method_kwargs.num_boxes", kw.num_boxes, 1)
        for key, low, high in (("box_scale", 0, 1), ("box_ratio", 0, None)):
            value = list(kw[key])
            if len(value) != 2 or value[0] > value[1]:
                raise ConfigError(f"method_kwargs.{key}={value}: must be [low, high]")
            for v in value:
                check_range(f"method_kwargs.{key}", v, low, high, low_open=True)
        if kw.box_crop_size is not None:
            check_range("method_kwargs.box_crop_size", kw.box_crop_size, 8)
        kwargs = cfg.backbone.get("kwargs") or {}
        if str(cfg.backbone.name).startswith("vit") and not kwargs.get("dynamic_img_size"):
            raise ConfigError(
                f"backbone.kwargs.dynamic_img_size={kwargs.get('dynamic_img_size')}"
                ": pbsd feeds smaller crops to the ViT; set it to true"
            )
        require_spatial_map(cfg)

    def __init__(self, cfg: DictConfig):
        super().__init__(cfg)
        # its own stream, so that boxes never shift the data augmentation's random numbers
        self.box_generator = torch.Generator().manual_seed(int(cfg.get("seed") or 0))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["pbsd_box_generator"] = self.box_generator.get_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A resumed run draws the boxes the uninterrupted one would have."""
        super().on_load_checkpoint(checkpoint)
        if "pbsd_box_generator" in checkpoint:
            self.box_generator.set_state(checkpoint["pbsd_box_generator"])

    def forward(self, X: torch.Tensor) -> dict[str, Any]:
        """Adds the last feature map (``fmap``) while training, from the same forward pass."""
        if not self.training:
            return super().forward(X)
        if not self.no_channel_last:
            X = X.to(memory_format=torch.channels_last)
        fmap, feats = feature_map(self.backbone, X)
        return {
            "feats": feats,
            "fmap": fmap,
            "logits": self.classifier(feats.detach()),
            "z": F.normalize(self.projector(feats), dim=-1),
        }

    def crop_size(self, image_size: int) -> int:
        """``box_crop_size``, else 64 px per 224 px of crop; a multiple of a ViT's patch."""
        size = self.cfg.method_kwargs.box_crop_size
        size = size if size is not None else max(8, round(64 * image_size / 224))
        patch_embed = getattr(self.backbone, "patch_embed", None)
        if patch_embed is not None:
            patch = patch_embed.patch_size[0]
            size = max(patch, round(size / patch) * patch)
        return size

    def auxiliary_loss(self, out: dict[str, Any], batch: Sequence[Any]) -> torch.Tensor:
        kw = self.cfg.method_kwargs
        images = batch[1][0]  # the first large crop
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
        with torch.no_grad():  # the teacher side only gives targets
            teacher = F.normalize(self.projector(roi_pool(out["fmap"][0], boxes, width)), dim=-1)
        crops = crop_boxes(images, boxes, self.crop_size(width))
        if not self.no_channel_last:
            crops = crops.to(memory_format=torch.channels_last)
        student = F.normalize(self.projector(self.backbone(crops)), dim=-1)
        # the key of the image seen from the other large crop, as for the first crop's query
        keys = out["momentum_z"][1]
        loss = pbsd_loss(
            student, teacher, keys, self.queue.keys, self.queue.labels, self.temperature
        )
        self.log("train_pbsd_loss", loss, on_epoch=True, sync_dist=True)
        return kw.pbsd_weight * loss
