"""zoo/summarize.py's classifier-stage tables: every stage of every method, mean and sample
standard deviation over the runs that have it, and the per-seed cells from the runs' files."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

ZOO = Path(__file__).resolve().parents[1] / "zoo" / "summarize.py"


def load():
    spec = importlib.util.spec_from_file_location("zoo_summarize", ZOO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_run(root: Path, method: str, seed: int, metrics: dict) -> None:
    run = root / method / f"run{seed}"
    run.mkdir(parents=True)
    (run / "args.json").write_text(json.dumps({"method": method, "seed": seed}))
    (run / "metrics.json").write_text(json.dumps(metrics))


def stage_metrics(prefix: str, base: float) -> dict:
    return {
        f"{prefix}acc1": base,
        f"{prefix}acc1_many": base + 10,
        f"{prefix}acc1_medium": base + 5,
        f"{prefix}acc1_few": base - 20,
    }


def test_the_stage_table_gives_each_stage_its_mean_and_spread_and_each_seed_its_cells(tmp_path):
    summarize = load()
    write_run(
        tmp_path,
        "dscl",
        0,
        {
            **stage_metrics("linear_", 60.0),
            **stage_metrics("linear_crt_", 70.0),
            "linear_tau_norm_tau": 0.7,
            **stage_metrics("linear_tau_norm_", 50.0),
        },
    )
    write_run(
        tmp_path,
        "dscl",
        1,
        {
            **stage_metrics("linear_", 64.0),
            **stage_metrics("linear_crt_", 71.0),
            "linear_tau_norm_tau": 1.1,
            **stage_metrics("linear_tau_norm_", 54.0),
        },
    )
    write_run(tmp_path, "scl", 0, stage_metrics("linear_lws_", 40.0))
    runs = summarize.collect(tmp_path)
    rows = {
        tuple(c.strip() for c in line.split("|")[1:3]): [c.strip() for c in line.split("|")[3:-1]]
        for line in summarize.stage_table(runs).splitlines()[2:]
    }
    # the sample standard deviation of two values a, b is |a - b| / sqrt(2)
    assert rows[("`dscl`", "balanced_linear")][:2] == ["0, 1", f"62.0 ± {4 / math.sqrt(2):.1f}"]
    assert rows[("`dscl`", "crt")][1:5] == [
        f"{m} ± {1 / math.sqrt(2):.1f}" for m in (70.5, 80.5, 75.5, 50.5)
    ]
    assert rows[("`dscl`", "tau_norm")][-1] == "0.7, 1.1"
    assert rows[("`scl`", "lws")] == [
        "0",
        "40.0",  # one seed: no spread to give
        "50.0",
        "45.0",
        "20.0",
        "",
    ]
    # stages a method's runs do not have get no row
    assert set(rows) == {
        ("`dscl`", "balanced_linear"),
        ("`dscl`", "crt"),
        ("`dscl`", "tau_norm"),
        ("`scl`", "lws"),
    }
    per_seed = summarize.stage_seeds(runs).splitlines()
    assert per_seed[0] == "| seed | stage | dscl | scl |"
    assert "| 1 | tau_norm | 54.0 / 64.0 / 59.0 / 34.0 |  |" in per_seed
    assert "| 0 | lws |  | 40.0 / 50.0 / 45.0 / 20.0 |" in per_seed
    summarize.plot_stages(runs, tmp_path / "stages.png")
    assert (tmp_path / "stages.png").stat().st_size > 0


def test_the_untrained_floor_is_its_own_row(tmp_path):
    """A run named untrained-* (the floor: scl at lr 1e-8) is not folded into scl's row."""
    summarize = load()
    for name, seed in (("untrained-fashion-mnist-lt", 0), ("scl-fashion-mnist-lt", 0)):
        run = tmp_path / name / "scl" / "run"
        run.mkdir(parents=True)
        args = {
            "method": "scl",
            "seed": seed,
            "name": name,
            "data": {"dataset": "fashion_mnist_lt"},
        }
        (run / "args.json").write_text(json.dumps(args))
        base = 50.0 if "un" in name else 70.0
        metrics = dict(zip(summarize.KEYS, (base, base + 10, base - 10, base - 30)))
        (run / "metrics.json").write_text(json.dumps(metrics))
    runs = summarize.collect(tmp_path)
    assert sorted(runs) == ["scl", "untrained"]
    assert runs["untrained"][0]["knn_acc1"] == 50.0 and runs["scl"][0]["knn_acc1"] == 70.0
    # one seed: its values, no spread
    assert "| `scl` | 0 | 70.0 | 80.0 | 60.0 | 40.0 |" in summarize.table(runs).splitlines()
    summarize.plot(runs, tmp_path / "knn.png", "fashion_mnist_lt")  # the floor as a dashed line
    assert (tmp_path / "knn.png").stat().st_size > 0


def test_the_entry_points_table_reads_main_linears_last_epoch_and_sets_the_gap_beside_the_spread(
    tmp_path,
):
    """One method through solo-ext-* (DSCL's stage in the run's metrics.json) and through
    solo-learn's scripts (its stage in main_linear.py's CSV log, the last epoch's row)."""
    summarize = load()
    knn = dict.fromkeys(summarize.KEYS[1:], 0.0)
    ext = tmp_path / "dscl"
    for seed, (knn_top1, stage_top1) in enumerate(((50.0, 40.0), (54.0, 44.0))):
        run = ext / f"seed{seed}" / "trained_models" / "dscl" / "0"
        run.mkdir(parents=True)
        (run / "args.json").write_text(json.dumps({"method": "dscl", "seed": seed}))
        metrics = {"knn_acc1": knn_top1, **knn, **stage_metrics("linear_", stage_top1)}
        (run / "metrics.json").write_text(json.dumps(metrics))
    scripts = tmp_path / "solo-learn-scripts-dscl"
    for seed, (knn_top1, last_top1) in enumerate(((51.0, 47.0), (57.0, 51.0))):
        run = scripts / f"seed{seed}" / "trained_models" / "dscl" / "0"
        run.mkdir(parents=True)
        (run / "args.json").write_text(json.dumps({"method": "dscl", "seed": seed}))
        (run / "metrics.json").write_text(json.dumps({"knn_acc1": knn_top1, **knn}))
        log = scripts / f"seed{seed}" / "lightning_logs" / "version_0"
        log.mkdir(parents=True)
        fields = "val_acc1,val_acc1_many,val_acc1_medium,val_acc1_few,epoch,step,train_loss_epoch"
        rows = [  # an early epoch, the last, and a training row (no validation) after it
            "10.0,11.0,12.0,13.0,0,8,",
            f"{last_top1},{last_top1 + 10},{last_top1 + 5},{last_top1 - 20},9,89,",
            ",,,,9,89,2.5",
        ]
        (log / "metrics.csv").write_text("\n".join([fields, *rows]) + "\n")
    lines = summarize.entry_point_table([ext, scripts]).splitlines()
    cells = {
        line.split("|")[2].strip(): [c.strip() for c in line.split("|")[3:-1]]
        for line in lines[2:4]
    }
    root2 = math.sqrt(2)
    assert cells["`solo-ext-*`"][:2] == ["0, 1", f"52.0 ± {4 / root2:.1f}"]
    assert cells["`solo-ext-*`"][5:] == [f"{m} ± {4 / root2:.1f}" for m in (42.0, 52.0, 47.0, 22.0)]
    assert cells["solo-learn's scripts"][:2] == ["0, 1", f"54.0 ± {6 / root2:.1f}"]
    assert cells["solo-learn's scripts"][5:] == [
        f"{m} ± {4 / root2:.1f}" for m in (49.0, 59.0, 54.0, 29.0)
    ]
    gaps = [line for line in lines if line.startswith("| `dscl` | ")][2:]
    # the standard error of the gap, sqrt(s1² / 2 + s2² / 2): s² is 8 and 18 for kNN, 8 and 8
    se_knn, se_stage = math.sqrt(8 / 2 + 18 / 2), math.sqrt(8 / 2 + 8 / 2)
    assert gaps == [
        f"| `dscl` | kNN top-1 | 2.0 | {4 / root2:.1f} | {6 / root2:.1f} | {se_knn:.1f} |",
        f"| `dscl` | `balanced_linear` top-1 | 7.0 | {4 / root2:.1f} | {4 / root2:.1f}"
        f" | {se_stage:.1f} |",
    ]
