"""Whole runs on two processes: ``solo-ext-pretrain --config-name synthetic-lt/<method>
devices=2 strategy=ddp`` (gloo on CPU), with the shipped config's validation and online kNN, to
the end: checkpoint, ``args.json``, the online Many / Medium / Few kNN in the logs and the final
kNN in ``metrics.json``, all in one run directory. One run is started as a user starts it
(Lightning's launcher starts the command again for the second process, which imports everything
anew: about 6 s of the suite's 2 cores); the other step kinds' runs take ``strategy=ddp_fork``,
the same DDP on processes forked from the first, one run after another in one process.

(``test_distributed.py`` checks the losses, buffers and metrics of two processes against one;
``test_solo_learn_scripts.py`` runs the same through solo-learn's ``main_pretrain.py``.)
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import mains_in_one_process

from solo_ext.methods.registry import SOLO_EXT_METHODS

SHOT_GROUPS = ("many", "medium", "few")
VAL_PER_CLASS = 4
STEPS = 2  # a rank's optimiser steps in each whole run (what the runs check needs no more)


# the data of the shipped config, drawn smaller (60 down to 6 training images a class, the shot
# thresholds scaled with it): what the runs check does not depend on its size
SMALLER_DATA = [
    "data.synthetic.n_max=60",
    f"data.synthetic.val_per_class={VAL_PER_CLASS}",
    "data.many_threshold=30",
    "data.few_threshold=12",
    "optimizer.batch_size=32",
]


def run_args(method: str, strategy: str, *extra: str) -> list[str]:
    """The shipped config on two CPU processes (``strategy``: ddp or ddp_fork, the module's
    docstring), one epoch of ``STEPS`` steps a rank, on ``SMALLER_DATA``."""
    return [
        "--config-name",
        f"synthetic-lt/{method}",
        "devices=2",
        f"strategy={strategy}",
        "max_epochs=1",
        f"++limit_train_batches={STEPS}",
        "++enable_progress_bar=false",
        *SMALLER_DATA,
        *extra,
    ]


def run_command(
    command: str, args: list[str], cwd: Path, **more_env: str
) -> subprocess.CompletedProcess:
    """One of the installed ``solo-ext-*`` commands, one thread a process, output captured."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **more_env}
    return subprocess.run(
        [str(Path(sys.executable).with_name(command)), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def finite(value: str | float) -> bool:
    return value not in ("", None) and math.isfinite(float(value))


# one method per step and evaluation path (a two-process run costs ~15 s of the suite's 2 cores):
# DSCL for the supervised queue step (scl, kcl and tsc run the same step and evaluation with
# another criterion; their two-process steps are in test_distributed.py), PBSD with the loader's
# patches, DenseCL's dense maps, All4One's support set, PaCo's and BCL's online heads
WHOLE_RUNS = ("dscl", "pbsd", "densecl", "all4one_ct", "paco", "bcl")


def test_the_whole_runs_cover_every_step_and_evaluation_path():
    from solo_ext.methods.registry import load
    from solo_ext.methods.scl import SCL

    others = set(SOLO_EXT_METHODS) - set(WHOLE_RUNS)
    # what is left out runs the supervised step and evaluation of a method that is in
    assert all(issubclass(load(m), SCL) and not load(m).TERMS for m in others), others
    assert all(not load(m).JOINT_HEAD for m in others)


# the supervised queue step's whole run also reads with DALI (where it is installed)
DALI_RUN = "dscl"


def check_whole_run(method: str, tmp_path: Path, proc: subprocess.CompletedProcess) -> dict:
    """A finished two-process run: one run directory, written by the first process whatever the
    second one named its own, with its checkpoint, ``args.json``, the final kNN over the whole
    split and the online Many / Medium / Few kNN of the validation epoch. Its ``args.json``."""
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    (run_dir,) = (tmp_path / "trained_models" / method).iterdir()
    assert {p.name for p in run_dir.iterdir()} >= {"args.json", "metrics.json", "logs"}
    assert len(list(run_dir.glob("*.ckpt"))) == 1
    args = json.loads((run_dir / "args.json").read_text())
    assert args["devices"] == 2 and args["strategy"].startswith("ddp")
    assert args["environment"]["world_size"] == 2  # the run's record
    # the final kNN on the first process, over the whole training and validation split
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["num_val"] == 20 * VAL_PER_CLASS  # the config's 20 classes
    for group in SHOT_GROUPS:
        assert finite(metrics[f"knn_acc1_{group}"]), metrics
    # the online kNN of the validation epoch, over the features of both processes
    with open(run_dir / "logs" / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if finite(row.get("val_knn_acc1", ""))]
    assert len(rows) == 1
    for group in SHOT_GROUPS:
        assert finite(rows[0][f"val_knn_acc1_{group}"]), rows[0]
    return args


FORKED_RUNS = [m for m in WHOLE_RUNS if m != DALI_RUN]


@pytest.fixture(scope="module")
def forked_runs(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """Each step kind's whole run (but the DALI one) on two forked processes, one run after
    another in one process (one start of Python, torch and Lightning for all of them): its
    directory and its outcome."""
    dirs = {m: tmp_path_factory.mktemp(m) for m in FORKED_RUNS}
    runs = [(m, "pretrain", d, run_args(m, "ddp_fork")) for m, d in dirs.items()]
    done = mains_in_one_process(runs, timeout=1200, OMP_NUM_THREADS="1")
    return {
        m: (d, subprocess.CompletedProcess([m], done[m][0], *done[m][2:])) for m, d in dirs.items()
    }


@pytest.mark.parametrize("method", FORKED_RUNS)
def test_a_two_process_run_finishes_with_its_long_tail_knn(method, forked_runs):
    """Each step kind's whole run on two forked processes (the run started as a user starts it,
    through Lightning's launcher, is the one below)."""
    run_dir, proc = forked_runs[method]
    check_whole_run(method, run_dir, proc)


def test_a_two_process_dali_run_finishes_reading_disjoint_shares(tmp_path):
    """The supervised step's whole run as a user starts it (``strategy=ddp``: Lightning starts
    the command again for the second process, which takes the first one's run directory), with
    DALI's reader (CPU operators) drawing in the sampler's order: each rank's batches are its
    share (positions rank, rank + 2, ...) of one global order. Without DALI installed, the same
    run on the torchvision loader."""
    from omegaconf import OmegaConf

    from solo_ext.data.datasets import build_dataset
    from solo_ext.data.samplers import build_sampler

    with_dali = importlib.util.find_spec("nvidia") is not None and (
        importlib.util.find_spec("nvidia.dali") is not None
    )
    spy, env, dali = tmp_path / "spy", {}, []
    if with_dali:
        spy.mkdir()
        shim = str(Path(__file__).parent / "solo_shim")
        path = os.pathsep.join(filter(None, [shim, os.environ.get("PYTHONPATH")]))
        env = {"PYTHONPATH": path, "SOLO_EXT_TEST_SPY": str(spy)}
        dali = ["data.format=dali", "dali.device=cpu", "+data.sampler.name=class_balanced"]
    proc = run_command("solo-ext-pretrain", run_args(DALI_RUN, "ddp", *dali), tmp_path, **env)
    args = check_whole_run(DALI_RUN, tmp_path, proc)
    assert args["strategy"] == "ddp"
    if not with_dali:
        return
    assert args["data"]["format"] == "dali"
    assert args["environment"]["libraries"]["nvidia-dali"]  # DALI's version, recorded
    labels = build_dataset(OmegaConf.create(args["data"]), "train", None).targets
    batch = args["optimizer"]["batch_size"]
    whole = list(build_sampler("class_balanced", labels, seed=args["seed"], num_replicas=1, rank=0))
    for rank in (0, 1):
        seen = [
            json.loads(line) for line in (spy / f"labels-{rank}.jsonl").read_text().splitlines()
        ]
        assert len(seen) == STEPS  # limit_train_batches
        share = [labels[i] for i in whole[rank::2]]
        assert seen == [share[b * batch : (b + 1) * batch] for b in range(STEPS)]


def test_python_m_finds_the_shipped_configs(tmp_path):
    """``python -m solo_ext.pretrain`` (the README's other spelling, and how Lightning restarts
    the command on the second process) reads the same configs as ``solo-ext-pretrain``."""
    proc = subprocess.run(
        [sys.executable, "-m", "solo_ext.pretrain", "--config-name", "synthetic-lt/pbsd"]
        + ["--cfg", "job"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "method: pbsd" in proc.stdout


def test_the_processes_lightning_starts_take_the_first_process_run_id(tmp_path, monkeypatch):
    from solo_ext.commands.pretrain import RUN_ID_ENV, shared_run_id

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv(RUN_ID_ENV, raising=False)
    first = shared_run_id(tmp_path)
    assert os.environ[RUN_ID_ENV] == first
    monkeypatch.setenv("LOCAL_RANK", "1")  # a child: Lightning's launcher copied the environment
    assert shared_run_id(tmp_path) == first
    # a process started by another launcher (torchrun) has no id to take: it draws its own and
    # leaves the environment as it was
    monkeypatch.delenv(RUN_ID_ENV)
    other = shared_run_id(tmp_path)
    assert other != first and RUN_ID_ENV not in os.environ


def test_the_classifier_stages_on_two_processes_report_once_the_one_process_numbers(
    forked_runs, tmp_path
):
    """``solo-ext-linear classifier_stage=all`` on two processes as a user starts it
    (``strategy=ddp``: the second process runs the command again): the balanced stage trains
    on both, the decoupled stages give exactly the numbers of one process (every process trains
    them on the same cached features from the same seed), and only the first process prints
    and writes them."""
    import shutil

    from conftest import eval_cfg

    from solo_ext.commands import linear

    source, _ = forked_runs[FORKED_RUNS[0]]
    (run,) = (source / "trained_models" / FORKED_RUNS[0]).iterdir()
    one, two = tmp_path / "one", tmp_path / "two"
    for where in (one, two):
        shutil.copytree(run, where)
    stages = ["crt", "tau_norm", "lws", "logit_adjust"]
    quick = {"decoupled.epochs": 2, "decoupled.lws_epochs": 1}
    cfg = eval_cfg("linear", one, classifier_stage=stages, **quick, enable_progress_bar=False)
    want = linear.run(cfg)
    args = [
        f"pretrained_checkpoint_dir={two}",
        "classifier_stage=all",
        "max_epochs=1",
        *[f"{k}={v}" for k, v in quick.items()],
        "devices=2",
        "+strategy=ddp",
        "++enable_progress_bar=false",
    ]
    proc = run_command("solo-ext-linear", args, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    got = json.loads((two / "metrics.json").read_text())
    for stage in stages:
        assert proc.stdout.count(f"classifier stage {stage} on") == 1, proc.stdout
        for key in ("acc1", "acc5", "tau" if stage == "tau_norm" else "batch"):
            name = f"linear_{stage}_{key}"
            assert got[name] == pytest.approx(want[name], abs=1e-9), name
    assert proc.stdout.count("linear probe on") == 1
    assert got["linear_environment"]["world_size"] == 2 and finite(got["linear_acc1"])
