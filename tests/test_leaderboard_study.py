"""solo-ext-leaderboard --study, the zoo pages' tables: each row's mean and sample standard
deviation over seeds (kNN, every classifier stage), the per-seed cells and file, the entry points
side by side, and Welch's / paired t-tests with Holm's correction as worked by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy import stats

from solo_ext.leaderboard import cli, study

ZOO = Path(__file__).resolve().parents[1] / "zoo"


def write_run(run: Path, method: str, seed: int, metrics: dict, **more) -> Path:
    """A run directory: its args.json (a fashion_mnist_lt run) and metrics.json."""
    run.mkdir(parents=True)
    args = {"method": method, "seed": seed, "data": {"dataset": "fashion_mnist_lt"}, **more}
    (run / "args.json").write_text(json.dumps(args))
    (run / "metrics.json").write_text(json.dumps(metrics))
    return run


def stage_metrics(prefix: str, base: float) -> dict:
    return {
        f"{prefix}acc1": base,
        f"{prefix}acc1_many": base + 10,
        f"{prefix}acc1_medium": base + 5,
        f"{prefix}acc1_few": base - 20,
    }


def test_the_stage_table_gives_each_stage_its_mean_and_spread_and_each_seed_its_cells(tmp_path):
    dscl = ((60.0, 70.0, 0.7, 50.0), (64.0, 71.0, 1.1, 54.0))  # linear, cRT, tau, tau-norm
    for seed, (linear, crt, tau, tau_norm) in enumerate(dscl):
        metrics = {**stage_metrics("linear_", linear), **stage_metrics("linear_crt_", crt)}
        metrics.update({"linear_tau_norm_tau": tau, **stage_metrics("linear_tau_norm_", tau_norm)})
        write_run(tmp_path / "dscl" / f"run{seed}", "dscl", seed, metrics)
    write_run(tmp_path / "scl" / "run0", "scl", 0, stage_metrics("linear_lws_", 40.0))
    runs = study.collect(tmp_path)
    rows = {
        tuple(c.strip() for c in line.split("|")[1:3]): [c.strip() for c in line.split("|")[3:-1]]
        for line in study.stage_table(runs).splitlines()[2:]
    }
    # the sample standard deviation of two values a, b is |a - b| / sqrt(2)
    assert rows[("`dscl`", "balanced_linear")][:2] == ["0, 1", f"62.0 ± {4 / math.sqrt(2):.1f}"]
    assert rows[("`dscl`", "crt")][1:5] == [
        f"{m} ± {1 / math.sqrt(2):.1f}" for m in (70.5, 80.5, 75.5, 50.5)
    ]
    assert rows[("`dscl`", "tau_norm")][-1] == "0.7, 1.1"
    assert rows[("`scl`", "lws")] == ["0", "40.0", "50.0", "45.0", "20.0", ""]  # (no spread)
    # stages a method's runs do not have get no row
    stages = {("`dscl`", stage) for stage in ("balanced_linear", "crt", "tau_norm")}
    assert set(rows) == stages | {("`scl`", "lws")}
    per_seed = study.stage_seeds(runs).splitlines()
    assert per_seed[0] == "| seed | stage | dscl | scl |"
    assert "| 1 | tau_norm | 54.0 / 64.0 / 59.0 / 34.0 |  |" in per_seed
    assert "| 0 | lws |  | 40.0 / 50.0 / 45.0 / 20.0 |" in per_seed
    study.plot_stages(runs, tmp_path / "stages.png")
    assert (tmp_path / "stages.png").stat().st_size > 0


def test_the_untrained_floor_is_its_own_row(tmp_path):
    """A run named untrained-* (the floor: scl at lr 1e-8) is not folded into scl's row."""
    for name in ("untrained-fashion-mnist-lt", "scl-fashion-mnist-lt"):
        base = 50.0 if "un" in name else 70.0
        metrics = dict(zip(study.KEYS, (base, base + 10, base - 10, base - 30)))
        write_run(tmp_path / name / "scl" / "run", "scl", 0, metrics, name=name)
    runs = study.collect(tmp_path)
    assert sorted(runs) == ["scl", "untrained"]
    assert runs["untrained"][0]["knn_acc1"] == 50.0 and runs["scl"][0]["knn_acc1"] == 70.0
    # one seed: its values, no spread
    assert "| `scl` | 0 | 70.0 | 80.0 | 60.0 | 40.0 |" in study.table(runs).splitlines()
    study.plot(runs, tmp_path / "knn.png", "fashion_mnist_lt")  # the floor as a dashed line
    assert (tmp_path / "knn.png").stat().st_size > 0


def test_the_entry_points_table_reads_main_linears_last_epoch_and_sets_the_gap_beside_the_spread(
    tmp_path,
):
    """One method through solo-ext-* (DSCL's stage in the run's metrics.json) and through
    solo-learn's scripts (its stage the main_linear.py run of the run's checkpoint, the last
    epoch's validation row of its CSV log, as the leaderboard attaches it)."""
    knn = dict.fromkeys(study.KEYS[1:], 0.0)
    ext = tmp_path / "dscl"
    for seed, (knn_top1, stage_top1) in enumerate(((50.0, 40.0), (54.0, 44.0))):
        metrics = {"knn_acc1": knn_top1, **knn, **stage_metrics("linear_", stage_top1)}
        write_run(ext / f"seed{seed}" / "trained_models" / "dscl" / "0", "dscl", seed, metrics)
    scripts = tmp_path / "solo-learn-scripts-dscl"
    for seed, (knn_top1, last_top1) in enumerate(((51.0, 47.0), (57.0, 51.0))):
        run = scripts / f"seed{seed}" / "trained_models" / "dscl" / "0"
        write_run(run, "dscl", seed, {"knn_acc1": knn_top1, **knn})
        linear = scripts / f"seed{seed}" / "linear" / "linear" / "1"  # (checkpoint.dir=linear)
        linear.mkdir(parents=True)
        ckpt = str(run / "dscl-0-ep=9.ckpt")
        (linear / "args.json").write_text(json.dumps({
            "pretrained_feature_extractor": ckpt, "data": {"dataset": "fashion_mnist_lt"},
            "checkpoint": {"dir": "linear"}, "max_epochs": 10}))  # fmt: skip
        log = scripts / f"seed{seed}" / "lightning_logs" / "version_1"  # (where it ran)
        log.mkdir(parents=True)
        fields = "val_acc1,val_acc1_many,val_acc1_medium,val_acc1_few,epoch,step,train_loss_epoch"
        rows = [  # an early epoch, the last, and a training row (no validation) after it
            "10.0,11.0,12.0,13.0,0,8,",
            f"{last_top1},{last_top1 + 10},{last_top1 + 5},{last_top1 - 20},9,89,",
            ",,,,9,89,2.5",
        ]
        (log / "metrics.csv").write_text("\n".join([fields, *rows]) + "\n")
    lines = study.entry_point_table([ext, scripts]).splitlines()
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
    # for the stage; Welch's interval: gap ± t(0.975, df) se, df by Welch-Satterthwaite
    want = []
    for label, gap, v1, v2 in (("kNN top-1", -2.0, 8, 18), ("`balanced_linear` top-1", -7.0, 8, 8)):
        se = math.sqrt(v1 / 2 + v2 / 2)
        df = se**4 / ((v1 / 2) ** 2 + (v2 / 2) ** 2)
        half = stats.t.ppf(0.975, df) * se
        want.append(
            f"| `dscl` | {label} | {gap:+.1f} | {math.sqrt(v1):.1f} | {math.sqrt(v2):.1f}"
            f" | {se:.1f} | [{gap - half:+.1f}, {gap + half:+.1f}] |"
        )
    assert gaps == want


def test_holm_adjusts_one_family_step_down():
    holm = study.holm
    # sorted 0.01, 0.03, 0.04: x3, x2, x1 -> 0.03, 0.06, 0.04, made non-decreasing: 0.06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # (at most 1)
    assert holm([0.2]) == [0.2]


def test_welch_and_paired_tests_as_worked_by_hand():
    a, b = [60.0, 62.0, 67.0], [55.0, 56.0, 54.0]
    va, vb = (sum((x - sum(v) / 3) ** 2 for x in v) / 2 for v in (a, b))  # 13, 1
    se = math.sqrt(va / 3 + vb / 3)
    df = se**4 / ((va / 3) ** 2 / 2 + (vb / 3) ** 2 / 2)
    gap = sum(a) / 3 - sum(b) / 3
    got = study.welch(a, b)
    assert got["gap"] == pytest.approx(gap) and got["se"] == pytest.approx(se)
    assert got["df"] == pytest.approx(df) and got["t"] == pytest.approx(gap / se)
    assert got["p"] == pytest.approx(2 * stats.t.sf(gap / se, df))
    half = stats.t.ppf(0.975, df) * se
    assert (got["low"], got["high"]) == pytest.approx((gap - half, gap + half))
    # paired: the differences 5, 6, 13 (mean 8, sd sqrt(19)), 2 degrees of freedom
    got = study.paired(a, b)
    se = math.sqrt(19 / 3)
    assert (got["gap"], got["se"], got["df"]) == pytest.approx((8.0, se, 2.0))
    assert got["p"] == pytest.approx(2 * stats.t.sf(8 / se, 2))
    half = stats.t.ppf(0.975, 2) * se
    assert (got["low"], got["high"]) == pytest.approx((8 - half, 8 + half))


# a study's rows (each folder one, two of them of pbsd) and their runs' kNN top-1 by seed
STUDY = {"pbsd": [50.0, 52.0, 51.0], "pbsd-w0": [55.0, 58.0, 54.0], "dscl": [53.0, 52.0, 57.0]}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    """A study's layout: <row>/seed<N>/.../metrics.json; its runs by folder."""
    root = tmp_path_factory.mktemp("study")
    for row, tops in STUDY.items():
        for seed, top in enumerate(tops):
            method = row.split("-")[0]
            metrics = {"knn_acc1": top, "knn_k10_acc1": top - 1, **stage_metrics("linear_", top)}
            metrics.update({f"knn_{k}": 0.0 for k in ("acc1_many", "acc1_medium", "acc1_few")})
            metrics.update({f"knn_k10_{k}": 0.0 for k in ("acc1_many", "acc1_medium", "acc1_few")})
            run = root / row / f"seed{seed}" / "trained_models" / method / "0"
            write_run(run, method, seed, metrics)
    return {"root": root, "runs": study.collect(root, by="folder")}


def test_the_per_seed_file_rebuilds_the_tables_and_rows_go_by_folder(folders, tmp_path):
    runs = folders["runs"]
    assert sorted(runs) == ["dscl", "pbsd", "pbsd-w0"]  # (by method: two rows, not three)
    assert sorted(study.collect(folders["root"])) == ["dscl", "pbsd"]
    study.write_seeds(runs, tmp_path / "seeds.csv")
    again = study.read_seeds(tmp_path / "seeds.csv")
    assert study.table(again) == study.table(runs)
    assert study.stage_table(again) == study.stage_table(runs)
    assert "kNN k 10 top-1" in study.table(runs)
    comparisons = [("pbsd", "dscl", False), ("pbsd-w0", "pbsd", True)]
    assert study.significance_table(again, comparisons) == study.significance_table(
        runs, comparisons
    )


def test_the_significance_table_corrects_each_metric_over_its_comparisons(folders):
    comparisons = [("pbsd", "dscl", False), ("pbsd-w0", "pbsd", True)]
    lines = study.significance_table(folders["runs"], comparisons).splitlines()
    knn = [line for line in lines if line.startswith("| kNN top-1 |")]
    welch = study.welch(STUDY["pbsd"], STUDY["dscl"])
    pair = study.paired(STUDY["pbsd-w0"], STUDY["pbsd"])
    adjusted = study.holm([welch["p"], pair["p"]])
    assert knn[0].split("|")[2:4] == [" `pbsd` - `dscl` ", " 3 / 3 "]
    assert knn[0].split("|")[9].strip() == f"{adjusted[0]:.3f}"
    assert knn[1].split("|")[2:4] == [" `pbsd-w0` - `pbsd` (paired) ", " 3 paired "]
    assert knn[1].split("|")[4].strip() == f"{pair['gap']:+.1f}"
    assert knn[1].split("|")[9].strip() == f"{adjusted[1]:.3f}"
    # a direction is read only below 0.05 after the correction
    for line, p in zip(knn, adjusted):
        verdict = line.split("|")[10].strip()
        assert (verdict == "not separated at this number of seeds") == (p >= 0.05)
    # a metric no run has is left out; one every row has is there for each comparison
    assert not [line for line in lines if line.startswith("| crt |")]
    assert len([line for line in lines if line.startswith("| balanced_linear |")]) == 2


def test_a_comparison_short_of_seeds_is_listed_untested_and_counts_in_its_family(folders):
    runs = {**folders["runs"], "pbsd-16px": folders["runs"]["pbsd-w0"][:1]}  # one seed: no test
    comparisons = [("pbsd", "dscl", False), ("pbsd-16px", "pbsd", False)]
    lines = study.significance_table(runs, comparisons).splitlines()
    knn = [line for line in lines if line.startswith("| kNN top-1 |")]
    welch = study.welch(STUDY["pbsd"], STUDY["dscl"])
    # Holm over both comparisons asked for: the tested one's p doubled (the other counts as 1)
    assert knn[0].split("|")[9].strip() == f"{min(1.0, 2 * welch['p']):.3f}"
    cells = [c.strip() for c in knn[1].split("|")[2:11]]
    assert cells[:2] == ["`pbsd-16px` - `pbsd`", "1 / 3"]
    assert cells[2:8] == ["n/a"] * 6 and cells[8].startswith("not tested")


def test_a_row_without_a_metric_leaves_that_metrics_family(folders):
    """An entry point that makes DSCL's stage only (solo-learn's main_linear.py) is compared on
    what it measures: on cRT its comparison is neither listed nor counted in Holm's family. A
    row with no runs yet (a study under way) is still listed, untested, and counted."""
    with_crt = {
        row: [{**r, "linear_crt_acc1": r["knn_acc1"] + 10} for r in folders["runs"][row]]
        for row in ("pbsd", "dscl")
    }
    runs = {**with_crt, "scripts": folders["runs"]["pbsd-w0"]}  # (no linear_crt_ key)
    crt = study.welch([t + 10 for t in STUDY["pbsd"]], [t + 10 for t in STUDY["dscl"]])

    def lines(comparisons, label):
        table = study.significance_table(runs, comparisons).splitlines()
        return [line for line in table if line.startswith(f"| {label} |")]

    both = [("pbsd", "dscl", False), ("pbsd", "scripts", False)]
    (only,) = lines(both, "crt")
    assert only.split("|")[2].strip() == "`pbsd` - `dscl`"
    assert only.split("|")[9].strip() == f"{crt['p']:.3f}"  # a family of one: p unchanged
    assert len(lines(both, "balanced_linear")) == 2  # (both rows have DSCL's stage)
    later = lines([("pbsd", "dscl", False), ("later", "pbsd", False)], "crt")
    assert [line.split("|")[3].strip() for line in later] == ["3 / 3", "0 / 3"]
    assert later[0].split("|")[9].strip() == f"{min(1.0, 2 * crt['p']):.3f}"


@pytest.mark.parametrize("name", ["fashion-mnist-lt.md", "fashion-mnist-lt-long.md"])
def test_each_zoo_pages_tables_are_those_its_committed_values_make(name, tmp_path, capsys):
    """Each zoo page's generated tables (the comparisons, every row, the classifier stages) are
    what its own ``solo-ext-leaderboard --study --from-csv`` commands print from the per-seed
    file committed beside it (their plots drawn here, not there)."""
    import shlex

    page = (ZOO / name).read_text()
    commands = page.replace("\\\n", " ").splitlines()
    commands = [c for c in commands if c.startswith("solo-ext-leaderboard --study --from-csv")]
    assert len(commands) == 2
    for command in commands:
        argv = shlex.split(command)[1:]
        argv = [str(ZOO.parent / a) if a.endswith(".csv") else a for a in argv]
        argv = [str(tmp_path / Path(a).name) if a.endswith(".png") else a for a in argv]
        cli.run(argv)
    lines = page.splitlines()
    blocks = [
        [r for r in b.splitlines() if r.startswith("| ")]
        for b in capsys.readouterr().out.split("\n\n")
    ]
    tables = [t for t in blocks if t]
    shown = [t for t in tables if t[0] in lines]  # (the per-seed stage cells are in the CSV)
    assert [t[0].split(" | ")[0] for t in shown] == ["| metric", "| method", "| method"]
    for table in shown:
        for line in table:
            assert line in lines, line
    assert len(list(tmp_path.glob("*.png"))) == 2


@pytest.mark.parametrize(
    "argv, key, value",
    [
        (["--compare", "pbsd"], "--compare", "'pbsd'"),
        (["--paired", "pbsd:"], "--paired", "'pbsd:'"),
        (["--from-csv", "missing.csv"], "--from-csv", "'missing.csv'"),
        (["--plot", "/no/such/folder/knn.png"], "--plot", "'/no/such/folder/knn.png'"),
    ],
)
def test_a_bad_study_argument_is_one_line(argv, key, value, tmp_path, capsys):
    seeds = ZOO / "fashion-mnist-lt-long.csv"
    argv = argv if "--from-csv" in argv else ["--from-csv", str(seeds), "--by", "folder", *argv]
    with pytest.raises(SystemExit) as stop:
        cli.run(["--study", *argv, "--csv", str(tmp_path / "seeds.csv")])
    (line,) = capsys.readouterr().err.splitlines()
    assert stop.value.code == 2 and key in line and value in line
    assert not (tmp_path / "seeds.csv").exists()  # (nothing written)
