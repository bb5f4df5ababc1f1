"""Scaffolding of the closed-form strategy tests: tiny float64 models stacked on N nodes,
gradients written by hand, ``strategy.step`` called directly, expectations worked out in each
test's comments; and a timeline that hears whom a test says (:class:`Heard`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from exogym.sim.comm import InProcessCommunicator
from exogym.sim.engine import NodeStack
from exogym.strategy.base import StackedStrategy
from exogym.strategy.optim import OptimSpec

F64 = torch.float64
TOL = {"rtol": 0.0, "atol": 1e-12}


def t(rows, dtype: torch.dtype = F64) -> Tensor:
    return torch.tensor(rows, dtype=dtype)


class Vec(nn.Module):
    """One parameter vector ``w``; optionally a BatchNorm that only adds buffers."""

    def __init__(self, values, *, dtype: torch.dtype = F64, bn: bool = False) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(list(values), dtype=dtype))
        if bn:
            self.bn = nn.BatchNorm1d(2, affine=False).to(dtype)

    def forward(self, x: Tensor) -> Tensor:  # never called: gradients are set by hand
        return (self.w * x).sum()


def sgd(lr: float, momentum: float = 0.0) -> OptimSpec:
    return OptimSpec(name="sgd", lr=lr, momentum=momentum)


def stack(
    strategy: StackedStrategy, model: nn.Module, n: int = 2, total_steps: int = 100,
    seed: int = 0,
) -> tuple[NodeStack, InProcessCommunicator]:
    """``model`` on ``n`` nodes (loop engine), set up with ``strategy`` for ``total_steps`` in
    a run of seed ``seed``."""
    nodes = NodeStack(model, n, engine="loop")
    comm = InProcessCommunicator(n)
    strategy.setup(nodes, comm, total_steps, seed=seed)
    return nodes, comm


def build(
    strategy: StackedStrategy, values, *, n: int = 2, bn: bool = False, total_steps: int = 100,
    seed: int = 0,
) -> tuple[NodeStack, InProcessCommunicator]:
    """:func:`stack` of a :class:`Vec` holding ``values``."""
    return stack(strategy, Vec(values, bn=bn), n, total_steps, seed)


@torch.no_grad()
def set_rows(tensor: Tensor, rows) -> None:
    tensor.copy_(torch.tensor(rows, dtype=tensor.dtype))


def step_with(strategy: StackedStrategy, nodes: NodeStack, grads, step: int) -> None:
    """Write the per-node gradients of ``w`` by hand, then the strategy's step ``step``."""
    set_rows(nodes.grads["w"], grads)
    with torch.no_grad():
        strategy.step(step)


class Heard:
    """Who is heard (a communicator's ``attendance.heard``): exactly ``heard`` (``N`` booleans) at
    every synchronisation."""

    def __init__(self, heard: list[bool]) -> None:
        self.heard = heard

    def __call__(self, active: list[bool] | None, deadline: str | None) -> list[bool] | None:
        return None if all(self.heard) else self.heard
