"""Every command the README and docs/ show runs, as shown, in a test, so none of them rots.

Each ```bash block is preceded by a marker, ``<!-- command: <name> -->``, and found by it (not by
its position). A block is run by bash, line for line as the page shows it, in a fresh directory
that holds tiny stand-ins of the data it reads (at the recipes' own paths: ``./datasets``); the
console commands are reached through wrappers that append tiny settings (one step, a batch of two,
the CPU), which Hydra lets win over the block's own values, and blocks that evaluate runs start
from tiny runs made first with the command the page gives for them. Blocks for solo-learn's own
scripts run where solo-learn is importable (``SOLO_LEARN_DIR``: its checkout). The set-up and
main-job blocks are CI's and ``test_cli.py``'s (``test_readme.py``); the install from a fresh
solo-learn checkout downloads solo-learn and is checked here for its facts only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import ROOT, SOLO_LEARN_DIR, fake_cifar, fake_images, free_port

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKED = re.compile(r"<!-- command: ([a-z0-9-]+) -->\n```bash\n(.*?)```", re.S)
BASH = re.compile(r"```bash\n", re.S)

# tiny settings appended to each command (Hydra overrides: the last value of a key wins)
TINY = {
    "solo-ext-pretrain": "++max_epochs=1 ++limit_train_batches=1 ++limit_val_batches=1 "
    "++optimizer.batch_size=2 ++data.num_workers=0 ++accelerator=cpu ++devices=1 "
    "++sync_batchnorm=False ++precision=32 ++strategy=auto",
    "solo-ext-linear": "++max_epochs=1 ++optimizer.batch_size=4 ++data.num_workers=0 "
    "++accelerator=cpu ++devices=1 ++precision=32 ++decoupled.epochs=1 ++decoupled.lws_epochs=1",
    "solo-ext-knn": "++accelerator=cpu ++batch_size=8",
    "solo-ext-dense-probe": "++max_epochs=1 ++accelerator=cpu",
    "main_pretrain.py": "++max_epochs=1 ++limit_train_batches=1 ++limit_val_batches=1 "
    "++optimizer.batch_size=2 ++data.num_workers=0 ++accelerator=cpu '++devices=\"1\"' "
    "++sync_batchnorm=False ++precision=32 ++strategy=auto",
    "main_linear.py": "++max_epochs=1 ++limit_train_batches=1 ++limit_val_batches=1 "
    "++optimizer.batch_size=4 ++data.num_workers=0 ++accelerator=cpu '++devices=\"1\"' "
    "++precision=32 ++strategy=auto",
}
# the stand-in data's own settings (its classes hold a few images each)
DATA = {
    # the embedded data smaller: 6 classes of 24 down to 6 images (the evaluations read the run's)
    "synthetic": {
        "solo-ext-pretrain": "++data.num_classes=6 ++data.imbalance_factor=4 "
        "++data.synthetic.n_max=24 ++data.synthetic.val_per_class=4",
    },
    "cifar100": {
        "solo-ext-pretrain": "++data.lt_n_max=4 ++data.imbalance_factor=2",
        "solo-ext-linear": "++data.lt_n_max=4 ++data.imbalance_factor=2",
        "main_pretrain.py": "++data.lt_n_max=4 ++data.imbalance_factor=2",
        "main_linear.py": "++data.lt_n_max=4 ++data.imbalance_factor=2",
        "solo-ext-make-lt": "--lt_n_max 4 --imbalance_factor 2",
    },
    # ResNet-50's crops at 64 px instead of 224 (the stand-in images are 40 px)
    "imagenet_lt": {
        "solo-ext-pretrain": "++augmentations.0.crop_size=64 ++augmentations.1.crop_size=64",
        "main_pretrain.py": "++augmentations.0.crop_size=64 ++augmentations.1.crop_size=64",
    },
}


@dataclass
class Block:
    """How a named block runs: its stand-in data, the commands that make the runs it evaluates,
    whether it needs solo-learn, and what it leaves behind (globs under its directory)."""

    data: str = "synthetic"
    before: list[str] = field(default_factory=list)
    solo: bool = False
    installs: bool = False  # its `pip install` lines are not run (they would change this env)
    nodes: int = 1  # run this many times at once, as the machines of one run (NODE_RANK)
    leaves: list[str] = field(default_factory=list)
    cwd_root: bool = False  # runs in the repository's root (the benchmarks)


RUNS = {
    "quick-start-evaluation": Block(
        before=["solo-ext-pretrain --config-name synthetic-lt/pbsd"],
        leaves=["leaderboard/synthetic_lt*.md", "trained_models/pbsd/*/linear_crt_per_class.csv"],
    ),
    "install-into-solo-learn": Block(solo=True, installs=True),
    "imagenet-lt": Block(
        data="imagenet_lt", leaves=["leaderboard/imagenet_lt.md", "trained_models/pbsd/*/*.ckpt"]
    ),
    "evaluation": Block(
        before=["solo-ext-pretrain --config-name synthetic-lt/pbsd"],
        leaves=["trained_models/pbsd/*/dense_predictions.png"],
    ),
    "solo-learn-scripts": Block(
        data="cifar100", solo=True, leaves=["trained_models/dscl/*/*.ckpt"]
    ),
    "make-lt": Block(data="cifar100", leaves=["datasets/cifar100-lt/counts.json"]),
    "leaderboard": Block(
        data="cifar100",
        before=["solo-ext-pretrain --config-name cifar100-lt/dscl"],
        leaves=["leaderboard/cifar100_lt*.tex", "leaderboard-peers/cifar100_lt*.md"],
    ),
    "wandb": Block(data="cifar100", leaves=["trained_models/dscl/*/wandb"]),
    "benchmarks": Block(cwd_root=True),
    "tutorial-imagenet-lt-pretrain": Block(
        data="imagenet_lt", solo=True, leaves=["trained_models/pbsd/*/*.ckpt"]
    ),
    "tutorial-imagenet-lt-evaluate": Block(
        data="imagenet_lt",
        before=[
            "solo-ext-pretrain --config-name imagenet-lt/dscl",
            "solo-ext-pretrain --config-name imagenet-lt/pbsd",
        ],
        leaves=["leaderboard/imagenet_lt.tex"],
    ),
    "several-machines-torchrun": Block(
        data="imagenet_lt", solo=True, nodes=2, leaves=["trained_models/dscl/*/*.ckpt"]
    ),
    "tutorial-cifar100-lt": Block(data="cifar100", leaves=["leaderboard/cifar100_lt*.md"]),
    "tutorial-cifar100-lt-seeds": Block(
        data="cifar100", leaves=["trained_models/dscl/*/*.ckpt", "seeds.csv", "dscl-scl.png"]
    ),
}
# checked elsewhere: CI runs the set-up block (test_readme.py), test_cli.py the main job; the
# fresh solo-learn install downloads it (test_the_fresh_install_names_the_tested_solo_learn);
# CI's second environment runs the block of the tests that need solo-learn
# (test_ci_runs_the_solo_learn_tests_as_shown)
# a cluster's job (SLURM) cannot run here
ELSEWHERE = {"setup", "main-job", "install-fresh", "test-solo-learn", "several-machines-slurm"}


def blocks() -> dict[str, tuple[Path, str]]:
    found: dict[str, tuple[Path, str]] = {}
    for page in PAGES:
        for name, body in MARKED.findall(page.read_text()):
            assert name not in found, f"block {name!r} in {page} and {found[name][0]}"
            found[name] = (page, body)
    return found


def test_every_bash_block_is_named_and_run_here():
    for page in PAGES:
        text = page.read_text()
        assert len(BASH.findall(text)) == len(MARKED.findall(text)), (
            f"{page.relative_to(ROOT)}: a ```bash block without <!-- command: <name> --> above it"
        )
    assert set(blocks()) == set(RUNS) | ELSEWHERE


def _wrappers(bin_dir: Path, data: str) -> dict[str, str]:
    """Wrappers of the console commands and of python (for solo-learn's scripts and the
    benchmarks) that append the tiny settings; returns the environment they read."""
    bin_dir.mkdir()
    env = {}
    for name in ("solo-ext-pretrain", "solo-ext-linear", "solo-ext-knn", "solo-ext-dense-probe",
                 "solo-ext-make-lt"):  # fmt: skip
        beside = Path(sys.executable).parent / name  # this environment's, even off PATH
        real = str(beside) if beside.exists() else shutil.which(name)
        assert real, f"{name} is not installed"
        var = "TINY_" + name.upper().replace("-", "_")
        env[var] = " ".join(filter(None, [TINY.get(name, ""), DATA[data].get(name, "")]))
        (bin_dir / name).write_text(f'#!/bin/bash\neval exec "{real}" \'"$@"\' "${var}"\n')
    for script in ("main_pretrain.py", "main_linear.py"):
        var = "TINY_" + script.upper().replace(".", "_")
        env[var] = " ".join(filter(None, [TINY[script], DATA[data].get(script, "")]))
    (bin_dir / "python").write_text(
        "#!/bin/bash\n"
        'case "$1" in\n'
        f'  main_pretrain.py) eval exec "{sys.executable}" \'"$@"\' "$TINY_MAIN_PRETRAIN_PY";;\n'
        f'  main_linear.py) eval exec "{sys.executable}" \'"$@"\' "$TINY_MAIN_LINEAR_PY";;\n'
        f'  main_knn.py) exec "{sys.executable}" "$@" --batch_size 8 --num_workers 0;;\n'
        f'  -m) [ "$2" = benchmarks ] && exec "{sys.executable}" "$@" --tiny;;\n'
        "esac\n"
        f'exec "{sys.executable}" "$@"\n'
    )
    (bin_dir / "torchrun").write_text(  # (the script's tiny settings after its own)
        "#!/bin/bash\n"
        f'eval exec "{sys.executable}" -m torch.distributed.run \'"$@"\' "$TINY_MAIN_PRETRAIN_PY"\n'
    )
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    return env


def _stand_in(data: str, cwd: Path) -> None:
    """Tiny data where the recipes look for it (``./datasets``)."""
    if data == "cifar100":
        fake_cifar(cwd / "datasets", "cifar100", [4] * 100, test_per_class=1)
    elif data == "imagenet_lt":
        root = cwd / "datasets" / "imagenet"
        train = [f"train/n{c:08d}/{i}.JPEG" for c in range(3) for i in range(4)]
        test = [f"val/n{c:08d}/v{i}.JPEG" for c in range(3) for i in range(2)]
        fake_images(root, train + test)
        for name, paths in (("ImageNet_LT_train.txt", train), ("ImageNet_LT_test.txt", test)):
            lines = [f"{p} {int(p.split('/')[1][1:])}" for p in paths]
            (root / name).write_text("\n".join(lines) + "\n")


def _bash(script: str, cwd: Path, *envs: dict[str, str]) -> None:
    """Runs ``script`` once per environment, all at once (the machines of one run)."""
    procs = [
        subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for env in envs
    ]
    for proc in procs:
        out = proc.communicate(timeout=900)[0]
        assert proc.returncode == 0, f"{script}\n{out[-8000:]}"


@pytest.fixture(scope="session")
def made(tmp_path_factory) -> dict:
    """The runs made by a block's ``before`` commands, kept for the next block that starts from
    the same ones: (data, commands) -> their trained_models, and the folder they are kept in."""
    return {"root": tmp_path_factory.mktemp("made")}


def marks(name: str) -> list:
    """solo_learn where the block needs it; the blocks that start from the same runs in one
    pytest-xdist worker (the runs made once); each block early (a minute or so of commands)."""
    spec = RUNS[name]
    same = [n for n in sorted(RUNS) if (RUNS[n].data, *RUNS[n].before) == (spec.data, *spec.before)]
    shared = [pytest.mark.xdist_group("docs-" + same[0])] if spec.before and len(same) > 1 else []
    return [pytest.mark.solo_learn] * spec.solo + shared + [pytest.mark.early]


@pytest.mark.parametrize("name", [pytest.param(n, marks=marks(n)) for n in sorted(RUNS)])
def test_the_block_runs_as_shown(name, tmp_path, made):
    spec = RUNS[name]
    page, body = blocks()[name]
    cwd = tmp_path / "work"
    cwd.mkdir()
    _stand_in(spec.data, cwd)
    if spec.solo:  # run from solo-learn's checkout, as its README says: its scripts beside
        for script in ("main_pretrain.py", "main_linear.py", "main_knn.py"):
            (cwd / script).symlink_to(Path(SOLO_LEARN_DIR) / script)
    shim = str(ROOT / "tests" / "solo_shim")  # CIFAR's checksums skipped for the stand-in
    env = {
        **os.environ,
        **_wrappers(tmp_path / "bin", spec.data),
        # the wrappers, then this environment's commands (found even when it is not activated)
        "PATH": os.pathsep.join(
            [str(tmp_path / "bin"), str(Path(sys.executable).parent), os.environ["PATH"]]
        ),
        "PYTHONPATH": os.pathsep.join(filter(None, [shim, os.environ.get("PYTHONPATH")])),
        "SOLO_EXT_TEST_CIFAR_UNCHECKED": "1",
        "SOLO_EXT_TEST_CUDA_IS_CPU": "1",  # (main_knn.py moves every batch with .cuda())
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "PYTHONWARNINGS": "ignore",
    }
    if spec.before:
        key = (spec.data, *spec.before)
        if key not in made:
            _bash("\n".join(spec.before), cwd, env)
            made[key] = made["root"] / str(len(made))
            shutil.copytree(cwd / "trained_models", made[key])
        else:
            shutil.copytree(made[key], cwd / "trained_models")
    if spec.installs:
        body = "\n".join(line for line in body.splitlines() if not line.startswith("pip install"))
    if spec.nodes > 1:  # the machines of one run, side by side
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        _bash(body, cwd, *({**env, "NODE_RANK": str(r)} for r in range(spec.nodes)))
    else:
        _bash(body, ROOT if spec.cwd_root else cwd, env)
    for pattern in spec.leaves:
        assert list(cwd.glob(pattern)), f"{page.name}'s {name!r} left no {pattern}"


def test_the_fresh_install_names_the_tested_solo_learn():
    """The fresh-checkout install cannot run here (it downloads solo-learn); what it states is
    held: the commit is the one the patches name, and the pins it speaks of are solo-learn's."""
    from solo_ext.solo_learn.check import TESTED_WITH

    page, body = blocks()["install-fresh"]
    text = page.read_text()
    assert "git clone https://github.com/vturrisi/solo-learn" in body
    assert f"git checkout {TESTED_WITH[1]}" in body
    assert f"solo-learn {TESTED_WITH[0]} at\ncommit `{TESTED_WITH[1]}`" in text
    assert 'pip install --no-deps "setuptools<70"' in body
    solo_dir = os.environ.get("SOLO_LEARN_DIR")
    if solo_dir and (Path(solo_dir) / "requirements.txt").is_file():
        pins = (Path(solo_dir) / "requirements.txt").read_text().replace(" ", "").splitlines()
        assert "lightning==2.1.2" in pins
        assert any(p.startswith("torchmetrics") and p.endswith("<0.12.0") for p in pins), pins


def test_ci_runs_the_solo_learn_tests_as_shown():
    """The installs and the test command of docs/install.md's "Testing against solo-learn" are
    those .ci/run's second environment runs (its checkout for /path/to/solo-learn)."""
    _, body = blocks()["test-solo-learn"]
    ci = (ROOT / ".ci" / "run").read_text()
    for line in body.strip().splitlines():
        command = line.split("  #")[0].strip()
        if command.startswith("pip install"):
            assert command in ci, command
        else:
            assert command.startswith("SOLO_LEARN_DIR=/path/to/solo-learn "), command
            for word in command.split()[1:]:
                assert word in ci, word
