"""FedProx: FedAvg whose local objective adds a proximal term toward the round's global model.

Reference: T. Li, A. K. Sahu, M. Zaheer, M. Sanjabi, A. Talwalkar, V. Smith, "Federated
Optimization in Heterogeneous Networks", MLSys 2020, arXiv:1812.06127 (Algorithm 2, FedProx).

In round ``t`` every node ``k`` starts from the global model ``w^t`` and (inexactly) minimizes

    h_k(w; w^t) = F_k(w) + (mu / 2) ||w - w^t||^2,

whose gradient is ``grad F_k(w) + mu (w - w^t)``; the server then averages the nodes' models,
``w^{t+1} = (1/N) sum_k w_k^{t+1}``, exactly as FedAvg (:class:`exogym.strategy.fedavg.FedAvg`,
whose rounds, averaging and byte accounting this class reuses). Here the local solver is ``H``
steps of the inner optimizer (AdamW by default; the paper's solver is SGD, ``optim.name=sgd``):
before each inner step, every node's gradient gets ``+ mu (w - w^t)``, with ``w^t`` the model at
the start of the current round (the last average, or the initial model). Clipping
(``max_grad_norm``) applies to that full gradient of ``h_k``. With ``mu = 0`` FedProx is FedAvg.
Every node takes part in every round (the paper's sampling of devices: ``participation``) and
does ``H`` steps, unless ``stragglers`` > 0 (FedAvg's option, the paper's Section 5.2 "systems
heterogeneity"): then that fraction of the nodes, drawn each round, take ``e ~ U{1, ..., H}``
steps and stop (their parameters and optimizer state stay as they are for the rest of the
round), and their partial work is averaged with the others' (FedProx's way; the paper's FedAvg
drops it: ``drop_stragglers=True``). The paper's gamma-inexactness is this: a node solves its
subproblem only as far as its budget allows.

Sent per round (every ``H`` steps) by each node: FedAvg's ``2 (N-1)/N * (P + B)`` bytes (ring
all-reduce of the parameters, ``P`` bytes, and float buffers, ``B`` bytes; a ``codec`` compresses
them as in FedAvg); the proximal term needs no communication (``w^t`` is the last average, which
every node has). MNIST CNN (``P`` = 861,480 bytes, no buffers), ``N = 4``: 1,292,220 bytes per
node per round, 12,922.2 bytes per step at ``H = 100``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from exogym.strategy.base import in_range
from exogym.strategy.fedavg import FedAvg

__all__ = ["FedProx"]


@dataclass(kw_only=True)
class FedProx(FedAvg):
    """FedAvg with the proximal term (mu/2) ||w - w^t||^2 in every node's local objective.

    Attributes:
        mu: weight of the proximal term (the paper's mu; 0 gives FedAvg).
    """

    id = "fedprox"
    mu: float = 0.01

    def __post_init__(self) -> None:
        super().__post_init__()
        in_range("mu", self.mu, 0.0, float("inf"))

    def init_state(self) -> None:
        super().init_state()
        # w^t, the model at the start of the round: [1, *shape], broadcast over the nodes.
        self.round_start: dict[str, Tensor] = {
            k: p[:1].detach().clone() for k, p in self.nodes.params.items()
        }

    @torch.no_grad()
    def step(self, step: int) -> None:
        if self.mu > 0.0:
            for k, g in self.nodes.grads.items():  # grad h_k = grad F_k + mu (w - w^t)
                g.add_(self.nodes.params[k] - self.round_start[k], alpha=self.mu)
        super().step(step)

    @torch.no_grad()
    def average(self, round_index: int | None = None) -> None:
        super().average(round_index)
        for k, w in self.round_start.items():  # the server model w^{t+1}: the next anchor
            w.copy_(self.server_state[k].unsqueeze(0))
