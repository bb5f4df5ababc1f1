"""FedAdam: FedOpt with Adam's second moment on the server (no bias correction).

Reference: S. J. Reddi, Z. Charles, M. Zaheer, Z. Garrett, K. Rush, J. Konečný, S. Kumar,
H. B. McMahan, "Adaptive Federated Optimization", ICLR 2021, arXiv:2003.00295 (Algorithm 2,
the FedAdam line).

Rounds as in :mod:`exogym.strategy.fedopt`: ``H`` local steps per node, then with the mean client
update ``Delta_t = (1/N) sum_i (x_i - x_t)`` (client minus server)::

    m_t     = beta1 m_{t-1} + (1 - beta1) Delta_t                      m_{-1} = 0
    v_t     = beta2 v_{t-1} + (1 - beta2) Delta_t^2                    v_{-1} = tau^2
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)

elementwise, without Adam's bias correction (the paper's form). Defaults: ``beta1 = 0.9``,
``beta2 = 0.99`` and ``tau = 1e-3`` as in the paper's experiments; ``eta = 1e-2`` and ``H = 100``
chosen for AdamW clients (the paper tunes ``eta`` per task for SGD clients).

Sent per round (every ``H`` steps) by each node: ``2 (N-1)/N * (P + B)`` bytes (``P`` parameter
bytes, ``B`` float buffer bytes; a ``codec`` compresses the ``P`` part, see
:mod:`exogym.strategy.fedopt`). MNIST CNN, ``N = 4``: 1,292,220 bytes per round, 12,922.2 bytes
per step at ``H = 100``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from exogym.strategy.base import in_range
from exogym.strategy.fedopt import AdaptiveFedOpt

__all__ = ["FedAdam"]


@dataclass(kw_only=True)
class FedAdam(AdaptiveFedOpt):
    """FedOpt with a server Adam step: v_t = beta2 v + (1 - beta2) Delta^2.

    Attributes:
        beta2: decay of the second moment v (the paper's beta_2).
    """

    id = "fedadam"
    beta2: float = 0.99

    def __post_init__(self) -> None:
        super().__post_init__()
        in_range("beta2", self.beta2, 0.0, 1.0, hi_open=True)

    def update_v(self, v: list[Tensor], delta_sq: list[Tensor]) -> None:
        torch._foreach_mul_(v, self.beta2)
        torch._foreach_add_(v, delta_sq, alpha=1.0 - self.beta2)
