"""The one table of dataset facts, read by both hosts, the loaders of solo-learn's scripts and the
evaluation: classes, normalisation statistics, native resolution, the ResNet stem, which of
solo-learn's own datasets a name shares its pipelines with, where its images come from and its
long-tailed profile. No other module branches on a dataset's name: they read these facts.

Nothing here imports torch or a host: it is data.
"""

from __future__ import annotations

from dataclasses import dataclass

Stats = tuple[tuple[float, float, float], tuple[float, float, float]]

IMAGENET_STATS: Stats = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
CIFAR10_STATS: Stats = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
CIFAR100_STATS: Stats = ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))
SYNTHETIC_STATS: Stats = ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
# Fashion-MNIST's training images (grey, given as RGB: the same in the three channels)
FASHION_MNIST_STATS: Stats = ((0.2860, 0.2860, 0.2860), (0.3530, 0.3530, 0.3530))

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
        source: where the images come from: ``image_folder`` (class folders),
            ``torchvision`` (CIFAR's archives), ``idx`` (Fashion-MNIST's four IDX files, read
            with torchvision), ``split_files`` (a root and the published lists) or
            ``generated`` (made in memory, both splits always there).
        images_per_class: training images per class of the full set, where fixed (CIFAR,
            Fashion-MNIST): a long-tailed profile's head class by default.
        archive_dir: the folder torchvision unpacks the archive into (CIFAR).
        default_imbalance: the imbalance factor of a long-tailed profile when none is given.
        default_classes: the class count when the config gives none (generated data).
        balanced: every class has (about) the same number of training images.
        counts_file: the training counts may come from a ``counts.json`` beside the folder.
        part_labels: the images come with per-pixel part labels (the dense probe's).
        stats_from_config: an ``augmentations`` entry's ``mean`` / ``std`` replace ``stats``.
    """

    classes: int | None
    stats: Stats = IMAGENET_STATS
    native_size: int | None = None
    small_image_stem: bool = False
    solo_name: str | None = None
    long_tailed: bool = False
    split_files: tuple[str, str] | None = None
    source: str = "image_folder"
    images_per_class: int | None = None
    archive_dir: str | None = None
    default_imbalance: float | None = None
    default_classes: int | None = None
    balanced: bool = False
    counts_file: bool = False
    part_labels: bool = False
    stats_from_config: bool = False


_CIFAR10 = dict(source="torchvision", images_per_class=5000, archive_dir="cifar-10-batches-py")
_CIFAR100 = dict(source="torchvision", images_per_class=500, archive_dir="cifar-100-python")
_FASHION = dict(source="idx", images_per_class=6000)
_LT = dict(long_tailed=True, default_imbalance=100)

DATASETS: dict[str, DatasetFacts] = {
    # solo-learn's own names
    "cifar10": DatasetFacts(10, CIFAR10_STATS, 32, True, "cifar10", balanced=True, **_CIFAR10),
    "cifar100": DatasetFacts(100, CIFAR100_STATS, 32, True, "cifar100", balanced=True, **_CIFAR100),
    "imagenet100": DatasetFacts(100, solo_name="imagenet100", balanced=True),
    "imagenet": DatasetFacts(1000, solo_name="imagenet", balanced=True),
    "custom": DatasetFacts(None, solo_name="custom", counts_file=True, stats_from_config=True),
    # solo-ext's long-tailed datasets
    "cifar10_lt": DatasetFacts(10, CIFAR10_STATS, 32, True, "cifar10", **_LT, **_CIFAR10),
    "cifar100_lt": DatasetFacts(100, CIFAR100_STATS, 32, True, "cifar100", **_LT, **_CIFAR100),
    # Zalando's product photos, 28 px grey (Xiao et al., 2017); at imbalance 100 the profile is
    # 6000 ... 60 images: the ImageNet-LT thresholds give 8 many and 2 medium classes, none few
    # (from a head class of 1000 (data.lt_n_max): 5 many, 3 medium, 2 few)
    "fashion_mnist": DatasetFacts(10, FASHION_MNIST_STATS, 28, True, balanced=True, **_FASHION),
    "fashion_mnist_lt": DatasetFacts(10, FASHION_MNIST_STATS, 28, True, **_LT, **_FASHION),
    "imagenet_lt": DatasetFacts(
        1000,
        solo_name="imagenet",
        split_files=("ImageNet_LT_train.txt", "ImageNet_LT_test.txt"),
        source="split_files",
        **_LT,
    ),
    "places_lt": DatasetFacts(
        365,
        solo_name="imagenet",
        split_files=("Places_LT_train.txt", "Places_LT_test.txt"),
        source="split_files",
        **_LT,
    ),
    "inat2018": DatasetFacts(
        8142,
        solo_name="imagenet",
        split_files=("iNaturalist18_train.txt", "iNaturalist18_val.txt"),
        source="split_files",
        **_LT,
    ),
    "custom_lt": DatasetFacts(None, solo_name="custom", stats_from_config=True, **_LT),
    "synthetic_lt": DatasetFacts(
        None,
        SYNTHETIC_STATS,
        32,
        True,
        None,
        source="generated",
        long_tailed=True,
        default_imbalance=10,
        default_classes=20,
        part_labels=True,
    ),
}

# solo-learn's scripts give ResNets the small-image stem by these names themselves
SOLO_SMALL_STEM = ("cifar10", "cifar100")
# names solo-learn's scripts accept only through solo-ext: those that are not solo-learn's own
SOLO_EXT_ONLY = tuple(name for name, f in DATASETS.items() if f.solo_name != name)
LONG_TAILED = tuple(name for name, f in DATASETS.items() if f.long_tailed)
SPLIT_FILE_DATASETS = tuple(name for name, f in DATASETS.items() if f.split_files)


def facts(dataset: str) -> DatasetFacts:
    """The facts of ``dataset``; unknown names get those of an image folder of photographs."""
    return DATASETS.get(dataset, DATASETS["custom"])
