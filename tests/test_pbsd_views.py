"""PBSD's loader views: boxes drawn in the query crop after its geometry (crop, flip); each patch
is that crop's ``resized_crop`` at the box (bilinear), flipped with the query's flip probability.
That the patches then get their own colour and never the query's: tests/test_transforms_published.py
(``test_pbsd_patches_are_the_published_patches``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import functional as TF

from solo_ext.data.pbsd_views import PBSDViews
from solo_ext.facts import SYNTHETIC_STATS

MEAN, STD = (torch.tensor(s).view(3, 1, 1) for s in SYNTHETIC_STATS)


def _aug(flip: float) -> dict:
    """Colour off."""
    return {
        "crop_size": 32,
        "num_crops": 1,
        "rrc": {"enabled": True, "crop_min_scale": 0.3, "crop_max_scale": 1.0},
        "color_jitter": {"prob": 0.0},
        "grayscale": {"prob": 0.0},
        "gaussian_blur": {"prob": 0.0},
        "horizontal_flip": {"prob": flip},
    }


def _views(query: dict, key: dict | None = None) -> PBSDViews:
    q, k = OmegaConf.create(query), OmegaConf.create(key or _aug(0.5))
    return PBSDViews("synthetic_lt", q, k, 5, (0.05, 0.6), (3 / 4, 4 / 3), 16)


def _image(seed: int = 0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _as_pil(view: torch.Tensor) -> Image.Image:
    """A normalised view back to the 8-bit image it was made from."""
    pixels = ((view * STD + MEAN) * 255).round().clamp(0, 255).byte()
    return Image.fromarray(pixels.permute(1, 2, 0).numpy())


def _published_patch(crop: Image.Image, box: torch.Tensor) -> torch.Tensor:
    x1, y1, x2, y2 = (int(v) for v in box)
    cut = TF.resized_crop(crop, y1, x1, y2 - y1, x2 - x1, [16, 16], T.InterpolationMode.BILINEAR)
    return (TF.to_tensor(cut) - MEAN) / STD


@pytest.mark.parametrize("flip", [0.0, 1.0])
def test_patches_are_the_query_crops_resized_crops_at_the_boxes(flip):
    """Colour off: each patch equals resized_crop of the (flipped) query crop at its box; with
    the flip, the boxes are in the flipped crop's frame and the patch is flipped on its own."""
    torch.manual_seed(0)
    query, key, patches, boxes = _views(_aug(flip))(_image())
    assert query.shape == (3, 32, 32) and key.shape == (3, 32, 32)
    assert patches.shape == (5, 3, 16, 16) and boxes.shape == (5, 4)
    x1, y1, x2, y2 = boxes.unbind(1)
    assert (x1 >= 0).all() and (y1 >= 0).all() and (x2 <= 32).all() and (y2 <= 32).all()
    area = (x2 - x1) * (y2 - y1) / 32**2
    assert area.min() >= 0.05 - 1 / 32 and area.max() <= 0.6 + 2 / 32  # whole pixels
    crop = _as_pil(query)
    for patch, box in zip(patches, boxes):
        want = _published_patch(crop, box)
        if flip:
            want = TF.hflip(want)
        torch.testing.assert_close(patch, want, atol=1e-6, rtol=0)  # the crop is exact


def test_the_device_patches_read_the_query_entry_as_the_loader_does(monkeypatch):
    """PBSD's device path takes its colour settings from the query's augmentations entry the
    way the loader's views do: the declared defaults for what the entry leaves out, and
    solo-learn's ``gaussian_prob`` when ``gaussian_blur.prob`` is not given."""
    import solo_ext.methods.pbsd as pbsd
    from solo_ext.data.transforms import AUGMENTATION_OPTIONS, photometric_ops

    made = {}
    monkeypatch.setattr(pbsd, "DevicePatchAugment", lambda *a, **kw: made.update(kw))
    entry = OmegaConf.create(
        {"crop_size": 32, "num_crops": 1, "color_jitter": {"prob": 0.8}, "gaussian_prob": 0.7}
    )
    pbsd.device_patch_augment("synthetic_lt", entry)
    defaults = tuple(
        AUGMENTATION_OPTIONS[f"color_jitter.{k}"].default
        for k in ("brightness", "contrast", "saturation", "hue")
    )
    assert made["jitter"] == defaults and made["jitter_prob"] == 0.8
    assert made["grayscale"] == AUGMENTATION_OPTIONS["grayscale.prob"].default
    assert made["blur"] == 0.7  # the loader blurs with the same probability:
    (blur,) = [op for op in photometric_ops(entry, 32) if "Blur" in repr(op)]
    assert blur.p == 0.7
