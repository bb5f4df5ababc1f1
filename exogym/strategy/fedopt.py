"""FedOpt: local training rounds, then a server optimizer step on the mean client update.

Reference: S. J. Reddi, Z. Charles, M. Zaheer, Z. Garrett, K. Rush, J. Konečný, S. Kumar,
H. B. McMahan, "Adaptive Federated Optimization", ICLR 2021, arXiv:2003.00295 (Algorithm 1,
FedOpt, and Algorithm 2, FedAdagrad / FedYogi / FedAdam).

Each round ``t``, from the server model ``x_t``:

1. every node ``i`` starts from ``x_t`` and takes ``H`` local steps of the inner optimizer (the
   paper's ``K`` steps of ClientOpt), reaching ``x_i^t``;
2. client update ``Delta_i^t = x_i^t - x_t`` (client minus server: the OPPOSITE sign of DiLoCo's
   pseudo-gradient ``x_t - x_i^t``), averaged over the nodes by one all-reduce:
   ``Delta_t = (1/N) sum_i Delta_i^t``;
3. the server applies ServerOpt to ``x_t`` with ``Delta_t`` as a pseudo-gradient pointing *uphill
   in parameter progress*: every update moves ``x`` along ``+Delta_t``, toward the clients' mean;
4. every node restarts from ``x_{t+1}``; each node keeps its own inner optimizer state.

:class:`FedOpt` owns the rounds and the communication; a subclass defines ServerOpt
(:meth:`FedOpt.server_update`). :class:`AdaptiveFedOpt` is Algorithm 2's shared part, with
``m_{-1} = 0`` and ``v_{-1} = tau^2`` (the paper requires ``v_{-1} >= tau^2``; we take the
smallest value)::

    m_t     = beta1 m_{t-1} + (1 - beta1) Delta_t
    v_t     = (per variant, see fedadagrad.py, fedadam.py, fedyogi.py)
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)

elementwise, with no bias correction (as in the paper). The server optimizer runs once, on the
single global copy ``x``, not per node.

Departures from the paper, all explicit: every node takes part in every round (the paper samples a
subset ``S`` of clients; here ``|S| = N``); the client optimizer is the inner optimizer, AdamW by
default (the paper's clients run SGD: ``optim.name=sgd``); floating-point buffers (BatchNorm
statistics) are averaged across nodes at each round and become the server model's buffers
(integer counters: node 0's), as in exogym's DiLoCo.

Absent nodes (a world): the server averages the updates that arrived (a ring among those ``M``
clients, ``2 (M-1)/M * (P + B)`` each) and only those clients restart from the new server model;
a client that is down, lost its update or was cut by a ``deadline`` keeps its own parameters, and
one back up receives the server model and the server optimizer's state from a live peer.

Sent per round (every ``H`` steps) by each node, ``P`` = parameter bytes, ``B`` = float buffer
bytes: ``2 (N-1)/N * (P + B)`` (one ring all-reduce of the fp32 client updates and buffers).
With ``codec``, the client updates go through it: ``2 (N-1)/N * S_c`` (``(N-1) * S_c`` for a
sparse codec) with ``S_c`` the codec's payload for ``P``, plus ``2 (N-1)/N * B`` for the buffers
in a separate uncompressed all-reduce when the model has any. MNIST CNN (``P`` = 861,480 bytes,
no buffers), ``N = 4``: 1,292,220 bytes per node per round, 12,922.2 bytes per step at
``H = 100``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from exogym.strategy.base import StackedStrategy, in_range, positive_int, restart_rows

__all__ = ["AdaptiveFedOpt", "FedOpt"]


@dataclass(kw_only=True)
class FedOpt(StackedStrategy):
    """Rounds of H local steps, then a server optimizer step on the mean client update.

    Attributes:
        H: local steps per round (the paper's K local steps of ClientOpt).
        eta: the server learning rate (the paper's eta).
    """

    supports_participation: ClassVar[bool] = True
    H: int = 100
    eta: float = 1e-2

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int("H", self.H)
        in_range("eta", self.eta, 0.0, float("inf"), lo_open=True)

    # -- the server optimizer (subclasses) -----------------------------------------------------
    @abc.abstractmethod
    def init_server_optimizer(self) -> None:
        """Allocate the server optimizer's state for :attr:`server_params`."""

    @abc.abstractmethod
    def server_update(self, x: list[Tensor], delta: list[Tensor]) -> None:
        """``x <- ServerOpt(x, Delta_t)`` in place; ``x`` and ``delta`` in ``server_params`` order.

        ``delta`` is the mean client update ``x_i - x`` (client minus server).
        """

    # -- rounds ----------------------------------------------------------------------------------
    def init_state(self) -> None:
        self.server_params, self.server_buffers = self.snapshot()  # x_t
        self.rounds = 0
        self.init_server_optimizer()

    def communicates(self, step: int) -> bool | None:
        """Only the last step of a round communicates (a subclass with another step: None)."""
        return self._communicates_every_H(step, FedOpt)

    @torch.no_grad()
    def step(self, step: int) -> None:
        self.inner_step()
        if (step + 1) % self.H == 0:
            self.server_round()

    @torch.no_grad()
    def server_round(self) -> None:
        """Average the client updates, step the server model, restart every node from it (with
        a world: the clients whose updates arrived; the others keep their own parameters)."""
        members = self.arrivals()
        if members is not None and not any(members):
            return  # no update arrived: no server step
        names = list(self.nodes.params)
        local = [self.nodes.params[k] for k in names]
        buffers = list(self.nodes.float_buffers.values())
        # Delta_i = x_i - x (client minus server), node-stacked: [N, *shape].
        updates = [p - self.server_params[k].unsqueeze(0)
                   for k, p in zip(names, local, strict=True)]
        reduced, buffer_means = self.all_reduce_with_buffers(updates, buffers, "mean",
                                                             tag="client_updates",
                                                             members=members)
        self.server_update([self.server_params[k] for k in names], reduced)
        self.rounds += 1
        keep = None if members is None else self.comm.local_rows(members, self.nodes.device)
        for k, p in zip(names, local, strict=True):
            restart_rows(p, self.server_params[k], keep)
        self.adopt_buffers(buffer_means, self.server_buffers, keep)

    def recover(self, node: int, donor: int) -> None:
        """A node back up gets the server model and the server optimizer's state, and the
        donor's inner optimizer state (``recovery="copy"``) or a fresh one."""
        shared = [t for name in ("m", "v", "momentum")
                  for t in getattr(self, name, {}).values()]
        self.recover_from_global(node, donor, self.server_params, self.server_buffers, shared)

    def global_state(self) -> dict[str, Tensor]:
        out = {k: v.clone() for k, v in self.server_params.items()}
        out.update({k: v.clone() for k, v in self.server_buffers.items()})
        return out


@dataclass(kw_only=True)
class AdaptiveFedOpt(FedOpt):
    """Algorithm 2 of Reddi et al.: momentum m, a per-variant second moment v, adaptivity tau.

    Attributes:
        beta1: decay of the first moment m (the paper's beta_1).
        tau: adaptivity: added to sqrt(v), and v starts at tau^2 (the paper's tau).
    """

    beta1: float = 0.9
    tau: float = 1e-3

    def __post_init__(self) -> None:
        super().__post_init__()
        in_range("beta1", self.beta1, 0.0, 1.0, hi_open=True)
        in_range("tau", self.tau, 0.0, float("inf"), lo_open=True)
        self.tau = float(self.tau)  # a real number, as in the paper

    @abc.abstractmethod
    def update_v(self, v: list[Tensor], delta_sq: list[Tensor]) -> None:
        """``v_{t-1} -> v_t`` in place, given ``Delta_t^2`` (the variant's line of Algorithm 2)."""

    def init_server_optimizer(self) -> None:
        self.m = {k: torch.zeros_like(x) for k, x in self.server_params.items()}  # m_{-1} = 0
        self.v = {k: torch.full_like(x, self.tau**2) for k, x in self.server_params.items()}

    def server_update(self, x: list[Tensor], delta: list[Tensor]) -> None:
        m, v = list(self.m.values()), list(self.v.values())
        torch._foreach_mul_(m, self.beta1)
        torch._foreach_add_(m, delta, alpha=1.0 - self.beta1)  # m_t
        self.update_v(v, torch._foreach_mul(delta, delta))  # v_t
        denom = torch._foreach_sqrt(v)
        torch._foreach_add_(denom, self.tau)
        torch._foreach_addcdiv_(x, m, denom, value=self.eta)  # x + eta m / (sqrt(v) + tau)
