"""The long-tail papers' stronger views against their published code, written out here with
torchvision's and timm's calls: RandAugment (timm's, as PaCo's, GPaCo's and BCL's ImageNet-LT
views build it: crop, flip, jitter, RandAugment, ToTensor, Normalize), AutoAugment, Cutout and the
padded random crop (PaCo's CIFAR-100-LT view: RandomCrop(32, padding=4), flip, the CIFAR-10
policy, ToTensor, Cutout(1 hole, 16 px), Normalize). Given the same seeds, solo-ext's view is the
published one pixel for pixel; the keys' defaults leave every existing pipeline as it was; bad
values and the DALI graph stop in one line naming the key and the value."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image
from test_transforms_published import _image as image
from test_transforms_published import dscl_query, to_tensor
from timm.data.auto_augment import rand_augment_transform
from torchvision import transforms as T
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

from solo_ext.config import ConfigError
from solo_ext.data.transforms import Cutout, build_augmentation, check_augmentations
from solo_ext.facts import SYNTHETIC_STATS, facts

MEAN, STD = SYNTHETIC_STATS
SEEDS = range(12)


def entry(size: int = 32, **extra: object) -> dict:
    """DSCL's query entry with every colour step off (flip p 0.5), plus ``extra`` (dotted
    keys)."""
    aug = dscl_query(size)
    aug["color_jitter"] = {"prob": 0.0}
    aug["grayscale"]["prob"] = aug["gaussian_blur"]["prob"] = 0.0
    return entry_with(aug, extra)


def entry_with(aug: dict, extra: dict) -> dict:
    """``aug`` with the dotted keys of ``extra`` set (None: null)."""
    dotlist = [f"{k}={'null' if v is None else v}" for k, v in extra.items()]
    return OmegaConf.to_container(OmegaConf.merge(aug, OmegaConf.from_dotlist(dotlist)))


def view_of(aug: dict, dataset: str = "synthetic_lt") -> Callable:
    return build_augmentation(dataset, OmegaConf.create(aug))


def seed_all(seed: int) -> None:
    """torch's generator (crops, flips, jitter, AutoAugment, Cutout), Python's and numpy's
    (timm's RandAugment)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def published_rand_augment(size: int, mean=MEAN, n: int = 2, m: int = 10, mstd: float = 0.5):
    """PaCo's / GPaCo's / BCL's RandAugment: ``rand-n{n}-m{m}-mstd{mstd}`` with the translation
    constant 45 % of the crop and the fill the mean in 8 bits."""
    hparams = dict(
        translate_const=int(size * 0.45), img_mean=tuple(min(255, round(255 * x)) for x in mean)
    )
    return rand_augment_transform(f"rand-n{n}-m{m}-mstd{mstd}", hparams)


# --- RandAugment: the ImageNet-LT views of PaCo, GPaCo and BCL -----------------------------


@pytest.mark.parametrize("flip", [0.0, 1.0])
@pytest.mark.parametrize("size", [32, 40])
def test_rand_augment_view_is_the_published_pipeline(size, flip):
    """Jitter off, flip certain either way: torchvision's and timm's transforms composed in the
    published order give solo-ext's pixels; RandAugment does change them."""
    aug = entry(size, **{"rand_augment.n": 2, "horizontal_flip.prob": flip})
    crop = T.RandomResizedCrop(size, scale=(0.08, 1.0))
    published = T.Compose(
        [
            crop,
            T.RandomHorizontalFlip(flip),
            published_rand_augment(size),
            T.ToTensor(),
            T.Normalize(MEAN, STD),
        ]
    )
    plain = T.Compose([crop, T.RandomHorizontalFlip(flip), T.ToTensor(), T.Normalize(MEAN, STD)])
    view, changed = view_of(aug), 0
    for seed in SEEDS:
        seed_all(seed)
        got = view(image(seed))
        seed_all(seed)
        assert torch.equal(got, published(image(seed))), seed
        seed_all(seed)
        changed += not torch.equal(got, plain(image(seed)))
    assert changed >= len(SEEDS) // 2


def paco_imagenet_view(img: Image.Image, aug: dict, seen: set[str]) -> torch.Tensor:
    """PaCo's ImageNet-LT view with torchvision's functional calls in the published order
    (crop, flip, jitter, RandAugment, ToTensor, Normalize), each draw taken where solo-ext takes
    it (jitter's, then its grayscale step's coin, then the flip's): flip and jitter commute
    (brightness, saturation and hue act per pixel, contrast on the mean), so the view is the
    published one for the same draws."""
    size, cj = aug["crop_size"], aug["color_jitter"]
    top, left, h, w = T.RandomResizedCrop.get_params(img, (0.08, 1.0), (3 / 4, 4 / 3))
    img = TF.resized_crop(img, top, left, h, w, [size, size], InterpolationMode.BILINEAR)
    jitter = torch.rand(1).item() <= cj["prob"]  # RandomApply's coin
    if jitter:
        ranges = [[1 - cj[k], 1 + cj[k]] for k in ("brightness", "contrast", "saturation")]
        order, *factors = T.ColorJitter.get_params(*ranges, None)
    torch.rand(1)  # solo-ext's grayscale step (p 0): its coin, never grey
    if torch.rand(1).item() < aug["horizontal_flip"]["prob"]:
        seen.add("flip")
        img = TF.hflip(img)
    else:
        seen.add("no flip")
    if jitter:
        seen.add("jitter")
        adjust = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation)
        for i in order.tolist():
            if i < 3:
                img = adjust[i](img, factors[i])
    img = published_rand_augment(size)(img)
    return to_tensor(img)


def test_rand_augment_with_jitter_is_the_published_order():
    """PaCo's ImageNet-LT settings (jitter 0.4, 0.4, 0.4, 0 always; flip p 0.5; RandAugment
    n 2, m 10, mstd 0.5): the published order's pixels, whether the view is flipped or not."""
    aug = entry(32, **{"rand_augment.n": 2, "rand_augment.m": 10, "rand_augment.mstd": 0.5})
    aug["color_jitter"] = {
        "prob": 1.0,
        "brightness": 0.4,
        "contrast": 0.4,
        "saturation": 0.4,
        "hue": 0.0,
    }
    view, seen = view_of(aug), set()
    for seed in SEEDS:
        seed_all(seed)
        got = view(image(seed))
        seed_all(seed)
        assert torch.equal(got, paco_imagenet_view(image(seed), aug, seen)), seed
    assert seen == {"flip", "no flip", "jitter"}


def test_rand_augment_fills_with_the_entrys_mean():
    """A custom folder's entry ``mean`` is RandAugment's fill (``img_mean``), as it is the
    normalisation's: the published pipeline with that mean, not with the dataset table's."""
    mean, std = [0.1, 0.2, 0.3], [0.2, 0.2, 0.2]
    aug = entry(32, **{"rand_augment.n": 3, "rand_augment.m": 10, "horizontal_flip.prob": 0.0})
    aug.update(mean=mean, std=std)
    view = view_of(aug, "custom")

    def published(img, fill_mean):
        img = T.RandomResizedCrop(32, scale=(0.08, 1.0))(img)
        torch.rand(1), torch.rand(1)  # solo-ext's grayscale and flip coins (p 0)
        return to_tensor(published_rand_augment(32, fill_mean, n=3)(img), mean, std)

    other = 0
    for seed in range(20):
        seed_all(seed)
        got = view(image(seed))
        seed_all(seed)
        assert torch.equal(got, published(image(seed), mean)), seed
        seed_all(seed)
        other += not torch.equal(got, published(image(seed), facts("custom").stats[0]))
    assert other > 0  # the fill shows where a rotation, shear or translation drew


# --- AutoAugment, Cutout and the padded crop: PaCo's CIFAR-100-LT view ---------------------


def published_cutout(img: torch.Tensor, length: int, holes: int = 1) -> torch.Tensor:
    """The published Cutout (uoguelph-mlrg's ``util/cutout.py``, as PaCo copies it), its
    centres drawn from torch instead of numpy."""
    h, w = img.size(1), img.size(2)
    mask = np.ones((h, w), np.float32)
    for _ in range(holes):
        y = torch.randint(h, (1,)).item()
        x = torch.randint(w, (1,)).item()
        y1, y2 = np.clip(y - length // 2, 0, h), np.clip(y + length // 2, 0, h)
        x1, x2 = np.clip(x - length // 2, 0, w), np.clip(x + length // 2, 0, w)
        mask[y1:y2, x1:x2] = 0.0
    return img * torch.from_numpy(mask).expand_as(img)


def paco_cifar_view(
    img: Image.Image, flip: float, policy: str, length: int, padding: int = 4
) -> torch.Tensor:
    """PaCo's CIFAR-100-LT view with torchvision's calls in the published order: RandomCrop(32,
    padding), flip, AutoAugment, ToTensor, Cutout, Normalize; solo-ext's grayscale step (p 0)
    draws one coin before the flip, replayed here."""
    img = T.RandomCrop(32, padding=padding)(img)
    torch.rand(1)
    img = T.RandomHorizontalFlip(flip)(img)
    if policy:
        img = T.AutoAugment(T.AutoAugmentPolicy[policy.upper()])(img)
    tensor = TF.to_tensor(img)
    if length:
        tensor = published_cutout(tensor, length)
    return TF.normalize(tensor, MEAN, STD)


def paco_cifar_entry(flip: float = 0.5, policy: str | None = "cifar10", length: int = 16) -> dict:
    return entry(
        32,
        **{
            "rrc.enabled": False,
            "random_crop.padding": 4,
            "auto_augment.policy": policy,
            "cutout.length": length,
            "horizontal_flip.prob": flip,
        },
    )


@pytest.mark.parametrize("policy", ["cifar10", "imagenet", "svhn"])
def test_auto_augment_is_torchvisions_policy(policy):
    """``auto_augment.policy``: ``T.AutoAugment`` of that policy after the flip, with the same
    draws; it changes the pixels."""
    view = view_of(paco_cifar_entry(policy=policy, length=0))
    changed = 0
    for seed in SEEDS:
        torch.manual_seed(seed)
        got = view(image(seed, 32, 32))
        torch.manual_seed(seed)
        assert torch.equal(got, paco_cifar_view(image(seed, 32, 32), 0.5, policy, 0)), seed
        torch.manual_seed(seed)
        changed += not torch.equal(got, paco_cifar_view(image(seed, 32, 32), 0.5, "", 0))
    assert changed >= len(SEEDS) // 2


def test_pacos_cifar_view_is_the_published_one():
    """Pad-4 crop, flip, the CIFAR-10 policy, ToTensor, Cutout 16, Normalize: the published
    pixels for the same seed, each hole black (0 before the normalisation)."""
    view = view_of(paco_cifar_entry())
    black = (torch.zeros(3, 1, 1) - torch.tensor(MEAN)[:, None, None]) / STD[0]
    for seed in SEEDS:
        torch.manual_seed(seed)
        got = view(image(seed, 32, 32))
        torch.manual_seed(seed)
        assert torch.equal(got, paco_cifar_view(image(seed, 32, 32), 0.5, "cifar10", 16)), seed
        assert (got == black).all(0).sum() >= 8 * 8  # a 16 px hole, clipped at most to 8 x 8


def hole(h: int, w: int, y: int, x: int, length: int) -> torch.Tensor:
    """The clipped square of the published Cutout, by hand: rows y - length // 2 up to (not
    including) y + length // 2, within [0, h); columns alike."""
    rows = torch.arange(h)[:, None]
    cols = torch.arange(w)[None, :]
    half = length // 2
    inside_rows = (rows >= max(0, y - half)) & (rows < min(h, y + half))
    inside_cols = (cols >= max(0, x - half)) & (cols < min(w, x + half))
    return inside_rows & inside_cols


@pytest.mark.parametrize("h,w,length", [(32, 32, 16), (20, 30, 16), (32, 32, 15), (9, 7, 4)])
def test_cutout_zeroes_the_clipped_square_at_the_drawn_centre(h, w, length):
    """On ones: the zeros are exactly the square around the centre torch draws (y, then x),
    clipped at the borders (a square near one is smaller), on every channel."""
    cutout, seen = Cutout(length), set()
    for seed in range(40):
        torch.manual_seed(seed)
        got = cutout(torch.ones(3, h, w))
        torch.manual_seed(seed)
        y, x = torch.randint(h, (1,)).item(), torch.randint(w, (1,)).item()
        want = hole(h, w, y, x, length)
        assert torch.equal(got == 0, want.expand(3, h, w)), (seed, y, x)
        assert torch.equal(got[:, ~want], torch.ones(3, int((~want).sum()))), seed
        half = length // 2
        clipped = y < half or x < half or y + half > h or x + half > w
        seen.add("border" if clipped else "inside")
        if length % 2:
            assert int(want.sum()) <= (length - 1) ** 2  # an odd side loses one row and column
    assert "border" in seen


def test_cutout_near_a_corner_by_hand():
    """A centre drawn at the top right of a 32 px image: the hole is cut to the rows above
    y + 8 and the columns from x - 8 to the edge."""
    for seed in range(200):
        torch.manual_seed(seed)
        y, x = torch.randint(32, (1,)).item(), torch.randint(32, (1,)).item()
        if y < 8 and x > 24:
            break
    else:
        pytest.fail("no seed draws a centre in the corner")
    torch.manual_seed(seed)
    got = Cutout(16)(torch.ones(1, 32, 32))[0]
    want = torch.ones(32, 32)
    want[0 : y + 8, x - 8 : 32] = 0
    assert torch.equal(got, want)
    assert int((got == 0).sum()) == (y + 8) * (32 - (x - 8))


def test_cutout_holes_each_draw_their_centre():
    """``holes`` squares, centres drawn one after another (y, x, y, x, ...), overlaps allowed."""
    for seed in range(10):
        torch.manual_seed(seed)
        got = Cutout(6, holes=3)(torch.ones(3, 24, 24))
        torch.manual_seed(seed)
        want = torch.zeros(24, 24, dtype=torch.bool)
        for _ in range(3):
            y, x = torch.randint(24, (1,)).item(), torch.randint(24, (1,)).item()
            want |= hole(24, 24, y, x, 6)
        assert torch.equal(got == 0, want.expand(3, 24, 24)), seed
        torch.manual_seed(seed)
        assert torch.equal(got, published_cutout(torch.ones(3, 24, 24), 6, holes=3)), seed
    assert repr(Cutout(6, holes=3)) == "Cutout(length=6, holes=3)"


@pytest.mark.parametrize("padding", [4, 0])
def test_random_crop_padding_is_torchvisions_random_crop(padding):
    """``rrc.enabled: false`` with ``random_crop.padding``: ``T.RandomCrop(size, padding)`` for
    the same seed (zero borders where the crop takes the padding), not the resize."""
    aug = entry(32, **{"rrc.enabled": False, "random_crop.padding": padding})
    aug["horizontal_flip"]["prob"] = 0.0
    view, padded = view_of(aug), 0
    published = T.Compose([T.RandomCrop(32, padding=padding), T.ToTensor()])
    for seed in SEEDS:
        img = image(seed, 36, 44)
        torch.manual_seed(seed)
        got = view(img)
        torch.manual_seed(seed)
        tensor = published(img)
        assert torch.equal(got, TF.normalize(tensor, MEAN, STD)), seed
        padded += bool((tensor.sum(0) == 0).any())
        assert not torch.equal(got, to_tensor(TF.resize(img, [32, 32]))), seed
    assert (padded > 0) == (padding > 0)


# --- the defaults change nothing -------------------------------------------------------------

OFF = {
    "rand_augment.n": 0,
    "rand_augment.m": 10,
    "rand_augment.mstd": 0.5,
    "auto_augment.policy": None,
    "cutout.length": 0,
    "cutout.holes": 1,
    "random_crop.padding": None,
}


@pytest.mark.parametrize("rrc", [True, False])
def test_the_defaults_leave_a_pipeline_as_it_was(rrc):
    """An existing entry, with the new keys left out or given at their defaults: the pipeline
    as it was written before them (same operations, same pixels for the same seed)."""
    from solo_ext.data.transforms import PILGaussianBlur

    aug = dscl_query(32, **{"rrc.enabled": rrc})  # DSCL's query view
    before = T.Compose(
        [
            T.RandomResizedCrop(32, scale=(0.08, 1.0)) if rrc else T.Resize((32, 32)),
            T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
            T.RandomGrayscale(p=0.2),
            T.RandomApply([PILGaussianBlur()], p=0.5),
            T.RandomHorizontalFlip(p=0.5),
            T.ToTensor(),
            T.Normalize(MEAN, STD),
        ]
    )
    without, explicit = view_of(aug), view_of(entry_with(aug, OFF))
    assert repr(without) == repr(explicit) == repr(before)
    for seed in range(6):
        views = []
        for transform in (before, without, explicit):
            seed_all(seed)
            views.append(transform(image(seed)))
        assert torch.equal(views[0], views[1]) and torch.equal(views[0], views[2]), seed


# --- bad values -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key,value,shown",
    [
        ("rand_augment.n", -1, "-1"),
        ("rand_augment.n", 1.5, "1.5"),
        ("rand_augment.m", 31, "31"),
        ("rand_augment.m", -1, "-1"),
        ("rand_augment.mstd", -0.5, "-0.5"),
        ("auto_augment.policy", "cifar100", "'cifar100'"),
        ("cutout.length", -16, "-16"),
        ("cutout.holes", 0, "0"),
        ("random_crop.padding", -4, "-4"),
    ],
)
def test_a_bad_value_is_one_line(key, value, shown):
    """``check_augmentations`` names the entry's key and the value; building the view without
    the check (solo-learn's ``main_pretrain.py``) stops on it too."""
    aug = entry_with(entry(32, **{"rrc.enabled": False}), {key: value})
    with pytest.raises(ConfigError) as info:
        check_augmentations(OmegaConf.create({"augmentations": [entry(32), aug]}))
    message = str(info.value)
    assert message.startswith(f"augmentations.1.{key}={shown}: must be "), message
    assert "\n" not in message
    with pytest.raises(ConfigError, match=rf"^{key}={shown}: must be "):
        view_of(aug)


def test_padding_with_random_resized_crops_is_one_line():
    """The padded crop takes the resize's place: with ``rrc.enabled`` true it is refused,
    naming both keys."""
    aug = entry(32, **{"random_crop.padding": 4})
    with pytest.raises(ConfigError) as info:
        check_augmentations(OmegaConf.create({"augmentations": [aug]}))
    message = str(info.value)
    assert message.startswith(
        "augmentations.0.random_crop.padding=4 with augmentations.0.rrc.enabled=true: "
    ), message
    assert "\n" not in message
    with pytest.raises(ConfigError, match=r"^random_crop.padding=4 with rrc.enabled=true: "):
        view_of(aug)


def test_good_values_pass_the_check():
    augs = [
        paco_cifar_entry(),
        entry(32, **{"rand_augment.n": 2, "rand_augment.m": 30, "rand_augment.mstd": 0}),
        entry(32, **{"auto_augment.policy": "imagenet", "cutout.holes": 2, "cutout.length": 8}),
        entry(32, **{"rrc.enabled": False, "random_crop.padding": 0}),
    ]
    check_augmentations(OmegaConf.create({"augmentations": augs}))


# --- solo-ext's DALI graph ------------------------------------------------------------------


@pytest.mark.parametrize(
    "key,value,shown,what",
    [
        ("rand_augment.n", 2, "2", "RandAugment"),
        ("auto_augment.policy", "cifar10", "'cifar10'", "AutoAugment"),
        ("cutout.length", 16, "16", "Cutout"),
        ("random_crop.padding", 4, "4", "padded random crop"),
    ],
)
def test_the_dali_graph_refuses_each_key_in_one_line(key, value, shown, what):
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (pip install .[dali])")
    from solo_ext.data.dali import DALIAugmentation

    aug = OmegaConf.create(entry_with({"crop_size": 8, "rrc": {"enabled": False}}, {key: value}))
    with pytest.raises(ConfigError) as info:
        DALIAugmentation("custom", aug)
    message = str(info.value)
    assert message.startswith(f"augmentations.{key}={shown}: "), message
    assert what in message and "data.format=image_folder" in message and "\n" not in message
    off = OmegaConf.create(entry_with({"crop_size": 8, "rrc": {"enabled": False}}, OFF))
    DALIAugmentation("custom", off)  # the defaults, given: the graph builds
