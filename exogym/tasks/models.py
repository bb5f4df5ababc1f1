"""Models that follow exogym's contract: ``model(batch)`` returns the loss.

:class:`Classifier` wraps any network that maps inputs to logits, plus a loss function, into that
form; in eval mode it also reports accuracy. :class:`MnistCNN` is the MNIST task's network.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Classifier", "MnistCNN"]


class Classifier(nn.Module):
    """``(inputs, targets)`` batch -> ``{"loss": ...}``, plus ``"accuracy"`` in eval mode.

    Args:
        net: maps a batch of inputs to logits ``[B, C]``.
        loss_fn: ``loss_fn(logits, targets) -> scalar`` (default: cross-entropy).
    """

    def __init__(
        self, net: nn.Module, loss_fn: Callable[[Tensor, Tensor], Tensor] = F.cross_entropy
    ) -> None:
        super().__init__()
        self.net = net
        self.loss_fn = loss_fn

    def forward(self, batch: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        x, y = batch
        logits = self.net(x)
        out = {"loss": self.loss_fn(logits, y)}
        if not self.training:
            out["accuracy"] = (logits.argmax(dim=-1) == y).float().mean()
        return out


class MnistCNN(nn.Module):
    """Two 5x5 conv + max-pool blocks (16, 32 channels), then 1568 -> 128 -> 10: 215,370 parameters.

    Input ``[B, 1, 28, 28]``, output logits ``[B, 10]``.
    """

    def __init__(self, num_classes: int = 10, channels: tuple[int, int] = (16, 32),
                 hidden: int = 128) -> None:
        super().__init__()
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),   # (B, c1, 14, 14)
            nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),  # (B, c2, 7, 7)
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(c2 * 7 * 7, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))

