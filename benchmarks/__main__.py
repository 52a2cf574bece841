"""``python -m benchmarks`` (from the repository's root): loss kernels, training steps and
DALI training loaders against their references.

    python -m benchmarks                      # everything, official kernel sizes
    python -m benchmarks --what kernels --kernels dscl --json bench.json
    python -m benchmarks --what loaders --device cpu --loader-threads 2
    python -m benchmarks --tiny               # seconds: checks the runner itself

Prints one table and, with ``--json``, writes the rows and the machine they ran on. On a GPU the
table gives times, their ratios against each reference measured in the same run, images/s and
peak memory; on CPU it gives the counted work (FLOPs, operators dispatched, peak memory) and
times only as ratios measured in the same run. ``loaders`` (part of everything) needs NVIDIA DALI;
without it, it prints one line and is skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import kernels as K
from benchmarks.loaders import LoaderSizes
from benchmarks.timing import measure


def machine(device: torch.device) -> dict[str, Any]:
    info = {
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    from solo_ext.host import HOST

    info["host"] = HOST
    return info


def kernel_rows(
    names: list[str],
    sizes: str,
    device: torch.device,
    warmup: int,
    repeats: int,
    done: Callable[[list[dict]], None] | None = None,
):
    """The rows of every kernel; ``done`` is given each kernel's rows as soon as they exist."""
    rows = []
    for name in names:
        first = len(rows)
        kernel = K.KERNELS[name](K.SIZES[sizes][name], device)
        results = measure(kernel.candidates, device, warmup=warmup, repeats=repeats)
        for candidate, res in results.items():
            rows.append(
                {
                    "kind": "kernel",
                    "name": kernel.name,
                    "shape": kernel.shape,
                    "candidate": candidate,
                    "median_s": res.median,
                    "q1_s": res.quartiles[0],
                    "q3_s": res.quartiles[1],
                    "peak_mib": res.peak_mib,
                    "gflops": res.flops / 1e9,
                    "ops": res.ops,
                    "ratio_vs_floor": res.median / results["floor"].median,
                    "ratio_vs_straightforward": res.median / results["straightforward"].median,
                }
            )
        if done is not None:
            done(rows[first:])
    return rows


def add_step_ratios(rows: list[dict]) -> None:
    """Each step's time and FLOPs over its reference's."""
    by_label = {(r["name"], r["candidate"]): r for r in rows}
    for r in rows:
        ref = by_label[(r["name"], r["reference"])]
        r["ratio_vs_reference"] = r["median_s"] / ref["median_s"]
        if r.get("gflops") and ref.get("gflops"):
            r["flops_ratio_vs_reference"] = r["gflops"] / ref["gflops"]
        if r.get("ops") and ref.get("ops"):
            r["ops_ratio_vs_reference"] = r["ops"] / ref["ops"]


def format_table(rows: list[dict], device: str = "cuda") -> str:
    """The rows as a markdown table; on CPU without the times themselves (their ratios only)."""
    timed = device != "cpu"
    head = ["kind", "benchmark", "shape", "candidate"]
    head += ["median ms", "IQR ms"] if timed else []
    head += ["time ratio", "GFLOP (ratio)", "operators (ratio)", "peak MiB"]
    head += ["images/s"] if timed else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["kind"] == "kernel":
            ratio = (
                f"{r['ratio_vs_floor']:.2f}x floor, {r['ratio_vs_straightforward']:.2f}x straightf."
            )
        elif r["kind"] == "loader":  # images/s over the reference's: < 1 is slower
            ratio = f"{r['ratio_vs_solo_learn']:.3f}x {r['reference']} images/s"
        else:
            ratio = f"{r['ratio_vs_reference']:.3f}x {r['reference']}"
        peak = "n/a" if r.get("peak_mib") is None else f"{r['peak_mib']:.0f}"
        flops = "n/a"
        if r.get("gflops") is not None:
            flops = f"{r['gflops']:.1f}"
            if "flops_ratio_vs_reference" in r:
                flops += f" ({r['flops_ratio_vs_reference']:.3f}x)"
        ops = "n/a" if r.get("ops") is None else str(r["ops"])
        if "ops_ratio_vs_reference" in r:
            ops += f" ({r['ops_ratio_vs_reference']:.3f}x)"
        cells = [r["kind"], r["name"], r["shape"], r["candidate"]]
        if timed:
            cells += [
                f"{1000 * r['median_s']:.1f}",
                f"{1000 * r['q1_s']:.1f}-{1000 * r['q3_s']:.1f}",
            ]
        cells += [ratio, flops, ops, peak]
        if timed:
            cells.append("n/a" if r.get("images_per_s") is None else f"{r['images_per_s']:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def loader_rows(args: argparse.Namespace, device: torch.device) -> list[dict]:
    """The DALI training loaders (solo-ext's sampled readers against solo-learn's file reader);
    without DALI, one line and no rows."""
    from solo_ext.data.dali import dali_installed

    if not dali_installed():
        print("loaders: skipped, NVIDIA DALI is not installed (pip install -e '.[dali]')")
        return []
    from benchmarks.loaders import measure_loaders

    sizes = dataclasses.replace(
        LoaderSizes.tiny() if args.tiny else LoaderSizes(),
        images=args.loader_images,
        image_size=args.loader_image_size,
        classes=args.loader_classes,
        crop_size=args.loader_crop,
    )
    return measure_loaders(
        sizes,
        args.batch_size,
        device.type,
        args.loader_threads,
        args.warmup,
        args.rounds,
    )


def _at_least(low: int):
    """An argparse type: an int >= ``low``."""

    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{value}: must be >= {low}")
        return value

    return parse


def check_step_args(p: argparse.ArgumentParser, args: argparse.Namespace, device_type: str):
    """Unknown ``--pairs`` and a backbone / crop the config checks refuse stop the run in one
    line, before anything is measured."""
    from benchmarks.steps import pairs, step_cfg
    from solo_ext.config import ConfigError

    known = sorted({key for (name, method, _), _ in pairs() for key in (name, method)})
    for name in args.pairs or []:
        if name not in known:
            p.error(f"--pairs {name}: not one of {known}")
    try:
        step_cfg("scl", {}, args.batch_size, device_type, args.tiny, args.backbone, args.crop_size)
    except ConfigError as err:
        p.error(str(err))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("--what", choices=["kernels", "steps", "loaders", "all"], default="all")
    p.add_argument("--kernels", nargs="+", choices=sorted(K.KERNELS), default=sorted(K.KERNELS))
    p.add_argument("--sizes", choices=sorted(K.SIZES), default="official")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--warmup",
        type=_at_least(0),
        default=1,
        help="untimed calls / steps / loader epochs first (loaders: at least one)",
    )
    p.add_argument("--repeats", type=_at_least(1), default=5, help="timed rounds of each kernel")
    p.add_argument(
        "--batch-size",
        type=_at_least(1),
        default=64,
        help="training-step batch per view; loader batch",
    )
    p.add_argument("--backbone", default="resnet18", help="training-step backbone")
    p.add_argument(
        "--crop-size",
        type=_at_least(1),
        default=32,
        help="training-step crop (above 64: ImageNet stem)",
    )
    p.add_argument("--steps", type=_at_least(1), default=3, help="timed steps per fit")
    p.add_argument(
        "--rounds",
        type=_at_least(1),
        default=3,
        help="fits of each method (the first counts its step's work) / epochs of each loader, "
        "interleaved",
    )
    p.add_argument("--pairs", nargs="+", help="only these methods' step pairs (e.g. dscl)")
    p.add_argument("--loader-images", type=_at_least(1), default=1024, help="loader: images")
    p.add_argument(
        "--loader-image-size", type=_at_least(8), default=256, help="loader: JPEG side (px)"
    )
    p.add_argument("--loader-classes", type=_at_least(1), default=8, help="loader: classes")
    p.add_argument("--loader-crop", type=_at_least(1), default=224, help="loader: crop (px)")
    p.add_argument(
        "--loader-threads",
        type=_at_least(1),
        help="loader: DALI threads of every pipeline (default 2 on cpu, 4 on cuda)",
    )
    p.add_argument(
        "--tiny", action="store_true", help="tiny sizes, two rounds of one step: seconds"
    )
    p.add_argument("--json", type=Path, help="also write the rows and the machine here")
    args = p.parse_args(argv)
    if args.tiny:
        args.sizes, args.repeats, args.warmup = "tiny", 1, 0
        args.batch_size, args.steps, args.rounds = 4, 1, 2
        tiny = LoaderSizes.tiny()
        args.loader_images, args.loader_image_size = tiny.images, tiny.image_size
        args.loader_classes, args.loader_crop = tiny.classes, tiny.crop_size
    if args.loader_threads is None:
        args.loader_threads = 4 if args.device.startswith("cuda") else 2
    if args.loader_images < args.loader_classes:
        p.error(f"--loader-images {args.loader_images}: fewer than --loader-classes")
    if args.what in ("loaders", "all") and args.batch_size > args.loader_images:
        p.error(f"--batch-size {args.batch_size}: above --loader-images {args.loader_images}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device={args.device}: no CUDA device here")
    if args.what in ("steps", "all"):
        check_step_args(p, args, device.type)

    result = {"machine": machine(device), "args": {k: str(v) for k, v in vars(args).items()}}
    rows: list[dict] = []
    result["rows"] = rows

    def keep(new_rows: list[dict]) -> None:
        """Adds finished rows and rewrites ``--json``: a run stopped half-way (a time limit, a
        fault) keeps every kernel and pair it finished."""
        rows.extend(new_rows)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=2))

    keep([])  # a bad --json path stops the run before anything is measured
    if args.what in ("kernels", "all"):
        kernel_rows(args.kernels, args.sizes, device, args.warmup, args.repeats, done=keep)
    if args.what in ("steps", "all"):
        from benchmarks.steps import measure_pairs

        def keep_pair(pair_rows: list[dict]) -> None:
            add_step_ratios(pair_rows)
            keep(pair_rows)

        measure_pairs(
            device,
            args.batch_size,
            args.steps,
            args.warmup,
            args.rounds,
            args.tiny,
            args.pairs,
            args.backbone,
            args.crop_size,
            done=keep_pair,
        )
    if args.what in ("loaders", "all"):
        keep(loader_rows(args, device))
    print(f"machine: {json.dumps(result['machine'])}")
    print(format_table(rows, device.type))
    return result


if __name__ == "__main__":
    sys.exit(main() and 0)
