"""FedYogi: FedOpt with Yogi's additive second moment on the server.

Reference: S. J. Reddi, Z. Charles, M. Zaheer, Z. Garrett, K. Rush, J. Konečný, S. Kumar,
H. B. McMahan, "Adaptive Federated Optimization", ICLR 2021, arXiv:2003.00295 (Algorithm 2,
the FedYogi line); Yogi itself: M. Zaheer, S. Reddi, D. Sachan, S. Kale, S. Kumar, "Adaptive
Methods for Nonconvex Optimization", NeurIPS 2018.

Rounds as in :mod:`exogym.strategy.fedopt`: ``H`` local steps per node, then with the mean client
update ``Delta_t = (1/N) sum_i (x_i - x_t)`` (client minus server)::

    m_t     = beta1 m_{t-1} + (1 - beta1) Delta_t                      m_{-1} = 0
    v_t     = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)     v_{-1} = tau^2
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)

elementwise (``sign(0) = 0``). Unlike Adam, ``v`` moves by at most ``(1 - beta2) Delta^2`` per
round, up toward ``Delta^2`` or down from it, so it never shrinks by a factor (and stays positive
from ``v_{-1} > 0``). Defaults: ``beta1 = 0.9``, ``beta2 = 0.99``, ``tau = 1e-3`` as in the
paper's experiments; ``eta = 1e-2`` and ``H = 100`` chosen for AdamW clients.

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

__all__ = ["FedYogi"]


@dataclass(kw_only=True)
class FedYogi(AdaptiveFedOpt):
    """FedOpt with a server Yogi step: v_t = v - (1 - beta2) Delta^2 sign(v - Delta^2).

    Attributes:
        beta2: rate of the second moment's additive change (the paper's beta_2).
    """

    id = "fedyogi"
    beta2: float = 0.99

    def __post_init__(self) -> None:
        super().__post_init__()
        in_range("beta2", self.beta2, 0.0, 1.0, hi_open=True)

    def update_v(self, v: list[Tensor], delta_sq: list[Tensor]) -> None:
        direction = torch._foreach_sign(torch._foreach_sub(v, delta_sq))  # sign(v - Delta^2)
        torch._foreach_mul_(direction, delta_sq)
        torch._foreach_add_(v, direction, alpha=-(1.0 - self.beta2))
