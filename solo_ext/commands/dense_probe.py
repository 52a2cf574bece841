"""``solo-ext-dense-probe``: a linear 1x1 probe on a frozen backbone's last feature map.

    solo-ext-dense-probe pretrained_checkpoint_dir=trained_models/densecl/<run id>

On ``synthetic_lt``, whose images come with per-pixel label maps (background, the main object's
shape, the second object's shape), the probe's logits on the map are upsampled (bilinear) to the
image and trained with per-pixel cross-entropy on the training split; the validation mIoU and
pixel accuracy go into ``metrics.json`` beside the checkpoint (``dense_miou``,
``dense_pixel_acc``), and ``dense_predictions.png`` shows a few images, their label maps and the
predictions side by side. Keys: ``solo_ext/conf/dense_probe.yaml``.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from solo_ext.commands import mains
from solo_ext.commands.options import DENSE_PROBE_OPTIONS as OPTIONS
from solo_ext.config import ConfigError, check_options, fill_options
from solo_ext.data.datasets import build_dataset
from solo_ext.data.synthetic import PART_CLASSES
from solo_ext.data.transforms import build_eval_transform
from solo_ext.eval.metrics_file import update_metrics
from solo_ext.eval.segmentation import confusion, plot_predictions, segmentation_report
from solo_ext.facts import DATASETS, facts
from solo_ext.modules.feature_maps import feature_map
from solo_ext.runs.environment import environment
from solo_ext.runs.load import load_for_eval


@torch.no_grad()
def feature_maps(backbone: nn.Module, dataset, batch_size: int = 128) -> torch.Tensor:
    """Last feature maps [N, C, h, w] of a dataset of (image, label) under eval mode."""
    backbone.eval()
    maps = [feature_map(backbone, x)[0].float() for x, _ in DataLoader(dataset, batch_size)]
    return torch.cat(maps)


class DenseProbe(pl.LightningModule):
    """A 1x1 convolution on frozen maps; logits upsampled to the label maps' size."""

    def __init__(self, dim: int, num_classes: int, lr: float, weight_decay: float):
        super().__init__()
        self.save_hyperparameters()
        self.head = nn.Conv2d(dim, num_classes, kernel_size=1)

    def forward(self, fmap: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        return F.interpolate(self.head(fmap), size=size, mode="bilinear", align_corners=False)

    def training_step(self, batch, batch_idx):
        fmap, target = batch
        loss = F.cross_entropy(self(fmap, target.shape[-2:]), target.long())
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(
            self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay
        )


def run(cfg: DictConfig) -> dict[str, Any]:
    """Checks ``cfg`` (module docstring), trains the probe, returns the metrics."""
    OmegaConf.set_struct(cfg, False)
    check_options(cfg, OPTIONS)
    fill_options(cfg, OPTIONS)  # (a whole config given with --config-name may leave keys out)
    backbone, pre_cfg, out_dir = load_for_eval(cfg)
    dataset = pre_cfg.data.dataset
    if not facts(dataset).part_labels:
        with_labels = [name for name, f in DATASETS.items() if f.part_labels]
        raise ConfigError(
            f"data.dataset={dataset!r}: the dense probe needs per-pixel labels, which "
            f"{', '.join(with_labels)} has"
        )
    pl.seed_everything(cfg.seed, workers=True)
    transform = build_eval_transform(dataset)
    splits = {s: build_dataset(pre_cfg.data, s, transform) for s in ("train", "val")}
    maps = {s: feature_maps(backbone, d) for s, d in splits.items()}
    labels = {s: torch.as_tensor(d.label_maps) for s, d in splits.items()}
    num_classes = len(PART_CLASSES)
    probe = DenseProbe(
        maps["train"].size(1), num_classes, cfg.optimizer.lr, cfg.optimizer.weight_decay
    )
    loader = DataLoader(
        TensorDataset(maps["train"], labels["train"]),
        batch_size=cfg.optimizer.batch_size,
        shuffle=True,
    )
    trainer = pl.Trainer(
        max_epochs=cfg.max_epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(probe, loader)
    probe.eval()
    with torch.no_grad():
        pred = probe(maps["val"], labels["val"].shape[-2:]).argmax(dim=1)
    report = segmentation_report(confusion(pred, labels["val"], num_classes))
    metrics = {f"dense_{k}": v for k, v in report.items()}
    metrics["dense_map_size"] = list(maps["val"].shape[-2:])
    metrics["dense_environment"] = environment(precision="32-true", accelerator="cpu")
    update_metrics(out_dir, metrics)
    if cfg.num_plot:
        k = min(cfg.num_plot, len(splits["val"]))
        picks = np.linspace(0, len(splits["val"]) - 1, k).astype(int)
        plot_predictions(
            out_dir / "dense_predictions.png",
            splits["val"].data[picks],
            labels["val"][picks].numpy(),
            pred[picks].numpy(),
            PART_CLASSES,
            f"dense probe: mIoU {report['miou']:.1f}%",
        )
    print(
        f"dense probe on synthetic_lt val: mIoU {report['miou']:.2f}%  "
        f"pixel acc {report['pixel_acc']:.2f}%  (map {tuple(maps['val'].shape[-2:])})"
    )
    return metrics


main = mains.dense_probe  # (its console script: the same, imported without this module)

if __name__ == "__main__":
    main()
