"""Shared fixtures: tiny configs on the embedded data, fast enough for 2 CPU cores."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import DictConfig, OmegaConf

from solo_ext.methods.registry import SOLO_EXT_METHODS

ROOT = Path(__file__).resolve().parents[1]


# --- the real solo-learn ------------------------------------------------------------------
# A test that needs the real solo-learn (its scripts, its parse_cfg, its modules) is marked
# ``solo_learn``. Where solo-learn is not the host, or its checkout is not found, it skips,
# saying so; with SOLO_EXT_REQUIRE_SOLO_LEARN=1 (CI's second environment, which runs
# ``pytest -m solo_learn``: docs/install.md) such a skip is a failure instead.
def _solo_learn_checkout() -> Path | None:
    """The checkout whose scripts the tests run: SOLO_LEARN_DIR, else the one holding the
    importable ``solo`` (an editable install); None where neither has ``main_pretrain.py``."""
    from solo_ext.host import HOST

    if HOST != "solo":
        return None
    import solo

    where = Path(os.environ.get("SOLO_LEARN_DIR") or Path(solo.__file__).resolve().parents[1])
    return where if (where / "main_pretrain.py").is_file() else None


SOLO_LEARN_DIR = _solo_learn_checkout()
NEEDS_SOLO_LEARN = "needs the real solo-learn"
REQUIRE_SOLO_LEARN = os.environ.get("SOLO_EXT_REQUIRE_SOLO_LEARN", "0") == "1"


def free_port() -> int:
    """A TCP port free on this machine now (a rendezvous for processes started by a test)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "solo_learn: needs the real solo-learn as the host and its checkout"
    )
    config.addinivalue_line(
        "markers", "early(minutes=1): a long test, started first (the longest first)"
    )


def share_module_fixtures(config, items) -> None:
    """Tests that share a module-scoped fixture (a training run, mostly) go to one pytest-xdist
    worker (``--dist loadgroup``), so that the fixture is made once, not once per worker."""
    if not getattr(config.option, "loadgroup", False):  # (one process, or another --dist)
        return
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent.setdefault(name, name) != name:
            name = parent[name]
        return name

    shared = {}
    for item in items:
        defs = getattr(item, "_fixtureinfo", None)
        names = [
            f"{item.module.__name__}.{name}"
            for name, found in (defs.name2fixturedefs.items() if defs else ())
            if found and found[-1].scope == "module"
        ]
        for name in names[1:]:  # (a test using two joins their groups)
            parent[root(name)] = root(names[0])
        shared[item] = names
    for item, names in shared.items():
        group = next((m.args[0] for m in item.iter_markers("xdist_group")), None)
        if group is None and names:
            group = root(names[0])
        if group is not None:
            in_group(item, group)


def in_group(item, group: str) -> None:
    """pytest-xdist's loadgroup reads a test's group from an ``@<group>`` suffix of its node id,
    which it appends for an ``xdist_group`` mark through an attribute pytest 9.2 no longer reads
    (the node id is structured there): the suffix is appended here, where this pytest keeps it."""
    nodeid = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):
        item._id = type(item._id).parse(nodeid)
    else:
        item._nodeid = nodeid


@pytest.hookimpl(tryfirst=True)  # (before pytest-xdist reads the groups)
def pytest_collection_modifyitems(config, items):
    # the longest tests first, so that pytest-xdist's workers finish together
    def minutes(item) -> float:
        early = item.get_closest_marker("early")
        return early.kwargs.get("minutes", 1) if early else 0

    items.sort(key=lambda item: -minutes(item))
    share_module_fixtures(config, items)
    if SOLO_LEARN_DIR is not None:
        return
    why = (
        f"{NEEDS_SOLO_LEARN} as the host and its checkout "
        "(solo-learn importable; SOLO_LEARN_DIR naming its checkout)"
    )
    for item in items:
        if item.get_closest_marker("solo_learn") is not None:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Where solo-learn is required, a test skipped for want of it fails."""
    report = (yield).get_result()
    if REQUIRE_SOLO_LEARN and report.skipped and NEEDS_SOLO_LEARN in str(report.longrepr):
        why = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (
            f"skipped where solo-learn is required (SOLO_EXT_REQUIRE_SOLO_LEARN=1): {why}"
        )


# two threads for the suite's process, or its share of the cores among pytest-xdist's workers;
# a process that is told its share (the two-process workers, OMP_NUM_THREADS=1) keeps it: two
# processes of two threads on two cores spin in OpenMP's barriers for seconds at every operator
if "OMP_NUM_THREADS" not in os.environ:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // workers)))
METHOD_NAMES = sorted(SOLO_EXT_METHODS)

AUGMENTATION = {
    "rrc": {"enabled": True, "crop_min_scale": 0.5, "crop_max_scale": 1.0},
    "color_jitter": {
        "prob": 0.5,
        "brightness": 0.4,
        "contrast": 0.4,
        "saturation": 0.2,
        "hue": 0.1,
    },
    "grayscale": {"prob": 0.2},
    "gaussian_blur": {"prob": 0.0},
    "solarization": {"prob": 0.0},
    "equalization": {"prob": 0.0},
    "horizontal_flip": {"prob": 0.5},
    "crop_size": 32,
    "num_crops": 2,
}


def stand_in_checkpoint(folder: Path, name: str = "run.ckpt") -> Path:
    """An empty checkpoint file, with a pretraining run's ``args.json`` beside it that gives
    only the run's views (the query view a classifier stage takes by default)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "args.json").write_text(json.dumps({"augmentations": [AUGMENTATION]}))
    ckpt = folder / name
    ckpt.touch()
    return ckpt


# The cheapest backbone every method runs on at 32 px (the suite must fit 2 CPU cores): the CIFAR
# ResNet-32, 0.46 M parameters against ResNet-18's 11.2 M (which the weight updates, the momentum
# encoder, the gradient all-reduce and every checkpoint write pay for), with an 8 x 8 last
# feature map for the methods that read it (PBSD, DenseCL).
TINY_BACKBONE = {"name": "cifar_resnet32"}
# ResNet-18 (ImageNet stem) for the tests that read its 512 features, its stem, or its numbers
RESNET18 = {"name": "resnet18", "kwargs": {"small_image_stem": False}}


def tiny_cfg(method: str, tmp_path: Path | str, /, **overrides) -> DictConfig:
    """A pretraining config of a few steps on a small ``synthetic_lt``."""
    cfg = OmegaConf.create(
        {
            "name": f"tiny-{method}",
            "method": method,
            "backbone": dict(TINY_BACKBONE),
            "method_kwargs": {"proj_hidden_dim": 32, "proj_output_dim": 16, "queue_size": 64},
            "data": {
                "dataset": "synthetic_lt",
                "num_classes": 4,
                "imbalance_factor": 4,
                "synthetic": {"n_max": 24, "val_per_class": 4, "image_size": 32},
                "num_workers": 0,
            },
            "augmentations": [AUGMENTATION],
            "optimizer": {
                "name": "sgd",
                "batch_size": 8,
                "lr": 0.1,
                "classifier_lr": 0.1,
                "weight_decay": 1e-5,
            },
            "scheduler": {"name": "warmup_cosine", "warmup_epochs": 0},
            "knn_eval": {"enabled": False},
            "checkpoint": {"enabled": True, "dir": str(Path(tmp_path) / "trained_models")},
            "max_epochs": 1,
            "limit_train_batches": 2,
            "limit_val_batches": 1,
            "num_sanity_val_steps": 0,
            "accelerator": "cpu",
            "devices": 1,
            "enable_progress_bar": False,
            "seed": 0,
        }
    )
    if method == "tsc":  # the targets of 4 classes spread in a few steps (10000 by default)
        cfg.method_kwargs.target_steps = 200
    if method == "bcl":  # the classifier's crop and two contrastive views
        cfg.augmentations[0].num_crops = 3
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    if method == "bcl":  # no queue (a queue size given to every method is not bcl's)
        cfg.method_kwargs.pop("queue_size", None)
    return cfg


@pytest.fixture
def make_cfg(tmp_path):
    def make(method: str = "scl", /, **overrides) -> DictConfig:
        return tiny_cfg(method, tmp_path, **overrides)

    return make


def eval_cfg(name: str, run_dir: Path | str, **overrides) -> DictConfig:
    """The packaged defaults of ``solo-ext-knn`` / ``solo-ext-linear`` for ``run_dir``."""
    cfg = OmegaConf.load(ROOT / "solo_ext" / "conf" / f"{name}.yaml")
    cfg.pretrained_checkpoint_dir = str(run_dir)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


@pytest.fixture
def command(capsys, monkeypatch):
    """A console command's ``main()`` run in this process, as its console script runs it
    (``sys.argv``, Hydra from scratch, the one-line errors): ``call(main, prog, *argv, cwd=...)``
    gives (exit status, stdout, stderr). The console scripts themselves are run as
    subprocesses by a few tests (tests/test_cli.py, tests/test_configs.py)."""

    def call(main: Callable[[], None], prog: str, *argv: str, cwd: Path | None = None):
        from hydra.core.global_hydra import GlobalHydra

        if cwd is not None:
            monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", [prog, *argv])
        GlobalHydra.instance().clear()
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        finally:
            GlobalHydra.instance().clear()
        out, err = capsys.readouterr()
        return code, out, err

    return call


# console commands' main()s one after another in one fresh process, as their console scripts
# run them (sys.argv, Hydra from scratch, the working directory): the tests that start several
# commands pay one start of Python for all of them
_MAINS_IN_ONE_PROCESS = """
import json, os, sys, traceback
from hydra.core.global_hydra import GlobalHydra
from solo_ext.commands import mains
WATCHED = ("torch", "lightning", "torchmetrics", "solo_ext.host", "solo_ext.methods", "solo")
results = {}
for label, name, cwd, argv in json.loads(sys.argv[1]):
    os.chdir(cwd)
    sys.argv = ["solo-ext-" + name.replace("_", "-"), *argv]  # (the configs follow the name)
    GlobalHydra.instance().clear()
    print(f"=== {label}", flush=True)
    print(f"=== {label}", file=sys.stderr, flush=True)
    try:
        getattr(mains, name)()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except Exception:
        traceback.print_exc()
        code = 1
    sys.stdout.flush(), sys.stderr.flush()
    results[label] = [code, sorted(m for m in WATCHED if m in sys.modules)]
print("results " + json.dumps(results))
"""


def mains_in_one_process(
    runs: list[tuple[str, str, Path | str, list[str]]], timeout: float = 600, **env: str
) -> dict[str, tuple[int, list[str], str, str]]:
    """Runs ``(label, command, cwd, argv)`` one after another in one fresh process (``command``:
    a name in ``solo_ext.commands.mains``). Per label: the exit status (-1: never reached), the
    modules of the training stack imported when it ended (torch, Lightning, torchmetrics, the
    host, the methods, solo-learn), and its own part of stdout and stderr."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _MAINS_IN_ONE_PROCESS,
            json.dumps([[*r[:2], str(r[2]), r[3]] for r in runs]),
        ],
        env={**os.environ, "PYTHONWARNINGS": "ignore", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    results = json.loads(last.removeprefix("results ")) if last.startswith("results ") else {}

    def own(text: str, label: str) -> str:
        part = text.partition(f"=== {label}\n")[2].split("\n=== ", 1)[0]
        return part or text  # (all of it when the process ended before this run)

    return {
        label: (*results.get(label, (-1, [])), own(proc.stdout, label), own(proc.stderr, label))
        for label, *_ in runs
    }


def write_fashion_mnist(
    root: Path, train_per_class: int = 30, test_per_class: int = 4, gz: bool = True
) -> Path:
    """The four Fashion-MNIST IDX files, tiny (10 classes, 28x28), written under ``root``: the
    labels cycle through the classes, and an image of class c is c * 20 plus noise."""
    import gzip

    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for prefix, per_class in (("train", train_per_class), ("t10k", test_per_class)):
        labels = np.tile(np.arange(10, dtype=np.uint8), per_class)
        noise = rng.integers(0, 20, (labels.size, 28, 28))
        images = (labels[:, None, None].astype(np.int64) * 20 + noise).astype(np.uint8)
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            head = bytes([0, 0, 8, array.ndim]) + b"".join(
                n.to_bytes(4, "big") for n in array.shape
            )
            name = root / f"{prefix}-{kind}-ubyte"
            payload = head + array.tobytes()
            if gz:
                with gzip.open(f"{name}.gz", "wb") as f:
                    f.write(payload)
            else:
                name.write_bytes(payload)
    return root


def fake_cifar(root: Path, name: str, train_counts: list[int], test_per_class: int = 2) -> None:
    """CIFAR's python layout (torchvision's file names; checksums skipped by the shim) holding
    ``train_counts[c]`` random images of class c, and ``test_per_class`` test images."""
    import torchvision.datasets as tvd

    cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
    label_key = "labels" if name == "cifar10" else "fine_labels"
    folder = root / cls.base_folder
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    classes = len(train_counts)
    for files, counts in (
        (cls.train_list, train_counts),
        (cls.test_list, [test_per_class] * classes),
    ):
        labels = np.array([c for c, n in enumerate(counts) for _ in range(n)])
        for (file_name, _), part in zip(files, np.array_split(labels, len(files))):
            pixels = rng.integers(0, 256, (len(part), 3072), dtype=np.uint8)
            with open(folder / file_name, "wb") as f:
                pickle.dump({"data": pixels, label_key: part.tolist()}, f)
    with open(folder / cls.meta["filename"], "wb") as f:
        pickle.dump({cls.meta["key"]: [f"c{i}" for i in range(classes)]}, f)


def fake_images(root: Path, paths: list[str], size: int = 40) -> None:
    """Tiny JPEG files at ``root / path``."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / path)


# --- values just outside a declared key -----------------------------------------------------
# The bad-input tests try each declared key (an ``Option``) with these values. They are made
# from the declaration alone (its kind, bounds and choices), never filtered by the check under
# test: a check that wrongly accepts one fails its test.
OUTSIDE_BY_KIND = {
    "bool": ["yes", 1],
    "text": [True],
    "devices": [-2, "0,x", [0, -1], True],
}
# the list keys of the evaluation commands, by their declaration's class
OUTSIDE_BY_CLASS = {
    "KList": [0, [], [10, 10], [10, 0], "ten"],  # k: distinct counts >= 1
    "EpochList": ["many", [0], [3, 2], [1.5]],  # increasing epochs >= 1
    "StageList": ["crt2", [], ["crt", "crt"], 3],  # distinct stage names
}


def outside(option) -> list:
    """Values just outside ``option``: a misspelt word, each bound crossed, a fraction for an
    integer, and for ``[low, high]`` pairs a short list and a reversed one."""
    if type(option).__name__ in OUTSIDE_BY_CLASS:
        return list(OUTSIDE_BY_CLASS[type(option).__name__])
    if option.kind in OUTSIDE_BY_KIND:
        return list(OUTSIDE_BY_KIND[option.kind])
    word = f"{option.choices[0]}_typo" if option.choices else "many"
    if option.kind == "str":
        return [word]
    low, high = option.low, option.high
    below = None if low is None else (low if option.low_open else low - 1)
    above = None if high is None else (high if option.high_open else high + 1)
    if option.kind == "pair":
        start = 0.0 if low is None else low
        if high is None:  # no upper bound: 0.5 and 2 above the lower one
            a, b = start + 0.5, start + 2.0
        else:  # a quarter and three quarters of the way up (a bound of 0 included)
            a, b = start + (high - start) / 4, start + 3 * (high - start) / 4
        values = [word, [a], [b, a]]
        values += [] if below is None else [[below, b]]
        return values + ([] if above is None else [[a, above]])
    values = [word] + [v for v in (below, above) if v is not None]
    return values + ([(low or 0) + 1.5] if option.kind == "int" else [])
