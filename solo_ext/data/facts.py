"""The one table of dataset facts, read by both hosts, the loaders of solo-learn's scripts and the
evaluation: classes, normalisation statistics, native resolution, the ResNet stem, and which of
solo-learn's own datasets a name shares its pipelines with.

Nothing here imports torch or a host: it is data.
"""

from __future__ import annotations

from dataclasses import dataclass

Stats = tuple[tuple[float, float, float], tuple[float, float, float]]

IMAGENET_STATS: Stats = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
CIFAR10_STATS: Stats = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
CIFAR100_STATS: Stats = ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))
SYNTHETIC_STATS: Stats = ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))

# Many (> many_threshold training images), medium, few (< few_threshold): ImageNet-LT's split.
MANY_THRESHOLD = 100
FEW_THRESHOLD = 20


@dataclass(frozen=True)
class DatasetFacts:
    """What is fixed about a dataset name.

    Attributes:
        classes: number of classes; None when the data decides (image folders, synthetic_lt).
        stats: (mean, std) used to normalise its images.
        native_size: side of its stored images when they are stored at the training resolution
            (CIFAR's 32 px): evaluated as they are, with no resize or centre crop. None for
            datasets of large photographs (resize + centre crop).
        small_image_stem: ResNets get a 3x3 stride-1 first convolution and no max-pool, as
            solo-learn does for CIFAR (the ImageNet stem leaves a 1x1 last map at 32 px).
        solo_name: the solo-learn dataset whose transforms this one shares in solo-learn's
            scripts (None: solo-learn has no such pipeline; solo-ext supplies it).
        long_tailed: the training split follows a long-tailed profile (Many / Medium / Few).
        split_files: default (train, val) split-file names of the published benchmarks.
    """

    classes: int | None
    stats: Stats = IMAGENET_STATS
    native_size: int | None = None
    small_image_stem: bool = False
    solo_name: str | None = None
    long_tailed: bool = False
    split_files: tuple[str, str] | None = None


DATASETS: dict[str, DatasetFacts] = {
    # solo-learn's own names
    "cifar10": DatasetFacts(10, CIFAR10_STATS, 32, True, "cifar10"),
    "cifar100": DatasetFacts(100, CIFAR100_STATS, 32, True, "cifar100"),
    "imagenet100": DatasetFacts(100, solo_name="imagenet100"),
    "imagenet": DatasetFacts(1000, solo_name="imagenet"),
    "custom": DatasetFacts(None, solo_name="custom"),
    # solo-ext's long-tailed datasets
    "cifar10_lt": DatasetFacts(10, CIFAR10_STATS, 32, True, "cifar10", True),
    "cifar100_lt": DatasetFacts(100, CIFAR100_STATS, 32, True, "cifar100", True),
    "imagenet_lt": DatasetFacts(
        1000,
        solo_name="imagenet",
        long_tailed=True,
        split_files=("ImageNet_LT_train.txt", "ImageNet_LT_test.txt"),
    ),
    "places_lt": DatasetFacts(
        365,
        solo_name="imagenet",
        long_tailed=True,
        split_files=("Places_LT_train.txt", "Places_LT_test.txt"),
    ),
    "inat2018": DatasetFacts(
        8142,
        solo_name="imagenet",
        long_tailed=True,
        split_files=("iNaturalist18_train.txt", "iNaturalist18_val.txt"),
    ),
    "custom_lt": DatasetFacts(None, solo_name="custom", long_tailed=True),
    "synthetic_lt": DatasetFacts(None, SYNTHETIC_STATS, 32, True, None, True),
}

# solo-learn's scripts give ResNets the small-image stem by these names themselves
SOLO_SMALL_STEM = ("cifar10", "cifar100")
# names solo-learn's scripts accept only through solo-ext
SOLO_EXT_ONLY = tuple(name for name in DATASETS if name.endswith("_lt") or name == "inat2018")
LONG_TAILED = tuple(name for name, f in DATASETS.items() if f.long_tailed)
SPLIT_FILE_DATASETS = tuple(name for name, f in DATASETS.items() if f.split_files)


def facts(dataset: str) -> DatasetFacts:
    """The facts of ``dataset``; unknown names get those of an image folder of photographs."""
    return DATASETS.get(dataset, DATASETS["custom"])
