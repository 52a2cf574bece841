"""The run's backbone travels to the evaluation: every ``backbone.kwargs`` key the evaluation
config does not give comes from the ``args.json`` beside the checkpoint (the small-image stem
first), and a given value that differs from the run's stops in one line naming both.

The function on tiny files here, then ``solo-ext-linear`` on a tiny pretraining run;
``tests/test_solo_learn_linear_backbone.py`` runs solo-learn's ``main_linear.py`` itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import RESNET18, eval_cfg, tiny_cfg
from omegaconf import DictConfig, OmegaConf

from solo_ext.config import ConfigError, fill_stem_option
from solo_ext.runs.backbone import fill_run_backbone, merge_run_backbone

RUN_BACKBONE = {
    "name": "resnet18",
    "kwargs": {"small_image_stem": True, "zero_init_residual": True},
}


def checkpoint(tmp_path: Path, backbone: dict | None = RUN_BACKBONE) -> Path:
    """A run directory holding a (fake) checkpoint and, unless ``backbone`` is None, the
    ``args.json`` of a run with that backbone."""
    run_dir = tmp_path / "trained_models" / "pbsd" / "abc123"
    run_dir.mkdir(parents=True)
    ckpt = run_dir / "pbsd-abc123-ep=0.ckpt"
    ckpt.write_bytes(b"not read")
    if backbone is not None:
        saved = {"method": "pbsd", "backbone": backbone, "data": {"dataset": "custom"}}
        (run_dir / "args.json").write_text(json.dumps(saved))
    return ckpt


def linear_cfg(
    backbone: dict | None = None, dataset: str = "custom", struct: bool = True
) -> DictConfig:
    """A linear config as solo-learn's are written (``backbone.name`` only), in struct mode as
    Hydra hands it over."""
    cfg = OmegaConf.create(
        {"backbone": backbone or {"name": "resnet18"}, "data": {"dataset": dataset}}
    )
    OmegaConf.set_struct(cfg, struct)
    return cfg


def kwargs_of(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg.backbone.kwargs)


# --- the function ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "backbone",
    [
        {"name": "resnet18"},  # no kwargs
        {"name": "???"},  # solo-learn's "must be given" marker
        {"name": None, "kwargs": None},
        {"name": "None", "kwargs": {"small_image_stem": "None"}},  # solo-learn's null
        None,  # no backbone section at all
    ],
    ids=["name-only", "missing", "null", "None-string", "no-section"],
)
def test_a_key_not_given_is_the_runs(tmp_path, backbone):
    cfg = linear_cfg(backbone)
    if backbone is None:
        del cfg.backbone
    assert fill_run_backbone(cfg, checkpoint(tmp_path)) == RUN_BACKBONE
    assert OmegaConf.to_container(cfg.backbone) == RUN_BACKBONE


def test_given_values_that_agree_are_kept(tmp_path):
    run = {"name": "vit_tiny", "kwargs": {"img_size": 32, "patch_size": 8, "drop_path_rate": 0.0}}
    given = {"name": "vit_tiny", "kwargs": {"patch_size": 8, "drop_path_rate": 0, "extra": 1}}
    cfg = linear_cfg(given)
    fill_run_backbone(cfg, checkpoint(tmp_path, run))
    # 0 and 0.0 are one setting; a key the run did not record is left as given
    assert kwargs_of(cfg) == {"patch_size": 8, "drop_path_rate": 0, "extra": 1, "img_size": 32}


@pytest.mark.parametrize(
    "given,line",
    [
        (
            {"name": "resnet18", "kwargs": {"small_image_stem": False}},
            "backbone.kwargs.small_image_stem=False: the checkpoint {ckpt!r} was trained with True",
        ),
        (
            {"name": "resnet18", "kwargs": {"zero_init_residual": False, "small_image_stem": True}},
            "backbone.kwargs.zero_init_residual=False: the checkpoint {ckpt!r} was trained with "
            "True",
        ),
        (
            {"name": "resnet50"},
            "backbone.name='resnet50': the checkpoint {ckpt!r} was trained with 'resnet18'",
        ),
    ],
    ids=["stem", "other-kwarg", "name"],
)
def test_a_given_value_that_differs_stops_in_one_line(tmp_path, given, line):
    ckpt = checkpoint(tmp_path)
    cfg = linear_cfg(given)
    before = OmegaConf.to_container(cfg)
    with pytest.raises(ConfigError) as info:
        fill_run_backbone(cfg, ckpt)
    assert str(info.value) == line.format(ckpt=str(ckpt))
    assert OmegaConf.to_container(cfg) == before  # nothing filled in


def test_a_list_valued_kwarg_is_compared_as_a_list(tmp_path):
    ckpt = checkpoint(tmp_path, {"name": "vit_tiny", "kwargs": {"img_size": [32, 32]}})
    cfg = linear_cfg({"name": "vit_tiny"})
    fill_run_backbone(cfg, ckpt)
    assert kwargs_of(cfg) == {"img_size": [32, 32]}
    fill_run_backbone(cfg, ckpt)  # given now, and the same
    cfg = linear_cfg({"name": "vit_tiny", "kwargs": {"img_size": [32, 16]}})
    with pytest.raises(ConfigError, match=r"^backbone.kwargs.img_size=\[32, 16\]: the checkpoint"):
        fill_run_backbone(cfg, ckpt)


def test_without_args_json_nothing_happens(tmp_path):
    cfg = linear_cfg({"name": "resnet50", "kwargs": {"small_image_stem": False}})
    before = OmegaConf.to_container(cfg)
    assert fill_run_backbone(cfg, checkpoint(tmp_path, backbone=None)) is None
    assert OmegaConf.to_container(cfg) == before


def test_a_run_without_backbone_kwargs_fills_only_the_name(tmp_path):
    cfg = linear_cfg({"name": "???"})
    fill_run_backbone(cfg, checkpoint(tmp_path, {"name": "resnet50"}))
    assert cfg.backbone.name == "resnet50" and OmegaConf.select(cfg, "backbone.kwargs") is None


@pytest.mark.parametrize(
    "text,what",
    [
        ("{not json", "not a readable run config"),
        ('["a list"]', "not a run config"),
        (
            '{"backbone": {"kwargs": [1, 2]}}',
            "backbone={'kwargs': [1, 2]} is not a backbone section",
        ),
    ],
)
def test_an_unreadable_args_json_is_one_line_naming_it(tmp_path, text, what):
    ckpt = checkpoint(tmp_path)
    (ckpt.parent / "args.json").write_text(text)
    with pytest.raises(ConfigError) as info:
        fill_run_backbone(linear_cfg(), ckpt)
    message = str(info.value)
    assert message.startswith(f"{str(ckpt.parent / 'args.json')!r}: {what}")
    assert "\n" not in message


@pytest.mark.parametrize(
    "dataset,run_stem", [("synthetic_lt", False), ("custom", True), ("cifar100_lt", False)]
)
def test_the_runs_stem_wins_over_the_dataset_tables(tmp_path, dataset, run_stem):
    """Filled before ``fill_stem_option`` (as main_linear.py's parse_cfg does), the run's stem is
    the one built, whatever the table says for the evaluation's dataset."""
    run = {"name": "resnet18", "kwargs": {"small_image_stem": run_stem}}
    cfg = linear_cfg(dataset=dataset, struct=False)
    fill_run_backbone(cfg, checkpoint(tmp_path, run))
    fill_stem_option(cfg)
    assert cfg.backbone.kwargs.small_image_stem is run_stem


def test_merge_takes_a_run_config_section(tmp_path):
    """solo-ext-linear's path: the run's config is already read (a DictConfig)."""
    cfg = linear_cfg()
    merge_run_backbone(cfg, OmegaConf.create(RUN_BACKBONE), "run.ckpt")
    assert kwargs_of(cfg) == RUN_BACKBONE["kwargs"]


# --- solo-ext-linear on a tiny run ------------------------------------------------------------


@pytest.fixture(scope="module")
def stemless_run(tmp_path_factory) -> Path:
    """scl on synthetic_lt with the ImageNet stem (``small_image_stem: false``, the table's
    default for synthetic_lt being the small stem); one step, no validation."""
    from solo_ext.commands.pretrain import run

    root = tmp_path_factory.mktemp("stemless")
    cfg = tiny_cfg("scl", root, limit_train_batches=1, limit_val_batches=0, backbone=RESNET18)
    return Path(run(cfg)["run_dir"])


def listing(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in root.rglob("*")
    }


def test_solo_ext_linear_builds_the_runs_backbone(stemless_run):
    """A config naming only ``resnet18`` gets the run's ImageNet stem, not the table's."""
    from solo_ext.commands import linear

    cfg = eval_cfg("linear", stemless_run, max_epochs=1, **{"backbone.name": "resnet18"})
    metrics = linear.run(cfg)
    assert 0 <= metrics["linear_acc1"] <= 100
    assert cfg.backbone.kwargs.small_image_stem is False  # the run's, carried into the config


def test_solo_ext_linear_stops_at_a_contradicting_kwarg_in_one_line(stemless_run, command):
    """The command (``pretrained_feature_extractor``, solo-learn's key): exit status 2, one line
    naming both values, nothing written."""
    from solo_ext.commands.linear import main

    (ckpt,) = stemless_run.glob("*.ckpt")
    before = listing(stemless_run)
    code, _, err = command(
        main,
        "solo-ext-linear",
        f"+pretrained_feature_extractor='{ckpt}'",
        "+backbone.kwargs.small_image_stem=true",
        cwd=stemless_run,
    )
    assert code == 2, err[-3000:]
    (line,) = err.strip().splitlines()
    assert line.startswith("solo-ext-linear: error: backbone.kwargs.small_image_stem=True: "), line
    assert repr(str(ckpt)) in line and line.endswith("was trained with False"), line
    assert listing(stemless_run) == before
