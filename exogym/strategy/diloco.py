"""DiLoCo: H local AdamW steps per node, then an outer Nesterov step on the mean pseudo-gradient.

Reference: A. Douillard, Q. Feng, A. A. Rusu, R. Chhaparia, Y. Donchev, A. Kuncoro, M. Ranzato,
A. Szlam, J. Shen, "DiLoCo: Distributed Low-Communication Training of Language Models",
arXiv:2311.08105 (Algorithm 1).

With ``k`` nodes and the global parameters ``theta^(t-1)``, each outer step ``t``:

1. every node ``i`` starts from ``theta^(t-1)`` and takes ``H`` inner steps on its own data with
   the inner optimizer (AdamW), reaching ``theta_i^(t)``;
2. outer gradient: ``Delta^(t) = (1/k) sum_i (theta^(t-1) - theta_i^(t))`` (one all-reduce);
3. ``theta^(t) = OuterOpt(theta^(t-1), Delta^(t))``, with OuterOpt SGD with Nesterov momentum,
   learning rate 0.7 and momentum 0.9 (the paper's values), in ``torch.optim.SGD``'s form:
   ``b <- mu b + Delta; theta <- theta - eta (Delta + mu b)`` (first step: ``b = Delta``);
4. every node's parameters are replaced by ``theta^(t)``; each node keeps its own inner optimizer
   state across outer steps.

The paper trains transformers (no BatchNorm); here floating-point buffers are averaged across nodes
at each outer step and become the global model's buffers. The global model evaluated between outer
steps is ``theta^(t)`` from the last one. The paper's ``H`` is 500; the default here is 100, as in
the EXO Gym examples, for short runs.

Sent per outer step (every ``H`` steps) by each node: ``2 (N-1)/N * (P + B)`` bytes (ring
all-reduce of the fp32 pseudo-gradient, ``P`` = parameter bytes, and of the float buffers,
``B`` bytes); nothing in between.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from exogym.strategy.base import Strategy, in_range, positive_int

__all__ = ["DiLoCo"]


@dataclass(kw_only=True)
class DiLoCo(Strategy):
    """Distributed low-communication training (inner AdamW, outer Nesterov SGD every H steps).

    Attributes:
        H: inner steps per outer step (the paper's H; 500 in the paper).
        outer_lr: the outer optimizer's learning rate (0.7 in the paper).
        outer_momentum: the outer optimizer's momentum (0.9 in the paper).
        nesterov: Nesterov momentum for the outer SGD (the paper's choice); False gives heavy-ball.
    """

    id = "diloco"
    H: int = 100
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int("H", self.H)
        in_range("outer_lr", self.outer_lr, 0.0, float("inf"), lo_open=True)
        in_range("outer_momentum", self.outer_momentum, 0.0, 1.0, hi_open=True)
        if self.nesterov and self.outer_momentum == 0.0:
            raise ValueError("nesterov=True needs outer_momentum > 0")

    def init_state(self) -> None:
        state = self.nodes.node_state(0)
        self.global_params = {k: state[k].clone() for k in self.nodes.params}
        self.global_buffers = {k: state[k].clone() for k in self.nodes.buffers}
        self.outer_optimizer = torch.optim.SGD(
            list(self.global_params.values()),
            lr=self.outer_lr,
            momentum=self.outer_momentum,
            nesterov=self.nesterov,
        )

    @torch.no_grad()
    def step(self, step: int) -> None:
        self.inner_step()
        if (step + 1) % self.H == 0:
            self.outer_step()

    @torch.no_grad()
    def outer_step(self) -> None:
        """Average the pseudo-gradients, step the global copy, restart every node from it."""
        names = list(self.nodes.params)
        local = [self.nodes.params[k] for k in names]
        buffers = list(self.nodes.float_buffers.values())
        # Delta_i = theta^(t-1) - theta_i^(t), node-stacked: [N, *shape].
        pseudo = [self.global_params[k].unsqueeze(0) - p for k, p in zip(names, local, strict=True)]
        reduced = self.comm.all_reduce(pseudo + buffers, "mean", tag="pseudo_grads")
        for k, delta in zip(names, reduced[: len(names)], strict=True):
            self.global_params[k].grad = delta
        self.outer_optimizer.step()
        self.outer_optimizer.zero_grad(set_to_none=True)
        for k, p in zip(names, local, strict=True):
            p.copy_(self.global_params[k].expand_as(p))
        for (k, b), mean in zip(self.nodes.float_buffers.items(), reduced[len(names):],
                                strict=True):
            b.copy_(mean.expand_as(b))
            self.global_buffers[k].copy_(mean)
        for k, b in self.nodes.buffers.items():
            if not b.is_floating_point():
                self.global_buffers[k].copy_(b[0])

    def global_state(self) -> dict[str, Tensor]:
        out = {k: v.clone() for k, v in self.global_params.items()}
        out.update({k: v.clone() for k, v in self.global_buffers.items()})
        return out
