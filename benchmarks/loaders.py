"""Training loaders: solo-ext's sampled DALI reader against solo-learn's DALI file reader, same
decode and augmentations, over whole epochs of an image folder written for the run.

The folder (class sub-folders of JPEG files, a long-tailed count profile, deterministic smooth
pixels plus a little noise) lives in a temporary directory for the measurement only. Every
pipeline decodes with ``decoders.image`` (``mixed`` on the GPU, ``cpu`` otherwise, solo-learn's
paddings) and applies the same :func:`solo_ext.data.dali.dali_crops` graph (random resized crop
and flip, two crops); only the reader differs:

- ``sampled`` / ``sampled_class_balanced``: solo-ext's ``external_source`` fed per sample in the
  order of the ``instance`` / ``class_balanced`` sampler
  (:func:`solo_ext.data.dali.build_pipeline`);
- ``solo-learn``: ``readers.file(files, labels, shard_id=0, num_shards=1,
  shuffle_after_epoch=True, name="Reader")`` over the files listed as solo-learn lists them
  (sorted class folders, sorted files); solo-learn's own ``PretrainPipelineBuilder`` when the
  real solo-learn is the host.

An epoch is the loader's: the sampled pipelines run until their source stops (the last short
batch dropped) and are reset; the file reader never stops, so its epoch is
``epoch_size("Reader") // batch_size`` batches, scheduled so that at most the pipeline's prefetch
depth is in flight and none is left running after the epoch's last batch (nothing of one
candidate runs while another is timed). Candidates run one warm-up epoch each, then rounds of one
epoch each, interleaved, each round starting with the next candidate.

Every timed epoch thus starts with an empty prefetch queue, for the reference too (in training,
solo-learn's reader prefetches across epochs, the sampled pipelines restart at each epoch: at
most a batch's latency per epoch while the model waits, not measured here). The images are
written just before, so every reader reads them from the page cache: a cold disk is not measured.
Measure at the training machine's settings (``--loader-threads``): the sampled source runs in the
Python thread that calls ``run()``, beside DALI's threads (it gives file names only; DALI reads
the files, since reading them in that thread cost 10-15 % of the images per second when the
threads equal the cores).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.timing import Measurement

REFERENCE = "solo-learn"
CANDIDATES = {"sampled": "instance", "sampled_class_balanced": "class_balanced"}
SEED = 12  # solo-learn's pipelines' default seed
PREFETCH = 2  # DALI's default prefetch_queue_depth


@dataclass(frozen=True)
class LoaderSizes:
    images: int = 1024
    image_size: int = 256
    classes: int = 8
    crop_size: int = 224
    imbalance: float = 10.0  # largest class over smallest

    @classmethod
    def tiny(cls) -> LoaderSizes:
        return cls(images=64, image_size=32, classes=4, crop_size=24, imbalance=4.0)


def class_counts(images: int, classes: int, imbalance: float) -> list[int]:
    """A long-tailed profile: ``n_c`` proportional to ``imbalance ** (-c / (C - 1))``, summing to
    ``images``, every class at least one image."""
    if images < classes:
        raise ValueError(f"{images} images: fewer than the {classes} classes")
    weights = np.asarray([imbalance ** (-c / max(1, classes - 1)) for c in range(classes)])
    counts = np.maximum(1, np.floor(images * weights / weights.sum()).astype(int))
    counts[0] += images - int(counts.sum())  # the rounding goes to the head class
    return [int(c) for c in counts]


def write_image_folder(root: Path, sizes: LoaderSizes, seed: int = 0) -> list[int]:
    """``root/class_XX/img_XXXXX.jpg``: smooth random images (a coarse grid upsampled bicubic,
    plus a little noise), so that decoding them costs what photographs cost. Returns the count
    of each class."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    side = sizes.image_size
    counts = class_counts(sizes.images, sizes.classes, sizes.imbalance)
    n = 0
    for c, count in enumerate(counts):
        folder = root / f"class_{c:02d}"
        folder.mkdir(parents=True)
        for _ in range(count):
            coarse = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            image = np.asarray(Image.fromarray(coarse).resize((side, side), Image.BICUBIC))
            noise = rng.integers(-12, 13, image.shape)
            image = np.clip(image.astype(np.int16) + noise, 0, 255).astype(np.uint8)
            Image.fromarray(image).save(folder / f"img_{n:05d}.jpg", quality=90)
            n += 1
    return counts


def list_files(root: Path) -> tuple[list[str], list[int]]:
    """The files and labels as solo-learn's DALI pipelines list them: class folders sorted by
    name, each folder's files sorted."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    data = [
        (str(root / name / file), label)
        for label, name in enumerate(classes)
        for file in sorted(os.listdir(root / name))
    ]
    return [f for f, _ in data], [label for _, label in data]


def crops_transform(crop_size: int) -> Callable[[Any], Any]:
    """One ``augmentations`` entry (random resized crop of ``crop_size``, flip), two crops."""
    from omegaconf import OmegaConf

    from solo_ext.data.dali import dali_crops

    aug = OmegaConf.create({"crop_size": crop_size, "num_crops": 2})
    return dali_crops("custom", [aug])


def solo_learn_builder() -> Any:
    """solo-learn's ``PretrainPipelineBuilder`` when the real solo-learn is the host, else None."""
    from solo_ext.host import HOST

    if HOST != "solo":
        return None
    try:
        from solo.data.dali_dataloader import PretrainPipelineBuilder
    except ImportError:
        return None
    return PretrainPipelineBuilder


def reader_pipeline(
    root: Path,
    transforms: Callable[[Any], Any],
    *,
    batch_size: int,
    device: str,
    device_id: int | None,
    num_threads: int,
    seed: int,
) -> tuple[Any, str]:
    """The reference: DALI's file reader as solo-learn's ``PretrainPipelineBuilder`` configures
    it, the decode of :func:`solo_ext.data.dali.build_pipeline`, then ``transforms``; solo-learn's
    builder itself when it is importable. Returns the built pipeline and what built it."""
    builder = solo_learn_builder()
    if builder is not None:
        made = builder(
            root,
            batch_size=batch_size,
            device=device,
            transforms=transforms,
            random_shuffle=True,
            device_id=device_id or 0,
            shard_id=0,
            num_shards=1,
            num_threads=num_threads,
            seed=seed,
        )
        pipe = made.pipeline(
            batch_size=made.batch_size,
            num_threads=made.num_threads,
            device_id=device_id,
            seed=made.seed,
        )
        pipe.build()
        return pipe, "solo.data.dali_dataloader.PretrainPipelineBuilder"

    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    from solo_ext.data.dali import _DEVICE_PADDING, _HOST_PADDING

    files, labels = list_files(root)

    @pipeline_def(enable_conditionals=True)
    def pipeline():
        data, label = fn.readers.file(
            files=files,
            labels=labels,
            shard_id=0,
            num_shards=1,
            shuffle_after_epoch=True,
            name="Reader",
        )
        mixed = device == "gpu"
        images = fn.decoders.image(
            data,
            device="mixed" if mixed else "cpu",
            output_type=types.RGB,
            device_memory_padding=_DEVICE_PADDING if mixed else 0,
            host_memory_padding=_HOST_PADDING if mixed else 0,
        )
        crops = transforms(images)
        crops = list(crops) if isinstance(crops, list | tuple) else [crops]
        if mixed:
            label = label.gpu()
        return (*crops, fn.cast(label, dtype=types.INT64))

    pipe = pipeline(batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=seed)
    pipe.build()
    return pipe, "benchmarks.loaders.reader_pipeline (solo-learn's reader settings)"


def sampled_pipeline(
    root: Path,
    sampler_name: str,
    transforms: Callable[[Any], Any],
    *,
    batch_size: int,
    device: str,
    device_id: int | None,
    num_threads: int,
    seed: int,
) -> Any:
    """solo-ext's reader: the image folder in the order of sampler ``sampler_name``."""
    from torchvision.datasets import ImageFolder

    from solo_ext.data.dali import ItemReader, SamplerSource, build_pipeline
    from solo_ext.data.samplers import build_sampler

    dataset = ImageFolder(str(root))
    labels = list(dataset.targets)
    sampler = build_sampler(sampler_name, labels, seed=0, num_replicas=1, rank=0)
    source = SamplerSource(ItemReader(dataset), labels, sampler, batch_size)
    return build_pipeline(
        source,
        transforms,
        batch_size=batch_size,
        device=device,
        device_id=device_id,
        num_threads=num_threads,
        seed=seed,
    )


class SampledEpochs:
    """Epochs of a pipeline whose source stops: ``run()`` until StopIteration, then ``reset()``."""

    def __init__(self, pipe: Any):
        self.pipe = pipe

    def epoch(self) -> int:
        batches = 0
        while True:
            try:
                self.pipe.run()
            except StopIteration:
                break
            batches += 1
        self.pipe.reset()
        return batches


class ReaderEpochs:
    """Epochs of ``steps`` batches of a pipeline whose reader never stops (DALI's iterator with
    ``LastBatchPolicy.DROP`` and a ``reader_name``): ``run()``'s prefetching (``depth`` batches
    in flight), with nothing scheduled past the epoch's last batch."""

    def __init__(self, pipe: Any, steps: int, depth: int = PREFETCH):
        self.pipe, self.steps, self.depth = pipe, steps, depth
        self.first = True  # the pipeline's first schedule_run prefetches ``depth`` batches
        self.pending = 0  # scheduled, not yet consumed

    def _schedule(self) -> None:
        self.pipe.schedule_run()
        self.pending += self.depth if self.first else 1
        self.first = False

    def epoch(self) -> int:
        for batch in range(self.steps):
            while self.pending < self.depth and batch + self.pending < self.steps:
                self._schedule()
            self.pipe.outputs()
            self.pending -= 1
        return self.steps

    def drain(self) -> None:
        """Consumes what is still in flight (only after the first epoch when ``steps`` is below
        the prefetch depth), untimed."""
        while self.pending > 0:
            self.pipe.outputs()
            self.pending -= 1


def measure_loaders(
    sizes: LoaderSizes,
    batch_size: int,
    device: str,
    num_threads: int,
    warmup: int,
    rounds: int,
) -> list[dict[str, Any]]:
    """Rows ``{name, candidate, reference, median_s, q1_s, q3_s, images_per_s,
    ratio_vs_solo_learn, ...}`` (seconds per epoch; images per second over the median epoch),
    the reference's row among them. ``device`` is torch's (``cpu`` / ``cuda``)."""
    dali_device = "gpu" if device == "cuda" else "cpu"
    device_id = 0 if dali_device == "gpu" else None
    common = dict(
        batch_size=batch_size,
        device=dali_device,
        device_id=device_id,
        num_threads=num_threads,
        seed=SEED,
    )
    with tempfile.TemporaryDirectory(prefix="solo-ext-bench-loaders-") as tmp:
        root = Path(tmp) / "train"
        counts = write_image_folder(root, sizes)
        steps = sizes.images // batch_size
        if steps == 0:
            raise ValueError(f"batch {batch_size}: above the {sizes.images} images of an epoch")
        transforms = crops_transform(sizes.crop_size)
        ref_pipe, ref_impl = reader_pipeline(root, transforms, **common)
        epoch_size = ref_pipe.epoch_size("Reader")
        if isinstance(epoch_size, dict):
            epoch_size = epoch_size["Reader"]
        runners: dict[str, Any] = {REFERENCE: ReaderEpochs(ref_pipe, int(epoch_size) // batch_size)}
        for label, sampler_name in CANDIDATES.items():
            pipe = sampled_pipeline(root, sampler_name, transforms, **common)
            runners[label] = SampledEpochs(pipe)
        images: dict[str, int] = {}
        for _ in range(max(1, warmup)):
            for label, runner in runners.items():
                images[label] = runner.epoch() * batch_size
                if isinstance(runner, ReaderEpochs):
                    runner.drain()
        results = {label: Measurement() for label in runners}
        labels = list(runners)
        for r in range(rounds):
            # each round starts with the next candidate: none always follows the same one
            for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
                runner = runners[label]
                start = time.perf_counter()
                got = runner.epoch() * batch_size
                results[label].seconds.append(time.perf_counter() - start)
                if got != images[label]:
                    raise RuntimeError(f"{label}: {got} images in an epoch, {images[label]} before")
        del runners, ref_pipe

    ref_rate = images[REFERENCE] / results[REFERENCE].median
    shape = (
        f"{sizes.images} jpg {sizes.image_size}px {sizes.classes} cls -> 2x{sizes.crop_size}px "
        f"B={batch_size} T={num_threads} {dali_device}"
    )
    rows = []
    for label, res in results.items():
        rate = images[label] / res.median
        rows.append(
            {
                "kind": "loader",
                "name": "dali training loader",
                "shape": shape,
                "candidate": label,
                "reference": REFERENCE,
                "reference_impl": ref_impl,
                "median_s": res.median,
                "q1_s": res.quartiles[0],
                "q3_s": res.quartiles[1],
                "gflops": None,
                "peak_mib": None,
                "images_per_epoch": images[label],
                "images_per_s": rate,
                # images/s of each epoch: the spread of the rate itself
                "images_per_s_epochs": [images[label] / s for s in res.seconds],
                "images_per_s_stdev": (
                    statistics.stdev(images[label] / s for s in res.seconds)
                    if len(res.seconds) > 1
                    else 0.0
                ),
                "ratio_vs_solo_learn": rate / ref_rate,
                "class_counts": counts,
            }
        )
    return rows
