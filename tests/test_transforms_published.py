"""solo-ext's views against the published protocol (MoCo v2 / DSCL / PBSD), written out here with
torchvision's and PIL's functional calls: given the same random parameters (the same seed, the
draws replayed in the pipeline's order), a crop, a whole view and PBSD's query, key and patches
are the published ones pixel for pixel: crops resized bilinearly, the blur PIL's
``GaussianBlur(radius=sigma)``. ``rrc.interpolation: bicubic`` and ``gaussian_blur.kind:
torchvision`` give solo-ext's earlier pipeline (bicubic crops, torchvision's kernel blur)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image, ImageFilter
from torchvision import transforms as T
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

from solo_ext.config import ConfigError
from solo_ext.data.pbsd_views import PBSDViews
from solo_ext.data.transforms import PILGaussianBlur, build_augmentation, check_augmentations
from solo_ext.facts import SYNTHETIC_STATS

MEAN, STD = SYNTHETIC_STATS
Blur = Callable[[Image.Image, float], Image.Image]
MODES = {"bilinear": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC}
# solo-ext's earlier kernel: 10 % of the side, odd
KERNEL = {32: 3, 64: 7, 96: 9, 224: 23}


def pil_blur(img: Image.Image, sigma: float) -> Image.Image:
    """The published blur: PIL's Gaussian of radius sigma."""
    return img.filter(ImageFilter.GaussianBlur(radius=sigma))


def kernel_blur(size: int) -> Blur:
    """solo-ext's earlier blur at ``size`` px: torchvision's Gaussian kernel."""
    k = KERNEL[size]
    return lambda img, sigma: TF.gaussian_blur(img, [k, k], [sigma, sigma])


def blur_of(kind: str, size: int) -> Blur:
    """The blur of ``gaussian_blur.kind`` at ``size`` px."""
    return pil_blur if kind == "pil" else kernel_blur(size)


def dscl_query(size: int = 96, **extra: object) -> dict:
    """DSCL's query crop: jitter (0.4, 0.4, 0.4, 0.1) p 0.8, grayscale p 0.2, blur p 0.5,
    flip p 0.5, scale (0.08, 1)."""
    aug = {
        "crop_size": size,
        "num_crops": 1,
        "rrc": {"enabled": True, "crop_min_scale": 0.08, "crop_max_scale": 1.0},
        "color_jitter": {
            "prob": 0.8,
            "brightness": 0.4,
            "contrast": 0.4,
            "saturation": 0.4,
            "hue": 0.1,
        },
        "grayscale": {"prob": 0.2},
        "gaussian_blur": {"prob": 0.5},
        "solarization": {"prob": 0.0},
        "equalization": {"prob": 0.0},
        "horizontal_flip": {"prob": 0.5},
    }
    return OmegaConf.to_container(
        OmegaConf.merge(aug, OmegaConf.from_dotlist([f"{k}={v}" for k, v in extra.items()]))
    )


def dscl_key(size: int = 96) -> dict:
    """DSCL's key crop: jitter (0.4, 0.4, 0.4, 0) always, flip p 0.5, no grayscale, no blur."""
    aug = dscl_query(size)
    aug["color_jitter"].update(prob=1.0, hue=0.0)
    aug["grayscale"]["prob"] = aug["gaussian_blur"]["prob"] = 0.0
    return aug


def _image(seed: int = 0, h: int = 120, w: int = 160) -> Image.Image:
    """Noise over a smooth gradient: resampling and blurring both show in every pixel."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, w)[None, :, None] * np.linspace(0.2, 1, h)[:, None, None]
    pixels = (0.5 * ramp + 0.5 * rng.integers(0, 256, (h, w, 3))).astype(np.uint8)
    return Image.fromarray(pixels)


def _range(value: float, centre: float = 1.0) -> list[float] | None:
    """ColorJitter's range of a factor (None: off)."""
    if value == 0:
        return None
    return [max(0.0, centre - value), centre + value] if centre else [-value, value]


def published_colour(img: Image.Image, aug: dict, blur: Blur, seen: set[str]) -> Image.Image:
    """Jitter (RandomApply), grayscale, blur (RandomApply, sigma uniform in [0.1, 2]): the
    published colour augmentation with torch's draws, in order."""
    cj = aug["color_jitter"]
    if cj["prob"] > 0 and torch.rand(1).item() <= cj["prob"]:  # RandomApply: p < r skips
        seen.add("jitter")
        ranges = (
            _range(cj["brightness"]),
            _range(cj["contrast"]),
            _range(cj["saturation"]),
            _range(cj["hue"], centre=0.0),
        )
        order, *factors = T.ColorJitter.get_params(*ranges)
        adjust = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)
        for i in order.tolist():
            if factors[i] is not None:
                img = adjust[i](img, factors[i])
    if torch.rand(1).item() < aug["grayscale"]["prob"]:
        seen.add("grayscale")
        img = TF.rgb_to_grayscale(img, num_output_channels=3)
    p = aug["gaussian_blur"]["prob"]
    if p > 0 and torch.rand(1).item() <= p:
        sigma = torch.empty(1).uniform_(0.1, 2.0).item()
        seen.add("blur")
        img = blur(img, sigma)
    return img


def to_tensor(img: Image.Image, mean=MEAN, std=STD) -> torch.Tensor:
    """``ToTensor`` and the normalisation (the synthetic data's by default)."""
    return TF.normalize(TF.to_tensor(img), mean, std)


def published_view(
    img: Image.Image, aug: dict, mode: InterpolationMode, blur: Blur, seen: set[str]
) -> torch.Tensor:
    """Random resized crop (``mode``), colour, flip, tensor: the published view."""
    size = aug["crop_size"]
    rrc = aug["rrc"]
    top, left, h, w = T.RandomResizedCrop.get_params(
        img, (rrc["crop_min_scale"], rrc["crop_max_scale"]), (3 / 4, 4 / 3)
    )
    img = TF.resized_crop(img, top, left, h, w, [size, size], mode)
    img = published_colour(img, aug, blur, seen)
    if torch.rand(1).item() < aug["horizontal_flip"]["prob"]:
        seen.add("flip")
        img = TF.hflip(img)
    return to_tensor(img)


def solo_ext_view(aug: dict) -> Callable:
    """solo-ext's pipeline of one ``augmentations`` entry."""
    return build_augmentation("synthetic_lt", OmegaConf.create(aug))


SEEDS = range(12)
ALL_DRAWS = {"jitter", "grayscale", "blur", "flip"}


@pytest.mark.parametrize("flip", [0.0, 1.0])
@pytest.mark.parametrize("size", [32, 96])
def test_a_crop_is_the_published_bilinear_crop(size, flip):
    """Colour off: the view is torchvision's ``resized_crop`` at the drawn box, bilinear."""
    aug = dscl_query(size)
    aug["color_jitter"]["prob"] = aug["grayscale"]["prob"] = aug["gaussian_blur"]["prob"] = 0.0
    aug["horizontal_flip"]["prob"] = flip
    view = solo_ext_view(aug)
    for seed in range(4):
        torch.manual_seed(seed)
        got = view(_image(seed))
        torch.manual_seed(seed)
        want = published_view(_image(seed), aug, InterpolationMode.BILINEAR, pil_blur, set())
        assert torch.equal(got, want), seed


def test_a_view_is_the_published_view_given_the_same_draws():
    """DSCL's query settings: every draw (crop, jitter and its order, grayscale, blur's sigma,
    flip) replayed with the published calls gives the same pixels; the seeds cover each
    branch."""
    aug = dscl_query(96)
    view, seen = solo_ext_view(aug), set()
    for seed in SEEDS:
        torch.manual_seed(seed)
        got = view(_image(seed))
        torch.manual_seed(seed)
        want = published_view(_image(seed), aug, InterpolationMode.BILINEAR, pil_blur, seen)
        assert torch.equal(got, want), seed
    assert seen == ALL_DRAWS


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
@pytest.mark.parametrize("kind", ["pil", "torchvision"])
def test_each_option_changes_its_own_step(interpolation, kind):
    """``rrc.interpolation`` picks the crop's resampling and ``gaussian_blur.kind`` the blur,
    each on its own; the other draws are the same whichever is chosen."""
    aug = dscl_query(96, **{"rrc.interpolation": interpolation, "gaussian_blur.kind": kind})
    view = solo_ext_view(aug)
    for seed in SEEDS:
        torch.manual_seed(seed)
        got = view(_image(seed))
        torch.manual_seed(seed)
        want = published_view(_image(seed), aug, MODES[interpolation], blur_of(kind, 96), set())
        assert torch.equal(got, want), seed


def _earlier_pipeline(size: int) -> T.Compose:
    """solo-ext's pipeline before the published defaults, as it was written (DSCL's query)."""
    return T.Compose(
        [
            T.RandomResizedCrop(size, scale=(0.08, 1.0), interpolation=InterpolationMode.BICUBIC),
            T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
            T.RandomGrayscale(p=0.2),
            T.RandomApply([T.GaussianBlur(KERNEL[size], sigma=(0.1, 2.0))], p=0.5),
            T.RandomHorizontalFlip(p=0.5),
            T.ToTensor(),
            T.Normalize(MEAN, STD),
        ]
    )


def test_the_options_give_the_earlier_pipeline_and_the_defaults_do_not():
    """``rrc.interpolation: bicubic`` + ``gaussian_blur.kind: torchvision``: the earlier
    pipeline's pixels for the same seed; the defaults differ from it (the tests above can tell
    the two apart)."""
    options = {"rrc.interpolation": "bicubic", "gaussian_blur.kind": "torchvision"}
    transforms = [_earlier_pipeline(96), solo_ext_view(dscl_query(96, **options))]
    transforms.append(solo_ext_view(dscl_query(96)))
    for seed in range(4):
        views = []
        for transform in transforms:
            torch.manual_seed(seed)
            views.append(transform(_image(seed)))
        assert torch.equal(views[0], views[1]), seed
        assert not torch.allclose(views[0], views[2]), seed


def test_without_rrc_the_resize_takes_the_interpolation():
    """``rrc.enabled: false``: the resize to the crop size uses ``rrc.interpolation`` too."""
    aug = dscl_query(32)
    aug["rrc"]["enabled"] = False
    aug["color_jitter"]["prob"] = aug["grayscale"]["prob"] = aug["gaussian_blur"]["prob"] = 0.0
    aug["horizontal_flip"]["prob"] = 0.0
    for name, mode in MODES.items():
        aug["rrc"]["interpolation"] = name
        want = to_tensor(TF.resize(_image(), [32, 32], mode))
        assert torch.equal(solo_ext_view(aug)(_image()), want), name


# PBSD: the query crop (224 px) and its patches (64 px), as published
PATCH, BOXES, BOX_SCALE, BOX_RATIO = 64, 5, (0.05, 0.6), (3 / 4, 4 / 3)


def published_pbsd(
    img: Image.Image, query: dict, key: dict, mode: InterpolationMode, kind: str, seen: set[str]
) -> list[torch.Tensor]:
    """The query crop's geometry (crop, flip), the boxes in it, each patch cut (bilinear, 64 px)
    and augmented on its own (flip, jitter, grayscale, blur), the query's colour, the key."""
    size = query["crop_size"]
    top, left, h, w = T.RandomResizedCrop.get_params(img, (0.08, 1.0), (3 / 4, 4 / 3))
    crop = TF.resized_crop(img, top, left, h, w, [size, size], mode)
    if torch.rand(1).item() < 0.5:
        seen.add("query flip")
        crop = TF.hflip(crop)
    boxes = [T.RandomResizedCrop.get_params(crop, BOX_SCALE, BOX_RATIO) for _ in range(BOXES)]
    patches = []
    for top_, left_, bh, bw in boxes:
        cut = TF.resized_crop(crop, top_, left_, bh, bw, [PATCH, PATCH], InterpolationMode.BILINEAR)
        if torch.rand(1).item() < 0.5:
            seen.add("flip")
            cut = TF.hflip(cut)
        patches.append(to_tensor(published_colour(cut, query, blur_of(kind, PATCH), seen)))
    query_draws: set[str] = set()
    q = to_tensor(published_colour(crop, query, blur_of(kind, size), query_draws))
    seen.update(f"query {draw}" for draw in query_draws)
    k = published_view(img, key, mode, blur_of(kind, size), set())
    xyxy = torch.tensor([[x, y, x + bw, y + bh] for y, x, bh, bw in boxes], dtype=torch.float32)
    return [q, k, torch.stack(patches), xyxy]


@pytest.mark.parametrize(
    "interpolation,kind",
    [("bilinear", "pil"), ("bicubic", "torchvision")],
    ids=["published", "earlier"],
)
def test_pbsd_patches_are_the_published_patches(interpolation, kind):
    """DSCL's query and key at 224 px, five 64 px patches: query, key, patches and boxes equal
    the published ones for the same draws (defaults), or the earlier ones (the two options). The
    seeds flip the query crop and colour it (its colour reaching no patch), and give the patches
    each colour draw of their own."""
    query, key = dscl_query(224), dscl_key(224)
    if interpolation != "bilinear":  # the published case gives neither option: the defaults
        for aug in (query, key):
            aug["rrc"]["interpolation"], aug["gaussian_blur"]["kind"] = interpolation, kind
    views = PBSDViews(
        "synthetic_lt",
        OmegaConf.create(query),
        OmegaConf.create(key),
        BOXES,
        BOX_SCALE,
        BOX_RATIO,
        PATCH,
    )
    seen: set[str] = set()
    for seed in range(4):
        image = _image(seed, 256, 320)
        torch.manual_seed(seed)
        got = views(image)
        torch.manual_seed(seed)
        want = published_pbsd(image, query, key, MODES[interpolation], kind, seen)
        for name, a, b in zip(("query", "key", "patches", "boxes"), got, want):
            assert torch.equal(a, b), (seed, name)
    assert ALL_DRAWS | {"query flip", "query jitter"} <= seen


def test_a_strong_blur_is_not_cut_short_on_a_patch():
    """At 64 px the earlier kernel (7 px) truncates sigma 2's Gaussian; PIL's radius blur
    smooths a point into a wider spot."""
    dot = Image.new("L", (PATCH, PATCH))
    dot.putpixel((32, 32), 255)
    spread = {}
    for kind in ("pil", "torchvision"):
        out = np.asarray(blur_of(kind, PATCH)(dot, 2.0), dtype=np.float64)
        spread[kind] = (out[32] > 0).sum()
    assert spread["pil"] > spread["torchvision"]


def test_the_pil_blur_takes_uint8_tensors_exactly_and_refuses_float_ones():
    img = _image()
    torch.manual_seed(0)
    want = TF.pil_to_tensor(PILGaussianBlur()(img))
    torch.manual_seed(0)
    assert torch.equal(PILGaussianBlur()(TF.pil_to_tensor(img)), want)
    with pytest.raises(TypeError, match="float32 tensor"):
        PILGaussianBlur()(TF.to_tensor(img))


@pytest.mark.parametrize(
    "key,value", [("rrc.interpolation", "nearest"), ("gaussian_blur.kind", "kornia")]
)
def test_an_unknown_choice_is_one_line(key, value):
    """Checked with the other keys of the entry, and where the pipeline is built (solo-learn's
    ``main_pretrain.py`` builds PBSD's views without the check)."""
    aug = OmegaConf.merge(dscl_query(32), OmegaConf.from_dotlist([f"{key}={value}"]))
    with pytest.raises(ConfigError, match=rf"^augmentations\.0\.{key}='{value}': must be one of"):
        check_augmentations(OmegaConf.create({"augmentations": [aug]}))
    with pytest.raises(ConfigError, match=rf"^{key}='{value}': must be one of"):
        build_augmentation("synthetic_lt", aug)


def test_the_test_transform_of_photographs_is_the_published_one():
    """Resize the shorter side to 256 (torchvision's default, bilinear), centre crop 224: the
    published classifier stage's test transform (and solo-learn's ImageNet validation)."""
    from solo_ext.data.transforms import build_eval_transform

    gen = torch.Generator().manual_seed(3)
    pixels = (torch.rand(300, 410, 3, generator=gen) * 255).to(torch.uint8).numpy()
    image = Image.fromarray(pixels)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's
    published = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(mean, std)])
    assert torch.equal(build_eval_transform("imagenet_lt", 224)(image), published(image))
