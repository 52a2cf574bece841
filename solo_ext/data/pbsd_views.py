"""PBSD's views of an image, made in the loader as the published code makes them.

For each image: the query crop's geometry first (random resized crop, bilinear by default as
published, ``rrc.interpolation``; then the horizontal flip), then L boxes drawn inside that crop
(random-resized-crop parameters with PBSD's area and aspect ranges, in whole pixels), each cut
from the crop *before* its colour augmentation and resized to ``patch_size`` (bilinear, always),
then given its own augmentation (flip and the query's colour augmentation, whose blur is PIL's
radius blur by default, ``gaussian_blur.kind``). The query then gets its colour augmentation;
the key is the second crop's own pipeline. Everything works on PIL images until ``ToTensor``.
Items: ``[query, key, patches [L, 3, s, s], boxes [L, 4]]`` with boxes as (x1, y1, x2, y2) in the
query crop's pixels, the frame of the teacher's ROI-align.

Every geometric draw of an item (crop, flip, boxes) comes before any colour draw, so turning a
colour augmentation off changes no box.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import functional as TF

from solo_ext.data.transforms import (
    augmentation_value,
    build_augmentation,
    crop_interpolation,
    crop_scale,
    flip_prob,
    normalize,
    photometric_ops,
)

RATIO = (3 / 4, 4 / 3)  # of the query crop, as RandomResizedCrop's default


class PBSDViews:
    """The transform of a PBSD run whose patches come from the loader.

    Args:
        dataset: the dataset's name (its normalisation statistics).
        query, key: the ``augmentations`` entries of the first and second crop.
        num_boxes, box_scale, box_ratio: L and the boxes' area (fraction of the crop) and
            aspect ranges.
        patch_size: side of each patch after resizing.
    """

    def __init__(
        self,
        dataset: str,
        query: DictConfig,
        key: DictConfig,
        num_boxes: int,
        box_scale: tuple[float, float],
        box_ratio: tuple[float, float],
        patch_size: int,
    ):
        self.size = int(query.crop_size)
        self.rrc = bool(augmentation_value(query, "rrc.enabled"))
        self.scale = crop_scale(query)
        self.interpolation = crop_interpolation(query)
        self.flip = flip_prob(query)
        self.num_boxes, self.patch_size = num_boxes, patch_size
        self.box_scale, self.box_ratio = tuple(box_scale), tuple(box_ratio)
        tensor = [T.ToTensor(), normalize(dataset, query)]
        self.query_colour = T.Compose([*photometric_ops(query, self.size), *tensor])
        self.patch_transform = T.Compose(
            [
                T.RandomHorizontalFlip(self.flip),
                *photometric_ops(query, patch_size),
                *tensor,
            ]
        )
        self.key: Callable = build_augmentation(dataset, key)

    def geometry(self, image: Image.Image) -> tuple[Image.Image, list[tuple[int, int, int, int]]]:
        """The query crop (cropped, resized, maybe flipped) and the boxes' (top, left, height,
        width) in it."""
        if self.rrc:
            top, left, height, width = T.RandomResizedCrop.get_params(image, self.scale, RATIO)
            crop = TF.resized_crop(
                image, top, left, height, width, [self.size, self.size], self.interpolation
            )
        else:
            crop = TF.resize(image, [self.size, self.size], self.interpolation)
        if torch.rand(1).item() < self.flip:
            crop = TF.hflip(crop)
        boxes = [
            T.RandomResizedCrop.get_params(crop, self.box_scale, self.box_ratio)
            for _ in range(self.num_boxes)
        ]
        return crop, boxes

    def __call__(self, image: Image.Image) -> list[Any]:
        """``[query, key, patches [L, 3, s, s], boxes [L, 4] (x1, y1, x2, y2)]``."""
        crop, boxes = self.geometry(image)
        size = [self.patch_size, self.patch_size]
        cuts = [
            TF.resized_crop(crop, top, left, h, w, size, T.InterpolationMode.BILINEAR)
            for top, left, h, w in boxes
        ]
        patches = torch.stack([self.patch_transform(cut) for cut in cuts])
        xyxy = torch.tensor(
            [[left, top, left + w, top + h] for top, left, h, w in boxes], dtype=torch.float32
        )
        return [self.query_colour(crop), self.key(image), patches, xyxy]

    def __repr__(self) -> str:
        return (
            f"PBSDViews(query {self.size} px + {self.num_boxes} patches of "
            f"{self.patch_size} px, key {self.key})"
        )
