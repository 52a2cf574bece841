"""Every shipped pretraining recipe that follows an official run trains that run: its effective
values (``tests/official_runs/effective.py``: the lr after the batch scaling, the lr of given epochs
as the method's own ``configure_optimizers`` steps it, every flag and view) equal the official
scripts' (``tests/official_runs/runs.yaml``, each value with its file and line), through
both entry points' ``parse_cfg``, except the keys the recipe's header names under ``Differs from the
official run``; a stated difference that is not one fails too.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from official_runs.effective import (
    differences,
    effective_values,
    linear_effective_values,
    official_runs,
    stated_differences,
)
from omegaconf import OmegaConf
from test_configs import compose_config, data_overrides

from solo_ext.commands import linear
from solo_ext.commands.pretrain import parse_cfg
from solo_ext.config import check_options
from solo_ext.host import METHODS
from solo_ext.methods.registry import register
from solo_ext.methods.schedules import warmup_step

RUNS = official_runs()
# (recipe, run id) of each shipped recipe the table follows; PRETRAIN, LINEAR: (its name, run id)
FOLLOWED = [(recipe, run_id) for run_id, run in RUNS.items() for recipe in run["recipes"]]
PRETRAIN = [(r.split("/", 1)[1], run_id) for r, run_id in FOLLOWED if r.startswith("pretrain/")]
LINEAR = [(r.split("/", 1)[1], run_id) for r, run_id in FOLLOWED if r.startswith("linear/")]
# solo-learn's scripts' parse_cfg: the real solo-learn's
ENTRY_POINTS = ["solo-ext-pretrain", pytest.param("main_pretrain.py", marks=pytest.mark.solo_learn)]
SOLO_LEARN_LINEAR = pytest.param("main_linear.py", marks=pytest.mark.solo_learn)


def resolve(entry: str, name: str, root: Path, overrides: list[str] = ()):
    """The recipe as the entry point resolves it (data paths pointed at stand-ins, nothing else)."""
    raw = compose_config("pretrain", name)
    cfg = compose_config("pretrain", name, data_overrides(raw.data.dataset, root) + list(overrides))
    if entry == "solo-ext-pretrain":
        return parse_cfg(cfg)
    from solo.args.pretrain import parse_cfg as solo_parse_cfg

    register()  # (what the start-up hook does when solo-learn's scripts import solo.methods)
    cfg = solo_parse_cfg(cfg)
    return METHODS[cfg.method].add_and_assert_specific_cfg(cfg)  # as the method's __init__


def check(entry: str, name: str, run_id: str, root: Path, overrides: list[str] = ()) -> None:
    run = RUNS[run_id]
    cfg = resolve(entry, name, root, overrides)
    if cfg.data.get("train_class_counts") is not None:  # the stand-in split file's one image:
        cfg.data.train_class_counts = [1] * cfg.data.num_classes  # a prior the methods accept
    found = differences(run["values"], effective_values(cfg, run["values"], run["steps_per_epoch"]))
    stated = stated_differences(ROOT / "scripts" / "pretrain" / f"{name}.yaml")
    unstated = {k: v for k, v in found.items() if k not in stated}
    stale = sorted(set(stated) - set(found))
    assert not unstated, f"{name} ({entry}) differs from {run_id} unstated: {unstated}"
    assert not stale, f"{name}: the header states differences that are not: {stale}"


def resolve_linear(entry: str, name: str, root: Path, pretrained: str | None = None):
    """A linear recipe as the entry point resolves it, for a checkpoint file (an empty stand-in)
    with the ``args.json`` of the pretraining recipe ``pretrained`` (default: the same name) beside
    it; with the run's query view the stage takes, as the entry point read it from that file."""
    raw = compose_config("linear", name)
    run = resolve("solo-ext-pretrain", pretrained or name, root)
    (root / "args.json").write_text(json.dumps(OmegaConf.to_container(run, resolve=True)))
    ckpt = root / "run.ckpt"
    ckpt.touch()
    overrides = data_overrides(raw.data.dataset, root) + [f"pretrained_feature_extractor={ckpt}"]
    cfg = compose_config("linear", name, overrides)
    if entry == "solo-ext-linear":
        OmegaConf.set_struct(cfg, False)
        check_options(cfg, linear.OPTIONS)
        cfg = linear.resolve(cfg, cfg.data, run)
        return cfg, linear.stage_view(cfg, run)
    from solo.args.linear import parse_cfg as solo_parse_cfg

    from solo_ext.solo_learn import parsed

    register()
    return solo_parse_cfg(cfg), parsed.RUN.stage_view


@pytest.mark.parametrize("entry", ["solo-ext-linear", SOLO_LEARN_LINEAR])
@pytest.mark.parametrize("name, run_id", LINEAR, ids=[n for n, _ in LINEAR])
def test_linear_recipe_trains_its_official_stage(entry, name, run_id, tmp_path):
    run = RUNS[run_id]
    cfg, view = resolve_linear(entry, name, tmp_path)
    found = differences(
        run["values"], linear_effective_values(cfg, run["values"], entry, run_view=view)
    )
    stated = stated_differences(ROOT / "scripts" / "linear" / f"{name}.yaml")
    unstated = {k: v for k, v in found.items() if k not in stated}
    assert not unstated, f"{name} ({entry}) differs from {run_id} unstated: {unstated}"
    assert not sorted(set(stated) - set(found)), f"{name}: stale statements"


@pytest.mark.parametrize("entry", ["solo-ext-linear", SOLO_LEARN_LINEAR])
@pytest.mark.parametrize("method", ["scl", "dscl", "pbsd"])
def test_imagenet_lt_stage_trains_on_the_published_crops(entry, method, tmp_path):
    """On ImageNet-LT the run's own query view, which the stage takes by default, is the
    official stage's crops: the stage's transform there is what it was before it followed the
    run (the fixed ``published`` one)."""
    from official_runs.effective import _views

    from solo_ext.eval.classifier_stage import published_train_augmentation, stage_train_transform

    cfg, view = resolve_linear(entry, "imagenet-lt/dscl", tmp_path, f"imagenet-lt/{method}")
    assert cfg.train_augmentation == "pretrain"
    fixed = published_train_augmentation("imagenet_lt")
    assert _views(OmegaConf.create({"augmentations": [view]})) == _views(
        OmegaConf.create({"augmentations": [fixed]})
    )
    taken = stage_train_transform("imagenet_lt", "pretrain", view)
    assert repr(taken) == repr(stage_train_transform("imagenet_lt", "published"))


def test_the_table_covers_every_recipe_that_follows_an_official_run():
    followed = {f"pretrain/{name}" for name, _ in PRETRAIN}
    for path in sorted((ROOT / "scripts" / "pretrain").glob("**/*.yaml")):
        if "augmentations" in path.parts:
            continue
        header = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))
        recipe = f"pretrain/{path.relative_to(ROOT / 'scripts' / 'pretrain').with_suffix('')}"
        names_a_run = "following the official" in " ".join(header.split()).lower()
        if names_a_run:
            assert recipe in followed, f"{recipe} says it follows an official run: not in the table"


def test_every_official_value_has_its_source():
    for run_id, run in RUNS.items():
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", run["repository"]), run_id
        assert re.fullmatch(r"[0-9a-f]{7,40}", str(run["commit"])), run_id
        assert run["steps_per_epoch"] >= 1, run_id
        for key, entry in run["values"].items():
            assert {"value", "source"} <= set(entry), f"{run_id}: {key}"
            assert re.search(r"[\w/.-]+:\d+", entry["source"]), f"{run_id}: {key}: {entry}"


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("name, run_id", PRETRAIN, ids=[n for n, _ in PRETRAIN])
def test_recipe_trains_its_official_run(entry, name, run_id, tmp_path):
    check(entry, name, run_id, tmp_path)


@pytest.mark.parametrize(
    "override, key",
    [
        ("optimizer.lr=0.02", "lr"),  # the absolute lr written where the scaled one belongs
        ("scheduler.interval=step", "lr_at.1"),  # the warm-up per iteration
        ("method_kwargs.temperature=0.07", "temperature"),
        ("augmentations.0.horizontal_flip.prob=0.0", "views.0.horizontal_flip.prob"),
    ],
)
def test_a_recipe_that_drifts_fails(override, key, tmp_path):
    with pytest.raises(AssertionError, match=re.escape(key)):
        check("solo-ext-pretrain", "imagenet-lt/paco", "paco-imagenet-lt-r50", tmp_path, [override])


def test_a_stated_difference_that_is_none_fails(tmp_path):
    recipe = ROOT / "scripts" / "pretrain" / "imagenet-lt" / "kcl.yaml"
    stated = stated_differences(recipe)
    assert set(stated) == {"sync_bn"}
    with pytest.raises(AssertionError, match="sync_bn"):
        check("solo-ext-pretrain", "imagenet-lt/kcl", "kcl-tsc-imagenet-lt-r50", tmp_path, [
            "sync_batchnorm=False"
        ])  # fmt: skip


@pytest.mark.parametrize("warmup, steps", [(10, [321, 361]), (3, [5]), (1, []), (0, [2, 4])])
def test_warmup_step_is_the_official_cifar_schedule(warmup, steps):
    """lr x (e + 1) / W in the first W epochs, then x 0.1 from each milestone on, per epoch."""
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(2)]
    opt = torch.optim.SGD([{"params": [params[0]]}, {"params": [params[1]]}], lr=0.1)
    schedule = warmup_step(opt, warmup, steps, static=[False, True])
    for epoch in range(400):
        if epoch < warmup:
            want = 0.1 * (epoch + 1) / warmup
        else:
            want = 0.1 * 0.1 ** len([m for m in steps if epoch >= m])
        assert math.isclose(opt.param_groups[0]["lr"], want, rel_tol=1e-12), epoch
        assert opt.param_groups[1]["lr"] == 0.1  # a static group keeps its lr
        opt.step()
        schedule.step()


@pytest.mark.parametrize(
    "overrides, text",
    [
        (["scheduler.interval=step"], "scheduler.interval='step'"),
        (["scheduler.lr_decay_steps=null"], "scheduler.lr_decay_steps=None"),
        (["scheduler.lr_decay_steps=[361,321]"], "not increasing"),
    ],
)
def test_bad_schedule_keys_stop_in_one_line(overrides, text, tmp_path):
    with pytest.raises(ValueError) as info:
        resolve("solo-ext-pretrain", "cifar100-lt/paco", tmp_path, overrides)
    assert text in str(info.value) and "\n" not in str(info.value)


def test_warmup_step_trains_per_epoch_in_a_whole_run(tmp_path):
    """A whole run (both hosts run the schedule: solo-learn's BaseMethod where it is
    importable): three epochs of two steps, warm-up 2, x 0.1 from epoch 2; Lightning steps the
    schedule once an epoch, and every group (backbone, projector, classifier) follows it."""
    from conftest import tiny_cfg

    from solo_ext.commands.pretrain import run

    schedule = {"name": "warmup_step", "interval": "epoch", "warmup_epochs": 2}
    cfg = tiny_cfg("paco", tmp_path, max_epochs=3, scheduler={**schedule, "lr_decay_steps": [2]})
    model = run(cfg)["model"]
    (config,) = model.trainer.lr_scheduler_configs
    assert config.interval == "epoch" and config.scheduler.last_epoch == 3  # (not 6 steps)
    base = 0.1 * 8 / 256  # optimizer.lr per 256 images, at the batch of 8
    for group in model.trainer.optimizers[0].param_groups:
        assert group["initial_lr"] == pytest.approx(base)
        assert group["lr"] == pytest.approx(base * 0.1)  # epoch 3: past the milestone
