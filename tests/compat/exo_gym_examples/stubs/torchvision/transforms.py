"""The torchvision transforms EXO Gym's ``example/mnist.py`` composes, on ``[C, H, W]`` tensors
(the stand-in MNIST's images): ``Compose``, ``RandomAffine`` (rotation and translation),
``ToTensor`` and ``Normalize``, with torchvision's arguments and meaning."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


class Compose:
    """Apply ``transforms`` in order."""

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x


class RandomAffine:
    """A rotation by an angle drawn uniformly in ``[-degrees, degrees]`` and a translation by up to
    ``translate = (a, b)`` of the width and height (drawn uniformly, whole pixels), about the
    centre, nearest pixel, zeros outside; drawn from torch's global generator as torchvision's."""

    def __init__(self, degrees: float, translate: tuple[float, float] | None = None) -> None:
        self.degrees, self.translate = float(degrees), translate

    def __call__(self, image: Tensor) -> Tensor:
        angle = math.radians(float(torch.empty(1).uniform_(-self.degrees, self.degrees)))
        _, h, w = image.shape
        tx = ty = 0.0
        if self.translate is not None:
            mx, my = self.translate[0] * w, self.translate[1] * h
            tx = float(torch.empty(1).uniform_(-mx, mx).round())
            ty = float(torch.empty(1).uniform_(-my, my).round())
        cos, sin = math.cos(angle), math.sin(angle)
        # the grid maps each output pixel back to its input pixel, in [-1, 1] coordinates
        theta = torch.tensor([[cos, -sin, -2 * tx / w], [sin, cos, -2 * ty / h]])
        grid = F.affine_grid(theta.unsqueeze(0), [1, *image.shape], align_corners=False)
        out = F.grid_sample(image.unsqueeze(0).float(), grid, mode="nearest",
                            align_corners=False)
        return out.squeeze(0).to(image.dtype)


class ToTensor:
    """A ``uint8`` image ``[C, H, W]`` as ``float32`` in ``[0, 1]``."""

    def __call__(self, image: Tensor) -> Tensor:
        return image.float().div(255.0)


class Normalize:
    """``(x - mean[c]) / std[c]`` per channel ``c``."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.std
