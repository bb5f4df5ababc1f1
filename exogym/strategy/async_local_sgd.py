"""Asynchronous Local-SGD, with Delayed Nesterov momentum (DN) and Dynamic Local Updates (DyLU).

B. Liu, R. Chhaparia, A. Douillard, S. Kale, A. A. Rusu, J. Shen, A. Szlam, M. Ranzato,
"Asynchronous Local-SGD Training for Language Modeling", arXiv:2401.09135 (2024), Algorithm 1
(asynchronous local-SGD), Algorithm 3 (Delayed Nesterov) and section 4.2 (Dynamic Local Updates).
Checked against HALoS's implementation of both, utnslab/halos commit 4b5bf73: ``src/halos/opt.py``
(``DelayedNesterovOptimizer``), ``src/halos/simulation/common.py`` (``_parse_worker_configs``,
``--rescale_num_local_steps``) and ``src/halos/worker.py`` (a worker keeps its inner optimizer
between rounds).

Each node takes ``H_i`` inner steps from the server model it last received, pushes its
pseudo-gradient ``g = theta_base - theta_node`` and waits for the reply; the server applies ``g``
*as soon as it arrives*, to its current model (which other nodes may have moved since the node's
base: the update is stale by ``tau`` server versions), and replies with the new model
(:mod:`exogym.strategy.server`; every update is one server version). Outer optimizers (``outer``):

- ``"delayed_nesterov"`` (Algorithm 3, the paper's method and the default): the
  pseudo-gradients are summed in a buffer ``Delta``;
  every arrival steps ``theta <- theta - eta (c beta m + g / N_b)``, and at every ``N_b``-th
  arrival the momentum takes the buffer first, ``m <- beta m + Delta / N_b``, and the step is
  ``theta <- theta - eta ((1 - c N_b + c) beta m + g / N_b)``; ``Delta <- 0``. ``c`` (the
  momentum "activation") = 0 applies momentum only once per ``N_b`` updates. With ``N_b = N``
  and one round of ``N`` arrivals computed from the same base, the server moves by exactly
  DiLoCo's Nesterov step ``eta (mean g + beta m)`` over the round.
- ``"nesterov"``: SGD with Nesterov momentum on ``g / N`` at every arrival (``N`` the number of
  nodes), as DiLoCo's outer optimizer would step on each node's share of the average: the
  paper's baseline. It shows that this momentum, fed stale pseudo-gradients one at a time,
  hurts; DN is its fix. On the default task (MNIST CNN, 4 nodes, 500 steps, ``H = 50``,
  ``eta = 0.7``, ``beta = 0.9``) it diverges (final eval loss 271, 11.35% accuracy) where DN
  reaches 97.40%.

DyLU (``dylu=True``): node ``w`` takes ``H_w = max(1, floor(H * v_w / max_j v_j))`` local steps,
with ``v`` the nodes' compute speeds (the run's world and network), so a slow node pushes about
as often as the fastest. The floor is the paper's (section 4.2); the minimum of one step keeps a
node slower than ``max_j v_j / H`` pushing (HALoS's ``max(1, ...)``). ``dylu_rounding="ceil"``
rounds up, as HALoS does (``max(1, ceil(num_local_steps * worker_speed))``, its speeds divided by
the fastest). Speeds 1 : 0.7 : 0.45 and ``H = 8``: ``[8, 5, 3]`` (floor), ``[8, 6, 4]`` (ceil).
Equal speeds: ``H_w = H``.

Choices the paper leaves open: the pseudo-gradient weight is ``1 / N`` in both outer
optimizers (DN's own ``1 / N_b``, HALoS ``opt.py``; no staleness weighting, as in the paper's
Algorithm 1); ``N_b`` defaults to the number of nodes (the paper's choice); the inner optimizer
state is kept between rounds (HALoS ``worker.py``); the paper's ``beta = 0.9``. Communication:
a push of the parameters (``S`` bytes) per round and a pull of the model (and float buffers);
the server's link queues them first come, first served (:meth:`exogym.sim.clock.SimClock.push`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import Tensor

from exogym.strategy.base import in_range, positive_int
from exogym.strategy.server import ServerStrategy
from exogym.utils.validation import check_number

__all__ = ["AsyncLocalSGD", "dylu_steps"]

_OUTER = ("delayed_nesterov", "nesterov")
Rounding = Literal["floor", "ceil"]
_ROUNDING: tuple[Rounding, ...] = ("floor", "ceil")


@dataclass(kw_only=True)
class AsyncLocalSGD(ServerStrategy):
    """Asynchronous Local-SGD (Liu et al. 2024): a parameter server applies each node's
    pseudo-gradient when it arrives.

    Attributes:
        H: local steps per round (``H_i = H`` unless ``dylu``).
        outer: ``"delayed_nesterov"`` (DN, Algorithm 3) or ``"nesterov"`` (the paper's
            baseline; diverges on the default task).
        outer_lr: ``eta``, the server's learning rate.
        outer_momentum: ``beta``.
        c: DN's momentum activation in [0, 1] (0: momentum once per ``N_b`` updates).
        N_b: DN's buffer length in updates; None: the number of nodes.
        dylu: Dynamic Local Updates: ``H_i`` scaled by node speed.
        dylu_rounding: ``"floor"`` (the paper's section 4.2) or ``"ceil"`` (HALoS's code) of
            ``H v_i / max_j v_j``, at least 1 either way.
    """

    id: ClassVar[str] = "async_local_sgd"

    outer: Literal["delayed_nesterov", "nesterov"] = "delayed_nesterov"
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    c: float = 0.0
    N_b: int | None = None
    dylu: bool = False
    dylu_rounding: Rounding = "floor"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.outer not in _OUTER:
            raise ValueError(f"outer must be one of {_OUTER}, got {self.outer!r}")
        check_number("outer_lr", self.outer_lr, lo=0.0, lo_open=True)
        in_range("outer_momentum", self.outer_momentum, 0.0, 1.0)
        in_range("c", self.c, 0.0, 1.0)
        if self.N_b is not None:
            positive_int("N_b", self.N_b)
        if not isinstance(self.dylu, bool):
            raise ValueError(f"dylu must be True or False, got {self.dylu!r}")
        if self.dylu_rounding not in _ROUNDING:
            raise ValueError(f"dylu_rounding must be one of {list(_ROUNDING)}, got "
                             f"{self.dylu_rounding!r}")

    def init_state(self) -> None:
        super().init_state()
        params = list(self.global_params.values())
        self.outer_opt: torch.optim.SGD | None = None
        if self.outer == "nesterov":
            self.outer_opt = torch.optim.SGD(params, lr=self.outer_lr,
                                             momentum=self.outer_momentum, nesterov=True)
        # Delayed Nesterov's momentum m and buffer Delta (empty for "nesterov", whose momentum
        # is the SGD optimizer's), and its update counter t.
        dn = self.outer == "delayed_nesterov"
        self.m = {k: torch.zeros_like(p) for k, p in self.global_params.items()} if dn else {}
        self.buffer = ({k: torch.zeros_like(p) for k, p in self.global_params.items()} if dn
                       else {})
        self.t = 0

    def local_steps(self, node: int) -> int:
        if not self.dylu:
            return super().local_steps(node)
        return dylu_steps(super().local_steps(node), self.speeds, node, self.dylu_rounding)

    @property
    def buffer_length(self) -> int:
        """``N_b``: the given one, or the number of nodes."""
        return self.N_b if self.N_b is not None else self.nodes.num_nodes

    @torch.no_grad()
    def apply(self, node: int, delta: dict[str, Tensor], staleness: int) -> None:
        n = self.nodes.num_nodes
        if self.outer_opt is not None:
            for k, p in self.global_params.items():
                p.grad = delta[k] / n
            self.outer_opt.step()
            self.outer_opt.zero_grad(set_to_none=True)
        else:
            self._delayed_nesterov(delta)
        self.version += 1

    def _delayed_nesterov(self, g: dict[str, Tensor]) -> None:
        """Algorithm 3 of the paper (module docstring), one arrival."""
        nb, beta, c, eta = self.buffer_length, self.outer_momentum, self.c, self.outer_lr
        boundary = (self.t + 1) % nb == 0
        for k, theta in self.global_params.items():
            self.buffer[k] += g[k]
            if boundary:
                self.m[k].mul_(beta).add_(self.buffer[k], alpha=1.0 / nb)
                theta.sub_(eta * ((1 - c * nb + c) * beta * self.m[k] + g[k] / nb))
                self.buffer[k].zero_()
            else:
                theta.sub_(eta * (c * beta * self.m[k] + g[k] / nb))
        self.t += 1


def dylu_steps(H: int, speeds: Sequence[float], node: int, rounding: Rounding = "floor") -> int:
    """Dynamic Local Updates: ``H_w = max(1, floor(H * v_w / max_j v_j))`` (Liu et al. 2024,
    section 4.2), or with ``rounding="ceil"`` HALoS's ``max(1, ceil(...))``, so that every
    node's round takes about the fastest node's time. The 1e-9 keeps a product that is an
    integer but for a rounding error (``100 * 0.29 = 28.999999999999996``) at that integer."""
    x = H * speeds[node] / max(speeds)
    steps = math.floor(x + 1e-9) if rounding == "floor" else math.ceil(x - 1e-9)
    return max(1, steps)
