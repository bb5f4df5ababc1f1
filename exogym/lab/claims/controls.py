"""The claims suite's negative control: a method broken on purpose, which the suite's rules must
find not reproduced (a suite whose rules cannot tell it from DiLoCo decides nothing).

:class:`DiLoCoWithoutOuterStep` is DiLoCo whose outer step drops the pseudo-gradient: every
``H`` steps the nodes send it (the bytes and time are DiLoCo's), the global model does not move,
and every node restarts from it: the model the run deploys is the initial one, and each round's
local progress is thrown away. Configs name it by its path
(``exogym.lab.claims.controls:DiLoCoWithoutOuterStep``); it is not in the strategy registry.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from exogym.strategy.base import restart_rows
from exogym.strategy.diloco import DiLoCo

__all__ = ["DiLoCoWithoutOuterStep"]


@dataclass(kw_only=True)
class DiLoCoWithoutOuterStep(DiLoCo):
    """DiLoCo whose outer step drops the pseudo-gradient (the negative control).

    Attributes:
        H: inner steps per outer step, as DiLoCo's.
    """

    id = "diloco-without-outer-step"

    @torch.no_grad()
    def outer_step(self) -> None:
        """DiLoCo's communication (the same collective, bytes and time), then no update: every
        node restarts from the unchanged global model."""
        self.outer_steps += 1
        names = list(self.nodes.params)
        local = [self.nodes.params[k] for k in names]
        pseudo = [self.global_params[k].unsqueeze(0) - p for k, p in zip(names, local, strict=True)]
        _, buffer_means = self.all_reduce_with_buffers(
            pseudo, list(self.nodes.float_buffers.values()), "mean", tag="pseudo_grads")
        for k, p in zip(names, local, strict=True):
            restart_rows(p, self.global_params[k])
        self.adopt_buffers(buffer_means, self.global_buffers)
