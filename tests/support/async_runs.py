"""The hand-computed traces of the asynchronous methods (test_async.py, and the server's link in
test_async_clock.py): a model whose gradient is 1 whatever the data (``loss = w * mean(x)``,
``x = 1``), SGD with lr 1/8, and a network with no latency and all but infinite bandwidth, so
that every number of a trace is a dyadic fraction, compared for equality."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from exogym import Trainer
from exogym.strategy.optim import OptimSpec

FAST = "bw=1000000Gbps,latency=0s,efficiency=1,hop_latency=0s"


class Slope(nn.Module):
    """``loss = w . mean(x)``: the gradient is ``mean(x)`` (1 with the data below)."""

    def __init__(self, w: float = 1.0) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([w]))

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, _ = batch
        return (self.w * x.mean()).sum()


def ones() -> TensorDataset:
    return TensorDataset(torch.ones(64, 1), torch.zeros(64))


def async_run(strategy, *, nodes: int = 2, steps: int = 4, speeds: str = "1:0.5",
              network: str = FAST, model: nn.Module | None = None, **extra):
    """``strategy`` on ``nodes`` nodes of the given ``speeds`` (1 s a step at speed 1), batch 2,
    a row a step, one evaluation at the end."""
    return Trainer(model or Slope(), ones(), ones()).fit(
        strategy=strategy, num_nodes=nodes, max_steps=steps, batch_size=2, network=network,
        world=f"speed={speeds}" if speeds else None, step_time=1.0, progress=False,
        log_interval=1, eval_interval=steps, **extra)


def sgd(lr: float = 0.125) -> OptimSpec:
    return OptimSpec(name="sgd", lr=lr)
