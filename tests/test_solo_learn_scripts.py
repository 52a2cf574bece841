"""solo-learn's own, unmodified scripts with the whole plugin (only with the real solo-learn).

The scripts run as a user runs them: ``python main_pretrain.py --config-name <name>`` from a
directory with no configs (the search-path plugin finds solo-ext's), the shipped configs as
shipped plus the README's CPU overrides, and only existing keys changed to shorten the runs.
Checked here:

- ``data.sampler`` reaches ``training_step``: the labels of every batch equal those of the
  sampler's draw for the epoch (single process and 2-process DDP), and a misspelt name stops the
  start in one line;
- solo-ext's long-tailed datasets by name in ``main_pretrain.py``, ``main_linear.py`` and
  ``main_knn.py``, with the small-image stem travelling to the linear and kNN scripts and the
  Many / Medium / Few online kNN on by itself;
- every shipped config through solo-learn's own ``parse_cfg``;
- bad input: one line naming key and value, nothing written.

CI cannot install solo-learn (it is not on the package index): run this file in an environment
with solo-learn's pinned requirements and its source importable (SOLO_LEARN_DIR: its checkout).
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    ROOT,
    SOLO_LEARN_DIR,
    fake_cifar,
    fake_images,
    stand_in_checkpoint,
    write_fashion_mnist,
)
from test_configs import compose_config, configs, data_overrides
from test_ddp_runs import WHOLE_RUNS

from solo_ext.data.longtail import lt_counts

pytestmark = pytest.mark.solo_learn
SOLO_ROOT = SOLO_LEARN_DIR or Path("solo-learn")  # (the tests skip where it is not found)

# the README's overrides for a CPU-only machine, exactly
CPU = ["accelerator=cpu", 'devices="1"', "sync_batchnorm=False", "precision=32"]
DALI_CPU = ["data.format=dali", "dali.device=cpu"]  # DALI's CPU operators: no GPU needed
# a small synthetic_lt (existing keys of the synthetic-lt configs): 6 classes (solo-learn's linear
# model computes acc@5), 24 ... 6 training images
SMALL = [
    "max_epochs=1",
    "data.num_classes=6",
    "data.imbalance_factor=4",
    "data.synthetic.n_max=24",
    "data.synthetic.val_per_class=4",
    "optimizer.batch_size=8",
]


def solo(
    script: str, args: list[str], cwd: Path, start_new_session: bool = False, **env: str
) -> subprocess.CompletedProcess:
    """``python <solo-learn>/<script> <args>`` in ``cwd``, with the test shim on PYTHONPATH
    (``start_new_session``: in a process group of its own, which the shim's kills take)."""
    shim = str(ROOT / "tests" / "solo_shim")
    path = os.pathsep.join(filter(None, [shim, os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, str(SOLO_ROOT / script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "ignore", **env},
        start_new_session=start_new_session,
    )


def cpu(processes: int) -> list[str]:
    """CPU on ``processes`` processes."""
    return [a for a in CPU if not a.startswith("devices")] + [f'devices="{processes}"']


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def spy_on(script: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``solo`` (and ``ok``) with the labels of every batch recorded in ``cwd / "spy"``."""
    (cwd / "spy").mkdir()
    return ok(solo(script, args, cwd, SOLO_EXT_TEST_SPY=str(cwd / "spy")))


def spied(cwd: Path, rank: int = 0) -> list[list[int]]:
    """The labels ``spy_on``'s run in ``cwd`` recorded, a list per batch."""
    lines = (cwd / "spy" / f"labels-{rank}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def run_of(cwd: Path, method: str) -> tuple[Path, dict]:
    """The one run directory of ``method`` a script wrote under ``cwd``, and its args.json."""
    (run_dir,) = (cwd / "trained_models" / method).iterdir()
    return run_dir, json.loads((run_dir / "args.json").read_text())


def needs_dali() -> None:
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def synthetic_labels() -> list[int]:
    """The training labels of SMALL's synthetic_lt, in dataset order."""
    return [c for c, n in enumerate(lt_counts(24, 6, 4)) for _ in range(n)]


def expected_batches(name: str, labels: list[int], seed: int, world: int, rank: int, batch: int):
    """The labels of the batches a rank's loader gives in epoch 0 (drop_last)."""
    from solo_ext.data.samplers import build_sampler

    sampler = build_sampler(name, labels, seed=seed, num_replicas=world, rank=rank)
    order = [labels[i] for i in sampler]
    return [order[i : i + batch] for i in range(0, len(order) - batch + 1, batch)]


# --- samplers -----------------------------------------------------------------------------


def test_sampler_reaches_training_step(tmp_path):
    sampler = "class_balanced"
    args = ["--config-name", "synthetic-lt/dscl", *CPU, *SMALL, f"+data.sampler.name={sampler}"]
    spy_on("main_pretrain.py", args, tmp_path)
    seen = spied(tmp_path)
    labels = synthetic_labels()
    assert len(seen) == len(labels) // 8 and all(len(b) == 8 for b in seen)
    # exactly the sampler's draw for epoch 0, seeded with the run's seed (the config's 5)
    assert seen == expected_batches(sampler, labels, 5, 1, 0, 8)
    # and its law: about a sixth of the draws each, where the data has 31 % head, 8 % tail
    counts = np.bincount(sum(seen, []), minlength=6) / sum(map(len, seen))
    assert counts[0] < 0.25 and counts[-1] > 0.1


@pytest.mark.parametrize("data_format", ["image_folder", "dali"])
def test_sampler_under_ddp_shards_by_rank(data_format, tmp_path):
    """Two processes: each rank's batches are its share of one global order, with torchvision's
    loaders and with solo-learn's DALI loader (its CPU operators) alike."""
    if data_format == "dali":
        needs_dali()
    args = ["--config-name", "synthetic-lt/dscl", *cpu(2), "strategy=ddp", *SMALL]
    args += ["optimizer.batch_size=4", "+data.sampler.name=sqrt"]
    spy_on("main_pretrain.py", args + (DALI_CPU if data_format == "dali" else []), tmp_path)
    labels = synthetic_labels()
    for rank in (0, 1):
        assert spied(tmp_path, rank) == expected_batches("sqrt", labels, 5, 2, rank, 4)
    assert_online_shot_groups(tmp_path)


# --- DALI: the samplers drive solo-learn's DALI loaders --------------------------------------


def test_without_a_sampler_solo_learns_dali_loader_draws_the_instance_order(tmp_path):
    """main_pretrain.py with data.format=dali and no sampler on a solo-ext dataset: the batches
    training_step sees are the 'instance' sampler's seeded draw for epoch 0, the same as with
    torchvision's loaders (a named sampler's order through DALI: the two-process test above)."""
    needs_dali()
    args = ["--config-name", "synthetic-lt/dscl", *CPU, *SMALL, *DALI_CPU]
    proc = spy_on("main_pretrain.py", args, tmp_path)
    assert "DALI reads the training images in the 'instance' sampler's order" in proc.stdout
    assert spied(tmp_path) == expected_batches("instance", synthetic_labels(), 5, 1, 0, 8)
    assert_online_shot_groups(tmp_path)


def test_custom_image_folder_with_a_sampler_through_dali(tmp_path):
    """solo-learn's own 'custom' dataset (class folders of JPEG files, decoded by DALI) with a
    sampler: the labels follow the sampler's draw over the folders as ImageFolder lists them."""
    needs_dali()
    counts = [12, 6, 3]
    paths = [f"train/c{c}/{i}.jpg" for c, n in enumerate(counts) for i in range(n)]
    paths += [f"val/c{c}/{i}.jpg" for c in range(3) for i in range(2)]
    fake_images(tmp_path / "data", paths, size=36)
    args = [
        "--config-name",
        "synthetic-lt/dscl",
        *CPU,
        *DALI_CPU,
        "data.dataset=custom",
        f"data.train_path={tmp_path / 'data' / 'train'}",
        f"data.val_path={tmp_path / 'data' / 'val'}",  # (solo-learn's DALI run needs one)
        "data.num_classes=3",
        "max_epochs=1",
        "optimizer.batch_size=4",
        "+data.sampler.name=class_balanced",
    ]
    spy_on("main_pretrain.py", args, tmp_path)
    labels = [c for c, n in enumerate(counts) for _ in range(n)]
    assert spied(tmp_path) == expected_batches("class_balanced", labels, 5, 1, 0, 4)


# --- long-tailed datasets by name, through the three scripts ------------------------------


# the pretrained run's command: its transforms printed, the labels of its batches recorded
PRETRAIN = ["--config-name", "synthetic-lt/dscl", *CPU, *SMALL, "debug_augmentations=True"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """dscl on synthetic_lt through main_pretrain.py with ResNet-18, whose small-image stem
    comes from the dataset table; returns the run directory (its folder holds the spy's labels
    in spy/ and the script's output in stdout.txt)."""
    tmp = tmp_path_factory.mktemp("pretrain")
    proc = spy_on("main_pretrain.py", [*PRETRAIN, "backbone.name=resnet18"], tmp)
    (tmp / "stdout.txt").write_text(proc.stdout)
    run_dir, saved = run_of(tmp, "dscl")
    assert saved["backbone"]["kwargs"]["small_image_stem"] is True
    assert saved["data"]["train_class_counts"] == np.bincount(synthetic_labels()).tolist()
    assert_cifar_stem(next(run_dir.glob("*.ckpt")))
    assert_online_shot_groups(tmp)
    return run_dir


def test_without_a_sampler_every_image_is_drawn_at_most_once_an_epoch(pretrained):
    """No data.sampler with a solo-ext method: its seeded permutation, every image at most once
    an epoch."""
    seen = spied(pretrained.parents[2])
    labels = synthetic_labels()
    assert len(seen) == len(labels) // 8 and all(len(b) == 8 for b in seen)
    counts = np.bincount(sum(seen, []), minlength=6)
    assert (counts <= np.bincount(labels)).all()


def assert_cifar_stem(ckpt: Path) -> None:
    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    assert state["backbone.conv1.weight"].shape[-1] == 3  # solo-learn's CIFAR stem, not 7x7


def assert_online_shot_groups(run_cwd: Path, prefix: str = "val_knn_acc1_") -> None:
    """The Many / Medium / Few accuracy was logged by itself (solo-learn's runs without wandb
    log through Lightning's default logger, into lightning_logs/)."""
    (metrics,) = (run_cwd / "lightning_logs").rglob("metrics.csv")
    rows = metrics.read_text().splitlines()
    assert all(f"{prefix}{g}" in rows[0] for g in ("many", "medium", "few")), rows[0]


@pytest.mark.parametrize(
    "extra,bn",
    # (the linear configs, as solo-learn's, have no dali section)
    [
        ([], "train"),
        (["backbone_bn=eval"], "eval"),
        (["data.format=dali", "+dali.device=cpu"], "train"),
    ],
    ids=["stage", "backbone_bn=eval", "dali"],
)
def test_main_linear_on_a_long_tailed_dataset(extra, bn, pretrained, tmp_path):
    """main_linear.py with the long-tailed linear config on the pretrained run (DSCL's stage on
    the run's own view; the usual probe, ``backbone_bn=eval``; DALI's loader): the class-balanced
    sampler reaches the linear model's training_step, the backbone (its stem from args.json)
    loads, its validation has the long tail's Many / Medium / Few top-1, and the frozen
    backbone's BatchNorm statistics follow the stage's images unless ``eval``.
    (main_knn.py by name: the Fashion-MNIST-LT test and docs/solo-learn.md's block.)"""
    import torch

    dali = "data.format=dali" in extra
    if dali:
        needs_dali()
    (ckpt,) = pretrained.glob("*.ckpt")
    linear = ["--config-name", "synthetic-lt/dscl", *CPU, *SMALL, *extra]
    linear += [f"pretrained_feature_extractor='{ckpt}'", "backbone.name=resnet18"]
    proc = spy_on("main_linear.py", linear, tmp_path)
    said = "DALI reads the training images in the 'class_balanced' sampler's order"
    assert (said if dali else "'class_balanced' sampler") in proc.stdout
    assert spied(tmp_path) == expected_batches("class_balanced", synthetic_labels(), 5, 1, 0, 8)
    assert_online_shot_groups(tmp_path, "val_acc1_")
    run_dir, saved = run_of(tmp_path, "linear")
    (linear_ckpt,) = run_dir.glob("*.ckpt")
    assert saved["backbone_bn"] == bn and saved["train_augmentation"] == "pretrain"
    key = "backbone.bn1.running_mean"
    before = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"][key]
    after = torch.load(linear_ckpt, map_location="cpu", weights_only=False)["state_dict"][key]
    assert torch.equal(before, after) == (bn == "eval")


def stand_in_data(dataset: str, root: Path) -> list[str]:
    """Tiny data under ``root`` for a shipped config's dataset, and the overrides (existing keys
    only) that point the config at it."""
    if dataset in ("cifar10", "cifar100", "cifar10_lt", "cifar100_lt"):
        name = dataset.removesuffix("_lt")
        classes, n_max = (10, 5000) if name == "cifar10" else (100, 500)
        counts = lt_counts(n_max, classes, 100) if dataset.endswith("_lt") else [4] * classes
        fake_cifar(root, name, counts)
        overrides = [f"data.train_path={root}", f"data.val_path={root}"]
        return overrides + (["data.download=False"] if dataset.endswith("_lt") else [])
    if dataset == "imagenet100":
        fake_images(root, [f"{s}/n{c:03d}/{i}.jpg" for s in ("train", "val") for c in range(100)
                           for i in range(2 if s == "train" else 1)])  # fmt: skip
        return [f"data.train_path={root / 'train'}", f"data.val_path={root / 'val'}"]
    raise AssertionError(f"no stand-in for {dataset}")


# One shipped GPU config per data set (its reader, augmentation files and backbone), a different
# method in each: every config's parse_cfg is held by tests/test_config_sections.py, and every
# method's model and steps by the two-process runs below. The data sets whose configs another
# test already starts through main_pretrain.py are not started again.
ONE_PER_DATASET = {"cifar": "all4one_ct", "cifar10-lt": "scl", "imagenet-100": "densecl"}
STARTED_ELSEWHERE = {
    "cifar100-lt": "test_cifar100_lt_by_name_in_main_pretrain; docs/solo-learn.md's block",
    "fashion-mnist-lt": "test_fashion_mnist_lt_by_name_in_solo_learns_three_scripts",
    "imagenet-lt": "docs/tutorials/imagenet-lt.md's tutorial-imagenet-lt-pretrain block",
}


def test_every_data_set_has_a_gpu_config_that_starts():
    folders = {n.split("/")[0] for n in configs("pretrain") if "/" in n}
    assert folders - {"synthetic-lt"} == set(ONE_PER_DATASET) | set(STARTED_ELSEWHERE)
    assert not set(ONE_PER_DATASET) & set(STARTED_ELSEWHERE)


@pytest.mark.parametrize("name", [f"{d}/{m}" for d, m in ONE_PER_DATASET.items()])
def test_gpu_config_starts_on_cpu(name, tmp_path):
    """A shipped GPU config through main_pretrain.py with the README's CPU overrides, on
    stand-in data, for one optimiser step (its batch shrunk to fit a CPU)."""
    dataset = compose_config("pretrain", name).data.dataset
    data = stand_in_data(dataset, tmp_path / "data")
    args = [
        "--config-name",
        name,
        *CPU,
        *data,
        "data.num_workers=0",
        "optimizer.batch_size=2",
        "max_epochs=1",
        "+limit_train_batches=1",
        "+num_sanity_val_steps=0",
    ]
    ok(solo("main_pretrain.py", args, tmp_path, SOLO_EXT_TEST_CIFAR_UNCHECKED="1"))
    method = compose_config("pretrain", name).method  # (gpaco.yaml: method paco)
    assert list(run_of(tmp_path, method)[0].glob("*.ckpt"))


def test_cifar100_lt_by_name_in_main_pretrain(tmp_path):
    """cifar100_lt by name, read by solo-learn's DALI loader (the arrays as decoded pixels), with
    the published long tail's counts and its online kNN (torchvision's loader reads it by name
    in docs/solo-learn.md's block, run by tests/test_docs_commands.py)."""
    needs_dali()

    fake_cifar(tmp_path / "data", "cifar100", lt_counts(500, 100, 100))
    args = [
        "--config-name",
        "cifar100-lt/pbsd",
        *CPU,
        f"data.train_path={tmp_path / 'data'}",
        f"data.val_path={tmp_path / 'data'}",
        "data.download=False",  # the stand-in is there; torchvision must not fetch
        "backbone.name=resnet18",
        "max_epochs=1",
        "optimizer.batch_size=16",
        "+limit_train_batches=2",  # the whole validation split still runs (solo-learn's kNN)
        *DALI_CPU,
    ]
    ok(solo("main_pretrain.py", args, tmp_path, SOLO_EXT_TEST_CIFAR_UNCHECKED="1"))
    run_dir, saved = run_of(tmp_path, "pbsd")
    assert saved["data"]["num_classes"] == 100
    assert saved["data"]["train_class_counts"] == lt_counts(500, 100, 100)
    assert_cifar_stem(next(run_dir.glob("*.ckpt")))
    assert_online_shot_groups(tmp_path)


def test_fashion_mnist_lt_by_name_in_solo_learns_three_scripts(tmp_path):
    """fashion_mnist_lt from its IDX files through main_pretrain.py, main_linear.py (the
    Many / Medium / Few top-1 of its validation) and main_knn.py, with its recipes."""
    root = write_fashion_mnist(tmp_path / "fm", train_per_class=100)
    data = [f"data.train_path={root}", "data.lt_n_max=100"]
    for folder in ("pre", "lin"):
        (tmp_path / folder).mkdir()
    args = ["--config-name", "fashion-mnist-lt/dscl", *CPU, *data, "max_epochs=1"]
    ok(solo("main_pretrain.py", [*args, "+limit_train_batches=2"], tmp_path / "pre"))
    run_dir, saved = run_of(tmp_path / "pre", "dscl")
    assert saved["data"]["train_class_counts"] == lt_counts(100, 10, 100)
    assert_online_shot_groups(tmp_path / "pre")
    # (the recipe's batch of 256 is more than the 242 images of this long tail: no step at all)
    linear = ["--config-name", "fashion-mnist-lt/dscl", *CPU, *data, "max_epochs=1"]
    linear += [f"pretrained_feature_extractor={run_dir}", "optimizer.batch_size=32"]
    ok(solo("main_linear.py", linear, tmp_path / "lin"))
    assert_online_shot_groups(tmp_path / "lin", prefix="val_acc1_")
    knn = ["--dataset", "fashion_mnist_lt", "--train_data_path", str(root)]
    knn += ["--pretrained_checkpoint_dir", str(run_dir), "--k", "3", "--temperature", "0.1"]
    knn += ["--distance_function", "cosine", "--feature_type", "backbone", "--num_workers", "0"]
    proc = ok(solo("main_knn.py", knn, tmp_path, SOLO_EXT_TEST_CUDA_IS_CPU="1"))
    assert "Result: acc@1=" in proc.stdout


def test_made_lt_folder_as_custom_reads_its_counts_json(tmp_path):
    """solo-ext-make-lt's folder trained as solo-learn's ``custom`` (the DALI route): the class
    counts come from its counts.json, and the Many / Medium / Few online kNN runs."""
    from solo_ext.commands import make_lt

    out = tmp_path / "lt"
    make_lt.run(["--dataset", "synthetic_lt", "--num_classes", "6", "--imbalance_factor", "4",
                 "--out", str(out)])  # fmt: skip
    # two validation images a class (solo-learn validates a custom folder at 224 px)
    for folder in (out / "val").iterdir():
        for extra in sorted(folder.iterdir())[2:]:
            extra.unlink()
    args = [
        "--config-name",
        "synthetic-lt/dscl",
        *CPU,
        *SMALL,
        "data.dataset=custom",
        f"data.train_path={out / 'train'}",
        f"data.val_path={out / 'val'}",
        "+limit_train_batches=2",
    ]
    ok(solo("main_pretrain.py", args, tmp_path))
    _, saved = run_of(tmp_path, "dscl")
    written = json.loads((out / "counts.json").read_text())["train_counts"]
    assert saved["data"]["train_class_counts"] == written
    assert_online_shot_groups(tmp_path)


# --- bad input: one line, nothing written -------------------------------------------------


# The scripts' way of stopping, for one bad value each (main_pretrain.py: solo-learn's default
# DALI device; this machine has no GPU). The values themselves: tests/test_bad_input.py's table
# (the sampler's, the data's, the method's: the checks main_pretrain.py's parse_cfg calls) and
# test_entry_points.py (through main_pretrain.py's parse_cfg).
@pytest.mark.parametrize(
    "script,extra,said",
    [
        (
            "main_pretrain.py",
            [*SMALL, "data.format=dali", "dali.device=gpu"],
            "dali.device='gpu': no CUDA",
        ),
        ("main_linear.py", [], "pretrained_feature_extractor is missing"),
    ],
)
def test_bad_input_stops_in_one_line_and_writes_nothing(script, extra, said, tmp_path):
    (tmp_path / "trained_models").mkdir()
    (tmp_path / "trained_models" / "keep.txt").write_text("earlier work")
    before = tree(tmp_path)
    proc = solo(script, ["--config-name", "synthetic-lt/dscl", *CPU, *extra], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{script}: error: {said}"), last
    assert "Traceback" not in proc.stderr
    assert tree(tmp_path) == before


def test_main_linear_on_a_checkpoint_without_its_run_config_is_one_line(
    monkeypatch, capsys, tmp_path
):
    """The classifier stage trains on the run's query view, read from the args.json beside the
    checkpoint: without one, main_linear.py stops in one line naming the key and the file."""
    from solo.args.linear import parse_cfg

    ckpt = tmp_path / "run.ckpt"
    ckpt.touch()
    cfg = compose_config(
        "linear", "synthetic-lt/dscl", [*CPU, f"pretrained_feature_extractor={ckpt}"]
    )
    monkeypatch.setattr(sys, "argv", ["main_linear.py"])
    with pytest.raises(SystemExit) as info:
        parse_cfg(cfg)
    assert info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("main_linear.py: error: train_augmentation='pretrain': "), line
    assert str(tmp_path / "args.json") in line


# --- the shipped CPU configs, to the end (two processes where a method has a step kind) -------


@pytest.mark.parametrize("method", [*WHOLE_RUNS, "scl"])
def test_synthetic_lt_configs_run_as_shipped(method, tmp_path):
    """The CPU configs through main_pretrain.py with only their epochs and data shortened, to the
    end with validation and the online kNN: a method of each step kind (test_ddp_runs.WHOLE_RUNS)
    on two processes (gloo; ``ddp_fork``: runs started as a user starts them, ``strategy=ddp``,
    are the sampler's, the faults' and docs/running.md's), SCL on one."""
    processes = 2 if method in WHOLE_RUNS else 1
    args = [
        "--config-name",
        f"synthetic-lt/{method}",
        *cpu(processes),
        *(["strategy=ddp_fork"] if processes == 2 else []),
        *SMALL,
        "optimizer.batch_size=4",
        # SMALL's counts 24 ... 6: three many, one medium, two few classes
        "data.many_threshold=12",
        "data.few_threshold=8",
    ]
    proc = ok(solo("main_pretrain.py", args, tmp_path, OMP_NUM_THREADS="1"))
    run_dir, saved = run_of(tmp_path, method)
    assert list(run_dir.glob("*.ckpt"))
    # solo-learn's args.json carries the run's environment, solo-learn's release in it
    env = saved["environment"]
    assert env["solo_learn"]["release"].startswith("solo-learn ")
    assert env["world_size"] == processes and env["precision"] == "32-true"  # (CPU's 32)
    # pbsd's published patches come from solo-learn's own loader too
    assert ("pbsd: the loader makes its views: PBSDViews" in proc.stdout) == (method == "pbsd")
    (metrics,) = (tmp_path / "lightning_logs").rglob("metrics.csv")
    with open(metrics) as f:
        rows = [r for r in csv.DictReader(f) if r.get("val_knn_acc1_many") not in (None, "")]
    assert rows
    for group in ("many", "medium", "few"):
        assert math.isfinite(float(rows[-1][f"val_knn_acc1_{group}"])), rows[-1]
        if method in ("paco", "bcl"):  # the one-stage methods' reported classifier, their head
            assert math.isfinite(float(rows[-1][f"val_head_acc1_{group}"])), rows[-1]


# --- the patches stop a solo-ext config when solo-learn lacks a name it needs --------------


def test_solo_learns_modules_have_every_name_the_patches_need():
    import importlib

    from solo_ext.solo_learn import PATCHES
    from solo_ext.solo_learn.check import missing

    for name in PATCHES:  # (each declares its needs: test_solo_learn_patches.py)
        assert missing(importlib.import_module(name)) is None, name


@pytest.mark.parametrize(
    "renamed,said",
    [
        # a patch's need (every need is lost in turn in test_solo_learn_patches.py, in one
        # process; solo-learn's main_linear.py need below, with a config of solo-learn's own)
        ("solo.args.pretrain:_SUPPORTED_DATASETS", "solo.args.pretrain has no _SUPPORTED_DATASETS"),
        # the method registration: solo_ext.host reads the backbone table
        ("solo.methods.base:BaseMethod._BACKBONES", "BaseMethod has no _BACKBONES"),
    ],
)
def test_a_renamed_name_stops_a_solo_ext_config_in_one_line(renamed, said, tmp_path):
    args = ["--config-name", "synthetic-lt/dscl", *CPU, *SMALL]
    proc = solo("main_pretrain.py", args, tmp_path, SOLO_EXT_TEST_RENAME=renamed)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(
        "main_pretrain.py: error: method='dscl' needs solo-ext's patches of solo-learn"
    )
    assert said in line and "tested with solo-learn 1.0.6, commit 9187ea3" in line, line
    assert not (tmp_path / "trained_models").exists()


def test_a_config_of_solo_learn_alone_runs_when_the_patches_cannot(tmp_path):
    """solo-learn's own MoCo v2+ config on an image folder, with main_linear's patch point
    renamed: it trains, since it uses nothing of solo-ext."""
    from solo_ext.commands import make_lt

    out = tmp_path / "folder"
    make_lt.run(["--dataset", "synthetic_lt", "--num_classes", "4", "--imbalance_factor", "2",
                 "--out", str(out)])  # fmt: skip
    args = [
        "--config-path",
        str(SOLO_ROOT / "scripts" / "pretrain" / "cifar"),
        "--config-name",
        "mocov2plus.yaml",
        *CPU,
        "data.dataset=custom",
        f"data.train_path={out / 'train'}",
        f"data.val_path={out / 'val'}",
        "data.num_workers=0",
        "wandb.enabled=False",
        "auto_resume.enabled=False",
        "max_epochs=1",
        "optimizer.batch_size=8",
        "method_kwargs.queue_size=64",
        "+limit_train_batches=2",
        "+limit_val_batches=1",
    ]
    renamed = "solo.methods.linear:LinearModel.validation_step"
    ok(solo("main_pretrain.py", args, tmp_path, SOLO_EXT_TEST_RENAME=renamed))
    assert list((tmp_path / "trained_models" / "mocov2plus").rglob("*.ckpt"))


def test_a_solo_ext_method_crops_as_published_in_main_pretrain(pretrained, tmp_path):
    """main_pretrain.py builds a solo-ext method's views with solo-ext's pipeline (bilinear, as
    published; solo-learn's own is bicubic), and rrc.interpolation reaches it."""
    printed = (pretrained.parents[2] / "stdout.txt").read_text()
    assert "RandomResizedCrop(size=(32, 32)" in printed
    assert "interpolation=bilinear" in printed and "bicubic" not in printed
    older = ["+augmentations.0.rrc.interpolation=bicubic", "checkpoint.enabled=False"]
    proc = ok(solo("main_pretrain.py", [*PRETRAIN, *older], tmp_path))
    assert "interpolation=bicubic" in proc.stdout


def test_the_leaderboard_reads_a_main_pretrain_run(pretrained, tmp_path):
    """solo-ext-leaderboard on main_pretrain.py's run directory (solo-learn's layout, its logs
    in lightning_logs/ where the script ran): the online kNN and its split, the last
    validation row's."""
    cwd = pretrained.parents[2]
    out = tmp_path / "board"
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("solo-ext-leaderboard")), "trained_models"]
        + ["--out", str(out)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (table,) = out.glob("synthetic_lt*.csv")
    with open(table) as f:
        (row,) = [r for r in csv.DictReader(f) if r["kind"] == "measured"]
    (logs,) = (cwd / "lightning_logs").rglob("metrics.csv")
    with open(logs) as f:
        last = [r for r in csv.DictReader(f) if r.get("val_knn_acc1")][-1]
    assert row["method"] == "dscl" and row["knn_acc1"] == ""  # (the online kNN's own columns)
    assert float(row["online_knn_acc1"]) == pytest.approx(float(last["val_knn_acc1"]), abs=0.01)
    # read from the run's metrics.json, where the plugin keeps the last validation values
    # whichever logger the script has (with wandb there is no CSV log)
    kept = json.loads((pretrained / "metrics.json").read_text())
    want = {k: float(v) for k, v in last.items() if k.startswith("val_") and v}
    want = {k: None if math.isnan(v) else v for k, v in want.items()}  # (NaN: null)
    assert {k: v for k, v in kept.items() if k.startswith("val_")} == pytest.approx(want)
    # main_pretrain.py's record names the shipped recipe; what the command line changed is
    # flagged against it, nothing else
    saved = json.loads((pretrained / "args.json").read_text())
    assert saved["environment"]["config"]["recipe"] == "pretrain/synthetic-lt/dscl"
    # both lrs scaled by the batch (the recipe gives 0.4 and 0.4 per 256 images), although
    # synthetic_lt validates without a data.val_path
    for key in ("lr", "classifier_lr"):
        assert saved["optimizer"][key] == pytest.approx(0.4 * 8 / 256, rel=1e-12), key
    recipe = "(pretrain/synthetic-lt/dscl: "
    flagged = [d for d in row["differences"].split("; ") if recipe in d]
    assert sorted(d.split("=")[0] for d in flagged) == [
        "data.imbalance_factor", "data.num_classes", "data.synthetic.n_max",
        "data.synthetic.val_per_class", "per-GPU batch",
    ], flagged  # fmt: skip


@pytest.mark.parametrize("name", ["imagenet-lt/dscl", "cifar100-lt/dscl"])
def test_the_long_tailed_linear_configs_build_solo_learns_linear_model_as_published(name, tmp_path):
    """Through solo-learn's own parse_cfg and LinearModel (the patches' subclass): SGD momentum
    0.9 without weight decay; the fc starts N(0, 0.01); the BN mode is train. (Its lr of each
    epoch: test_official_runs.py's test_linear_recipe_trains_its_official_stage[main_linear.py].)"""
    from solo.args.linear import parse_cfg
    from solo.methods.linear import LinearModel
    from torch import nn

    ckpt = stand_in_checkpoint(tmp_path)
    dataset = compose_config("linear", name).data.dataset
    overrides = CPU + data_overrides(dataset, tmp_path) + [f"pretrained_feature_extractor={ckpt}"]
    cfg = parse_cfg(compose_config("linear", name, overrides))
    backbone = nn.Sequential(nn.Flatten())
    backbone.num_features = 2048
    model = LinearModel(backbone, loss_func=nn.CrossEntropyLoss(), mixup_func=None, cfg=cfg)
    assert model.backbone_bn == "train"
    assert model.classifier.weight.std().item() == pytest.approx(0.01, rel=0.05)
    (optimizer,), _ = model.configure_optimizers()
    group = optimizer.param_groups[0]
    assert (group["momentum"], group["weight_decay"]) == (0.9, 0.0)


def test_main_linear_runs_the_decoupled_stages_as_solo_ext_linear_does(pretrained, tmp_path):
    """``main_linear.py ++classifier_stage=all``: the four decoupled stages on the checkpoint's
    features, in metrics.json beside it, equal to solo-ext-linear's on the same checkpoint and
    seed; main_linear.py's own training runs as well."""
    import shutil

    from omegaconf import OmegaConf

    from solo_ext.commands import linear

    scripts, ours = tmp_path / "solo-learn-scripts", tmp_path / "ours"
    for where in (scripts, ours):
        shutil.copytree(pretrained, where)
    (ckpt,) = scripts.glob("*.ckpt")
    quick = ["++decoupled.epochs=2", "++decoupled.lws_epochs=1"]
    args = [
        "--config-name",
        "synthetic-lt/dscl",
        *CPU,
        *SMALL,
        *quick,
        "++classifier_stage=all",
        f"pretrained_feature_extractor='{ckpt}'",
        "backbone.name=resnet18",
        "checkpoint.enabled=False",
    ]
    proc = ok(solo("main_linear.py", args, tmp_path))
    assert "classifier_stage: crt, tau_norm, lws, logit_adjust" in proc.stdout
    got = json.loads((scripts / "metrics.json").read_text())
    stages = ["crt", "tau_norm", "lws", "logit_adjust"]
    cfg = OmegaConf.load(ROOT / "solo_ext" / "conf" / "linear.yaml")
    cfg.pretrained_checkpoint_dir = str(ours)
    cfg.classifier_stage = stages
    cfg.seed = 5  # main_linear.py's (solo-learn's default)
    cfg.decoupled.epochs, cfg.decoupled.lws_epochs = 2, 1
    want = linear.run(cfg)
    for stage in stages:
        for key in ("acc1", "acc5", "acc1_few", "epochs", "sampler", "lr"):
            name = f"linear_{stage}_{key}"
            assert got[name] == pytest.approx(want[name], abs=1e-6), name
    assert got["linear_tau_norm_tau"] == want["linear_tau_norm_tau"]
    (logged,) = (tmp_path / "lightning_logs").rglob("metrics.csv")
    assert "linear_crt_acc1" in logged.read_text().splitlines()[0]
    assert "val_acc1" in logged.read_text().splitlines()[0]  # its own stage trained too
