"""``solo-ext-leaderboard`` on run directories made here: a solo-ext run (pretrained on the active
host, then evaluated by ``solo-ext-knn`` and ``solo-ext-linear``), solo-learn's layout (args.json,
a ``main_linear.py`` run, Lightning's CSV logs in ``lightning_logs/``), and a broken tree."""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import statistics
from pathlib import Path

import pytest
from conftest import SOLO_LEARN_DIR, eval_cfg, tiny_cfg

from solo_ext.leaderboard import run as leaderboard
from solo_ext.leaderboard.published import (
    BEFORE_OPTION,
    PROTOCOL_OPTIONS,
    augmentation_differences,
    load_published,
    protocol_differences,
    published_stage,
    stage_differences,
)
from solo_ext.methods.registry import SOLO_EXT_METHODS, load

# the columns solo-learn's scripts log without wandb (Lightning's CSVLogger), as main_pretrain.py
# (a long-tailed dataset: the online kNN with its shot groups) and main_linear.py write them
PRETRAIN_COLUMNS = (
    "val_acc1,val_knn_acc1,step,epoch,val_knn_acc1_many,val_loss,val_knn_acc1_few,val_acc5,"
    "val_knn_acc1_medium,val_knn_acc5,train_class_loss_epoch,train_acc5_epoch,train_acc1_epoch,"
    "train_pbsd_loss_epoch"
).split(",")
LINEAR_COLUMNS = (
    "val_acc1,val_acc1_few,val_loss,epoch,val_acc1_medium,val_acc1_many,val_acc5,step,"
    "train_acc1_epoch,train_acc5_epoch,train_loss_epoch"
).split(",")
PBSD_KWARGS = {
    "proj_hidden_dim": 2048, "proj_output_dim": 128, "temperature": 0.07, "queue_size": 65536,
    "symmetric": False, "alpha": None, "beta": 8.0, "pbsd_weight": 1.5, "num_boxes": 5,
    "box_scale": [0.05, 0.6], "box_ratio": [0.75, 4 / 3], "box_crop_size": 64,
    "patch_source": "loader", "queue_start": "random", "batch_gather": False,
}  # fmt: skip


def write_lightning_csv(path: Path, columns: list[str], val_rows: list[dict]) -> None:
    """A CSVLogger file: per epoch a validation row, then a training row."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        for epoch, row in enumerate(val_rows):
            writer.writerow({"epoch": epoch, "step": 10 * epoch + 9, **row})
            writer.writerow({"epoch": epoch, "step": 10 * epoch + 9, "train_acc1_epoch": 1.5})


def solo_learn_run(cwd: Path, version: int, logged: list[dict] = (), **changes) -> Path:
    """``main_pretrain.py``'s run directory, ``trained_models/pbsd/<version>/``, without wandb,
    and its CSV log's validation rows ``logged`` (in ``lightning_logs/`` where it ran)."""
    run_dir = cwd / "trained_models" / "pbsd" / str(version)
    run_dir.mkdir(parents=True)
    kwargs = {**PBSD_KWARGS, **changes.pop("method_kwargs", {})}
    for key in changes.pop("lacks", ()):  # a run from before the option existed
        del kwargs[key]
    args = {
        "name": "pbsd-imagenet-lt",
        "method": "pbsd",
        "backbone": {"name": "resnet50", "kwargs": {"zero_init_residual": True}},
        "method_kwargs": kwargs,
        "data": {"dataset": "imagenet_lt", "num_classes": 1000, "format": "image_folder"},
        "optimizer": {"name": "sgd", "batch_size": 128, "lr": 0.1},
        "checkpoint": {"enabled": True, "dir": "trained_models", "frequency": 1},
        "max_epochs": 200,
        "devices": [0, 1],  # the published 2 x 128
        "num_nodes": 1,
        "wandb_run_id": str(version),
        **changes,
    }
    (run_dir / "args.json").write_text(json.dumps(args))
    (run_dir / f"pbsd-imagenet-lt-{version}-ep=199.ckpt").write_bytes(b"not read")
    if logged:
        log = cwd / "lightning_logs" / f"version_{version}" / "metrics.csv"
        write_lightning_csv(log, PRETRAIN_COLUMNS, logged)
    return run_dir


def linear_run(cwd: Path, version: int, ckpt: Path | str, logged: list[dict], **args) -> None:
    """``main_linear.py``'s run directory, ``trained_models/linear/<version>/``, of the
    checkpoint ``ckpt`` (as given on its command line), and its CSV log's validation rows."""
    run_dir = cwd / "trained_models" / "linear" / str(version)
    run_dir.mkdir(parents=True)
    args = {"pretrained_feature_extractor": str(ckpt), "wandb_run_id": str(version),
            "checkpoint": {"dir": "trained_models"}, **args}  # fmt: skip
    (run_dir / "args.json").write_text(json.dumps(args))
    log = cwd / "lightning_logs" / f"version_{version}" / "metrics.csv"
    write_lightning_csv(log, LINEAR_COLUMNS, logged)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> dict:
    """One solo-ext run (symmetric) with kNN and linear results, and two solo-learn runs."""
    import solo_ext.commands.knn
    import solo_ext.commands.linear
    import solo_ext.commands.pretrain

    cwd = tmp_path_factory.mktemp("runs")
    cfg = tiny_cfg("scl", cwd, **{"method_kwargs.symmetric": True})
    ours = Path(solo_ext.commands.pretrain.run(cfg)["run_dir"])
    solo_ext.commands.knn.run(eval_cfg("knn", ours, k=5))
    solo_ext.commands.linear.run(eval_cfg("linear", ours, max_epochs=2))

    online = [{"val_acc1": 20.0, "val_knn_acc1": 30.0, "val_knn_acc1_many": 40.0}]
    online.append({"val_acc1": 41.5, "val_knn_acc1": 44.25, "val_knn_acc1_many": 60.5,
                   "val_knn_acc1_medium": 40.0, "val_knn_acc1_few": "nan"})  # fmt: skip
    published_like = solo_learn_run(cwd, 0, online)
    linear = [{"val_acc1": 50.0}, {"val_acc1": 57.25, "val_acc1_many": 68.5,
              "val_acc1_medium": 54.0, "val_acc1_few": 38.75}]  # fmt: skip
    linear_run(
        cwd,
        1,
        next(published_like.glob("*.ckpt")).relative_to(cwd),  # as given on the command line
        linear,
        name="pbsd-imagenet-lt-linear",
        pretrain_method="pbsd",
        backbone={"name": "resnet50"},
        data={"dataset": "imagenet_lt", "sampler": {"name": "class_balanced"}},
        checkpoint={"enabled": True, "dir": "trained_models"},
        max_epochs=40,
        # DSCL's classifier stage (the default of the long-tailed linear configs)
        backbone_bn="train",
        classifier_init="normal",
        train_augmentation="pretrain",
    )
    other = solo_learn_run(
        cwd,
        2,
        online[1:],
        method_kwargs={"patch_source": "device"},
        lacks=["queue_start", "batch_gather"],
        backbone={"name": "resnet18"},
        max_epochs=100,
    )

    out = cwd / "leaderboard"
    return {"cwd": cwd, "ours": ours, "solo": published_like, "other": other, "out": out}


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(text: str) -> float | None:
    return float(text) if text else None


@pytest.fixture(scope="module")
def board(tree) -> dict:
    tables = leaderboard([str(tree["cwd"] / "trained_models"), "--out", str(tree["out"])])
    out = tree["out"]
    return {
        "tables": tables,
        "synthetic": read_csv(out / "synthetic_lt_imbalance_4.csv"),
        "imagenet_lt": read_csv(out / "imagenet_lt.csv"),
        "md": (out / "imagenet_lt.md").read_text()
        + (out / "synthetic_lt_imbalance_4.md").read_text(),
    }


def test_files_per_dataset(tree, board):
    # (the tiny runs' imbalance factor, 4, is not the dataset's default 10: a table of its own)
    assert sorted(board["tables"]) == ["imagenet_lt", "synthetic_lt (imbalance 4)"]
    for name in ("imagenet_lt", "synthetic_lt_imbalance_4"):
        for ext in ("md", "csv"):
            assert (tree["out"] / f"{name}.{ext}").stat().st_size > 0
        png = (tree["out"] / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG")


def test_solo_ext_run_values_are_its_metrics_json_and_symmetric_is_flagged(tree, board):
    metrics = json.loads((tree["ours"] / "metrics.json").read_text())
    (row,) = board["synthetic"]  # no published row for synthetic_lt
    assert row["kind"] == "measured" and row["method"] == "scl"
    for e in ("linear", "knn"):  # each in its own columns: the offline linear stage and kNN
        assert num(row[f"{e}_acc1"]) == metrics[f"{e}_acc1"]
        for group in ("many", "medium", "few"):
            assert num(row[f"{e}_{group}"]) == metrics[f"{e}_acc1_{group}"]
    assert num(row["linear_acc5"]) == metrics["linear_acc5"]
    assert row["head_acc1"] == ""  # (not a one-stage method)
    differences = row["differences"].split("; ")
    assert row["protocol"] == "symmetric=true" and row["flagged"] == "true"
    assert differences[0] == "symmetric=true" and row["compared_with"] == ""
    # the 2-epoch linear stage against the published long-tail stage (40 epochs)
    assert "linear epochs=2 (published 40)" in differences
    assert metrics["linear_epochs"] == 2 and metrics["linear_schedule"] in ("cosine", "step")
    assert (row["backbone"], row["epochs"], row["batch"]) == ("cifar_resnet32", "1", "8")
    assert "| ⚑ symmetric=true; linear epochs=2 (published 40); " in board["md"]
    assert f"{metrics['linear_acc1']:.2f}" in board["md"]


def test_solo_learn_layout_linear_run_and_csv_logs(tree, board):
    rows = {r["label"]: r for r in board["imagenet_lt"] if r["kind"] == "measured"}
    row = rows["pbsd 0"]
    # main_linear.py's last validation row, attached through pretrained_feature_extractor
    assert num(row["linear_acc1"]) == 57.25
    assert [num(row[f"linear_{g}"]) for g in ("many", "medium", "few")] == [68.5, 54.0, 38.75]
    assert "trained_models/linear/1" in row["source"] and "40 ep, class_balanced" in row["source"]
    # the online classifier and the online kNN of the pretraining log's last validation row,
    # each in its own columns
    assert (num(row["online_acc1"]), num(row["online_knn_acc1"])) == (41.5, 44.25)
    assert [num(row[f"online_knn_{g}"]) for g in ("many", "medium", "few")] == [60.5, 40.0, None]
    assert row["knn_acc1"] == "" and row["online_many"] == ""
    assert (row["backbone"], row["epochs"], row["batch"]) == ("resnet50", "200", "256")
    assert row["compared_with"] == "DSCL + PBSD" and row["flagged"] == "false"
    assert row["protocol"] == "as published"

    other = rows["pbsd 2"]  # no linear run: the online evaluations only
    assert (other["linear_acc1"], num(other["online_acc1"])) == ("", 41.5)
    assert [num(other[f"online_knn_{g}"]) for g in ("many", "medium", "few")] == [60.5, 40.0, None]
    assert other["flagged"] == "true" and other["compared_with"] == "DSCL + PBSD"
    assert other["protocol"] == "queue_start=empty, batch_gather=true, patch_source=device"
    assert other["differences"].split("; ") == [
        "queue_start=empty",  # args.json without the keys: a run from before the options
        "batch_gather=true",
        "patch_source=device",
        "epochs 100 (published 200)",
        "backbone resnet18 (published resnet50)",
    ]


def test_a_run_directory_given_alone_finds_its_linear_run_and_logs(tree, tmp_path, capsys):
    """solo-learn's linear runs are looked for where it puts them (``<dir>/linear/``), its CSV
    logs where the script ran: neither needs to be under the paths given."""
    tables = leaderboard([str(tree["solo"]), "--out", str(tmp_path)])
    (row,) = [r for r in tables["imagenet_lt"] if r.kind == "measured"]
    assert (row.value("linear"), row.value("online_knn")) == (57.25, 44.25)
    assert row.evaluations == ["linear", "online", "online_knn"]
    assert capsys.readouterr().err == ""


def test_published_rows_are_marked_and_apart(board):
    rows = board["imagenet_lt"]
    kinds = [r["kind"] for r in rows]
    n = kinds.count("published")
    assert kinds == ["published"] * n + ["measured"] * (len(kinds) - n)
    shipped = [p for p in load_published() if p.dataset == "imagenet_lt" and p.headline]
    assert [r["label"] for r in rows[:n]] == [p.label for p in shipped]
    for row, p in zip(rows[:n], shipped):
        column = {"offline": "linear", "head": "head", "online": "online"}[p.linear_eval]
        assert num(row[f"{column}_acc1"]) == p.linear_acc1 and row["source"] == p.source
        assert row["epochs"] == ("" if p.epochs is None else str(p.epochs)), p.label
        assert row["flagged"] == "false" and row["compared_with"] == ""
    assert "| published | DSCL + PBSD |" in board["md"]


def test_published_file_rows_and_protocol_table():
    rows = load_published()
    assert all(r.source and r.protocol and r.linear_acc1 is not None for r in rows)
    # one row per dataset, method, backbone, metric source, config and epochs, except variants
    # the source names apart (BCL's contrastive views; the TSC README's trials of the setting
    # of another row, each "<method>, trial <n>"), told apart by their labels
    keys = {}
    for r in rows:
        key = (r.dataset, r.method, r.backbone, r.linear_eval, tuple(r.config.items()), r.epochs)
        keys.setdefault(key, []).append(r.label)
    for key, labels in keys.items():
        assert len(labels) == len(set(labels)), key
        settings = [label for label in labels if not re.search(r", trial \d+$", label)]
        assert len(settings) == 1 or key[1] == "bcl", key
    for method, keys in PROTOCOL_OPTIONS.items():  # each key is one its method declares
        assert method in SOLO_EXT_METHODS
        assert set(keys) <= set(load(method).METHOD_KWARGS), method
    assert set(BEFORE_OPTION) <= {k for keys in PROTOCOL_OPTIONS.values() for k in keys}


def test_gather_options_are_not_flagged_on_one_process():
    published = {"symmetric": False, "queue_start": "random", "batch_gather": False}
    gathered = {**published, "batch_gather": True}
    assert protocol_differences("dscl", published, processes=4) == []
    assert protocol_differences("dscl", gathered, processes=1) == []
    assert protocol_differences("dscl", gathered, processes=4) == ["batch_gather=true"]
    assert protocol_differences("dscl", {}, processes=2) == [
        "queue_start=empty",
        "batch_gather=true",
    ]


def test_augmentation_options_off_the_published_protocol_are_flagged():
    """The crop resampling and the blur given in a run's augmentations entries; solo-learn's own
    methods (no published protocol here) are not compared."""
    augs = [
        {"crop_size": 224, "rrc": {"interpolation": "bicubic"}},
        {"crop_size": 224, "rrc": {"interpolation": "bilinear"}, "gaussian_blur": {"prob": 0.5}},
        {"crop_size": 96, "gaussian_blur": {"kind": "torchvision"}},
    ]
    assert augmentation_differences("dscl", augs) == [
        "augmentations.0.rrc.interpolation=bicubic",
        "augmentations.2.gaussian_blur.kind=torchvision",
    ]
    assert augmentation_differences("dscl", augs[1:2]) == []
    assert augmentation_differences("mocov2plus", augs) == []


def test_a_linear_evaluation_off_the_published_classifier_stage_is_flagged():
    """A linear number is compared with its published row's classifier stage, else on a
    long-tailed dataset with DSCL's (its official train_cls.sh: class-balanced, 40 epochs,
    batch 2048 at lr 10, x0.1 at 20 and 30, backbone BN in train mode, N(0, 0.01) init, its
    crops): each key the evaluation records and gives another value is flagged; a balanced
    dataset without a published stage compares nothing."""
    dscl = {"sampler": "class_balanced", "epochs": "40", "batch": "2048", "lr": "10",
            "schedule": "step", "lr_decay_epochs": "20 30", "backbone_bn": "train",
            "classifier_init": "normal", "train_augmentation": "pretrain",
            "loss": "ce"}  # fmt: skip
    assert published_stage("imagenet_lt") == published_stage("cifar100_lt") == dscl
    assert published_stage("cifar100") == {}
    run = {"sampler": "class_balanced", "epochs": 40, "batch": 2048, "lr": 1.25 * 2048 / 256,
           "schedule": "step", "lr_decay_epochs": [20, 30], "backbone_bn": "train",
           "classifier_init": "normal", "train_augmentation": "pretrain",
           "loss": "ce"}  # fmt: skip
    assert stage_differences(dscl, run) == []
    assert stage_differences(dscl, {"epochs": 40}) == []  # (what is not recorded: not compared)
    one_epoch = {**run, "epochs": 1, "sampler": "shuffle", "lr": 10.000001, "backbone_bn": "eval"}
    assert stage_differences(dscl, one_epoch) == [
        "linear sampler=shuffle (published class_balanced)",
        "linear epochs=1 (published 40)",
        "linear backbone_bn=eval (published train)",
    ]
    assert stage_differences(dscl, {**run, "lr_decay_epochs": [30]}) == [
        "linear lr_decay_epochs=30 (published 20 30)"
    ]
    # TSC's CIFAR-LT stage: LDAM with re-weighting over shuffled batches (an instance sampler
    # draws as shuffling does); both entry points train with cross-entropy
    tsc = next(p for p in load_published() if p.dataset == "cifar10_lt" and p.method == "tsc")
    assert tsc.stage["loss"] == "ldam_reweighted" and tsc.stage["sampler"] == "shuffle"
    assert stage_differences(tsc.stage, {"sampler": "instance", "loss": "ce"}) == [
        "linear loss=ce (published ldam_reweighted)"
    ]


def test_broken_and_partial_runs_are_skipped_in_one_line_each(tree, tmp_path, capsys):
    broken = tmp_path / "trained_models" / "scl"
    truncated, empty, stray = broken / "truncated", broken / "no-metrics", broken / "notes"
    for path in (truncated, empty, stray):
        path.mkdir(parents=True)
    args = (tree["ours"] / "args.json").read_text()
    (truncated / "args.json").write_text(args[: len(args) // 2])
    (empty / "args.json").write_text(args)
    (stray / "todo.txt").write_text("not a run")
    orphan = tmp_path / "trained_models" / "linear" / "3"
    orphan.mkdir(parents=True)
    (orphan / "args.json").write_text(json.dumps({"pretrained_feature_extractor": "gone.ckpt"}))

    tables = leaderboard([str(tree["ours"]), str(tmp_path), "--out", str(tmp_path / "out")])
    assert list(tables) == ["synthetic_lt (imbalance 4)"]
    assert len(tables["synthetic_lt (imbalance 4)"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    for path in (truncated, empty, stray, orphan):
        assert sum(x.startswith(f"solo-ext-leaderboard: skipped {path}: ") for x in lines) == 1
    assert len(lines) == 4, lines
    assert "args.json is not valid JSON" in next(x for x in lines if str(truncated) in x)


def test_bad_arguments_are_one_line_before_anything_is_written(tree, tmp_path, command):
    from solo_ext.leaderboard import main

    missing, out, a_file = tmp_path / "nowhere", tmp_path / "out", tmp_path / "file"
    a_file.write_text("")
    for argv, message in (
        ([str(missing), "--out", str(out)], f"paths: {str(missing)!r}: no such file or directory"),
        ([str(tree["ours"]), "--out", str(a_file / "x")], f"--out={str(a_file / 'x')!r}"),
        ([str(tmp_path), "--out", str(out)], "paths: no run with a result found under"),
    ):
        code, stdout, stderr = command(main, "solo-ext-leaderboard", *argv)
        assert code == 2 and stdout == "" and stderr.count("\n") == 1, stderr
        assert stderr.startswith("solo-ext-leaderboard: error: ") and message in stderr
    assert not out.exists()


def test_the_published_rows_shown_are_chosen(tree, tmp_path, capsys):
    """Each method's headline row by default, every row with ``--rows all``, methods or labels,
    every row of a method, a source's table; the markdown, CSV and LaTeX show the same rows. An
    item that chooses no row: one line naming it, before anything is written."""
    from solo_ext.leaderboard.latex import PUBLISHED_MARK, escape

    shipped = [p for p in load_published() if p.dataset == "imagenet_lt"]

    def shown(*rows: str) -> list[str]:
        out = tmp_path / str(len(list(tmp_path.iterdir())))
        tables = leaderboard([str(tree["solo"]), "--out", str(out), *rows])
        labels = [r.label for r in tables["imagenet_lt"] if r.kind == "published"]
        with open(out / "imagenet_lt.csv", newline="") as f:
            assert [r["label"] for r in csv.DictReader(f) if r["kind"] == "published"] == labels
        tex, md = (out / "imagenet_lt.tex").read_text(), (out / "imagenet_lt.md").read_text()
        assert tex.count(PUBLISHED_MARK + " &") == md.count("| published |") == len(labels)
        assert all(f"{escape(label)}{PUBLISHED_MARK} &" in tex for label in labels)
        return labels

    headline = shown()
    assert headline == [p.label for p in shipped if p.headline] and "KCL, trial 1" not in headline
    assert shown("--rows", "all") == [p.label for p in shipped]
    assert shown("--rows", "dscl,gpaco") == ["DSCL", "GPaCo"]
    assert shown("--rows", "pbsd:all") == [p.label for p in shipped if p.method == "pbsd"]
    table_11 = ["KCL", "KCL, 400 epochs", "TSC", "TSC, 200 epochs"]
    assert shown("--rows", "source=Table 11 (") == table_11
    out = tmp_path / "refused"
    with pytest.raises(SystemExit) as info:
        leaderboard([str(tree["solo"]), "--out", str(out), "--rows", "dscl,dscll"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and not out.exists()
    assert "--rows='dscl,dscll'" in err and "'dscll'" in err and "'dscl'?" in err


def test_the_batch_is_gpus_times_per_gpu_batch_and_another_per_gpu_batch_is_flagged(tmp_path):
    """2 x 128 and 4 x 64 hold the same 256 images, but the per-GPU batch is the contrast set of
    DSCL / PBSD: the rows say which, and the 4 x 64 run is flagged against its recipe."""
    smaller = {"devices": [0, 1, 2, 3], "optimizer": {"name": "sgd", "batch_size": 64, "lr": 0.1}}
    for version, changes in ((0, {}), (1, smaller)):
        solo_learn_run(tmp_path, version, [{"val_acc1": 40.0}], **changes)
    tables = leaderboard([str(tmp_path / "trained_models"), "--out", str(tmp_path / "board")])
    rows = {r.batch_text: r for r in tables["imagenet_lt"] if r.kind == "measured"}
    assert sorted(rows) == ["2 x 128", "4 x 64"] and {r.batch for r in rows.values()} == {256}
    assert not rows["2 x 128"].flagged
    assert rows["4 x 64"].differences == ["per-GPU batch=64 (pretrain/imagenet-lt/pbsd: 128)"]
    (published,) = [r for r in tables["imagenet_lt"] if r.label == "DSCL + PBSD"]
    assert published.batch_text == "2 x 128"  # (DSCL's README: 2 GPUs; its batch of 256)
    md = (tmp_path / "board" / "imagenet_lt.md").read_text()
    assert "| 4 x 64 |" in md and "| 2 x 128 |" in md


# seeds 0, 1, 2 of one setting and seed 0 at another lr: the online top-1 and kNN many of each
SWEEP_TOP1, SWEEP_MANY = [40.0, 43.0, 47.5, 30.0], [60.0, 61.0, 65.0, 50.0]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> dict:
    """Four solo-learn runs (``pbsd_s<seed>``: seeds 0, 1, 2, and 0 at another lr), their board."""
    cwd = tmp_path_factory.mktemp("sweep")
    for version, seed in enumerate((0, 1, 2, 0)):
        lr = {"optimizer": {"name": "sgd", "batch_size": 128, "lr": 0.2}} if version == 3 else {}
        row = {"val_acc1": SWEEP_TOP1[version], "val_knn_acc1": 1.0,
               "val_knn_acc1_many": SWEEP_MANY[version]}  # fmt: skip
        solo_learn_run(cwd, version, [row], seed=seed, name=f"pbsd_s{seed}", **lr)
    out = cwd / "board"
    tables = leaderboard([str(cwd / "trained_models"), "--out", str(out)])
    return {"runs": cwd / "trained_models", "out": out, "rows": tables["imagenet_lt"]}


def test_seeds_of_one_setting_make_one_row_with_mean_and_spread(sweep, tmp_path):
    """Three runs that differ only in the seed (and their names) are one row: n = 3, each
    number's mean and sample standard deviation; a run with another lr stays apart; --per-run
    lists every run with its name and seed."""
    out = sweep["out"]
    rows = [r for r in sweep["rows"] if r.kind == "measured"]
    assert sorted(r.n for r in rows) == [1, 3]
    (swept,) = [r for r in rows if r.n == 3]
    assert swept.seeds == [0, 1, 2] and swept.names == ["pbsd_s0", "pbsd_s1", "pbsd_s2"]
    values = SWEEP_TOP1[:3]
    mean = sum(values) / 3
    sd = (sum((v - mean) ** 2 for v in values) / 2) ** 0.5
    assert swept.value("online") == pytest.approx(mean)
    assert swept.spread["online_acc1"] == pytest.approx(sd)
    want_many = statistics.fmean(SWEEP_MANY[:3])
    assert swept.value("online_knn", "many") == pytest.approx(want_many)
    assert swept.spread["online_knn_acc1"] == 0.0  # (1.0 for every seed)
    (alone,) = [r for r in rows if r.n == 1]
    assert alone.value("online") == 30.0 and alone.spread.get("online_acc1") is None
    # another lr per 256 images than the shipped recipe: flagged against it
    assert any(d.startswith("optimizer.lr per 256 images=0.2 (pretrain/imagenet-lt/pbsd: ")
               for d in alone.differences), alone.differences  # fmt: skip
    assert not any("optimizer.lr" in d for d in swept.differences), swept.differences
    md = (out / "imagenet_lt.md").read_text()
    assert f"{mean:.2f} ± {sd:.2f}" in md and "n = 3, seeds 0, 1, 2" in md
    assert "| online linear top-1 | online kNN top-1 | online kNN many |" in md
    written = [r for r in read_csv(out / "imagenet_lt.csv") if r["kind"] == "measured"]
    assert sorted(r["n"] for r in written) == ["1", "3"]
    assert any(num(r["online_acc1_sd"]) == pytest.approx(sd) for r in written)

    per_run = leaderboard([str(sweep["runs"]), "--out", str(tmp_path), "--per-run"])
    rows = [r for r in per_run["imagenet_lt"] if r.kind == "measured"]
    assert sorted((r.seeds[0], r.names[0]) for r in rows) == [
        (0, "pbsd_s0"), (0, "pbsd_s0"), (1, "pbsd_s1"), (2, "pbsd_s2")
    ]  # fmt: skip
    assert "run 1, seed 1" in (tmp_path / "imagenet_lt.md").read_text()


def test_custom_folders_and_shot_thresholds_get_tables_of_their_own(tmp_path):
    """Two image folders given as ``custom`` are two tables; runs of one dataset grouped with
    several shot thresholds make one table per thresholds, each named by them; each row says how
    many classes each group has (from the run's training counts and thresholds)."""
    counts = [30, 12, 9, 4, 2]
    setups = [("/data/a", None, None), ("/data/b", None, None), ("/data/a", 10, 5)]
    for version, (path, many, few) in enumerate(setups):
        data = {"dataset": "custom", "train_path": path, "train_class_counts": counts}
        data.update({k: v for k, v in (("many_threshold", many), ("few_threshold", few)) if v})
        row = {"val_acc1": 10.0, "val_knn_acc1": 20.0, "val_knn_acc1_few": 5.0}
        solo_learn_run(tmp_path, version, [row], data=data)
    tables = leaderboard([str(tmp_path / "trained_models"), "--out", str(tmp_path / "board")])
    assert sorted(tables) == [
        "custom /data/a (many > 10, few < 5)", "custom /data/a (many > 100, few < 20)",
        "custom /data/b",
    ]  # fmt: skip
    (standard,) = tables["custom /data/a (many > 100, few < 20)"]
    assert standard.group_sizes == {"many": 0, "medium": 1, "few": 4}  # 30 is medium
    (other,) = tables["custom /data/a (many > 10, few < 5)"]
    assert other.group_sizes == {"many": 2, "medium": 1, "few": 2}
    md = "".join(p.read_text() for p in (tmp_path / "board").glob("*.md"))
    assert "| 2 / 1 / 2 |" in md and "| classes (many / medium / few) |" in md


def _readme_table(text: str, section: str) -> list[dict[str, str]]:
    """The rows of the markdown table under ``### <section>``, by its header's names."""
    lines = text.split(f"### {section}\n", 1)[1].splitlines()
    table = []
    for line in lines:
        if line.startswith("|"):
            table.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif table:
            break
    header, _, *body = table
    return [dict(zip(header, row)) for row in body]


SOLO_LEARN_TABLES = {"CIFAR-10": "cifar10", "CIFAR-100": "cifar100",
                     "ImageNet-100": "imagenet100", "ImageNet": "imagenet"}  # fmt: skip
README_BACKBONES = {"ResNet18": "resnet18", "ResNet50": "resnet50", "ViT Tiny": "vit_tiny"}


@pytest.mark.solo_learn
def test_the_solo_learn_rows_are_its_readme_tables_in_full():
    """Every number of solo-learn's README result tables is a published row (its top-1, online
    and offline where both are given), and no solo-learn row is not in the README."""
    text = (SOLO_LEARN_DIR / "README.md").read_text()
    published = [p for p in load_published() if p.source.startswith("solo-learn README")]
    seen = set()
    for section, dataset in SOLO_LEARN_TABLES.items():
        for row in _readme_table(text, section):
            label = row["Method"].replace(":rocket:", "").replace(":sleepy:", "").strip()
            if "finetuned" in " ".join(row.values()) or row["Backbone"] not in README_BACKBONES:
                continue  # (MAE's fine-tuned ViT-B: not a linear evaluation)
            backbone = README_BACKBONES[row["Backbone"]]
            given = {"": row.get("Acc@1"), "online": row.get("Acc@1 (online)"),
                     "offline": row.get("Acc@1 (offline)")}  # fmt: skip
            for evaluation, value in given.items():
                if value in (None, "-", ""):
                    continue
                match = [p for p in published
                         if (p.dataset, p.label, p.backbone) == (dataset, label, backbone)
                         and (evaluation == "" or p.linear_eval == evaluation)]  # fmt: skip
                assert len(match) == 1, (section, label, evaluation, match)
                assert match[0].linear_acc1 == float(value), (section, label, evaluation)
                assert match[0].epochs == int(row["Epochs"]), (section, label)
                seen.add(id(match[0]))
    assert {id(p) for p in published} == seen


def test_an_imbalance_factor_of_its_own_is_a_table_of_its_own(tmp_path):
    """CIFAR-100-LT at imbalance 50 is another benchmark than at 100: its own table, beside the
    published rows of that factor only (none here), never compared with the rows at 100."""
    for version, factor in enumerate((100, 50)):
        data = {"dataset": "cifar100_lt", "imbalance_factor": factor}
        row = {"val_acc1": 40.0 + version, "val_knn_acc1": 30.0}
        solo_learn_run(tmp_path, version, [row], data=data, method="tsc")
    out = tmp_path / "board"
    tables = leaderboard([str(tmp_path / "trained_models"), "--out", str(out)])
    assert sorted(tables) == ["cifar100_lt", "cifar100_lt (imbalance 50)"]
    at_100 = [p for p in load_published() if p.dataset == "cifar100_lt"]
    assert at_100 and {p.imbalance_factor for p in at_100} == {100}
    (measured,) = [r for r in tables["cifar100_lt"] if r.kind == "measured"]
    assert measured.compared_with == "TSC" and measured.imbalance_factor == 100
    (alone,) = tables["cifar100_lt (imbalance 50)"]
    assert alone.kind == "measured" and alone.compared_with == ""
    assert (out / "cifar100_lt_imbalance_50.md").is_file()


def test_a_balanced_linear_evaluation_is_held_to_solo_learns_linear_config(tmp_path):
    """An offline ImageNet-100 number is compared with the published row's classifier stage
    (solo-learn's scripts/linear/imagenet-100/<method>.yaml: 100 epochs, step at 60 and 80, its
    lr for batch 256): another lr is flagged; the published top-5 has its own column, and a
    number whose source does not say online or offline is marked."""
    run_dir = tmp_path / "trained_models" / "mocov2plus" / "0"
    run_dir.mkdir(parents=True)
    args = {"method": "mocov2plus", "backbone": {"name": "resnet18"}, "max_epochs": 400,
            "data": {"dataset": "imagenet100"}, "devices": [0], "num_nodes": 1,
            "optimizer": {"name": "sgd", "batch_size": 128, "lr": 0.3}, "wandb_run_id": "0",
            "checkpoint": {"dir": "trained_models"}}  # fmt: skip
    (run_dir / "args.json").write_text(json.dumps(args))
    (run_dir / "mocov2plus-0-ep=399.ckpt").write_bytes(b"not read")
    ckpt = "trained_models/mocov2plus/0/mocov2plus-0-ep=399.ckpt"
    linear_run(tmp_path, 1, ckpt, [{"val_acc1": 70.5, "val_acc5": 91.0}], max_epochs=100,
               devices=[0], num_nodes=1, data={"dataset": "imagenet100"},
               optimizer={"name": "sgd", "batch_size": 256, "lr": 0.3},
               scheduler={"name": "step", "lr_decay_steps": [60, 80]})  # fmt: skip
    out = tmp_path / "board"
    tables = leaderboard([str(tmp_path / "trained_models"), "--out", str(out)])
    (row,) = [r for r in tables["imagenet100"] if r.kind == "measured"]
    assert (row.value("linear"), row.value("linear", "acc5")) == (70.5, 91.0)
    (ref,) = [p for p in load_published() if p.dataset == "imagenet100"
              and p.label == row.compared_with and p.linear_eval == "offline"]  # fmt: skip
    assert ref.stage["lr"] == "3" and ref.stage["lr_decay_epochs"] == "60 80"
    assert row.differences == ["linear lr=0.3 (published 3)"]
    assert row.compared == (ref.label, "offline")  # (the plot draws that row, not the online)
    md = (out / "imagenet100.md").read_text()
    assert "| linear top-1 | linear top-5 |" in md
    cifar = [p for p in load_published() if p.dataset == "cifar100" and p.linear_eval == ""]
    assert cifar  # (a row whose source does not say online or offline: shown with (?))
    from solo_ext.leaderboard.table import markdown, published_row

    assert f"{cifar[0].linear_acc1:.2f} (?)" in markdown("cifar100", [published_row(cifar[0])])


@pytest.fixture(scope="module")
def wandb_run(tmp_path_factory) -> dict:
    """A tiny PaCo run logged with wandb offline (solo-learn's habit), with the online kNN on:
    no CSV log, its wandb files only."""
    import wandb as wandb_sdk

    import solo_ext.commands.pretrain

    cwd = tmp_path_factory.mktemp("wandb")
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(cwd / "elsewhere")}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        wandb = {"enabled": True, "offline": True, "project": "solo-ext-test"}
        knn = {"knn_eval.enabled": True, "knn_eval.k": 3}
        cfg = tiny_cfg("paco", cwd, wandb=wandb, max_epochs=2, **knn)
        run_dir = Path(solo_ext.commands.pretrain.run(cfg)["run_dir"])
        wandb_sdk.finish()  # (what the end of the process does: the log written out)
    return {"cwd": cwd, "run_dir": run_dir}


def test_a_run_keeps_its_last_validation_in_metrics_json(tree):
    """A run keeps its last validation values in metrics.json (``val_*``) whichever logger it
    has: those of its CSV log's last validation row, all of them (NaN: null)."""
    (log,) = tree["ours"].glob("logs*/metrics.csv")
    last = [r for r in read_csv(log) if r.get("val_acc1")][-1]
    want = {k: float(v) for k, v in last.items() if k.startswith("val_") and v}
    want = {k: None if math.isnan(v) else v for k, v in want.items()}
    metrics = json.loads((tree["ours"] / "metrics.json").read_text())
    kept = {k: v for k, v in metrics.items() if k.startswith("val_")}
    assert "val_acc1" in kept and kept == pytest.approx(want)  # (the same keys, each value)


def test_a_wandb_run_is_read_from_its_metrics_json(wandb_run, tmp_path, capsys):
    """A run logged with wandb offline (solo-learn's habit; no CSV log) fills every column from
    its metrics.json: the online classifier and the online kNN with its groups (``val_*``), the
    head and the kNN; no wandb file is read (without them the table is the same)."""
    run_dir = wandb_run["run_dir"]
    assert not list(run_dir.rglob("metrics.csv"))
    shutil.rmtree(run_dir / "wandb")
    tables = leaderboard([str(run_dir), "--out", str(tmp_path / "board")])
    (row,) = tables["synthetic_lt (imbalance 4)"]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert row.value("online") == metrics["val_acc1"]
    assert row.value("online", "acc5") == metrics["val_acc5"]
    assert row.value("online_knn") == metrics["val_knn_acc1"]
    assert metrics["val_knn_acc1_many"] is None  # (no class of the tiny set has over 100 images)
    for group in ("many", "medium", "few"):
        assert row.value("online_knn", group) == metrics[f"val_knn_acc1_{group}"]
    assert row.value("head") == metrics["head_acc1"] and row.value("knn") == metrics["knn_acc1"]
    assert row.evaluations == ["head", "online", "online_knn", "knn"]
    origins = [part.split(": ", 1)[1] for part in row.source.split("; ")[1:]]
    assert all(o.startswith(str(run_dir / "metrics.json")) for o in origins) and len(origins) == 4
    assert capsys.readouterr().err == ""


def test_a_copied_run_directory_counts_once(tmp_path, capsys):
    """A run directory copied beside itself (the same args.json, seed and results) is one run,
    not another seed: the row of seeds 0 and 1 stays n = 2, with one line naming the copy; a
    linear run of the copy's checkpoint is the run's."""
    for version in (0, 1):
        row = {"val_acc1": 40.0 + 10 * version, "val_knn_acc1": 30.0}
        solo_learn_run(tmp_path, version, [row], seed=version)
    runs = tmp_path / "trained_models" / "pbsd"
    copy = runs / "0-copy"
    shutil.copytree(runs / "0", copy)
    # a linear run of each: run 1's, and run 0's made from the copy's checkpoint
    for version, run_dir, top1 in ((2, copy, 55.5), (3, runs / "1", 57.5)):
        ckpt = next(run_dir.glob("*.ckpt")).relative_to(tmp_path)
        data = {"dataset": "imagenet_lt"}
        linear_run(tmp_path, version, ckpt, [{"val_acc1": top1}], data=data, max_epochs=40)

    out = tmp_path / "board"
    tables = leaderboard([str(tmp_path / "trained_models"), "--out", str(out)])
    (row,) = [r for r in tables["imagenet_lt"] if r.kind == "measured"]
    assert (row.n, row.seeds, row.runs) == (2, [0, 1], ["0", "1"])
    assert row.value("online") == 45.0 and row.spread["online_acc1"] == pytest.approx(50**0.5)
    assert row.value("linear") == 56.5 and row.spread["linear_acc1"] == pytest.approx(2**0.5)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "counted once: " in line and f"{copy} is a copy of {runs / '0'}" in line
    # another seed in the copy's args.json: another run (with the linear run of its checkpoint,
    # beside run 1; run 0 without one is a row of its own)
    args = json.loads((copy / "args.json").read_text())
    (copy / "args.json").write_text(json.dumps({**args, "seed": 2}))
    tables = leaderboard([str(tmp_path / "trained_models"), "--out", str(out)])
    rows = [r for r in tables["imagenet_lt"] if r.kind == "measured"]
    assert sorted((r.n, r.seeds) for r in rows) == [(1, [0]), (2, [2, 1])]
    assert "counted once" not in capsys.readouterr().err


def _markdown_rows(text: str) -> tuple[list[str], list[list[str]]]:
    """The header and the rows of a markdown table written by the leaderboard."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    split = [[cell.strip() for cell in line[2:-2].split(" | ")] for line in lines]
    return split[0], split[1:]


def _latex_rows(text: str) -> tuple[list[str], list[list[str]]]:
    """The column titles (each metric under its evaluation's \\multicolumn) and the body rows of
    the leaderboard's tabular."""
    body = text.split(r"\toprule", 1)[1].split(r"\bottomrule", 1)[0]
    lines = [line.removesuffix(r" \\") for line in body.splitlines() if line]
    lines = [line for line in lines if not line.startswith(("\\midrule", "\\cmidrule"))]
    top, metrics, *rows = [line.split(" & ") for line in lines]
    groups = []
    for cell in top:
        found = re.fullmatch(r"\\multicolumn\{(\d+)\}\{c\}\{(.*)\}", cell)
        groups += [found.group(2)] * int(found.group(1)) if found else [None]
    titles = [f"{g} {m}" if g else m for g, m in zip(groups, metrics)]
    return titles, rows


def _number(cell: str) -> tuple[float | None, float | None]:
    """(value, sd) of a markdown cell (``45.00 ± 3.54``) or a LaTeX one (``$45.00 \\pm 3.54$``)."""
    cell = cell.removesuffix(" (?)").strip("$")
    if cell in ("—", "--"):
        return None, None
    value, _, sd = cell.replace("\\pm", "±").partition(" ± ")
    return float(value), float(sd) if sd else None


def test_the_latex_table_holds_the_markdown_numbers(sweep):
    """``<dataset>.tex`` is a booktabs table of the markdown's rows and columns: each number the
    same (a mean with its spread as ``$x \\pm y$``), published rows first and marked, a flagged
    run marked, names escaped."""
    from solo_ext.leaderboard.latex import FLAG_MARK, PUBLISHED_MARK

    out, rows = sweep["out"], sweep["rows"]
    tex = (out / "imagenet_lt.tex").read_text()
    assert "\\usepackage{booktabs}" in tex and "\\label{tab:imagenet_lt}" in tex
    header, md_rows = _markdown_rows((out / "imagenet_lt.md").read_text())
    titles, tex_rows = _latex_rows(tex)
    metrics = (" top-1", " top-5", " many", " medium", " few")
    numeric = [i for i, title in enumerate(header) if title.endswith(metrics)]
    head = ["method", "backbone", "epochs", "GPUs $\\times$ batch", "$n$"]
    assert titles == [*head, *(header[i] for i in numeric)]
    assert len(tex_rows) == len(md_rows) == len(rows)
    spreads = 0
    for row, md, cells in zip(rows, md_rows, tex_rows):
        assert [_number(md[i]) for i in numeric] == [_number(c) for c in cells[5:]], row.label
        assert cells[3] == (row.batch_text or "--").replace(" x ", " $\\times$ ")
        spreads += sum("\\pm" in c for c in cells)
        published = row.kind == "published"
        assert cells[0].endswith(PUBLISHED_MARK) == published
        assert cells[0].endswith(FLAG_MARK) == (row.flagged and not published)
        assert cells[4] == ("" if published else str(row.n))
    assert spreads == 3  # (online top-1, kNN top-1, kNN many of the three seeds)
    (swept,) = [cells for row, cells in zip(rows, tex_rows) if row.n == 3]
    mean, sd = statistics.fmean(SWEEP_TOP1[:3]), statistics.stdev(SWEEP_TOP1[:3])
    assert swept[5 + titles[5:].index("online linear top-1")] == f"${mean:.2f} \\pm {sd:.2f}$"
    assert swept[0].startswith("pbsd pbsd\\_s0")
