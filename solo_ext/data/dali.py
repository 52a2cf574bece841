"""NVIDIA DALI loaders whose order is drawn by solo-ext's samplers.

DALI's file reader (``readers.File``, what solo-learn's DALI pipelines read with) draws its own
uniform order. Here the reader is an ``external_source`` fed per sample: item
``info.idx_in_epoch`` of epoch ``e`` is position ``idx_in_epoch`` of this rank's share of the
sampler's order for ``e`` (the same order, seed and rank share as the torchvision loaders), and
it yields the item's file name (read by DALI's ``io.file.read`` and decoded by DALI, on the GPU
with ``mixed`` decoding) or, for datasets held in memory (CIFAR's arrays, ``synthetic_lt``), its
decoded pixels. The decode and
augmentation graph after it is the caller's: solo-learn's own (``main_pretrain.py`` /
``main_linear.py`` through the plugin's patches) or :func:`dali_crops`, solo-ext's (``solo-ext-*``).

A DALI pipeline prefetches and cannot restart an epoch halfway, so :class:`DALILoader` rebuilds
its pipeline when an epoch starts where the previous one did not end (a resumed run, a
``limit_train_batches`` epoch); the epoch comes from its ``sampler``, whose ``set_epoch``
Lightning calls before every epoch.

Only the order is the sampler's: the augmentations' random numbers are DALI's own stream
(seeded with ``seed + rank`` when the pipeline is built), so a resumed run draws other crops than
an uninterrupted one, as with solo-learn's DALI loaders.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from solo_ext.config import ConfigError, declared
from solo_ext.data.options import DALI_OPTIONS, DATA_KEYS
from solo_ext.data.samplers import LongTailSampler, targets_of

# solo-learn's mixed-decoder paddings (nvJPEG's buffers, sized for ImageNet)
_DEVICE_PADDING, _HOST_PADDING = 211025920, 140544512


def dali_installed() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def run_dali_device(cfg: DictConfig) -> str:
    """``dali.device`` of a run's config (its declared default when not given), checked."""
    device = declared(cfg, "dali.device", DALI_OPTIONS)
    DALI_OPTIONS["dali.device"].check("dali.device", device)
    return device


def check_dali(cfg: DictConfig) -> None:
    """``data.format=dali`` needs DALI, and a sampled DALI loader reads the whole training set
    (no ``data.fraction``); one line naming the key."""
    if not dali_installed():
        raise ConfigError(
            "data.format='dali': NVIDIA DALI is not installed (pip install -e '.[dali]')"
        )
    fraction = declared(cfg, "data.fraction", DATA_KEYS)
    if fraction is not None and 0 < fraction < 1:
        raise ConfigError(
            f"data.fraction={fraction!r} with data.format='dali' and a solo-ext sampler or "
            "dataset: the sampled DALI loader reads the whole training set"
        )
    run_dali_device(cfg)


def dali_device(device: str) -> str:
    """``dali.device`` of a run that trains with DALI: ``gpu`` needs a CUDA device."""
    if device == "gpu" and not torch.cuda.is_available():
        raise ConfigError(
            "dali.device='gpu': no CUDA device here; set dali.device=cpu (DALI's CPU operators)"
        )
    return device


# --- the items ---------------------------------------------------------------------------------


def file_of(dataset: Any, i: int) -> str | None:
    """The file behind item ``i`` (ImageFolder, the split-file and long-tailed datasets), or
    None for a dataset held in memory."""
    path_of = getattr(dataset, "path_of", None)
    if callable(path_of):
        return path_of(i)
    samples = getattr(dataset, "samples", None)
    if samples is not None:
        return samples[i][0]
    return None


class ItemReader:
    """Item ``i`` of a dataset (built without a transform) as DALI takes it: the file's bytes
    (``encoded``), or the image's HWC uint8 pixels. Picklable."""

    def __init__(self, dataset: Any):
        self.dataset = dataset
        self.encoded = len(dataset) > 0 and file_of(dataset, 0) is not None

    def __call__(self, i: int) -> np.ndarray:
        if self.encoded:
            return np.fromfile(file_of(self.dataset, i), dtype=np.uint8)
        image = self.dataset[i][0]
        return np.ascontiguousarray(np.asarray(image.convert("RGB"), dtype=np.uint8))

    def path(self, i: int) -> np.ndarray:
        """Item ``i``'s file name as bytes, for DALI's ``io.file.read`` to read in its own
        threads (measured: reading in the Python thread that runs the pipeline leaves DALI's
        threads idle, 10-15 % fewer images per second)."""
        return np.frombuffer(os.fsencode(file_of(self.dataset, i)), dtype=np.uint8)


class SamplerSource:
    """DALI ``external_source`` callback (per sample): item ``info.idx_in_epoch`` of this rank's
    share of the sampler's order for epoch ``start_epoch + info.epoch_idx``; the epoch ends
    after ``steps * batch_size`` items (the last short batch dropped, as solo-learn's loaders).
    Returns (the file's name as bytes, or the decoded pixels; label; dataset index)."""

    def __init__(
        self,
        reader: ItemReader,
        labels: Sequence[int],
        sampler: LongTailSampler,
        batch_size: int,
        start_epoch: int = 0,
    ):
        self.reader, self.labels = reader, np.asarray(labels, dtype=np.int64)
        self.sampler, self.start_epoch = sampler, int(start_epoch)
        self.length = len(sampler) // batch_size * batch_size
        if self.length == 0:
            raise ConfigError(
                f"optimizer.batch_size={batch_size}: above the {len(sampler)} items a process "
                "reads per epoch"
            )
        self._epoch: int | None = None
        self._order: list[int] = []

    def order(self, epoch: int) -> list[int]:
        """This rank's share of the sampler's order for ``epoch`` (cached)."""
        if self._epoch != epoch:
            self.sampler.set_epoch(epoch)
            self._order, self._epoch = list(iter(self.sampler)), epoch
        return self._order

    def __call__(self, info: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if info.idx_in_epoch >= self.length:
            raise StopIteration
        index = self.order(self.start_epoch + info.epoch_idx)[info.idx_in_epoch]
        label = np.array([self.labels[index]], dtype=np.int64)
        item = self.reader.path(index) if self.reader.encoded else self.reader(index)
        return item, label, np.array([index], dtype=np.int64)


# --- solo-ext's augmentation graph -------------------------------------------------------------


def _coin(probability: float) -> Any:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    return fn.random.coin_flip(probability=probability, dtype=types.DALIDataType.BOOL)


def _jitter(images: Any, aug: DictConfig) -> Any:
    import nvidia.dali.fn as fn

    from solo_ext.data.transforms import _get

    factors = {}
    for key in ("brightness", "contrast", "saturation"):
        v = _get(aug, f"color_jitter.{key}")
        if v:
            factors[key] = fn.random.uniform(range=[max(0.0, 1 - v), 1 + v])
    hue = _get(aug, "color_jitter.hue")
    if hue:  # DALI's hue is in degrees
        factors["hue"] = fn.random.uniform(range=[-360 * hue, 360 * hue])
    return fn.color_twist(images, **factors) if factors else images


def _grayscale(images: Any) -> Any:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    gray = fn.color_space_conversion(images, image_type=types.RGB, output_type=types.GRAY)
    return fn.cat(gray, gray, gray, axis=2)


def _blur(images: Any, aug: DictConfig, size: int) -> Any:
    """PIL's kind: a Gaussian of sigma U(0.1, 2) with a window DALI sizes from sigma (no cap,
    as PIL's radius); torchvision's kind: its window of 10 % of the side."""
    import nvidia.dali.fn as fn

    from solo_ext.data.transforms import BLUR_SIGMA, _checked

    sigma = fn.random.uniform(range=list(BLUR_SIGMA))
    if _checked(aug, "gaussian_blur.kind") == "pil":
        return fn.gaussian_blur(images, sigma=sigma)
    kernel = max(3, int(0.1 * size) // 2 * 2 + 1)
    return fn.gaussian_blur(images, sigma=sigma, window_size=kernel)


def _solarize(images: Any) -> Any:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    inverted = types.Constant(255, dtype=types.UINT8) - images
    mask = images >= 128
    return fn.cast(mask * inverted + (mask ^ True) * images, dtype=types.UINT8)


# the torchvision pipeline's keys the DALI graph does not reproduce: (key, its off value, what
# it turns on); an entry that turns one on is refused in one line
_NOT_IN_DALI = (
    ("rand_augment.n", 0, "RandAugment"),
    ("auto_augment.policy", None, "AutoAugment"),
    ("cutout.length", 0, "Cutout"),
    ("random_crop.padding", None, "padded random crop"),
)


class DALIAugmentation:
    """One ``augmentations`` entry as a DALI graph (called inside a pipeline definition, with
    conditionals on): the torchvision pipeline's operations in its order (crop, jitter,
    grayscale, blur, solarization, flip, normalisation). Equalization, RandAugment,
    AutoAugment, Cutout and the padded random crop are refused in one line."""

    def __init__(self, dataset: str, aug: DictConfig):
        from solo_ext.data.transforms import (
            _checked,
            _get,
            augmentation_value,
            crop_scale,
            flip_prob,
            normalize,
        )

        if _get(aug, "equalization.prob") > 0:
            raise ConfigError(
                f"augmentations.equalization.prob={_get(aug, 'equalization.prob')}: DALI has "
                "no random equalization; use data.format=image_folder"
            )
        for key, off, what in _NOT_IN_DALI:
            if _get(aug, key) != off:
                raise ConfigError(
                    f"augmentations.{key}={_get(aug, key)!r}: solo-ext's DALI graph has no "
                    f"{what}; use data.format=image_folder"
                )
        self.aug, self.size = aug, int(aug.crop_size)
        self.rrc = bool(_get(aug, "rrc.enabled"))
        self.scale = crop_scale(aug)
        self.interpolation = _checked(aug, "rrc.interpolation")
        self.jitter_p = float(_get(aug, "color_jitter.prob"))
        self.gray_p = float(_get(aug, "grayscale.prob"))
        self.blur_p = float(augmentation_value(aug, "gaussian_blur.prob"))
        self.solar_p = float(_get(aug, "solarization.prob"))
        self.flip_p = float(flip_prob(aug))
        norm = normalize(dataset, aug)
        self.mean = [255 * float(m) for m in norm.mean]
        self.std = [255 * float(s) for s in norm.std]

    def __call__(self, images: Any) -> Any:
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types

        interp = types.INTERP_LINEAR if self.interpolation == "bilinear" else types.INTERP_CUBIC
        if self.rrc:
            images = fn.random_resized_crop(
                images, size=[self.size, self.size], random_area=list(self.scale),
                interp_type=interp, antialias=False,
            )  # fmt: skip
        else:
            images = fn.resize(images, size=[self.size, self.size], interp_type=interp)
        if self.jitter_p > 0 and _coin(self.jitter_p):
            images = _jitter(images, self.aug)
        if self.gray_p > 0 and _coin(self.gray_p):
            images = _grayscale(images)
        if self.blur_p > 0 and _coin(self.blur_p):
            images = _blur(images, self.aug, self.size)
        if self.solar_p > 0 and _coin(self.solar_p):
            images = _solarize(images)
        return fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            mean=self.mean,
            std=self.std,
            mirror=fn.random.coin_flip(probability=self.flip_p),
        )

    def __repr__(self) -> str:
        return f"DALIAugmentation({dict(self.aug)})"


class DALICrops:
    """Every crop of an ``augmentations`` list (each entry ``num_crops`` times, large crops
    first) as DALI graphs: images -> list of crops."""

    def __init__(self, dataset: str, augmentations: Sequence[DictConfig]):
        self.pipelines = [(DALIAugmentation(dataset, a), int(a.num_crops)) for a in augmentations]

    def __call__(self, images: Any) -> list[Any]:
        return [t(images) for t, n in self.pipelines for _ in range(n)]

    def __repr__(self) -> str:
        return "\n".join(f"{n} x {t}" for t, n in self.pipelines)


def dali_crops(dataset: str, augmentations: Sequence[DictConfig]) -> DALICrops:
    return DALICrops(dataset, augmentations)


# --- the pipeline and the loader ---------------------------------------------------------------


def build_pipeline(
    source: SamplerSource,
    transforms: Callable[[Any], Any],
    *,
    batch_size: int,
    device: str,
    device_id: int | None,
    num_threads: int,
    seed: int,
) -> Any:
    """A built pipeline: the source, DALI's decoder (``mixed`` on the GPU) when the items are
    files, then ``transforms``; outputs ``(*crops, label, index)``."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    @pipeline_def(enable_conditionals=True)
    def pipeline():
        data, labels, indexes = fn.external_source(
            source=source,
            num_outputs=3,
            batch=False,
            dtype=[types.UINT8, types.INT64, types.INT64],
            layout=[None if source.reader.encoded else "HWC", None, None],
        )
        if source.reader.encoded:  # the source gives the file's name; DALI reads it
            mixed = device == "gpu"
            images = fn.decoders.image(
                fn.io.file.read(data),
                device="mixed" if mixed else "cpu",
                output_type=types.RGB,
                device_memory_padding=_DEVICE_PADDING if mixed else 0,
                host_memory_padding=_HOST_PADDING if mixed else 0,
            )
        else:
            images = data.gpu() if device == "gpu" else data
        crops = transforms(images)
        crops = list(crops) if isinstance(crops, list | tuple) else [crops]
        if device == "gpu":
            labels, indexes = labels.gpu(), indexes.gpu()
        return (*crops, labels, indexes)

    pipe = pipeline(
        batch_size=batch_size,
        num_threads=num_threads,
        device_id=device_id,
        seed=seed,
    )
    pipe.build()
    return pipe


class DALILoader:
    """Lightning's training loader over a sampled DALI pipeline: ``len()`` steps per epoch,
    each batch ``[indexes, crops, labels]`` (``pretrain``, solo-learn's pretraining batch) or
    ``(images, labels)`` (``classification``).

    ``sampler`` is the run's sampler; Lightning sets its epoch before each epoch and the
    pipeline reads that epoch's order. ``dataset`` is the training set (its labels and counts).
    """

    def __init__(
        self,
        dataset: Any,
        labels: Sequence[int],
        sampler: LongTailSampler,
        transforms: Callable[[Any], Any],
        *,
        kind: str,
        batch_size: int,
        device: str = "gpu",
        device_id: int | None = None,
        num_threads: int = 4,
        seed: int = 12,
        torch_device: torch.device | None = None,
    ):
        if kind not in ("pretrain", "classification"):
            raise ValueError(f"kind={kind!r}: not 'pretrain' or 'classification'")
        self.dataset, self.labels, self.sampler = dataset, list(labels), sampler
        self.transforms, self.kind, self.batch_size = transforms, kind, int(batch_size)
        self.device = device
        self.device_id = device_id if device == "gpu" else None
        self.num_threads, self.seed = int(num_threads), int(seed)
        self.reader = ItemReader(dataset)
        self._iterator: Any = None
        self._next_epoch: int | None = None
        self.generator = None  # (EpochSeed reseeds a loader's generator; DALI has its own)

    @property
    def steps(self) -> int:
        """Batches per epoch on this process (its share of the order, the last short batch
        dropped); the world size is read when asked (after ``torch.distributed`` is up)."""
        return len(self.sampler) // self.batch_size

    def __len__(self) -> int:
        return self.steps

    def _build(self, epoch: int) -> Any:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        # the source's own sampler: its epoch is the pipeline's, which runs ahead of Lightning's
        source = SamplerSource(
            self.reader, self.labels, copy.deepcopy(self.sampler), self.batch_size, epoch
        )
        pipe = build_pipeline(
            source,
            self.transforms,
            batch_size=self.batch_size,
            device=self.device,
            device_id=self.device_id,
            num_threads=self.num_threads,
            seed=self.seed,
        )
        names = [f"crop{i}" for i in range(pipe.num_outputs - 2)] + ["label", "index"]
        return DALIGenericIterator(
            pipe, names, last_batch_policy=LastBatchPolicy.DROP, auto_reset=True
        )

    def __iter__(self):
        epoch = int(self.sampler.epoch)
        if self._iterator is None or self._next_epoch != epoch:
            self._iterator = self._build(epoch)
        self._next_epoch = None  # mid-epoch until the epoch's last batch
        for n, batch in enumerate(self._iterator, 1):
            out = batch[0]
            crops = [v for k, v in out.items() if k.startswith("crop")]
            labels = out["label"].flatten().long()
            if n == self.steps:
                self._next_epoch = epoch + 1
            if self.kind == "pretrain":
                yield [out["index"].flatten().long(), crops, labels]
            else:
                yield crops[0], labels

    def __repr__(self) -> str:
        return (
            f"DALILoader({self.kind}, {type(self.sampler).__name__}, steps={self.steps}, "
            f"device={self.device}, encoded={self.reader.encoded})"
        )


def dali_loader(
    train_set: Any,
    sampler: LongTailSampler,
    transforms: Callable[[Any], Any],
    *,
    kind: str,
    batch_size: int,
    device: str,
    num_workers: int,
    seed: int,
) -> DALILoader:
    """A run's DALI training loader: ``train_set`` (built without a transform) read in the
    order of ``sampler`` (rank and world from ``torch.distributed`` once it is up), through
    ``transforms``, on ``device`` (``gpu``: the process's GPU; check it with
    :func:`dali_device`), ``max(1, num_workers)`` DALI threads, seeded with ``seed + rank``."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    rank = int(os.environ.get("RANK", local_rank))
    labels = targets_of(train_set)
    if labels is None:
        raise ConfigError(f"{type(train_set).__name__}: no labels to sample by")
    return DALILoader(
        train_set,
        labels,
        sampler,
        transforms,
        kind=kind,
        batch_size=int(batch_size),
        device=device,
        device_id=local_rank,
        num_threads=max(1, int(num_workers)),
        seed=int(seed) + rank,
    )
