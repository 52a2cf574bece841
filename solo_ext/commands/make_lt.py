"""``solo-ext-make-lt``: writes a long-tailed subset as an ImageFolder tree plus its counts.

    solo-ext-make-lt --dataset cifar100_lt --train_path ./datasets --imbalance_factor 100 \\
        --out ./datasets/cifar100-lt-100

writes ``<out>/train/<class>/...`` (the long-tailed training images), ``<out>/val/<class>/...``
(the balanced evaluation split) and ``<out>/counts.json``. Images stored as files are linked
(``--copy`` copies them); in-memory ones (CIFAR, Fashion-MNIST, synthetic_lt) are written as
PNG. solo-learn's
own ``main_pretrain.py`` then trains on exactly this subset with ``data.dataset=custom``
``data.train_path=<out>/train`` (image_folder or DALI format).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from tqdm import tqdm

from solo_ext.config import ConfigError, one_line_errors
from solo_ext.data.datasets import LONG_TAILED, build_dataset, fill_data_cfg


def _folder_name(name: str, index: int) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
    return f"{index:04d}_{safe}"[:120]


def write_split(dataset: Any, out: Path, copy: bool, desc: str) -> list[int]:
    """Writes every item of ``dataset`` under ``out/<class>/``; returns the counts per class."""
    classes = dataset.classes
    folders = [_folder_name(c, i) for i, c in enumerate(classes)]
    for folder in folders:
        (out / folder).mkdir(parents=True, exist_ok=True)
    counts = [0] * len(classes)
    for i in tqdm(range(len(dataset)), desc=desc, unit="img"):
        label = dataset.targets[i]
        source = dataset.path_of(i) if hasattr(dataset, "path_of") else None
        if source is not None:
            target = out / folders[label] / f"{i:07d}{Path(source).suffix}"
            if copy:
                shutil.copy2(source, target)
            else:
                os.symlink(os.path.abspath(source), target)
        else:
            image, _ = dataset[i]
            image.save(out / folders[label] / f"{i:07d}.png")
        counts[label] += 1
    return counts


def make_lt(cfg: Any, out: str | Path, copy: bool = False) -> dict[str, Any]:
    """Builds the train / val splits of ``cfg.data`` and writes them under ``out``."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out={str(out)!r}: exists and is not empty; nothing was written")
    train = build_dataset(cfg.data, "train", None)
    val = build_dataset(cfg.data, "val", None)
    summary = {
        "dataset": cfg.data.dataset,
        "imbalance_factor": cfg.data.imbalance_factor,
        "seed": cfg.data.lt_seed,
        "classes": list(train.classes),
        "folders": [_folder_name(c, i) for i, c in enumerate(train.classes)],
        "shot_groups": list(train.shot_groups),
        "many_threshold": cfg.data.many_threshold,
        "few_threshold": cfg.data.few_threshold,
    }
    summary["train_counts"] = write_split(train, out / "train", copy, "train")
    summary["val_counts"] = write_split(val, out / "val", copy, "val")
    (out / "counts.json").write_text(json.dumps(summary, indent=2))
    print(
        f"wrote {sum(summary['train_counts'])} train and {sum(summary['val_counts'])} val "
        f"images of {len(train.classes)} classes to {out}"
    )
    return summary


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="solo-ext-make-lt", description=__doc__.splitlines()[0])
    p.add_argument("--dataset", required=True, choices=LONG_TAILED)
    p.add_argument("--out", required=True, help="new (or empty) directory to write")
    p.add_argument(
        "--train_path",
        help="data root (CIFAR folder, Fashion-MNIST's IDX folder, ImageFolder, dataset root)",
    )
    p.add_argument("--val_path", help="validation root (default: as the data set defines)")
    p.add_argument("--imbalance_factor", type=float)
    p.add_argument("--seed", type=int, default=0, help="which images are kept (data.lt_seed)")
    p.add_argument("--num_classes", type=int)
    p.add_argument("--train_split_file")
    p.add_argument("--val_split_file")
    p.add_argument(
        "--lt_n_max", type=int, help="images of the head class (default: all of a class)"
    )
    p.add_argument("--many_threshold", type=int, default=100)
    p.add_argument("--few_threshold", type=int, default=20)
    p.add_argument(
        "--download", action="store_true", help="let torchvision download CIFAR / Fashion-MNIST"
    )
    p.add_argument("--copy", action="store_true", help="copy image files instead of linking")
    return p


def run(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    data = {
        k: v for k, v in vars(args).items() if v is not None and k not in ("out", "copy", "seed")
    }
    data["lt_seed"] = args.seed
    cfg = OmegaConf.create({"data": data})
    with one_line_errors("solo-ext-make-lt"):
        fill_data_cfg(cfg)
        return make_lt(cfg, args.out, args.copy)


def main() -> None:
    run()


if __name__ == "__main__":
    main()
