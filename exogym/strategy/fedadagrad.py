"""FedAdagrad: FedOpt with Adagrad's accumulated second moment on the server.

Reference: S. J. Reddi, Z. Charles, M. Zaheer, Z. Garrett, K. Rush, J. Konečný, S. Kumar,
H. B. McMahan, "Adaptive Federated Optimization", ICLR 2021, arXiv:2003.00295 (Algorithm 2,
the FedAdagrad line).

Rounds as in :mod:`exogym.strategy.fedopt`: ``H`` local steps per node, then with the mean client
update ``Delta_t = (1/N) sum_i (x_i - x_t)`` (client minus server)::

    m_t     = beta1 m_{t-1} + (1 - beta1) Delta_t                      m_{-1} = 0
    v_t     = v_{t-1} + Delta_t^2                                      v_{-1} = tau^2
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)

elementwise. Algorithm 2 keeps the momentum ``beta1`` for FedAdagrad too (``beta1 = 0`` gives
plain server Adagrad). Since ``v`` grows with every round and ``m`` starts at ``(1 - beta1)
Delta``, the first steps are about ``eta (1 - beta1)`` per coordinate: the default ``eta = 0.1``
is ten times FedAdam's. ``beta1 = 0.9`` and ``tau = 1e-3`` as in the paper's experiments;
``eta`` and ``H = 100`` chosen for AdamW clients.

Sent per round (every ``H`` steps) by each node: ``2 (N-1)/N * (P + B)`` bytes (``P`` parameter
bytes, ``B`` float buffer bytes; a ``codec`` compresses the ``P`` part, see
:mod:`exogym.strategy.fedopt`). MNIST CNN, ``N = 4``: 1,292,220 bytes per round, 12,922.2 bytes
per step at ``H = 100``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from exogym.strategy.fedopt import AdaptiveFedOpt

__all__ = ["FedAdagrad"]


@dataclass(kw_only=True)
class FedAdagrad(AdaptiveFedOpt):
    """FedOpt with a server Adagrad step: v_t = v + Delta^2."""

    id = "fedadagrad"
    eta: float = 0.1

    def update_v(self, v: list[Tensor], delta_sq: list[Tensor]) -> None:
        torch._foreach_add_(v, delta_sq)
