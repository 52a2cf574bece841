"""The DALI loaders driven by solo-ext's samplers, on DALI's CPU operators (no GPU needed).

Checked here: the labels and dataset indexes a DALI loader reads over an epoch are the sampler's
order for that epoch (every sampler; epochs started mid-way and resumed), their per-class counts
follow the sampler's law (the samplers' frequency test, on the DALI path), two ranks read
disjoint shares of one global order, files are decoded as PIL reads them and in-memory images
pass as they are, solo-ext's DALI augmentation graph does what each key says, the long-tailed
datasets by name, both of solo-ext's commands end to end, and bad input stops in one line.
The GPU parts (mixed decoding, GPU augmentations) are left to a GPU run.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (pip install '.[dali]')")

import nvidia.dali.fn as fn  # noqa: E402
import nvidia.dali.types as types  # noqa: E402
from conftest import tiny_cfg  # noqa: E402
from test_datasets import cifar_folder, write_images  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

from solo_ext.config import ConfigError  # noqa: E402
from solo_ext.data import dali  # noqa: E402
from solo_ext.data.dali import DALIAugmentation, DALILoader  # noqa: E402
from solo_ext.data.datasets import build_dataset, fill_data_cfg  # noqa: E402
from solo_ext.data.samplers import SAMPLERS, build_sampler  # noqa: E402
from solo_ext.methods.registry import SOLO_EXT_METHODS  # noqa: E402

COUNTS = [40, 16, 6, 2]
OWN_KWARGS = {"sqrt": {"power": 0.5}, "progressive": {"total_epochs": 4}}


class Tiny(Dataset):
    """In-memory 4x4 images whose pixels hold the item's index (R) and label (G)."""

    def __init__(self, counts=COUNTS, size: int = 4):
        rng = np.random.default_rng(0)
        self.targets = rng.permutation([c for c, n in enumerate(counts) for _ in range(n)])
        self.targets = self.targets.tolist()
        self.size = size

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int):
        pixels = np.zeros((self.size, self.size, 3), dtype=np.uint8)
        pixels[..., 0], pixels[..., 1] = i % 256, self.targets[i]
        return Image.fromarray(pixels), self.targets[i]


def plain(images):
    """No augmentation: the pixels as float, CHW."""
    return [fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW")]


def sampler_of(name, labels, **kwargs):
    return build_sampler(name, labels, **{**OWN_KWARGS.get(name, {}), "seed": 3, **kwargs})


def loader(dataset, sampler, transforms=plain, batch_size=8, kind="pretrain") -> DALILoader:
    return DALILoader(
        dataset, dataset.targets, sampler, transforms, kind=kind, batch_size=batch_size,
        device="cpu", num_threads=1, seed=0,
    )  # fmt: skip


def read_epoch(dl: DALILoader, epoch: int) -> tuple[list[int], list[int], list[torch.Tensor]]:
    """What ``dl`` gives for ``epoch`` (as Lightning sets it): indexes, labels, first crops."""
    dl.sampler.set_epoch(epoch)
    indexes, labels, crops = [], [], []
    for index, views, target in dl:
        indexes += index.tolist()
        labels += target.tolist()
        crops.append(views[0])
    return indexes, labels, crops


def expected(name, labels, epoch, n, **kwargs) -> list[int]:
    s = sampler_of(name, labels, **kwargs)
    s.set_epoch(epoch)
    return list(s)[:n]


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_each_epoch_reads_the_samplers_order(name):
    data = Tiny()
    dl = loader(data, sampler_of(name, data.targets, num_replicas=1, rank=0))
    assert len(dl) == len(data) // 8
    for epoch in (0, 1, 3):
        indexes, labels, crops = read_epoch(dl, epoch)
        assert indexes == expected(name, data.targets, epoch, len(dl) * 8, num_replicas=1, rank=0)
        assert labels == [data.targets[i] for i in indexes]
        # the pixels are the item's own: index in R, label in G
        pixels = torch.cat(crops)
        assert pixels[:, 0, 0, 0].long().tolist() == [i % 256 for i in indexes]
        assert pixels[:, 1, 0, 0].long().tolist() == labels


def test_an_epoch_left_half_way_and_a_resumed_epoch_read_their_own_order():
    data = Tiny()
    dl = loader(data, sampler_of("class_balanced", data.targets, num_replicas=1, rank=0))
    dl.sampler.set_epoch(0)
    for n, _ in enumerate(dl):  # limit_train_batches: the epoch stops after two batches
        if n == 1:
            break
    for epoch in (1, 2, 7):  # the next epoch, then a jump (a resumed run)
        indexes, _, _ = read_epoch(dl, epoch)
        assert indexes == expected("class_balanced", data.targets, epoch, len(dl) * 8)


@pytest.mark.parametrize(
    ("name", "epoch"), [("class_balanced", 0), ("sqrt", 0), ("progressive", 2)]
)
def test_per_class_counts_follow_the_samplers_law(name, epoch):
    """The samplers' frequency test on what DALI reads: each class within 5 sd of p_c."""
    data = Tiny()
    n = 6000
    s = sampler_of(name, data.targets, num_samples=n, num_replicas=1, rank=0)
    _, labels, _ = read_epoch(loader(data, s, batch_size=100), epoch)
    assert len(labels) == n
    probs = s.class_probabilities().tolist()
    for hits, p in zip(np.bincount(labels, minlength=len(COUNTS)), probs):
        assert abs(hits / n - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-12, (hits / n, p)
    if name == "class_balanced":  # far from the data's own profile (62 % / 3 %)
        assert np.bincount(labels)[-1] / n > 0.2


def test_two_ranks_read_disjoint_shares_of_one_global_order():
    data = Tiny()
    reads = []
    for rank in (0, 1):
        s = sampler_of("sqrt", data.targets, num_replicas=2, rank=rank)
        reads.append(read_epoch(loader(data, s, batch_size=4), 1)[0])
    whole = expected("sqrt", data.targets, 1, len(data), num_replicas=1, rank=0)
    n = len(reads[0])
    assert len(reads[1]) == n == len(data) // 2 // 4 * 4
    # rank r reads positions r, r + 2, ... of the one global order
    assert reads[0] == whole[0 : 2 * n : 2] and reads[1] == whole[1 : 2 * n : 2]


def test_files_are_decoded_by_dali_as_pil_reads_them(tmp_path):
    from torchvision.datasets import ImageFolder

    pixels = write_images(tmp_path, [5, 3, 2])
    data = ImageFolder(str(tmp_path))
    dl = loader(data, sampler_of("instance", data.targets), batch_size=2)
    assert dl.reader.encoded
    indexes, labels, crops = read_epoch(dl, 0)
    assert sorted(indexes) == list(range(10)) and labels == [data.targets[i] for i in indexes]
    got = torch.cat(crops)
    for row, i in enumerate(indexes):
        torch.testing.assert_close(got[row], torch.from_numpy(pixels[i]).permute(2, 0, 1).float())


def augmented(aug: dict, image: np.ndarray, n: int = 4) -> torch.Tensor:
    """``n`` outputs of solo-ext's DALI graph for one image (pixel values: mean 0, std 1/255)."""

    class One(Dataset):
        targets = [0] * n

        def __len__(self):
            return n

        def __getitem__(self, i):
            return Image.fromarray(image), 0

    entry = OmegaConf.create({"num_crops": 1, "mean": [0, 0, 0], "std": [1 / 255] * 3, **aug})
    graph = DALIAugmentation("custom", entry)
    dl = loader(One(), sampler_of("instance", One.targets), lambda im: [graph(im)], n)
    return read_epoch(dl, 0)[2][0]


GRADIENT = np.stack(
    [np.tile(np.arange(0, 256, 32, dtype=np.uint8), (8, 1))] * 3, axis=-1
) + np.array([0, 5, 11], dtype=np.uint8)
NO_CROP = {"crop_size": 8, "rrc": {"enabled": False}, "horizontal_flip": {"prob": 0.0}}


def chw(image: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(image).permute(2, 0, 1).float()


def test_graph_without_augmentation_is_the_image():
    out = augmented(NO_CROP, GRADIENT)
    for view in out:
        torch.testing.assert_close(view, chw(GRADIENT))


def test_graph_flip_grayscale_and_solarization():
    flipped = augmented({**NO_CROP, "horizontal_flip": {"prob": 1.0}}, GRADIENT)
    torch.testing.assert_close(flipped[0], chw(GRADIENT[:, ::-1].copy()))
    gray = augmented({**NO_CROP, "grayscale": {"prob": 1.0}}, GRADIENT)
    luma = (GRADIENT.astype(np.float64) @ [0.299, 0.587, 0.114]).round()
    for channel in range(3):  # ITU-R 601 luma, as PIL's and torchvision's grayscale
        assert (gray[0][channel] - torch.from_numpy(luma).float()).abs().max() <= 1
    solar = augmented({**NO_CROP, "solarization": {"prob": 1.0}}, GRADIENT)
    want = np.where(GRADIENT >= 128, 255 - GRADIENT, GRADIENT)
    torch.testing.assert_close(solar[0], chw(want))


def test_graph_jitter_and_blur_stay_within_their_ranges():
    bright = augmented(
        {**NO_CROP, "color_jitter": {"prob": 1.0, "brightness": 0.4, "contrast": 0,
                                     "saturation": 0, "hue": 0}},
        np.full((8, 8, 3), 100, dtype=np.uint8), n=16,
    )  # fmt: skip
    factors = bright[:, 0, 0, 0] / 100
    assert (factors >= 0.6 - 0.01).all() and (factors <= 1.4 + 0.01).all()
    assert factors.std() > 0.01  # drawn per image
    checker = (np.indices((8, 8)).sum(0) % 2 * 255).astype(np.uint8)
    checker = np.repeat(checker[..., None], 3, axis=-1)
    blurred = augmented({**NO_CROP, "gaussian_blur": {"prob": 1.0}}, checker, n=16)
    spread = blurred.std(dim=(1, 2, 3))  # sigma U(0.1, 2): from no visible blur to grey
    assert (spread <= chw(checker).std() + 1e-3).all() and spread.min() < 30


def test_random_resized_crop_keeps_the_size():
    out = augmented({"crop_size": 6, "rrc": {"crop_min_scale": 0.5}}, GRADIENT)
    assert out.shape == (4, 3, 6, 6)


def test_equalization_stops_in_one_line():
    with pytest.raises(ConfigError, match=r"equalization.prob=0.5: DALI has no random"):
        DALIAugmentation(
            "custom", OmegaConf.create({"crop_size": 8, "equalization": {"prob": 0.5}})
        )


# --- datasets by name ------------------------------------------------------------------------


def read_by_name(sampler: str, batch_size: int, **data):
    """The training set ``data`` names (format dali), its first epoch through a DALI loader
    (whose labels are the set's own): the set, whether files were read, indexes, crops."""
    cfg = fill_data_cfg(OmegaConf.create({"data": {**data, "format": "dali"}}))
    train = build_dataset(cfg.data, "train", None)
    dl = loader(train, sampler_of(sampler, train.targets), batch_size=batch_size)
    indexes, labels, crops = read_epoch(dl, 0)
    assert labels == [train.targets[i] for i in indexes]
    return train, dl.reader.encoded, indexes, torch.cat(crops)


def test_cifar_lt_by_name_reads_the_arrays(tmp_path, monkeypatch):
    root = cifar_folder(tmp_path, monkeypatch, "cifar10", [20] * 10, head=20)
    data = {"dataset": "cifar10_lt", "train_path": root, "imbalance_factor": 10}
    train, encoded, indexes, crops = read_by_name("class_balanced", 4, **data)
    assert not encoded
    torch.testing.assert_close(crops[0], chw(np.asarray(train[indexes[0]][0])))


def test_split_file_dataset_by_name_reads_its_files(tmp_path):
    pixels = write_images(tmp_path / "train", [5, 3, 1])
    lines = [f"train/class{c}/{i:03d}.png {c}" for c, n in enumerate([5, 3, 1]) for i in range(n)]
    (tmp_path / "ImageNet_LT_train.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "ImageNet_LT_test.txt").write_text("\n".join(lines) + "\n")
    data = {"dataset": "imagenet_lt", "train_path": str(tmp_path), "num_classes": 3}
    _, encoded, indexes, crops = read_by_name("class_balanced", 3, **data)
    assert encoded
    for row, i in enumerate(indexes):
        torch.testing.assert_close(crops[row], chw(pixels[i]))


def test_custom_lt_by_name_reads_the_kept_files(tmp_path):
    pixels = write_images(tmp_path, [6, 6, 6])
    data = {"dataset": "custom_lt", "train_path": str(tmp_path), "num_classes": 3}
    train, encoded, indexes, crops = read_by_name("sqrt", 3, **data, imbalance_factor=6)
    assert train.class_counts == [6, 2, 1] and encoded
    for row, i in enumerate(indexes):  # the kept item's own file
        torch.testing.assert_close(crops[row], chw(pixels[train.indices[i]]))


# --- both commands, end to end ---------------------------------------------------------------


def dali_cfg(method: str, tmp_path: Path, **overrides):
    cfg = tiny_cfg(method, tmp_path, **overrides)
    cfg.data.format = "dali"
    cfg.dali = {"device": "cpu"}
    cfg.data.sampler = {"name": "class_balanced"}
    cfg.limit_train_batches = 1.0
    return cfg


def test_solo_ext_pretrain_and_linear_with_dali(tmp_path):
    from solo_ext.commands import linear
    from solo_ext.commands.pretrain import run

    result = run(dali_cfg("dscl", tmp_path))
    run_dir = Path(result["run_dir"])
    assert result["metrics"]["train_class_loss"] > 0
    args = OmegaConf.load(run_dir / "args.json")
    assert args.data.format == "dali" and args.data.sampler.name == "class_balanced"
    stage = OmegaConf.load(Path(linear.__file__).parents[1] / "conf" / "linear.yaml")
    stage.update(pretrained_checkpoint_dir=str(run_dir), max_epochs=1, backbone_bn="train")
    stage.update(dali={"device": "cpu"}, enable_progress_bar=False)
    stage.optimizer.batch_size = 8
    out = linear.run(stage)
    assert 0 <= out["linear_acc1"] <= 100 and out["linear_sampler"] == "class_balanced"


@pytest.mark.parametrize("method", sorted(SOLO_EXT_METHODS))
def test_every_method_trains_from_the_dali_loader(method, tmp_path, capsys, caplog):
    """Two steps of each method on DALI's batches; PBSD, whose published patches a DALI loader
    cannot make, cuts them on the device and says so once (when the run's config is read)."""
    from solo_ext.commands.pretrain import run

    cfg = dali_cfg(method, tmp_path)
    cfg.limit_train_batches = 2
    result = run(cfg)
    assert math.isfinite(result["metrics"]["train_class_loss"])
    said = capsys.readouterr()
    said = said.out + said.err + caplog.text
    device_patches = "DALI's reader cannot make the published patches"
    assert said.count(device_patches) == (method == "pbsd")
    if method == "pbsd":
        assert result["model"].cfg.method_kwargs.patch_source == "device"


def test_a_resumed_run_reads_the_order_of_its_epoch(tmp_path, monkeypatch):
    """Stopped after epoch 0 and resumed: the loader gives epoch 1's order of the sampler (the
    epoch Lightning restores), not epoch 0's again."""
    from solo_ext.commands.pretrain import run

    read: list[tuple[int, list[int]]] = []
    iterate = DALILoader.__iter__

    def spied(self):
        for batch in iterate(self):
            read.append((self.sampler.epoch, batch[0].tolist()))
            yield batch

    monkeypatch.setattr(DALILoader, "__iter__", spied)
    first = run(dali_cfg("scl", tmp_path / "a", max_epochs=1))
    (ckpt,) = Path(first["run_dir"]).glob("*.ckpt")
    read.clear()
    run(dali_cfg("scl", tmp_path / "b", max_epochs=2, resume_from_checkpoint=str(ckpt)))
    cfg = first["model"].cfg
    targets = build_dataset(cfg.data, "train", None).targets
    s = build_sampler("class_balanced", targets, seed=cfg.seed, num_replicas=1, rank=0)
    s.set_epoch(1)
    want = list(s)[: len(read) * 8]
    assert {epoch for epoch, _ in read} == {1}
    assert [i for _, batch in read for i in batch] == want


@pytest.mark.parametrize(
    "device,off,message",
    [
        ("gpu", (torch.cuda, "is_available"), r"^dali.device='gpu': no CUDA device here"),
        ("cpu", (dali, "dali_installed"), r"^data.format='dali': NVIDIA DALI is not installed"),
    ],
)
def test_dali_on_gpu_without_cuda_or_not_installed_stops_in_one_line(
    device, off, message, tmp_path, monkeypatch
):
    from solo_ext.commands.pretrain import run

    monkeypatch.setattr(*off, lambda: False)
    cfg = dali_cfg("scl", tmp_path)
    cfg.dali.device = device
    with pytest.raises(ConfigError, match=message):
        run(cfg)
    assert not (tmp_path / "trained_models").exists()
