"""solo-learn's own ``main_linear.py`` builds the run's backbone (only with the real solo-learn).

A run pretrained with ``backbone.kwargs.small_image_stem=true`` on a folder of 32 px images
(``data.dataset=custom``, which solo-learn gives the ImageNet stem) is evaluated with a linear
config that names only ``resnet18``: the backbone gets the run's 3x3 stem from the ``args.json``
beside the checkpoint and trains, where it used to stop in a ``size mismatch for conv1.weight``
traceback; a given backbone value that contradicts the run stops the start in one line naming
both (exit status 2), before anything is written.

Run as ``tests/test_solo_learn_scripts.py`` is (its helpers are used here): in an environment
with solo-learn's pinned requirements and its source importable (SOLO_LEARN_DIR: its checkout).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_solo_learn_scripts import CPU, assert_cifar_stem, fake_images, ok, run_of, solo, tree

pytestmark = pytest.mark.solo_learn

CLASSES = 6  # solo-learn's linear model computes acc@5
# one epoch of one batch (main_linear.py's transforms of ``custom`` are 224 px crops)
RUN = [*CPU, "max_epochs=1", "optimizer.batch_size=8", "+limit_train_batches=1"]
RUN += ["+limit_val_batches=1", "+num_sanity_val_steps=0"]


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory) -> list[str]:
    """``train/`` (4 images a class) and ``val/`` (2) of 32 px images; returns the overrides
    that train on them as solo-learn's ``custom``."""
    root = tmp_path_factory.mktemp("images")
    fake_images(root, [f"train/c{c}/{i}.png" for c in range(CLASSES) for i in range(4)], size=32)
    fake_images(root, [f"val/c{c}/{i}.png" for c in range(CLASSES) for i in range(2)], size=32)
    return [
        "data.dataset=custom",
        f"data.train_path={root / 'train'}",
        f"data.val_path={root / 'val'}",
    ]


@pytest.fixture(scope="module")
def small_stem_run(tmp_path_factory, image_folder) -> Path:
    """scl through main_pretrain.py, ResNet-18 with the small-image stem asked for by keyword;
    returns its checkpoint."""
    tmp = tmp_path_factory.mktemp("pretrain")
    args = [
        "--config-name",
        "synthetic-lt/scl",
        *RUN,
        *image_folder,
        "backbone.name=resnet18",
        "+backbone.kwargs.small_image_stem=true",
        "knn_eval.enabled=False",
    ]
    ok(solo("main_pretrain.py", args, tmp))
    run_dir, saved = run_of(tmp, "scl")
    assert saved["backbone"] == {"name": "resnet18", "kwargs": {"small_image_stem": True}}
    (ckpt,) = run_dir.glob("*.ckpt")
    assert_cifar_stem(ckpt)
    return ckpt


def linear_args(ckpt: Path, image_folder: list[str], *extra: str) -> list[str]:
    return [
        "--config-name",
        "synthetic-lt/dscl",
        *RUN,
        *image_folder,
        f"pretrained_feature_extractor='{ckpt}'",
        *extra,
    ]


def test_main_linear_builds_the_runs_stem(small_stem_run, image_folder, tmp_path):
    """A linear config naming only ``resnet18``: the run's stem, the run's weights, trained."""
    args = linear_args(small_stem_run, image_folder, "backbone.name=resnet18")
    ok(solo("main_linear.py", args, tmp_path))
    run_dir, saved = run_of(tmp_path, "linear")  # the linear run's own
    assert saved["backbone"]["kwargs"] == {"small_image_stem": True}
    (ckpt,) = run_dir.glob("*.ckpt")
    assert_cifar_stem(ckpt)  # the linear model's backbone: 3x3, not the ImageNet 7x7


def test_main_linear_stops_at_the_linear_configs_own_backbone(
    small_stem_run, image_folder, tmp_path
):
    """The linear config's own backbone (cifar_resnet32), not the run's: one line naming both
    (every key's contradiction, a given kwarg's among them: tests/test_run_backbone.py)."""
    before = tree(tmp_path)
    proc = solo("main_linear.py", linear_args(small_stem_run, image_folder), tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "size mismatch" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("main_linear.py: error: backbone.name='cifar_resnet32': "), last
    assert repr(str(small_stem_run)) in last and last.endswith("with 'resnet18'"), last
    assert tree(tmp_path) == before
