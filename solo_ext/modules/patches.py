"""Random boxes inside a crop, ROI pooling of a feature map at them, and batched crops of them.

Everything is batched and device-side (torchvision's ``roi_align``), so PBSD works with any
loader, solo-learn's DALI loaders included.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torchvision.ops import roi_align


def sample_boxes(
    batch: int,
    num_boxes: int,
    height: int,
    width: int,
    scale: tuple[float, float] = (0.05, 0.6),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Boxes [batch, num_boxes, 4] as (x1, y1, x2, y2) in pixels, inside a height x width crop.

    Area ~ U(scale) of the crop, aspect ratio log-uniform in ``ratio`` (RandomResizedCrop's
    law), position uniform among those that keep the box inside.
    """
    shape = (batch, num_boxes)
    u = torch.rand((4, *shape), generator=generator, device=device)
    area = (scale[0] + (scale[1] - scale[0]) * u[0]) * height * width
    log_r = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * u[1]
    aspect = torch.exp(log_r)
    w = torch.sqrt(area * aspect).clamp(1, width)
    h = torch.sqrt(area / aspect).clamp(1, height)
    x1 = (width - w) * u[2]
    y1 = (height - h) * u[3]
    return torch.stack([x1, y1, x1 + w, y1 + h], dim=-1)


@contextmanager
def running_stats_kept(*modules: nn.Module) -> Iterator[None]:
    """Inside, the BatchNorm layers of ``modules`` normalise with their batch's statistics as
    usual (train mode: the outputs and gradients are unchanged), and their running statistics
    are as they were on the way out.

    They update copies inside, which are dropped after: the buffers themselves are never
    written, since autograd may hold them for the backward pass.
    """
    names = ("running_mean", "running_var", "num_batches_tracked")
    norms = [
        m
        for module in modules
        for m in module.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]
    saved = [[getattr(m, name) for name in names] for m in norms]
    for m, buffers in zip(norms, saved):
        for name, buffer in zip(names, buffers):
            setattr(m, name, buffer.clone())
    try:
        yield
    finally:
        for m, buffers in zip(norms, saved):
            for name, buffer in zip(names, buffers):
                setattr(m, name, buffer)


def _rois(boxes: torch.Tensor) -> torch.Tensor:
    """[B, L, 4] -> roi_align's [B * L, 5] with the batch index first."""
    b, n, _ = boxes.shape
    idx = torch.arange(b, device=boxes.device, dtype=boxes.dtype).repeat_interleave(n)
    return torch.cat([idx[:, None], boxes.reshape(b * n, 4)], dim=1)


def roi_pool(
    fmap: torch.Tensor, boxes: torch.Tensor, image_size: int, bins: int = 2
) -> torch.Tensor:
    """Mean of the ``bins x bins`` ROI-align of the map at each box: [B * L, C].

    ``boxes`` are in pixels of the image the map was computed from (``image_size`` wide). As
    the published PBSD teacher: torchvision's ``roi_align`` with its defaults (``aligned=False``,
    ``sampling_ratio=-1``, i.e. ceil(bin size) samples per bin) at the map's scale (1/32 for a
    ResNet at 224 px).
    """
    scale = fmap.shape[-1] / image_size
    pooled = roi_align(fmap.float(), _rois(boxes.float()), output_size=bins, spatial_scale=scale)
    return pooled.mean(dim=(2, 3))


def crop_boxes(images: torch.Tensor, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """The boxes cut from images [B, 3, H, W] and resized to size x size: [B * L, 3, s, s].

    Bilinear sampling at the output pixel centres (one sample per pixel), which for boxes at
    least ``size`` wide equals cropping then ``interpolate(mode="bilinear")``.
    """
    return roi_align(
        images,
        _rois(boxes.to(images.dtype)),
        output_size=size,
        spatial_scale=1.0,
        sampling_ratio=1,
        aligned=True,
    )


class DevicePatchAugment(nn.Module):
    """Per-patch augmentation of normalised patches [N, 3, s, s] on their device (kornia draws
    every patch's parameters apart): horizontal flip, colour jitter, grayscale, Gaussian blur,
    as torchvision's transforms do on one image at a time.

    The patches are mapped back to [0, 1] with ``mean`` / ``std``, augmented, and normalised
    again. Arguments of 0 probability leave their step out.
    """

    def __init__(
        self,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        flip: float = 0.5,
        jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.4, 0.1),
        jitter_prob: float = 0.8,
        grayscale: float = 0.2,
        blur: float = 0.5,
        blur_sigma: tuple[float, float] = (0.1, 2.0),
    ):
        super().__init__()
        import kornia.augmentation as K

        ops: list[nn.Module] = []
        if flip > 0:
            ops.append(K.RandomHorizontalFlip(p=flip))
        if jitter_prob > 0:
            ops.append(K.ColorJitter(*jitter, p=jitter_prob))
        if grayscale > 0:
            ops.append(K.RandomGrayscale(p=grayscale))
        self.ops = nn.Sequential(*ops)
        self.blur, self.blur_sigma = blur, blur_sigma
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        import kornia.augmentation as K

        x = (patches.float() * self.std + self.mean).clamp(0, 1)
        x = self.ops(x)
        if self.blur > 0:  # kernel from the patch size, as the loader's blur (10 % of the side)
            kernel = max(3, int(0.1 * x.shape[-1]) // 2 * 2 + 1)
            x = K.RandomGaussianBlur((kernel, kernel), self.blur_sigma, p=self.blur)(x)
        return ((x - self.mean) / self.std).to(patches.dtype)
