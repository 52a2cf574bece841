"""Fashion-MNIST from a folder of its four IDX files (Xiao et al., 2017), ``.gz`` or not.

Debian's ``dataset-fashion-mnist`` installs them in ``/usr/share/datasets/fashion-mnist``;
torchvision's ``FashionMNIST(download=True)`` puts them in ``<root>/FashionMNIST/raw``. Either
folder works as ``data.train_path``. The images are 28x28 grey; they are given as RGB (the grey
value in the three channels), so that every pipeline, solo-learn's included, takes them as it
takes CIFAR's.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable

import numpy as np
import torch
from PIL import Image
from torchvision import datasets as tvd

from solo_ext.config import ConfigError

# the files of each split: (images, labels)
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
TORCHVISION_LAYOUT = os.path.join("FashionMNIST", "raw")  # where torchvision downloads them
_UBYTE = 0x08  # the IDX type code of unsigned bytes


def idx_folder(root: str) -> str | None:
    """The folder under ``root`` that holds the IDX files (``root`` itself or torchvision's
    layout); None when neither holds the training images."""
    for folder in (root, os.path.join(root, TORCHVISION_LAYOUT)):
        if idx_path(folder, IDX_FILES["train"][0]) is not None:
            return folder
    return None


def idx_path(folder: str, name: str) -> str | None:
    """``folder/name`` or ``folder/name.gz``, whichever exists."""
    for candidate in (name, name + ".gz"):
        path = os.path.join(folder, candidate)
        if os.path.isfile(path):
            return path
    return None


def _open(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _header(path: str, head: bytes, dims: int) -> list[int]:
    """The sizes an IDX header gives, after checking its magic number; ConfigError naming the
    file otherwise."""
    if len(head) < 4 + 4 * dims or head[0:2] != b"\0\0" or head[2] != _UBYTE or head[3] != dims:
        raise ConfigError(
            f"{path}: not an IDX file of unsigned bytes with {dims} dimension(s) (its header "
            f"reads {head[:4].hex()})"
        )
    return [int.from_bytes(head[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]


def read_idx(path: str, dims: int) -> np.ndarray:
    """The array of an IDX file of unsigned bytes; ConfigError naming the file when it is not
    one, is truncated or is not a valid gzip stream."""
    try:
        with _open(path) as f:
            data = f.read()
    except (OSError, EOFError) as err:
        raise ConfigError(f"{path}: unreadable ({err})") from None
    shape = _header(path, data, dims)
    offset = 4 + 4 * dims
    expected = int(np.prod(shape))
    if len(data) - offset != expected:
        raise ConfigError(
            f"{path}: {len(data) - offset} bytes of data, its header {shape} needs {expected}"
        )
    return np.frombuffer(data, np.uint8, offset=offset).reshape(shape)


def check_idx_folder(root: str, key: str) -> None:
    """Every one of the four files is there and starts with the header of its kind (28x28
    images, labels of as many items): one line naming the missing or malformed file."""
    folder = idx_folder(root) or root
    for split, (images, labels) in IDX_FILES.items():
        sizes, paths = [], []
        for name, dims in ((images, 3), (labels, 1)):
            path = idx_path(folder, name)
            if path is None:
                raise ConfigError(
                    f"{key}={root!r}: no {name} (or {name}.gz) in {folder!r}; the four "
                    "Fashion-MNIST IDX files are needed (Debian: apt-get install "
                    "dataset-fashion-mnist; or set data.download=true)"
                )
            try:
                with _open(path) as f:
                    head = f.read(4 + 4 * dims)
            except (OSError, EOFError) as err:
                raise ConfigError(f"{path}: unreadable ({err})") from None
            sizes.append(_header(path, head, dims))
            paths.append(path)
        (n, height, width), (n_labels,) = sizes
        if (height, width) != (28, 28) or n != n_labels:
            raise ConfigError(
                f"{paths[0]}: {n} images of {height}x{width} with "
                f"{n_labels} labels ({split} split); Fashion-MNIST has 28x28 images, one label "
                "each"
            )


class FashionMNISTFolder(tvd.FashionMNIST):
    """torchvision's ``FashionMNIST`` read from ``root`` (a folder of the IDX files, ``.gz`` or
    not, or torchvision's own layout under it); items are (RGB PIL image, label)."""

    def __init__(
        self,
        root: str,
        train: bool = True,
        transform: Callable | None = None,
        download: bool = False,
    ):
        super().__init__(root, train=train, transform=transform, download=download)

    @property
    def raw_folder(self) -> str:
        return idx_folder(self.root) or os.path.join(self.root, TORCHVISION_LAYOUT)

    def _check_exists(self) -> bool:
        return all(
            idx_path(self.raw_folder, name) is not None
            for files in IDX_FILES.values()
            for name in files
        )

    def _load_data(self) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = IDX_FILES["train" if self.train else "val"]
        data = read_idx(idx_path(self.raw_folder, images), 3)
        targets = read_idx(idx_path(self.raw_folder, labels), 1)
        if targets.size and int(targets.max()) >= len(self.classes):
            raise ConfigError(
                f"{idx_path(self.raw_folder, labels)}: label {int(targets.max())}, "
                f"Fashion-MNIST has {len(self.classes)} classes"
            )
        return torch.from_numpy(data.copy()), torch.from_numpy(targets.astype(np.int64))

    def __getitem__(self, index: int):
        image = Image.fromarray(self.data[index].numpy()).convert("RGB")  # (uint8 [28, 28]: "L")
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.targets[index])
