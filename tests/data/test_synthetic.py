"""Tests of the embedded SyntheticLT dataset: profile, determinism, composition, learnability."""

from collections import Counter

import numpy as np
import pytest
from PIL import Image

from solo_ext.data.longtail import lt_counts, shot_groups
from solo_ext.data.synthetic import COLOURS, MAX_CLASSES, SHAPES, TEXTURES, SyntheticLT

C, N_MAX, IF, VAL_PER_CLASS = 20, 200, 10.0, 20


@pytest.fixture(scope="module")
def train():
    return SyntheticLT("train")


@pytest.fixture(scope="module")
def val():
    return SyntheticLT("val")


def _image_keys(ds):
    return {img.tobytes() for img in ds.data}


def test_train_follows_the_lt_profile(train):
    expected = lt_counts(N_MAX, C, IF)
    assert np.bincount(train.targets, minlength=C).tolist() == expected
    assert train.class_counts == expected == train.train_class_counts
    assert len(train) == sum(expected) == train.data.shape[0]
    assert train.data.shape[1:] == (32, 32, 3) and train.data.dtype == np.uint8
    assert train.shot_groups == shot_groups(expected, 100, 20)


def test_val_is_balanced_and_keeps_the_train_profile(val):
    assert np.bincount(val.targets, minlength=C).tolist() == [VAL_PER_CLASS] * C
    assert val.class_counts == [VAL_PER_CLASS] * C
    assert val.train_class_counts == lt_counts(N_MAX, C, IF)


def test_same_arguments_give_identical_pixels(train, val):
    again = SyntheticLT("train")
    assert np.array_equal(again.data, train.data) and again.targets == train.targets
    assert np.array_equal(SyntheticLT("val").data, val.data)


def test_another_seed_gives_other_pixels(val):
    other = SyntheticLT("val", seed=1)
    assert other.data.shape == val.data.shape
    assert not _image_keys(other) & _image_keys(val)


def test_train_and_val_share_no_image(train, val):
    assert not _image_keys(train) & _image_keys(val)


def test_class_definitions_depend_only_on_the_seed(train, val):
    assert val.recipes == train.recipes and val.classes == train.classes
    assert SyntheticLT("val", n_max=50, imbalance_factor=2.0, image_size=8).recipes == val.recipes


def test_class_combinations_are_distinct_and_named(train):
    assert len(set(train.recipes)) == C
    assert len(set(train.classes)) == C
    r = train.recipes[0]
    assert train.classes[0] == f"{r.colour}-{r.shape}-{r.texture}+{r.colour2}-{r.shape2}"


def test_every_part_is_shared_by_at_least_two_classes(train):
    # Per slot, so no single cue (e.g. the main colour) identifies a class.
    vocab = dict(colour=COLOURS, shape=SHAPES, texture=TEXTURES, colour2=COLOURS, shape2=SHAPES)
    for field, values in vocab.items():
        used = Counter(getattr(r, field) for r in train.recipes)
        assert set(used) == set(values), field
        assert min(used.values()) >= 2, (field, used)


def test_head_and_tail_share_parts(train):
    head, tail = train.recipes[: C // 2], train.recipes[C // 2 :]
    for field in ("colour", "shape", "texture"):
        assert {getattr(r, field) for r in head} & {getattr(r, field) for r in tail}


def test_images_within_a_class_differ(train):
    labels = np.array(train.targets)
    for c in range(C):
        imgs = train.data[labels == c]
        assert len({img.tobytes() for img in imgs}) == len(imgs)
        # Nuisance variation is large, not a few flipped bits: mean per-pixel spread.
        assert imgs.astype(np.float32).std(axis=0).mean() > 10.0


def _saturated_colour_histogram(data, levels=4, min_saturation=100):
    """[N, levels**3] colour histogram of the object pixels (background is near-grey)."""
    q = data.astype(np.int64) * levels // 256
    code = (q[..., 0] * levels + q[..., 1]) * levels + q[..., 2]
    weight = (data.max(-1).astype(np.int64) - data.min(-1)) > min_saturation
    hist = np.stack(
        [np.bincount(c.ravel(), w.ravel(), minlength=levels**3) for c, w in zip(code, weight)]
    )
    return hist / np.maximum(hist.sum(1, keepdims=True), 1)


def _nearest_class_mean_accuracy(x_train, y_train, x_val, y_val):
    means = np.stack([x_train[y_train == c].mean(0) for c in range(C)])
    pred = ((x_val[:, None] - means[None]) ** 2).sum(-1).argmin(1)
    return float((pred == y_val).mean())


def test_task_is_learnable_but_not_by_mean_colour(train, val):
    y_train, y_val = np.array(train.targets), np.array(val.targets)
    hist_train = _saturated_colour_histogram(train.data)
    hist_val = _saturated_colour_histogram(val.data)
    acc_hist = _nearest_class_mean_accuracy(hist_train, y_train, hist_val, y_val)
    mean_train = train.data.reshape(len(train), -1, 3).mean(1)
    mean_val = val.data.reshape(len(val), -1, 3).mean(1)
    acc_mean = _nearest_class_mean_accuracy(mean_train, y_train, mean_val, y_val)
    assert acc_hist > 5.0 / C  # chance is 1 / C
    # One global mean colour cannot separate classes that differ in shape or texture only.
    assert acc_mean < 0.35 < acc_hist


def test_getitem_returns_pil_rgb_and_label(train):
    img, label = train[len(train) - 1]
    assert isinstance(img, Image.Image) and img.mode == "RGB" and img.size == (32, 32)
    assert isinstance(label, int) and label == C - 1
    assert np.array_equal(np.asarray(img), train.data[-1])


def test_transform_is_applied():
    ds = SyntheticLT("val", num_classes=2, val_per_class=3, transform=lambda im: im.size)
    assert len(ds) == 6
    assert ds[4] == ((32, 32), 1)


def test_other_image_size():
    ds = SyntheticLT("val", num_classes=3, val_per_class=2, image_size=8)
    assert ds.data.shape == (6, 8, 8, 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"image_size": 7}, "data.image_size=7"),
        ({"num_classes": 1}, "data.num_classes=1"),
        ({"num_classes": MAX_CLASSES + 1}, f"data.num_classes={MAX_CLASSES + 1}"),
        ({"split": "test"}, "data.split='test'"),
        ({"imbalance_factor": 0.5}, "data.imbalance_factor=0.5"),
        ({"n_max": 5, "imbalance_factor": 10.0}, "data.imbalance_factor=10.0"),
        ({"n_max": 0}, "data.n_max=0"),
        ({"val_per_class": 0}, "data.val_per_class=0"),
        ({"seed": -1}, "data.seed=-1"),
        ({"few_threshold": 200}, "data.few_threshold=200"),
        ({"transform": 3}, "data.transform=3"),
    ],
)
def test_bad_arguments_raise_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=r"^[^\n]*$") as err:
        SyntheticLT(**kwargs)
    assert message in str(err.value)
