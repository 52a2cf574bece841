"""``solo.args.knn``: ``main_knn.py`` on a solo-ext dataset; its keys (imbalance factor, split
files, ...) come from the run's ``args.json``.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType
from typing import Any

from solo_ext.facts import SOLO_EXT_ONLY
from solo_ext.solo_learn import parsed
from solo_ext.solo_learn.check import function, stop_if_broken

# the names of the solo-learn module this patch needs (checked before it applies)
NEEDS = (function("parse_args_knn"),)


def _knn_data(args: Any) -> Any:
    """The ``data`` section for ``main_knn.py --dataset <solo-ext dataset>``: the run's own
    (``args.json``) when it was trained on that dataset, with the paths given on the command
    line."""
    import json

    from omegaconf import OmegaConf

    from solo_ext.data.datasets import fill_data_cfg

    data: dict[str, Any] = {}
    args_json = os.path.join(str(args.pretrained_checkpoint_dir or ""), "args.json")
    if os.path.isfile(args_json):
        with open(args_json) as f:
            trained = json.load(f).get("data") or {}
        if trained.get("dataset") == args.dataset:
            data = {k: v for k, v in trained.items() if k != "train_class_counts"}
    data.update(dataset=args.dataset, format="image_folder", num_workers=args.num_workers)
    for key, value in (("train_path", args.train_data_path), ("val_path", args.val_data_path)):
        if value is not None:
            data[key] = str(value)
    cfg = OmegaConf.create({"data": data})
    fill_data_cfg(cfg)
    return cfg.data


def knn_guarded(parse_args_knn):
    """``parse_args_knn`` that first stops, in one line, a ``main_knn.py`` command using
    solo-ext (a solo-ext dataset, or the run of a solo-ext method) while the patches are broken:
    looked for in the command line, before argparse rejects a dataset it was not taught."""

    @functools.wraps(parse_args_knn)
    @parsed.config_errors
    def guarded():
        import argparse
        import json

        from solo_ext.solo_learn.check import BROKEN

        if BROKEN:
            pre = argparse.ArgumentParser(add_help=False)
            pre.add_argument("--dataset")
            pre.add_argument("--pretrained_checkpoint_dir")
            known, _ = pre.parse_known_args()
            cfg: dict[str, Any] = {"data": {"dataset": known.dataset}}
            args_json = os.path.join(str(known.pretrained_checkpoint_dir or ""), "args.json")
            if os.path.isfile(args_json):
                with open(args_json) as f:
                    cfg["method"] = json.load(f).get("method")
            stop_if_broken(cfg)
        return parse_args_knn()

    return guarded


def apply(module: ModuleType) -> None:
    original = knn_guarded(module.parse_args_knn)

    @functools.wraps(original)
    @parsed.config_errors
    def parse_args_knn():
        args = original()
        if args.dataset in SOLO_EXT_ONLY:
            parsed.RUN = parsed.Run(_knn_data(args), None)
        return args

    module.parse_args_knn = parse_args_knn
