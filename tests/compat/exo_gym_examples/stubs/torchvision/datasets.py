"""``torchvision.datasets.MNIST`` for tests: MNIST read from ``$EXOGYM_DATA_DIR/mnist``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import Tensor
from torch.utils.data import Dataset

from exogym.tasks.data.mnist import read_idx


class MNIST(Dataset):
    """torchvision's ``MNIST(root, train, transform=None, download=False)``: item ``i`` is
    ``(transform(image), label)``, the image a ``uint8`` tensor ``[1, 28, 28]`` (where
    torchvision gives a PIL image; the stand-in transforms take either form's place).

    ``root`` and ``download`` are accepted and unused: the IDX files come from
    ``$EXOGYM_DATA_DIR/mnist``. ``$EXOGYM_STUB_MNIST_LIMIT`` keeps the first that many samples
    of each split (a test's budget); unset: all of them.
    """

    def __init__(self, root: str, train: bool = True, transform: Callable[[Any], Any] | None = None,
                 download: bool = False) -> None:
        folder = Path(os.environ["EXOGYM_DATA_DIR"]) / "mnist"
        split = "train" if train else "t10k"
        images = read_idx(folder / f"{split}-images-idx3-ubyte.gz")
        labels = read_idx(folder / f"{split}-labels-idx1-ubyte.gz")
        limit = int(os.environ.get("EXOGYM_STUB_MNIST_LIMIT", len(labels)))
        self.data: Tensor = images[:limit]
        self.targets: Tensor = labels[:limit].long()
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        image: Any = self.data[i].unsqueeze(0)  # [1, 28, 28] uint8
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.targets[i])
