"""EXO Gym's README, "Custom Algorithms" (github.com/exo-explore/gym, README.md), to the letter:
its per-node gradient quantization, with the imports its scripts use (``from exogym.strategy
import Strategy``: EXO Gym's per-node base). The tests run it on the simulator and under
torchrun."""
# ruff: noqa

from typing import Literal

import torch

from exogym.strategy import Strategy
from exogym.strategy.communicate import all_reduce


class QuantizationStrategy(Strategy):
    def __init__(self, optim_spec, quantization_level: Literal['int8']):
        super().__init__()
        self.optim_spec = optim_spec
        self.scale = 0.024
        self.zero_point = 0
        self.qdtype = torch.uint8

    def step(self):
        for param in self.model.parameters():
            if param.grad is not None:
                quantized = torch.round(param.grad / self.scale + self.zero_point).clamp(0, 255).to(self.qdtype)
                
                q_wide = quantized.to(torch.int32)
                all_reduce(q_wide)
                
                param.grad = (q_wide.to(torch.float32) * self.scale) / self.num_nodes

        self.optim.step()
        super().step()
