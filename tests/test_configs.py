"""Every config under scripts/ composes by the name the search-path plugin gives it
(``cifar100-lt/dscl``, ``dscl.yaml``), with its own augmentation files, and passes solo-ext's
checks as shipped; the linear configs run; the plugin serves each script its configs.

With the real solo-learn importable, tests/test_solo_learn_scripts.py passes the same configs
through solo-learn's own ``parse_cfg`` and scripts; tests/test_config_sections.py checks that each
holds every section and key of solo-learn's configs, so its plain overrides reach both.
"""

from __future__ import annotations

import copy
import csv
import functools
import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import RESNET18, ROOT, tiny_cfg, write_fashion_mnist
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from solo_ext.commands import knn, linear
from solo_ext.commands.pretrain import parse_cfg, run
from solo_ext.data.datasets import build_dataset
from solo_ext.data.transforms import build_eval_transform
from solo_ext.facts import SPLIT_FILE_DATASETS, facts
from solo_ext.host import build_backbone
from solo_ext.methods.registry import SOLO_EXT_METHODS

SCRIPTS = ROOT / "scripts"


# the config group every recipe takes first (solo-learn's defaults, quiet Hydra): not a recipe
SHARED = "ext_defaults"


def configs(kind: str) -> list[str]:
    """Recipe names as Hydra finds them on the plugin's search path (``scripts/<kind>``)."""
    root = SCRIPTS / kind
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.glob("*.yaml")) + sorted(
        str(p.relative_to(root).with_suffix(""))
        for p in root.glob("*/*.yaml")
        if p.parent.name != SHARED
    )


def compose_config(kind: str, name: str, overrides: list[str] = ()):
    """The recipe as Hydra composes it with these overrides: composed once in a test process,
    a copy of its own for each call."""
    return copy.deepcopy(_composed(kind, name, tuple(overrides)))


@functools.cache
def _composed(kind: str, name: str, overrides: tuple[str, ...]):
    with initialize_config_dir(config_dir=str(SCRIPTS / kind), version_base="1.2"):
        return compose(config_name=name, overrides=list(overrides))


def data_overrides(dataset: str, root: Path) -> list[str]:
    """Points a config at tiny stand-ins for data that is not on this machine (existing keys
    only: the configs are otherwise used as shipped)."""
    if dataset.startswith("cifar"):
        return ["++data.download=true"]  # skips the folder check; nothing is downloaded here
    if dataset.startswith("fashion_mnist"):  # tiny IDX files: 30 training images a class
        write_fashion_mnist(root)
        return [f"data.train_path={root}", "data.lt_n_max=30"]
    if dataset in SPLIT_FILE_DATASETS:
        train_file, val_file = facts(dataset).split_files
        for name in (train_file, val_file):
            (root / name).write_text("train/a/0.jpg 0\n")
        return [f"data.train_path={root}"]
    if dataset in ("custom", "custom_lt", "imagenet100"):
        for split in ("train", "val"):
            for c in range(100):
                (root / split / f"class{c:03d}").mkdir(parents=True)
                (root / split / f"class{c:03d}" / "0.jpg").touch()  # not read by parse_cfg
        return [f"data.train_path={root / 'train'}", f"data.val_path={root / 'val'}"]
    return []


def test_every_dataset_config_has_a_short_name_and_solo_learns_keys():
    pretrain = configs("pretrain")
    methods = {Path(n).name for n in pretrain if "/" in n}
    assert methods == set(SOLO_EXT_METHODS) | set(VARIANTS)
    for kind in ("pretrain", "linear"):
        for name in (n for n in configs(kind) if "/" in n):
            path = SCRIPTS / kind / f"{name}.yaml"
            raw = OmegaConf.load(path)
            for key in ("strategy", "devices", "accelerator", "precision"):
                assert OmegaConf.select(raw, key) is not None, f"{path}: no {key}"
            assert raw.data.format == "image_folder", path
            assert path.read_text().startswith("# @package _global_\n"), path
            # solo-learn's defaults come from the one shared group, taken first
            assert yaml.safe_load(path.read_text())["defaults"][:2] == [
                f"/{SHARED}/solo_learn",
                "_self_",
            ], path
            composed = compose_config(kind, name)
            shared = OmegaConf.load(SCRIPTS / kind / SHARED / "solo_learn.yaml")
            for key in ("checkpoint", "auto_resume", "wandb", "performance", "seed"):
                assert OmegaConf.select(raw, key) is None, f"{path}: {key} repeats {SHARED}"
                assert composed[key] == shared[key], (path, key)


def test_augmentation_files_are_solo_exts_own():
    """A config copied into a solo-learn config folder must not pick up solo-learn's
    ``augmentations/symmetric.yaml`` silently: solo-ext's files have names of their own."""
    for path in SCRIPTS.glob("pretrain/*/augmentations/*.yaml"):
        assert path.name.startswith("ext_"), path
    for path in SCRIPTS.glob("pretrain/*/*.yaml"):
        if path.parent.name == SHARED:
            continue
        defaults = yaml.safe_load(path.read_text())["defaults"]
        augs = [
            d["augmentations"] for d in defaults if isinstance(d, dict) and "augmentations" in d
        ]
        assert len(augs) == 1 and (path.parent / "augmentations" / augs[0]).is_file(), path


# configs named after a variant of a method: gpaco is method paco with gpaco: true
VARIANTS = {"gpaco": "paco"}


@pytest.mark.parametrize("name", configs("pretrain"))
def test_pretrain_config(name: str, tmp_path):
    dataset = compose_config("pretrain", name).data.dataset
    cfg = parse_cfg(compose_config("pretrain", name, data_overrides(dataset, tmp_path)))
    # (its method: test_config_sections.py's test_plain_overrides_reach_pretraining)
    assert cfg.data.num_large_crops == (3 if cfg.method == "bcl" else 2)
    assert cfg.backbone.name in ("resnet18", "cifar_resnet32", "resnet50")
    assert len(cfg.augmentations) >= 1  # its own augmentation file, at the global package


def test_short_names_are_the_dataset_configs():
    for method in [*SOLO_EXT_METHODS, *VARIANTS]:
        folder = "cifar" if method in ("densecl", "all4one_ct") else "cifar100-lt"
        short = compose_config("pretrain", f"{method}.yaml")
        assert short == compose_config("pretrain", f"{folder}/{method}")
    assert compose_config("linear", "dscl.yaml") == compose_config("linear", "cifar100-lt/dscl")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    # ResNet-18, the backbone the shipped evaluation configs name
    return Path(
        run(tiny_cfg("scl", tmp_path_factory.mktemp("configs"), backbone=RESNET18))["run_dir"]
    )


@pytest.mark.parametrize("name", configs("linear"))
def test_linear_config_keys(name: str):
    """solo-learn's linear keys (main_linear.py reads them) and solo-ext-linear's own; the run
    is taken by either key (main_linear.py's checkpoint, or solo-ext-linear's run directory)."""
    cfg = compose_config("linear", name)
    defaults = OmegaConf.load(ROOT / "solo_ext" / "conf" / "linear.yaml")
    unknown = set(cfg) - set(defaults) - set(linear.SOLO_LINEAR_KEYS)
    assert unknown == {"pretrained_feature_extractor"}, unknown
    assert OmegaConf.is_missing(cfg, "pretrained_feature_extractor")
    assert "pretrained_checkpoint_dir" in cfg and cfg.pretrained_checkpoint_dir is None
    assert cfg.data.sampler.name == "class_balanced"


def read_per_class_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_linear_config_runs_with_solo_ext_linear(tiny_run):
    """The shipped config (30 epochs, class-balanced sampling; the published classifier stage,
    synthetic_lt being long-tailed) on the tiny run's backbone classifies the 4 synthetic
    classes above chance, and its overall and Many / Medium / Few accuracy are those of its
    per-class CSV, recomputed here."""
    (ckpt,) = tiny_run.glob("*.ckpt")
    cfg = compose_config(
        "linear",
        "synthetic-lt/dscl",
        # Hydra's grammar needs the quotes: solo-learn's checkpoint names hold '='
        [f"pretrained_feature_extractor='{ckpt}'", "backbone.name=resnet18"],
    )
    OmegaConf.update(cfg, "data.num_classes", 4)  # the tiny run's data
    OmegaConf.update(cfg, "data.synthetic.n_max", 24)
    metrics = linear.run(cfg)
    assert metrics["linear_sampler"] == "class_balanced"
    stage = (metrics["linear_backbone_bn"], metrics["linear_train_augmentation"])
    assert stage == ("train", "pretrain")
    assert json.loads((tiny_run / "metrics.json").read_text())["linear_acc1"] == pytest.approx(
        metrics["linear_acc1"]
    )
    rows = read_per_class_csv(tiny_run / "linear_per_class.csv")
    data = cfg.data
    # the config's exponential profile: floor(n_max * IF ** (-c / (C - 1))) images of class c
    want_counts = [math.floor(24 * data.imbalance_factor ** (-c / 3)) for c in range(4)]
    assert [int(r["train_count"]) for r in rows] == want_counts
    tests = [int(r["test_count"]) for r in rows]
    assert tests == [data.synthetic.val_per_class] * 4
    acc = [float(r["acc1"]) for r in rows]
    overall = sum(a * n for a, n in zip(acc, tests)) / sum(tests)
    assert metrics["linear_acc1"] == pytest.approx(overall, abs=1e-3)  # the CSV has 4 decimals
    for group, member in {
        "many": lambda n: n > data.many_threshold,
        "medium": lambda n: data.few_threshold <= n <= data.many_threshold,
        "few": lambda n: n < data.few_threshold,
    }.items():
        ids = [c for c, n in enumerate(want_counts) if member(n)]
        got = metrics[f"linear_acc1_{group}"]
        if not ids:
            assert math.isnan(got), group
            continue
        want = sum(acc[c] * tests[c] for c in ids) / sum(tests[c] for c in ids)
        assert got == pytest.approx(want, abs=1e-3), group
    # chance is 25% (4 classes, a balanced val split of 4 x 20 images); the margin, 10 points
    # (8 images, twice the spread of guessing), leaves this run (50%) 12 images of room; over
    # pretraining seeds 0-19 x probe seeds 5, 6: mean 55%, all 40 at 42.5% or more (the features
    # path under cosine, the earlier default: this run 42.5%, mean 53%, 39 of the 40)
    assert metrics["linear_acc1"] > 25 + 10


@functools.cache  # the run is the module's: four configs, one computation
@torch.no_grad()
def knn_by_hand(run_dir: Path, k: int, temperature: float) -> dict[str, torch.Tensor]:
    """Weighted kNN written out: the backbone's weights taken from the run's checkpoint, the
    features of both splits under the deterministic transform, cosine similarity, the k most
    similar training images, each voting exp(similarity / T) for its class, the arg-max."""
    pre = OmegaConf.create(json.loads((run_dir / "args.json").read_text()))
    (ckpt,) = run_dir.glob("*.ckpt")
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    kwargs = OmegaConf.to_container(pre.backbone.get("kwargs") or {})
    backbone = build_backbone(pre.backbone.name, pre.method, pre.data.dataset, kwargs)
    prefix = "backbone."
    backbone.load_state_dict(
        {key[len(prefix) :]: v for key, v in state.items() if key.startswith(prefix)}
    )
    backbone.eval()
    transform = build_eval_transform(pre.data.dataset, pre.augmentations[0].crop_size)
    out = {}
    for split in ("train", "val"):
        dataset = build_dataset(pre.data, split, transform)
        images, labels = zip(*(dataset[i] for i in range(len(dataset))))
        feats = backbone(torch.stack(images))
        out[f"{split}_x"] = feats / feats.norm(dim=1, keepdim=True)
        out[f"{split}_y"] = torch.tensor(labels)
    num_classes = pre.data.num_classes
    pred = []
    for x in out["val_x"]:
        sim = out["train_x"] @ x
        nearest = sim.argsort(descending=True)[:k]
        votes = [0.0] * num_classes
        for i in nearest.tolist():
            votes[int(out["train_y"][i])] += math.exp(float(sim[i]) / temperature)
        pred.append(max(range(num_classes), key=votes.__getitem__))
    out["pred"] = torch.tensor(pred)
    return out


@pytest.mark.parametrize("name", configs("knn"))
def test_knn_config_runs(name: str, tiny_run):
    """The reported accuracy, overall and per class (CSV), is that of the kNN written here."""
    defaults = OmegaConf.load(ROOT / "solo_ext" / "conf" / "knn.yaml")
    cfg = compose_config("knn", name, [f"pretrained_checkpoint_dir={tiny_run}"])
    assert not set(cfg) - set(defaults), "keys solo-ext-knn does not read"
    metrics = knn.run(cfg)
    ours = knn_by_hand(tiny_run, cfg.k, cfg.temperature)
    hit = (ours["pred"] == ours["val_y"]).double()
    assert metrics["knn_acc1"] == pytest.approx(100 * hit.mean().item(), abs=1e-6)
    written = json.loads((tiny_run / "metrics.json").read_text())
    assert written["knn_acc1"] == pytest.approx(metrics["knn_acc1"])
    rows = read_per_class_csv(tiny_run / "knn_per_class.csv")
    assert len(rows) == 4
    for c, row in enumerate(rows):
        of_c = ours["val_y"] == c
        assert int(row["train_count"]) == int((ours["train_y"] == c).sum())
        assert int(row["test_count"]) == int(of_c.sum())
        assert float(row["acc1"]) == pytest.approx(100 * hit[of_c].mean().item(), abs=1e-3)


def test_search_path_plugin_serves_each_script_its_configs():
    from hydra.core.plugins import Plugins
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    from hydra_plugins.solo_ext_configs import SoloExtSearchPathPlugin, configs_for

    assert SoloExtSearchPathPlugin in Plugins.instance().discover(SearchPathPlugin)
    assert configs_for("/x/solo-learn/main_pretrain.py") == SCRIPTS / "pretrain"
    assert configs_for("main_linear.py") == SCRIPTS / "linear"
    assert configs_for("solo-ext-pretrain") == SCRIPTS / "pretrain"
    assert configs_for("my_own_app.py") is None  # other Hydra applications are left alone


def test_config_name_without_config_path(tmp_path, command, monkeypatch):
    """The plugin at work in a real Hydra application (the console script itself), from a
    directory with no configs; switched off with the start-up hook."""
    exe = Path(sys.executable).parent / "solo-ext-pretrain"
    argv = ["--config-name", "synthetic-lt/dscl", "--cfg", "job"]
    proc = subprocess.run([str(exe), *argv], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["method"] == "dscl" and cfg["augmentations"][0]["crop_size"] == 32
    from solo_ext.commands.pretrain import main

    monkeypatch.setenv("SOLO_EXT_AUTOLOAD", "0")
    code, _, err = command(main, str(exe), *argv, cwd=tmp_path)
    assert code != 0 and "synthetic-lt/dscl" in err, err


# --- the command lines the headers show ---------------------------------------------------------

# the headers' placeholders, as solo-ext and solo-learn name a run and its checkpoints: a
# checkpoint's name holds '=' (``ep=199``), which Hydra's grammar takes only in a quoted value
PLACEHOLDERS = {
    "<run id>": "offline-ab12cd34",
    "<run dir>": "trained_models/dscl/offline-ab12cd34",
    "<checkpoint>": "dscl-cifar100-lt-offline-ab12cd34-ep=199",
}
# the programs a header may show, and the configs they read
PROGRAMS = {
    "main_pretrain.py": "pretrain",
    "solo-ext-pretrain": "pretrain",
    "main_linear.py": "linear",
    "solo-ext-linear": "linear",
    "solo-ext-knn": "knn",
}
RUN_KEYS = ("pretrained_feature_extractor", "pretrained_checkpoint_dir")


def header_commands(path: Path) -> list[str]:
    """The command lines of a config's header (``#   python main_linear.py ...`` or
    ``#   solo-ext-<command> ...``, indented), continued lines joined, a closing remark in
    parentheses (``   (in a solo-learn checkout)``) left out."""
    commands, current = [], None
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line[1:].strip()
        if current is not None:
            current += " " + text
        elif line.startswith("#   ") and re.match(r"(python \S+\.py|solo-ext-[\w-]+)(\s|$)", text):
            current = text
        else:
            continue
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        commands.append(re.sub(r"\s{2,}\(.*\)$", "", current))
        current = None
    return commands


def test_every_header_command_line_is_taken_by_hydra():
    """Each command line a header shows, its placeholders filled in (a checkpoint named as
    solo-learn names them, with '='), is what a shell hands the program: every argument after
    the config name parses with Hydra's override parser, the config composes with them, and
    the run's key holds the path as written."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    shown = with_equals = 0
    for path in sorted(SCRIPTS.rglob("*.yaml")):
        for line in header_commands(path):
            for placeholder, value in PLACEHOLDERS.items():
                line = line.replace(placeholder, value)
            assert not re.search(r"<[^>]*>", line), f"{path}: an unknown placeholder: {line}"
            argv = shlex.split(line)
            argv = argv[1:] if argv[0] == "python" else argv
            kind = PROGRAMS[argv[0]]
            assert argv[1] == "--config-name", f"{path}: {line}"
            name, overrides = argv[2], argv[3:]
            assert (SCRIPTS / kind / name).with_suffix(".yaml") == path, f"{path}: {line}"
            parsed = parser.parse_overrides(overrides)  # raises at an argument Hydra refuses
            cfg = compose_config(kind, name, overrides)
            for override, given in zip(parsed, overrides):
                key = override.key_or_group
                assert key in RUN_KEYS, f"{path}: {line}"
                written = given.split("=", 1)[1]
                assert cfg[key] == written.strip("'") == override.value(), f"{path}: {line}"
                with_equals += "=" in cfg[key]
            shown += 1
    assert shown >= 2 * len(configs("pretrain")) + len(configs("knn"))
    assert with_equals >= len(configs("linear"))  # every linear recipe's checkpoint


def test_an_unquoted_checkpoint_name_is_refused_by_hydra():
    """(What the quotes in the headers are for.)"""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    name = PLACEHOLDERS["<checkpoint>"]
    with pytest.raises(OverrideParseException):
        OverridesParser.create().parse_overrides([f"pretrained_feature_extractor={name}.ckpt"])


# --- the GPUs and batches the headers state -----------------------------------------------------

NUMBERS = {"one": 1, "two": 2, "four": 4, "eight": 8}
COUNT = r"(\d+|one|two|four|eight)"
# "2 GPUs x 128": devices x optimizer.batch_size (the batch per GPU)
PER_GPU = re.compile(rf"\b{COUNT} GPUs? x (\d+)\b")
# "one GPU for the batch of 2048": devices, and devices x optimizer.batch_size
FOR_BATCH = re.compile(rf"\b{COUNT} GPUs? for the (?:total )?batch of (\d+)\b")
# "the total batch of 256 (2 GPUs x 128": the product too
TOTAL = re.compile(rf"\bbatch of (\d+) \({COUNT} GPUs? x (\d+)\b")


def recipe_comments(path: Path) -> str:
    """A recipe's comments, the header's and those beside its values, as one text (a phrase may
    be broken across the header's lines)."""
    texts = [line.partition("#")[2] for line in path.read_text().splitlines() if "#" in line]
    return " ".join(" ".join(texts).split())


def stated_gpus(text: str) -> list[tuple[str, int, int | None, int | None]]:
    """Each "<N> GPUs x <B>" phrase (and "<N> GPU(s) for the batch of <T>") of ``text`` that is
    not the official run's: (phrase, GPUs, batch per GPU, total batch)."""

    def number(word: str) -> int:
        return NUMBERS.get(word) or int(word)

    found = []
    for pattern in (PER_GPU, FOR_BATCH, TOTAL):
        for match in pattern.finditer(text):
            clause = re.split(r"[(),;:]", text[: match.start()])[-1]
            if "official" in clause:
                continue  # (the official run's setting, stated beside this one)
            if pattern is PER_GPU:
                gpus, per_gpu, total = match[1], match[2], None
            elif pattern is FOR_BATCH:
                gpus, per_gpu, total = match[1], None, match[2]
            else:
                gpus, per_gpu, total = match[2], match[3], match[1]
            found.append((match[0], number(gpus), per_gpu and int(per_gpu), total and int(total)))
    return found


def test_the_gpus_and_batches_a_header_states_are_the_recipes():
    """Every "<N> GPUs x <B>" a recipe states (header or comment; not the official run's that it
    quotes beside it) is its devices x optimizer.batch_size, and a stated total batch is their
    product."""
    from solo_ext.config import device_count

    checked = 0
    for kind in ("pretrain", "linear"):
        for name in configs(kind):
            path = SCRIPTS / kind / f"{name}.yaml"
            cfg = compose_config(kind, name)
            gpus, batch = device_count(cfg.devices), cfg.optimizer.batch_size
            for phrase, n, per_gpu, total in stated_gpus(recipe_comments(path)):
                where = f"{path.relative_to(ROOT)}: {phrase!r}, the file: {gpus} x {batch}"
                assert n == gpus, where
                assert per_gpu is None or per_gpu == batch, where
                assert total is None or total == gpus * batch, where
                checked += 1
    assert checked >= 25  # (the phrases are found)


def test_a_header_that_states_other_gpus_fails():
    text = "SGD at lr 0.1 for the total batch of 256 (4 GPUs x 64; the official 8 x 32)"
    assert stated_gpus(text) == [
        ("4 GPUs x 64", 4, 64, None),
        ("batch of 256 (4 GPUs x 64", 4, 64, 256),
    ]
    text = "(the official 224) gpus: one GPU for the batch of 2048 (the official 2 GPUs x 1024)"
    assert stated_gpus(text) == [("one GPU for the batch of 2048", 1, None, 2048)]
