"""The README's commands, end to end on tiny settings: pretrain (console script and ``-m``),
then the kNN and linear evaluations of the checkpoint it wrote."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, mains_in_one_process
from omegaconf import OmegaConf
from test_configs import compose_config

# the README's main job, run below with TINY appended
MAIN_JOB = ["solo-ext-pretrain", "--config-name", "synthetic-lt/pbsd"]
TINY = [
    "max_epochs=1",
    "data.num_classes=4",
    "data.synthetic.n_max=24",
    "data.synthetic.val_per_class=4",
    "optimizer.batch_size=8",
    "method_kwargs.queue_size=64",
    "method_kwargs.proj_hidden_dim=32",
    "+limit_train_batches=2",
    "+enable_progress_bar=false",
]


def _script(name: str) -> list[str]:
    exe = Path(sys.executable).parent / name
    found = str(exe) if exe.exists() else shutil.which(name)
    assert found, f"console script {name} is not installed (pip install -e .)"
    return [found]


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        cmd,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def pretrained_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("main_job")
    proc = _run(
        _script(MAIN_JOB[0]) + [*MAIN_JOB[1:], *TINY, f"checkpoint.dir={out}"],
        cwd=out,  # any directory: the search-path plugin finds the config
    )
    assert "kNN (k=20, cosine) on synthetic_lt val: acc@1" in proc.stdout and "few" in proc.stdout
    (run_dir,) = (out / "pbsd").iterdir()
    return run_dir


def test_main_job_layout(pretrained_run):
    names = sorted(p.name for p in pretrained_run.iterdir())
    for name in ("args.json", "metrics.json", "knn_per_class.csv", "knn_per_class.png"):
        assert name in names
    assert f"pbsd-synthetic-lt-{pretrained_run.name}-ep=0.ckpt" in names
    metrics = json.loads((pretrained_run / "metrics.json").read_text())
    assert 0 <= metrics["knn_acc1"] <= 100 and metrics["num_val"] == 16
    assert metrics["knn_num_many"] + metrics["knn_num_medium"] + metrics["knn_num_few"] == 4


def test_the_run_records_its_recipe_and_the_leaderboard_flags_what_differs(
    pretrained_run, tmp_path
):
    """args.json names the shipped recipe the run was composed from; the leaderboard compares
    the run with it and flags exactly the keys the command line changed (the epochs are a
    column of their own; the lr, given per 256 images, follows the batch as both entry points scale
    it, so it is not a difference)."""
    from solo_ext.leaderboard.recipe import recipe_differences
    from solo_ext.leaderboard.runs import read_args, read_run

    args = read_args(pretrained_run)
    config = args["environment"]["config"]
    recipe = "pretrain/synthetic-lt/pbsd"
    assert config["recipe"] == recipe and config["file"].endswith("synthetic-lt/pbsd.yaml"), config
    run = read_run(pretrained_run, args, [])
    assert recipe_differences(run) == [
        f"per-GPU batch=8 ({recipe}: 64)",
        f"method_kwargs.proj_hidden_dim=32 ({recipe}: 512)",
        f"method_kwargs.queue_size=64 ({recipe}: 1024)",
        f"data.num_classes=4 ({recipe}: 20)",
        f"data.synthetic.n_max=24 ({recipe}: 200)",
        f"data.synthetic.val_per_class=4 ({recipe}: 20)",
    ]
    # another lr and a class-balanced sampler: both flagged against the recipe
    args["optimizer"]["lr"] *= 2
    args["data"]["sampler"] = {"name": "class_balanced"}
    run = read_run(pretrained_run, args, [])
    found = recipe_differences(run)
    assert f"data.sampler.name=class_balanced ({recipe}: instance)" in found
    assert f"optimizer.lr per 256 images=0.8 ({recipe}: 0.4)" in found


def test_knn_cli_scores_one_k_or_several_on_the_same_features(pretrained_run, command):
    """``k`` as a list: the first under ``knn_``, each further one under ``knn_k<k>_`` (keys
    and per-class files), each what a run of that k alone reports."""
    from solo_ext.commands.knn import main

    def knn(k: str) -> tuple[str, dict]:
        argv = [f"pretrained_checkpoint_dir={pretrained_run}", f"k={k}"]
        code, out, err = command(main, "solo-ext-knn", *argv, cwd=pretrained_run)
        assert code == 0, err[-3000:]
        return out, json.loads((pretrained_run / "metrics.json").read_text())

    out, five = knn("5")
    assert "kNN (k=5, cosine) on synthetic_lt val: acc@1" in out and five["knn_k"] == 5
    alone = {5: five, 3: knn("3")[1]}
    both = knn("[5,3]")[1]
    assert (both["knn_k"], both["knn_k3_k"]) == (5, 3)
    for group in ("acc1", "acc1_many", "acc1_medium", "acc1_few", "acc5"):
        assert both[f"knn_{group}"] == alone[5][f"knn_{group}"]
        assert both[f"knn_k3_{group}"] == alone[3][f"knn_{group}"]
    assert (pretrained_run / "knn_k3_per_class.csv").is_file()


def test_linear_cli_with_class_balanced_sampler(pretrained_run, command):
    from solo_ext.commands.linear import main

    argv = [
        f"pretrained_checkpoint_dir={pretrained_run}",
        "max_epochs=3",
        "+data.sampler.name=class_balanced",
        "+enable_progress_bar=false",
    ]
    code, out, err = command(main, "solo-ext-linear", *argv, cwd=pretrained_run)
    assert code == 0, err[-3000:]
    assert "linear probe on synthetic_lt val: acc@1" in out
    metrics = json.loads((pretrained_run / "metrics.json").read_text())
    assert 0 <= metrics["linear_acc1"] <= metrics["linear_acc5"] <= 100
    assert metrics["linear_sampler"] == "class_balanced"
    assert "knn_acc1" in metrics  # the kNN result is kept
    assert (pretrained_run / "linear_per_class.png").is_file()


@pytest.mark.parametrize("key", ["pretrained_checkpoint_dir", "pretrained_feature_extractor"])
def test_a_linear_recipe_takes_the_run_directory(pretrained_run, command, key, tmp_path):
    """A recipe (``--config-name <dataset>/dscl``) with the run directory, under either key:
    the run's newest checkpoint is evaluated with the recipe's stage, as without a recipe."""
    from solo_ext.commands.linear import main

    argv = [
        "--config-name",
        "synthetic-lt/dscl",
        f"{key}={pretrained_run}",
        "max_epochs=1",
        "data.num_classes=4",  # the run's data
        "data.synthetic.n_max=24",
    ]
    code, out, err = command(main, "solo-ext-linear", *argv, cwd=tmp_path)
    assert code == 0, err[-3000:]
    assert "linear probe on synthetic_lt val: acc@1" in out
    metrics = json.loads((pretrained_run / "metrics.json").read_text())
    # the recipe's stage (its batch, sampler and schedule), one epoch
    assert metrics["linear_epochs"] == 1 and metrics["linear_batch"] == 256
    assert metrics["linear_sampler"] == "class_balanced"
    assert metrics["linear_lr_decay_epochs"] == [20, 25]
    assert list(tmp_path.iterdir()) == []


def test_eval_of_missing_run_is_one_line(tmp_path, command):
    from solo_ext.commands.knn import main

    code, _, err = command(main, "solo-ext-knn", f"pretrained_checkpoint_dir={tmp_path / 'none'}")
    assert code == 2
    assert err.strip().count("\n") == 0 and "no args.json" in err
    assert err.startswith("solo-ext-knn: error: ")


@pytest.mark.parametrize(
    "argv",
    [
        ["--config-name", "x", "seed=7", "--cfg", "job"],
        ["--cfg", "job", "--config-name", "x", "seed=7"],
        ["--config-name", "x", "--cfg", "job"],
    ],
)
def test_hydras_quiet_settings_stand_beside_the_overrides(argv):
    """Hydra takes the overrides as one run of arguments, so the added settings join them and
    ``--cfg job`` may stand before or after them."""
    from solo_ext.commands.entry import hydra_argv

    out = hydra_argv(["prog", *argv])
    added = [a for a in out if a.startswith(("hydra.", "hydra/"))]
    assert len(added) == 4 and out[0] == "prog"
    given = [a for a in argv if "=" in a]
    if given:  # right after the last override
        at = out.index(given[-1])
        assert out[at + 1 : at + 5] == added
    assert [a for a in out if a not in added] == ["prog", *argv]


def test_a_config_name_or_method_kwargs_typo_says_what_to_type(tmp_path, command):
    """A recipe name that is none: one line with the closest names and the recipes' folder. An
    evaluation config named by the run's method (``<dataset>/<method>``) is the data set's one
    config. A ``method_kwargs`` key without ``+``: a typo gets the closest key in one line, a
    declared key the recipe does not list is set."""
    from solo_ext.commands import mains

    code, _, err = command(
        mains.pretrain, "solo-ext-pretrain", "--config-name", "cifar100-lt/dscll"
    )
    assert code == 2 and err.count("\n") == 1, err
    assert "--config-name=cifar100-lt/dscll" in err and "'cifar100-lt/dscl'" in err
    assert str(ROOT / "scripts" / "pretrain") in err
    argv = ["--config-name", "synthetic-lt/dscl", "method_kwargs.temprature=0.1"]
    code, _, err = command(mains.pretrain, "solo-ext-pretrain", *argv, cwd=tmp_path)
    assert code == 2 and err.count("\n") == 1, err
    assert "method_kwargs.temprature=0.1" in err and "'temperature'" in err
    argv = ["--config-name", "synthetic-lt/dscl", "method_kwargs.queue_start=empty", "--cfg", "job"]
    code, out, _ = command(mains.pretrain, "solo-ext-pretrain", *argv, cwd=tmp_path)
    assert code == 0 and yaml.safe_load(out)["method_kwargs"]["queue_start"] == "empty"
    for main, prog, own in (
        (mains.linear, "solo-ext-linear", "dscl"),
        (mains.knn, "solo-ext-knn", "scl"),
    ):
        argv = ["--config-name", "cifar100-lt/pbsd", "--cfg", "job"]
        code, out, _ = command(main, prog, *argv, cwd=tmp_path)
        shown = compose_config(prog.split("-")[-1], f"cifar100-lt/{own}")
        assert code == 0 and yaml.safe_load(out) == OmegaConf.to_container(shown), prog
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "name, kind, example",
    [
        ("pretrain", "pretrain", "cifar100-lt/dscl"),
        ("linear", "linear", "cifar100-lt/dscl"),
        ("knn", "knn", "cifar100-lt/scl"),
        ("dense_probe", None, None),
    ],
)
def test_help_names_the_command_and_how_to_pick_a_recipe(name, kind, example, tmp_path, command):
    """``--help`` starts with the command's name (not Hydra's "entry is powered by Hydra"),
    says how to pick a recipe, and lists each dataset's recipes where they are."""
    from solo_ext.commands import mains

    prog = "solo-ext-" + name.replace("_", "-")
    code, out, _ = command(getattr(mains, name), prog, "--help", cwd=tmp_path)
    assert code == 0 and out.startswith(f"{prog}: ")
    assert "powered by Hydra" not in out and "entry" not in out.split()
    assert f"  {prog} " in out  # the usage
    if kind is None:  # (no recipes: the packaged defaults)
        assert "--config-name <dataset>/<method>" not in out
        assert "pretrained_checkpoint_dir: null" in out
    else:
        assert f"Pick a recipe with --config-name <dataset>/<method>, e.g. {example}." in out
        root = ROOT / "scripts" / kind
        assert f"files {root}/<dataset>/<method>.yaml:" in out
        folders = [p for p in sorted(root.iterdir()) if p.is_dir() and p.name != "ext_defaults"]
        for folder in folders:
            names = sorted(p.stem for p in folder.glob("*.yaml"))
            assert f"\n  {folder.name}: {', '.join(names)}\n" in out
    assert list(tmp_path.iterdir()) == []


def test_a_recipes_help_shows_its_config(tmp_path, command):
    from solo_ext.commands import mains

    argv = ["--config-name", "cifar100-lt/dscl", "max_epochs=7", "--help"]
    code, out, _ = command(mains.pretrain, "solo-ext-pretrain", *argv, cwd=tmp_path)
    assert code == 0 and out.startswith("solo-ext-pretrain: ")
    config = out.split("== Config ==\n", 1)[1]
    assert "method: dscl" in config and "max_epochs: 7" in config


@pytest.mark.parametrize(
    "argv, why",
    [
        ([], "method is missing from the config"),
        (["+method=scl"], "backbone.name is missing from the config"),
        (["seed=3"], "seed=3 sets a recipe's key"),  # (Hydra: several lines, status 1)
    ],
)
def test_pretrain_without_a_recipe_says_what_to_pass(argv, why, tmp_path, command):
    from solo_ext.commands import mains

    code, out, err = command(mains.pretrain, "solo-ext-pretrain", *argv, cwd=tmp_path)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"solo-ext-pretrain: error: no recipe given ({why}): pass "), err
    assert "--config-name <dataset>/<method>, e.g. --config-name cifar100-lt/dscl" in err
    assert list(tmp_path.iterdir()) == []


def test_every_console_script_is_its_commands_main():
    """What the in-process tests call (``main()``) is what each installed console script runs."""
    from importlib.metadata import entry_points

    from solo_ext import leaderboard
    from solo_ext.commands import dense_probe, knn, linear, make_lt, pretrain

    expected = {
        "solo-ext-pretrain": pretrain.main,
        "solo-ext-linear": linear.main,
        "solo-ext-knn": knn.main,
        "solo-ext-make-lt": make_lt.main,
        "solo-ext-dense-probe": dense_probe.main,
        "solo-ext-leaderboard": leaderboard.main,
    }
    scripts = {e.name: e for e in entry_points(group="console_scripts") if e.name in expected}
    assert set(scripts) == set(expected)
    for name, main in expected.items():
        assert scripts[name].load() is main, name
        assert Path(sys.executable).with_name(name).exists(), f"{name} is not installed"
    # python -m solo_ext.<command>: the same main (tests/test_ddp_runs.py runs the pretrain one)
    for command in ("pretrain", "linear", "knn", "make_lt", "dense_probe"):
        module = importlib.import_module(f"solo_ext.{command}")
        assert module.main is importlib.import_module(f"solo_ext.commands.{command}").main


def test_help_cfg_job_and_a_refused_value_answer_before_the_training_stack(tmp_path):
    """``--help``, ``--cfg job`` and a value the early checks refuse are answered without
    importing torch, Lightning, torchmetrics, the host or the methods (a second or so, not the
    seconds of Lightning's import): the same answers as once the stack is imported."""
    scl = ["--config-name", "synthetic-lt/scl"]
    dir_x = "pretrained_checkpoint_dir=x"
    missing = "pretrained_checkpoint_dir is missing"
    # (command, argv, None or the key and value its one-line refusal names)
    cases = [
        ("pretrain", [*scl, "optimizer.lr=-1"], "optimizer.lr=-1"),
        ("pretrain", [*scl, "max_epochs=0"], "max_epochs=0"),
        ("pretrain", [*scl, "~optimizer.lr"], "optimizer.lr is missing"),
        ("pretrain", ["--config-name", "synthetic-lt/pbsd", "--cfg", "job"], None),
        ("pretrain", ["--help"], None),
        ("knn", [dir_x, "k=0"], "k=0"),
        ("knn", ["--cfg", "job"], None),
        ("linear", ["--help"], None),
        ("linear", ["--cfg", "job"], None),
        ("linear", [dir_x, "scheduler.lr_decay_steps=[3,2]"], "scheduler.lr_decay_steps=[3, 2]"),
        ("linear", [dir_x, "scheduler.name=step"], "scheduler.lr_decay_steps is missing"),
        ("linear", [dir_x, "+dali.devic=cpu"], "dali.devic='cpu'"),
        ("linear", [dir_x, "classifier_init=zeros"], "classifier_init='zeros'"),
        ("linear", [dir_x, "classifier_stage=crt2"], "classifier_stage='crt2'"),
        ("dense_probe", ["--cfg", "job"], None),
        ("dense_probe", [dir_x, "num_plot=-1"], "num_plot=-1"),
        ("pretrain", [*scl, "data.num_workers=-1"], "data.num_workers=-1"),
        ("knn", [dir_x, "+data.bad_images=no"], "data.bad_images='no'"),
        # no run named (a recipe's pretrained_feature_extractor left at ???), or two
        ("knn", [], missing),
        ("linear", ["--config-name", "synthetic-lt/dscl"], missing),
        ("dense_probe", ["num_plot=1"], missing),
        (
            "linear",
            ["--config-name", "dscl", "pretrained_checkpoint_dir=a", "max_epochs=1"]
            + ["pretrained_feature_extractor=b"],
            "pretrained_checkpoint_dir='a' and pretrained_feature_extractor='b'",
        ),
        ("knn", ["--help"], None),
        ("dense_probe", ["--help"], None),
        ("pretrain", [], "no recipe given"),
    ]
    done = mains_in_one_process([(str(i), c, tmp_path, a) for i, (c, a, _) in enumerate(cases)])
    for i, (name, argv, named) in enumerate(cases):
        code, imported, _, err = done[str(i)]
        assert imported == [], (name, argv, imported)
        assert code == (0 if named is None else 2), (name, argv, code)
        if named is not None:  # one line, "<command>: error: " and the key with the value
            prog = "solo-ext-" + name.replace("_", "-")
            assert "\n" not in err.strip() and err.startswith(f"{prog}: error: {named}"), err
    assert "'device'" in done["11"][3]  # the closest key
    assert "method: pbsd" in done["3"][2] and list(tmp_path.iterdir()) == []
