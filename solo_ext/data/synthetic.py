"""SyntheticLT: a procedurally generated, long-tailed, compositional image dataset.

It is the project's embedded default dataset: nothing is downloaded, and the same arguments
always give the same pixels. Every class is a fixed recipe of shared parts -- a main object
(colour, shape, texture) plus a small solid second object (colour, shape) -- and every part value
is used by several classes, so a class is only identified by a *combination* of parts. Position,
scale, background and colour jitter vary per image.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image

from solo_ext.config import ConfigError
from solo_ext.data.longtail import _check_int, lt_counts, shot_groups
from solo_ext.data.options import SYNTHETIC_OPTIONS
from solo_ext.facts import FEW_THRESHOLD, MANY_THRESHOLD, facts

_FACTS = facts("synthetic_lt")

COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.85, 0.15, 0.15),
    "green": (0.15, 0.75, 0.20),
    "blue": (0.20, 0.30, 0.90),
    "yellow": (0.90, 0.85, 0.15),
    "magenta": (0.80, 0.20, 0.80),
}
SHAPES: tuple[str, ...] = ("disc", "square", "triangle", "ring", "cross", "stripes")
# Per-pixel classes of ``SyntheticLT.label_maps``: background, the main object's shape, the
# second object's shape (what a dense probe has to recognise at each location).
PART_CLASSES: tuple[str, ...] = (
    "background",
    *(f"main-{shape}" for shape in SHAPES),
    *(f"second-{shape}" for shape in SHAPES),
)
TEXTURES: tuple[str, ...] = ("solid", "checker", "dots")
# Sizes of the value sets of the recipe fields, in ClassRecipe order.
_FIELD_SIZES = (len(COLOURS), len(SHAPES), len(TEXTURES), len(COLOURS), len(SHAPES))
# Half of all combinations, so the duplicate repair in `make_recipes` converges quickly.
MAX_CLASSES = int(np.prod(_FIELD_SIZES)) // 2
_CLASS_STREAM, _SPLIT_STREAM = 0, {"train": 1, "val": 2}
_CHUNK = 512  # images rendered at once; bounds float32 temporaries at large image sizes


def check_synthetic(num_classes: int, n_max: int, imbalance_factor: float) -> None:
    """What synthetic_lt can make: distinct class recipes, and an image in the tail class; one
    line naming the key and the value (the config's check and the constructor's)."""
    if num_classes > MAX_CLASSES:
        raise ConfigError(
            f"data.num_classes={num_classes}: synthetic_lt makes at most {MAX_CLASSES} classes "
            "(distinct part combinations)"
        )
    if lt_counts(n_max, num_classes, imbalance_factor)[-1] < 1:
        raise ConfigError(
            f"data.imbalance_factor={imbalance_factor!r}: leaves the tail class with no image "
            f"at data.synthetic.n_max={n_max}"
        )


class ClassRecipe(NamedTuple):
    """The parts that define one class."""

    colour: str
    shape: str
    texture: str
    colour2: str
    shape2: str

    @property
    def name(self) -> str:
        """Human-readable name, e.g. ``"red-disc-checker+blue-cross"``."""
        return f"{self.colour}-{self.shape}-{self.texture}+{self.colour2}-{self.shape2}"


def make_recipes(num_classes: int, seed: int) -> list[ClassRecipe]:
    """Distinct class recipes in which every part value is spread evenly over the classes.

    Each field cycles through its value set (so with C >= 2 * |values| every value is used by
    at least two classes), is shuffled independently, and duplicates are then removed by swapping
    a field value with another class -- a swap keeps every value's usage count unchanged.

    Args:
        num_classes: Number of classes C, 2 <= C <= MAX_CLASSES.
        seed: Seed of the class-level random stream (independent of split).

    Returns:
        List of C distinct ClassRecipe.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, _CLASS_STREAM]))
    codes = np.stack(
        [rng.permutation(np.arange(num_classes) % size) for size in _FIELD_SIZES], axis=1
    )  # [C, 5] integer value codes
    radix = np.cumprod((1,) + _FIELD_SIZES[:-1])  # mixed-radix key: one int per recipe
    for _ in range(10_000):
        _, first, inverse = np.unique(codes @ radix, return_index=True, return_inverse=True)
        dup = np.flatnonzero(first[inverse] != np.arange(num_classes))
        if dup.size == 0:
            break
        for i in dup.tolist():
            j, f = rng.integers(num_classes), rng.integers(len(_FIELD_SIZES))
            codes[[i, j], f] = codes[[j, i], f]
    else:  # pragma: no cover - unreachable for C <= MAX_CLASSES
        raise RuntimeError(f"could not make {num_classes} distinct class recipes")
    colours = list(COLOURS)
    return [
        ClassRecipe(colours[a], SHAPES[b], TEXTURES[c], colours[d], SHAPES[e])
        for a, b, c, d, e in codes.tolist()
    ]


def _coverage(shape: np.ndarray, dx: np.ndarray, dy: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Anti-aliased coverage of each shape, from approximate signed distances in pixels.

    Args:
        shape: [n] shape indices into SHAPES.
        dx, dy: [n, H, W] pixel offsets from each object's centre.
        r: [n, 1, 1] object radius in pixels.

    Returns:
        [n, H, W] float32 coverage in [0, 1].
    """
    dist = np.hypot(dx, dy)
    box = np.maximum(np.abs(dx), np.abs(dy)) - 0.8 * r
    sdf = np.empty_like(dx)
    for k, name in enumerate(SHAPES):
        m = shape == k
        if not m.any():
            continue
        x, y, rk, d = dx[m], dy[m], r[m], dist[m]
        if name == "disc":
            s = d - rk
        elif name == "square":
            s = box[m]
        elif name == "triangle":  # upward equilateral triangle, inradius r/2
            s = np.maximum(np.maximum(y, 0.866 * x - 0.5 * y), -0.866 * x - 0.5 * y) - 0.5 * rk
        elif name == "ring":
            s = np.abs(d - 0.7 * rk) - 0.25 * rk
        elif name == "cross":
            arm1 = np.maximum(np.abs(x) - rk, np.abs(y) - 0.3 * rk)
            arm2 = np.maximum(np.abs(y) - rk, np.abs(x) - 0.3 * rk)
            s = np.minimum(arm1, arm2)
        else:  # vertical stripes clipped to a square: intersection is a max of distances
            period = np.maximum(0.5 * rk, 3.0)
            band = np.abs(np.mod(x, period) - 0.5 * period) - 0.25 * period
            s = np.maximum(box[m], band)
        sdf[m] = s
    return np.clip(0.5 - sdf, 0.0, 1.0)


def _texture(texture: np.ndarray, dx: np.ndarray, dy: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Brightness factor of each texture, tied to the object frame so it scales with the object.

    Args:
        texture: [n] texture indices into TEXTURES.
        dx, dy, r: As in `_coverage`.

    Returns:
        [n, H, W] float32 factor in [0.35, 1].
    """
    period = np.maximum(0.5 * r, 2.0)
    u, v = dx / period, dy / period
    checker = np.where((np.floor(u) + np.floor(v)) % 2 == 0, 1.0, 0.4)
    dots = np.where(np.hypot(u - np.round(u), v - np.round(v)) < 0.3, 0.35, 1.0)
    t = texture[:, None, None]
    return np.where(t == 1, checker, np.where(t == 2, dots, 1.0)).astype(np.float32)


class SyntheticLT(torch.utils.data.Dataset):
    """Long-tailed compositional shapes; train is lt_counts-profiled, val is balanced.

    Attributes:
        data: [N, H, W, 3] uint8 images, grouped by class.
        targets: Label per image, length N.
        classes: Class names, e.g. ``"red-disc-checker+blue-cross"``.
        recipes: The ClassRecipe of every class (identical for train and val).
        class_counts: Images per class in this split.
        train_class_counts: Images per class of the training split (also set on val).
        shot_groups: "many" / "medium" / "few" per class, from train_class_counts.
        label_maps: [N, H, W] uint8, the part covering each pixel (index into PART_CLASSES).
    """

    def __init__(
        self,
        split: str = "train",
        num_classes: int = _FACTS.default_classes,
        n_max: int = SYNTHETIC_OPTIONS["n_max"].default,
        imbalance_factor: float = _FACTS.default_imbalance,
        val_per_class: int = SYNTHETIC_OPTIONS["val_per_class"].default,
        image_size: int = SYNTHETIC_OPTIONS["image_size"].default,
        seed: int = SYNTHETIC_OPTIONS["seed"].default,
        transform: Callable[[Image.Image], Any] | None = None,
        many_threshold: int = MANY_THRESHOLD,
        few_threshold: int = FEW_THRESHOLD,
    ) -> None:
        if split not in _SPLIT_STREAM:
            raise ValueError(f"data.split={split!r}: must be one of {sorted(_SPLIT_STREAM)}")
        num_classes = _check_int("num_classes", num_classes, 2)
        check_synthetic(num_classes, n_max, imbalance_factor)
        val_per_class = _check_int("val_per_class", val_per_class, 1)
        image_size = _check_int("image_size", image_size, 8)
        seed = _check_int("seed", seed, 0)
        if transform is not None and not callable(transform):
            raise ValueError(f"data.transform={transform!r}: must be callable or None")
        self.train_class_counts = lt_counts(n_max, num_classes, imbalance_factor)
        self.shot_groups = shot_groups(self.train_class_counts, many_threshold, few_threshold)
        self.split, self.image_size, self.seed, self.transform = split, image_size, seed, transform
        self.recipes = make_recipes(num_classes, seed)
        self.classes = [r.name for r in self.recipes]
        if split == "train":
            self.class_counts = list(self.train_class_counts)
        else:
            self.class_counts = [val_per_class] * num_classes
        labels = np.repeat(np.arange(num_classes), self.class_counts)
        self.targets: list[int] = labels.tolist()
        # The split stream also hashes every size argument, so e.g. two n_max give fresh images.
        entropy = [seed, _SPLIT_STREAM[split], num_classes, n_max, val_per_class, image_size]
        rng = np.random.default_rng(np.random.SeedSequence(entropy + [int(imbalance_factor * 1e6)]))
        self.data, self.label_maps = self._render(labels, rng)

    def _render(self, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Draws every nuisance parameter up front, then renders in chunks.

        Args:
            labels: [N] class index per image.
            rng: The split's random stream.

        Returns:
            [N, S, S, 3] uint8 images and [N, S, S] uint8 label maps (``PART_CLASSES``).
        """
        n, s = len(labels), self.image_size
        codes = np.array(
            [
                [list(COLOURS).index(r.colour), SHAPES.index(r.shape), TEXTURES.index(r.texture)]
                + [list(COLOURS).index(r.colour2), SHAPES.index(r.shape2)]
                for r in self.recipes
            ]
        )[labels]  # [N, 5]
        palette = np.array(list(COLOURS.values()), dtype=np.float32)  # [5, 3]
        r1 = 0.32 * s * rng.uniform(0.5, 1.0, n)
        c1 = rng.uniform(r1[:, None], s - r1[:, None], (n, 2))  # main object fully inside
        r2 = s * rng.uniform(0.10, 0.14, n)
        # The second object sits at the main object's rim so that both stay mostly visible.
        angle = rng.uniform(0.0, 2 * np.pi, n)
        offset = (r1 + 0.5 * r2)[:, None] * np.stack([np.cos(angle), np.sin(angle)], axis=1)
        c2 = np.clip(c1 + offset, r2[:, None], s - r2[:, None])
        # Jitter brightness and hue so that colour is a category, not one exact RGB value.
        col1 = palette[codes[:, 0]] * rng.uniform(0.8, 1.15, (n, 1)) + rng.normal(0, 0.04, (n, 3))
        col2 = palette[codes[:, 3]] * rng.uniform(0.8, 1.15, (n, 1)) + rng.normal(0, 0.04, (n, 3))
        # Near-grey, low-contrast backgrounds keep the object colours the salient cue, while the
        # gradient direction and noise level vary so the background itself carries no label.
        bg0 = rng.uniform(0.3, 0.6, (n, 1)) + rng.uniform(-0.08, 0.08, (n, 3))
        bg1 = bg0 + rng.uniform(-0.1, 0.1, (n, 3))
        bg_angle = rng.uniform(0.0, 2 * np.pi, n)
        noise_std = rng.uniform(0.0, 0.05, n)
        noise_seeds = rng.integers(0, 2**63, n)

        grid = np.arange(s, dtype=np.float32) + 0.5
        yy, xx = np.meshgrid(grid, grid, indexing="ij")  # [S, S]
        out = np.empty((n, s, s, 3), dtype=np.uint8)
        maps = np.zeros((n, s, s), dtype=np.uint8)
        for lo in range(0, n, _CHUNK):
            sl = slice(lo, min(lo + _CHUNK, n))
            m = sl.stop - sl.start
            cos_a = np.cos(bg_angle[sl]).astype(np.float32).reshape(m, 1, 1)
            sin_a = np.sin(bg_angle[sl]).astype(np.float32).reshape(m, 1, 1)
            ramp = (cos_a * (xx - s / 2) + sin_a * (yy - s / 2)) / s + 0.5  # [m, S, S] ~[0, 1]
            img = (bg0[sl, None, None] + ramp[..., None] * (bg1 - bg0)[sl, None, None]).astype(
                np.float32
            )  # [m, S, S, 3]
            for centre, radius, shape, colour, texture, first_part in (
                (c1, r1, codes[:, 1], col1, codes[:, 2], 1),
                (c2, r2, codes[:, 4], col2, None, 1 + len(SHAPES)),
            ):
                dx = xx - centre[sl, 0].astype(np.float32).reshape(m, 1, 1)
                dy = yy - centre[sl, 1].astype(np.float32).reshape(m, 1, 1)
                rad = radius[sl].astype(np.float32).reshape(m, 1, 1)
                alpha = _coverage(shape[sl], dx, dy, rad)[..., None]
                paint = colour[sl, None, None].astype(np.float32)
                if texture is not None:
                    paint = paint * _texture(texture[sl], dx, dy, rad)[..., None]
                img = img * (1 - alpha) + paint * alpha
                # the part that covers a pixel for the most part (drawn later wins, as in img)
                covered = alpha[..., 0] > 0.5
                part = (first_part + shape[sl]).astype(np.uint8).reshape(m, 1, 1)
                maps[sl] = np.where(covered, part, maps[sl])
            # Per-image noise from per-image seeds keeps pixels independent of the chunk size.
            for k in range(m):
                i = lo + k
                noise = np.random.default_rng(noise_seeds[i]).standard_normal((s, s, 3))
                img[k] += noise_std[i] * noise.astype(np.float32)
            out[sl] = np.round(np.clip(img, 0.0, 1.0) * 255).astype(np.uint8)
        return out, maps

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        """Returns ``(image, label)``; image is a PIL RGB image, or ``transform(image)``."""
        img = Image.fromarray(self.data[index])
        if self.transform is not None:
            img = self.transform(img)
        return img, self.targets[index]


__all__ = [
    "COLOURS",
    "MAX_CLASSES",
    "PART_CLASSES",
    "SHAPES",
    "TEXTURES",
    "ClassRecipe",
    "SyntheticLT",
]
