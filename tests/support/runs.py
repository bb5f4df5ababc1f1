"""The tiny runs several test files share, and the models they train.

- :func:`small`: the overrides that make a strategy synchronise within a 6-step run (``exogym
  check``'s), for the registry-wide tests.
- :class:`TinyBN`: the process engine's model (test_dist.py), also --ft's (test_ft.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from exogym.lab.check import short_period
from exogym.strategy import get


def small(sid: str) -> dict[str, Any]:
    """Overrides that make a strategy synchronise within a 6-step run (``exogym check``'s)."""
    return short_period(get(sid))


class TinyBN(nn.Module):
    """Linear -> BatchNorm -> tanh -> Linear, cross-entropy: parameters, float and int buffers."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.fc1 = nn.Linear(6, 8, bias=False)  # a bias before BatchNorm has no gradient:
        # Adam would turn its round-off-sized gradient into full steps of either sign
        self.bn = nn.BatchNorm1d(8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.fc2(torch.tanh(self.bn(self.fc1(x)))), y)
