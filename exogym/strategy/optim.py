"""Inner optimizers and learning-rate schedules, as small validated configs.

The engine keeps every parameter as one node-stacked tensor ``[N, *shape]``, and one
``torch.optim`` optimizer steps all of them. That equals N independent optimizers exactly when the
optimizer's update is elementwise (each entry depends only on its own gradient history), which is
true of every optimizer offered here. Optimizers with cross-entry statistics (LAMB's per-tensor
trust ratio, Shampoo, Muon) would mix the nodes and are rejected by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch

from exogym.utils.validation import check_int, check_number

__all__ = ["OPTIMIZERS", "LRSchedule", "OptimSpec"]

# Elementwise torch optimizers: stacking N replicas into one tensor leaves each replica's update
# unchanged (bias corrections use the step count, which every node shares).
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adamw": torch.optim.AdamW,
    "adam": torch.optim.Adam,
    "sgd": torch.optim.SGD,
}


@dataclass(kw_only=True)
class OptimSpec:
    """The inner (per-node) optimizer.

    Attributes:
        name: one of ``adamw``, ``adam``, ``sgd``.
        lr: learning rate (the peak value when a schedule is used).
        weight_decay: decoupled for AdamW, L2 for Adam and SGD (torch semantics).
        betas: Adam's (beta1, beta2).
        eps: Adam's epsilon.
        momentum: SGD momentum.
        nesterov: SGD Nesterov momentum (needs momentum > 0).
    """

    name: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    momentum: float = 0.0
    nesterov: bool = False

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(
                f"optimizer name must be one of {sorted(OPTIMIZERS)}, got {self.name!r}"
            )
        check_number("lr", self.lr, lo=0.0, lo_open=True)
        check_number("weight_decay", self.weight_decay, lo=0.0)
        check_number("eps", self.eps, lo=0.0, lo_open=True)
        self.betas = tuple(self.betas)  # type: ignore[assignment]
        if len(self.betas) != 2:
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        for i, beta in enumerate(self.betas):
            check_number(f"betas[{i}]", beta, lo=0.0, hi=1.0, hi_open=True)
        check_number("momentum", self.momentum, lo=0.0, hi=1.0, hi_open=True)
        if not isinstance(self.nesterov, bool):
            raise ValueError(f"nesterov must be True or False, got {self.nesterov!r}")
        if self.nesterov and (self.name != "sgd" or self.momentum == 0.0):
            raise ValueError("nesterov=True needs name='sgd' and momentum > 0")

    @property
    def states_per_parameter(self) -> int:
        """Tensors of optimizer state per parameter tensor (Adam: 2 moments; SGD: momentum)."""
        if self.name in ("adam", "adamw"):
            return 2
        return 1 if self.momentum else 0

    def build(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        """The torch optimizer over ``params`` (node-stacked tensors)."""
        kwargs: dict[str, Any] = {"lr": self.lr, "weight_decay": self.weight_decay}
        if self.name in ("adam", "adamw"):
            kwargs.update(betas=self.betas, eps=self.eps)
        else:
            kwargs.update(momentum=self.momentum, nesterov=self.nesterov)
        return OPTIMIZERS[self.name](params, **kwargs)


@dataclass(kw_only=True)
class LRSchedule:
    """Linear warm-up, then optionally cosine decay, as a multiplier of the peak lr.

    For step ``t`` (0-based, the step about to be taken), ``W = warmup_steps``, ``T`` the total
    number of training steps and ``r = min_lr_ratio``::

        factor(t) = (t + 1) / W                                   if t < W
                  = r + (1 - r) * (1 + cos(pi * (t - W) / (T - W))) / 2   if cosine, t >= W
                  = 1                                             otherwise

    Attributes:
        warmup_steps: steps of linear warm-up from ``lr / W`` to ``lr``.
        cosine: decay from ``lr`` to ``min_lr_ratio * lr`` over the remaining steps.
        min_lr_ratio: the final lr as a fraction of the peak.
    """

    warmup_steps: int = 0
    cosine: bool = False
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        check_int("warmup_steps", self.warmup_steps, 0)
        if not isinstance(self.cosine, bool):
            raise ValueError(f"cosine must be True or False, got {self.cosine!r}")
        check_number("min_lr_ratio", self.min_lr_ratio, lo=0.0, hi=1.0)

    @property
    def active(self) -> bool:
        return self.warmup_steps > 0 or self.cosine

    def factor(self, t: int, total_steps: int) -> float:
        w = self.warmup_steps
        if t < w:
            return (t + 1) / w
        if not self.cosine:
            return 1.0
        span = max(total_steps - w, 1)
        progress = min((t - w) / span, 1.0)
        r = self.min_lr_ratio
        return r + (1.0 - r) * 0.5 * (1.0 + math.cos(math.pi * progress))


def field_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]
