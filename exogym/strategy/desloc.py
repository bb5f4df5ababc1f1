"""DES-LOC: local Adam whose parameters and two moments are averaged on three periods.

Reference: A. Iacob, L. Sani, M. Safaryan, P. Giampouras, S. Horvath, A. Jovanovic, M. Kurmanji,
P. Aleksandrov, W. F. Shen, X. Qiu, N. D. Lane, "DES-LOC: Desynced Low Communication Adaptive
Optimizers for Training Foundation Models", arXiv:2505.22549 (ICLR 2026, OpenReview 6N2qFixxYZ).
No code by the authors was public to check against; the rule below is the paper's.

Every node ``m`` runs the inner optimizer (Adam/AdamW, :class:`OptimSpec`) on its own data. With
``t`` the 1-based step and ``E_m[.]`` the mean over the nodes, step ``t`` is, per node:

1. ``g = clip(grad f(theta_t^m))`` (the gradient at the node's own parameters; clipping is the
   base's per-node L2 clipping ``max_grad_norm``, off by default: the paper clips with a radius
   ``rho``);
2. ``u_{t-1} <- E_m[u_{t-1}]`` if ``t mod K_u = 0``; ``v_{t-1} <- E_m[v_{t-1}]`` if
   ``t mod K_v = 0``; ``theta_t <- E_m[theta_t]`` if ``t mod K_x = 0``: each state is averaged
   *before* step ``t``'s update, as the paper's ``sync`` operators sit inside the update, and the
   averages replace the local values on every node;
3. the inner optimizer's step from the (possibly averaged) states: ``u_t = beta1 u_{t-1} +
   (1 - beta1) g``, ``v_t = beta2 v_{t-1} + (1 - beta2) g^2``,
   ``theta_{t+1} = theta_t - eta u_t / (sqrt(v_t) + eps)`` (torch's Adam/AdamW, with its bias
   corrections and weight decay).

When periods coincide, each state is averaged on its own (one all-reduce per state: tags
``params``, ``first_moment``, ``second_moment``). The moments are read from the inner optimizer's
state, ``self.optimizer.state[p]``: ``exp_avg`` (``u``) and ``exp_avg_sq`` (``v``) for Adam and
AdamW; ``momentum_buffer`` is a first moment too (SGD with momentum, the paper's SGDM variant;
Muon's matrices), so with Muon the first moment is each parameter's ``momentum_buffer`` or
``exp_avg`` and the second only the AdamW part's ``exp_avg_sq``. Before the first step the
optimizer has no state yet (all zeros on every node): a moment due at ``t = 1`` (a period of 1) is
not sent. Float buffers (BatchNorm statistics) are averaged with the parameters.

The paper recommends ``K_u = 3 K_x`` and ``K_v = 6 K_x`` (the moments decay more slowly than the
parameters move), the defaults here when ``K_u`` / ``K_v`` are not given. ``K_x`` defaults to 4 so
that short runs synchronise (the paper's headline, 170x less traffic than DDP, corresponds to
``K_x`` around 256: ``(1 + 1/3 + 1/6) / K_x`` of DDP's bytes).

A hazard of ``K_u < K_v`` (measured, not discussed in the paper): where a node's gradient has been
exactly zero since the last ``v`` average (a ReLU unit dead on that node, an embedding row of a
token it has not seen), its ``v`` is 0; a ``u`` average then brings it the other nodes' momentum,
and its Adam step there is ``u / (0 + eps)``, ``1e4``-``1e5`` times ``lr``. On the MNIST CNN with 8
nodes and the defaults, fc1's dead units blow the loss from 1.4 to 1.8e6 at the first ``u``
average (``t = 12``); ``K_v = K_u`` (both averaged together) trains normally.

The global model (evaluated, deployed) is the mean of the nodes' parameters and float buffers
(what a final parameter sync would give; node 0's integer buffers): after a sync every node takes
its own step, so no node holds it. Computing it is an evaluation-side view, not counted as traffic.

Sent by each node, ``P`` = parameter bytes, ``B`` = float buffer bytes, ``U`` / ``V`` = bytes of the
first / second moments (``U = V = P`` for Adam; Muon: ``U = P``, ``V`` = the AdamW part's): at a
step ``t`` with ``t mod K_x = 0``, ``2 (N-1)/N * (P + B)``; with ``t mod K_u = 0``,
``2 (N-1)/N * U``; with ``t mod K_v = 0``, ``2 (N-1)/N * V`` (ring all-reduces). Per step on
average, for Adam and the defaults: ``2 (N-1)/N * (P (1 + 1/3 + 1/6) + B) / K_x``. MNIST CNN
(``P`` = 861,480, no buffers), ``N = 4``, ``K_x = 4``: 1,292,220 bytes at every 4th step, as much
again at every 12th (``u``) and every 24th (``v``): 484,582.5 bytes per step on average (DDP:
1,292,220).

No codec: DES-LOC exchanges parameter values and optimizer states, not updates (as SPARTA).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from exogym.strategy.base import Strategy, positive_int

__all__ = ["DESLOC", "FIRST_MOMENTS", "SECOND_MOMENTS"]

#: Optimizer-state keys that are a first moment (u) / a second moment (v).
FIRST_MOMENTS: tuple[str, ...] = ("exp_avg", "momentum_buffer")
SECOND_MOMENTS: tuple[str, ...] = ("exp_avg_sq",)


@dataclass(kw_only=True)
class DESLOC(Strategy):
    """Local Adam with desynchronised averaging of parameters (K_x), u (K_u) and v (K_v).

    Attributes:
        K_x: steps between two parameter averages (the paper's K_x).
        K_u: steps between two first-moment averages (None: 3 K_x, the paper's recommendation).
        K_v: steps between two second-moment averages (None: 6 K_x, the paper's recommendation).
    """

    id = "desloc"
    supports_codec: ClassVar[bool] = False
    K_x: int = 4
    K_u: int | None = None
    K_v: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int("K_x", self.K_x)
        if self.K_u is None:
            self.K_u = 3 * self.K_x
        if self.K_v is None:
            self.K_v = 6 * self.K_x
        positive_int("K_u", self.K_u)
        positive_int("K_v", self.K_v)
        if self.optim.name not in ("adam", "adamw", "muon") and not (
                self.optim.name == "sgd" and self.optim.momentum > 0):
            raise ValueError(f"DES-LOC averages the inner optimizer's moments: optim.name must "
                             f"be adam, adamw, muon or sgd with momentum > 0, got "
                             f"{self.optim.name!r} with momentum {self.optim.momentum}")

    @property
    def sync_period(self) -> int | None:
        """None: the global model is the node mean, which every local step moves, so no run
        length leaves it at the initial model or loses local steps (as SPARTA)."""
        return None

    @property
    def u_period(self) -> int:
        """``K_u`` as given, or ``3 K_x``."""
        return self.K_u if self.K_u is not None else 3 * self.K_x

    @property
    def v_period(self) -> int:
        """``K_v`` as given, or ``6 K_x``."""
        return self.K_v if self.K_v is not None else 6 * self.K_x

    @torch.no_grad()
    def step(self, step: int) -> None:
        t = step + 1
        if t % self.u_period == 0:
            self._average_state(FIRST_MOMENTS, "first_moment")
        if t % self.v_period == 0:
            self._average_state(SECOND_MOMENTS, "second_moment")
        if t % self.K_x == 0:
            tensors = list(self.nodes.params.values()) + list(self.nodes.float_buffers.values())
            self.comm.all_reduce_(tensors, "mean", tag="params")
        self.inner_step()

    def moments(self, keys: tuple[str, ...]) -> list[Tensor]:
        """The inner optimizer's node-stacked state tensors stored under ``keys``, in parameter
        order (empty before the first step)."""
        out = []
        for p in self.nodes.params.values():
            state = self.optimizer.state.get(p, {})
            out += [state[k] for k in keys if isinstance(state.get(k), Tensor)]
        return out

    def _average_state(self, keys: tuple[str, ...], tag: str) -> None:
        tensors = self.moments(keys)
        if tensors:
            self.comm.all_reduce_(tensors, "mean", tag=tag)

    def global_state(self) -> dict[str, Tensor]:
        """The node mean of the parameters and float buffers; node 0's integer buffers."""
        return self.node_mean_state()
