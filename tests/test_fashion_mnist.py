"""Fashion-MNIST by name (``fashion_mnist``, ``fashion_mnist_lt``), read from a folder of its four
IDX files (tiny ones written here; the suite never needs the Debian package)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import write_fashion_mnist
from omegaconf import OmegaConf
from test_datasets import ldam_reference

from solo_ext.config import ConfigError
from solo_ext.data.datasets import build_dataset, fill_data_cfg, long_tail_counts
from solo_ext.data.idx import FashionMNISTFolder
from solo_ext.data.longtail import shot_groups


def data_cfg(path, dataset="fashion_mnist_lt", **data):
    cfg = OmegaConf.create({"data": {"dataset": dataset, "train_path": str(path), **data}})
    return fill_data_cfg(cfg).data


def raw_arrays(root, prefix):
    """The images and labels as written, read back with numpy alone (the IDX layout)."""
    with gzip.open(root / f"{prefix}-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(root / f"{prefix}-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return images, labels


@pytest.mark.parametrize("gz", [True, False])
def test_items_are_the_files_images_as_rgb(tmp_path, gz):
    root = write_fashion_mnist(tmp_path / "fm", gz=gz)
    train = FashionMNISTFolder(str(root), train=True)
    test = FashionMNISTFolder(str(root), train=False)
    assert len(train) == 300 and len(test) == 40
    assert train.classes[0] == "T-shirt/top" and len(train.classes) == 10
    images, labels = raw_arrays(write_fashion_mnist(tmp_path / "gz", gz=True), "train")
    for i in (0, 17, 299):
        image, label = train[i]
        assert image.mode == "RGB" and image.size == (28, 28) and label == labels[i]
        pixels = np.asarray(image)
        assert (pixels == images[i][:, :, None]).all()  # the grey value in every channel


def test_torchvisions_own_layout_is_found(tmp_path):
    """A folder that torchvision's download filled (``<root>/FashionMNIST/raw``)."""
    write_fashion_mnist(tmp_path / "FashionMNIST" / "raw", gz=False)
    data = data_cfg(tmp_path, "fashion_mnist")
    assert len(build_dataset(data, "val", None)) == 40


def test_the_long_tailed_split_is_cifar_lts_rule(tmp_path):
    """The kept training images are those of LDAM-DRW's IMBALANCECIFAR (cifar10_lt's rule, written
    out in ``ldam_reference``) for the seed given; the test split stays whole and balanced."""
    root = write_fashion_mnist(tmp_path / "fm")
    data = data_cfg(root, imbalance_factor=10, lt_n_max=30, lt_seed=3)
    train = build_dataset(data, "train", None)
    _, labels = raw_arrays(root, "train")
    keep = ldam_reference(labels, 10, 30, 10, seed=3)
    want_counts = np.bincount(labels[keep], minlength=10).tolist()
    assert train.indices == keep
    assert train.train_class_counts == want_counts == long_tail_counts(data)
    val = build_dataset(data, "val", None)
    assert val.class_counts == [4] * 10 and val.train_class_counts == want_counts
    # the shot groups of the default thresholds (100, 20) on these counts
    assert val.shot_groups == shot_groups(want_counts, 100, 20)


def test_the_full_profile_and_its_shot_groups():
    """Every image of the head class (6000) down to 60 at imbalance 100: 8 many, 2 medium and no
    few classes by ImageNet-LT's thresholds; a head class of 1000 gives 5, 3 and 2."""
    full = OmegaConf.create(
        {"dataset": "fashion_mnist_lt", "num_classes": 10, "imbalance_factor": 100}
    )
    counts = long_tail_counts(full)
    assert counts[0] == 6000 and counts[-1] == 60
    groups = shot_groups(counts, 100, 20)
    assert [groups.count(g) for g in ("many", "medium", "few")] == [8, 2, 0]
    small = OmegaConf.merge(full, {"lt_n_max": 1000})
    groups = shot_groups(long_tail_counts(small), 100, 20)
    assert [groups.count(g) for g in ("many", "medium", "few")] == [5, 3, 2]


def test_a_training_run_reads_the_files(tmp_path, make_cfg):
    from solo_ext.commands.pretrain import run

    root = write_fashion_mnist(tmp_path / "fm")
    cfg = make_cfg(
        "dscl",
        **{
            "data.dataset": "fashion_mnist_lt",
            "data.train_path": str(root),
            "data.imbalance_factor": 10,
            "data.lt_n_max": 30,
            "data.num_classes": 10,
            "knn_eval.enabled": True,
            "augmentations.0.crop_size": 28,
        },
    )
    cfg.data.pop("synthetic")
    out = run(cfg)
    metrics = json.loads((Path(out["run_dir"]) / "metrics.json").read_text())
    assert {"knn_acc1", "knn_acc1_many", "knn_acc1_medium", "knn_acc1_few"} <= set(metrics)
    args = json.loads((Path(out["run_dir"]) / "args.json").read_text())
    assert args["data"]["train_class_counts"][0] == 30


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("missing", "no t10k-labels-idx1-ubyte (or t10k-labels-idx1-ubyte.gz)"),
        ("magic", "train-images-idx3-ubyte.gz: not an IDX file of unsigned bytes"),
        ("size", "t10k-images-idx3-ubyte.gz: 40 images of 28x27"),
        ("count", "train-images-idx3-ubyte.gz: 300 images of 28x28 with 299 labels"),
    ],
)
def test_a_missing_or_malformed_file_is_one_line_naming_it(tmp_path, breakage, message):
    root = write_fashion_mnist(tmp_path / "fm")

    def rewrite(name, change):
        path = root / name
        with gzip.open(path) as f:
            payload = bytearray(f.read())
        change(payload)
        with gzip.open(path, "wb") as f:
            f.write(bytes(payload))

    if breakage == "missing":
        (root / "t10k-labels-idx1-ubyte.gz").unlink()
    elif breakage == "magic":
        rewrite("train-images-idx3-ubyte.gz", lambda p: p.__setitem__(2, 0x0D))  # floats
    elif breakage == "size":
        rewrite("t10k-images-idx3-ubyte.gz", lambda p: p.__setitem__(15, 27))
    else:
        rewrite("train-labels-idx1-ubyte.gz", lambda p: p.__setitem__(7, 43))  # 299
    with pytest.raises(ConfigError) as err:
        data_cfg(root)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_truncated_file_is_one_line_naming_it(tmp_path):
    """The header is sound but the data stops early: the read names the file."""
    root = write_fashion_mnist(tmp_path / "fm", gz=False)
    path = root / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    data = data_cfg(root, "fashion_mnist")
    with pytest.raises(ConfigError, match=f"^{path}: 235100 bytes of data, its header"):
        build_dataset(data, "train", None)


def test_lt_n_max_above_a_class_is_one_line(tmp_path):
    root = write_fashion_mnist(tmp_path / "fm")
    with pytest.raises(ConfigError, match="^data.lt_n_max=6001: data.dataset='fashion_mnist_lt'"):
        data_cfg(root, lt_n_max=6001)


def test_make_lt_writes_the_long_tailed_split_as_an_image_folder(tmp_path):
    """solo-ext-make-lt on the IDX files: the profile's images as 28 px RGB PNGs per class, the
    balanced test split, and counts.json with the profile."""
    from PIL import Image

    from solo_ext.commands import make_lt
    from solo_ext.data.longtail import lt_counts

    root = write_fashion_mnist(tmp_path / "fm")
    out = tmp_path / "lt"
    make_lt.run(["--dataset", "fashion_mnist_lt", "--train_path", str(root), "--lt_n_max", "30",
                 "--imbalance_factor", "10", "--out", str(out)])  # fmt: skip
    counts = json.loads((out / "counts.json").read_text())["train_counts"]
    assert counts == lt_counts(30, 10, 10)
    folders = sorted((out / "train").iterdir())
    assert [len(list(f.iterdir())) for f in folders] == counts
    assert [len(list(f.iterdir())) for f in sorted((out / "val").iterdir())] == [4] * 10
    image = Image.open(next(folders[0].iterdir()))
    assert image.mode == "RGB" and image.size == (28, 28)
