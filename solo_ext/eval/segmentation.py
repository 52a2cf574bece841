"""Dense evaluation metrics and the side-by-side plot of images, label maps and predictions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch


def confusion(pred: torch.Tensor, target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """[C, C] counts, rows = target class, columns = predicted class, of label maps [N, H, W]."""
    index = target.reshape(-1).long() * num_classes + pred.reshape(-1).long()
    return torch.bincount(index, minlength=num_classes**2).reshape(num_classes, num_classes)


def segmentation_report(conf: torch.Tensor) -> dict[str, float]:
    """mIoU (mean over classes present in the target or the prediction) and pixel accuracy,
    both in percent, from a confusion matrix."""
    conf = conf.double()
    tp = conf.diag()
    union = conf.sum(0) + conf.sum(1) - tp
    present = union > 0
    iou = tp[present] / union[present]
    return {
        "miou": float(iou.mean() * 100),
        "pixel_acc": float(tp.sum() / conf.sum() * 100),
        "num_seg_classes": int(present.sum()),
    }


def plot_predictions(
    path: str | Path,
    images: np.ndarray,
    targets: np.ndarray,
    preds: np.ndarray,
    class_names: Sequence[str],
    title: str = "",
) -> None:
    """A PNG with one row per image: the image, its label map, the probe's prediction.

    Args:
        images: [K, H, W, 3] uint8; targets, preds: [K, H, W] class indices.
    """
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure

    colours = matplotlib.colormaps["tab20"].resampled(max(len(class_names), 2))
    cmap = ListedColormap(colours(np.arange(len(class_names))))
    k = len(images)
    fig = Figure(figsize=(6, 2 * k + 0.6))
    FigureCanvasAgg(fig)
    for row in range(k):
        panels = (
            (images[row], None, "image"),
            (targets[row], cmap, "label map"),
            (preds[row], cmap, "prediction"),
        )
        for col, (data, colour_map, name) in enumerate(panels):
            ax = fig.add_subplot(k, 3, row * 3 + col + 1)
            if colour_map is None:
                ax.imshow(data)
            else:
                ax.imshow(
                    data,
                    cmap=colour_map,
                    vmin=0,
                    vmax=len(class_names) - 1,
                    interpolation="nearest",
                )
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(name, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
