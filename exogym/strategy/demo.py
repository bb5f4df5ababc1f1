"""DeMo: decoupled momentum; each node sends only the top-k DCT components of its momentum.

Reference: B. Peng, J. Quesnelle, D. P. Kingma, "DeMo: Decoupled Momentum Optimization",
arXiv:2411.19870 (Algorithm 1, with the signum variant and decoupled weight decay of the
experiments), and the authors' code, github.com/bloc97/DeMo (``demo.py``).

DeMo replaces both the gradient all-reduce and the inner optimizer. Each node ``i`` keeps its own
momentum ``m_i`` (never synchronised: the nodes' momenta drift apart), and every step, with
``eta`` the learning rate (``optim.lr``, after the schedule) and ``lambda`` the weight decay
(``optim.weight_decay``):

1. ``m_i <- beta m_i + eta g_i`` (``g_i``: the node's gradient, after per-node clipping when
   ``max_grad_norm`` is set). Algorithm 1 writes ``m <- beta m + g``; the reference code adds
   ``eta g``, and so does this one. With a constant ``eta`` the two are the same method exactly
   (``m`` scales by ``eta``, and top-k and sign do not see a scale); under a schedule each
   gradient is weighted by the ``eta`` of its own step, as in the authors' experiments.
2. ``q_i = ExtractFastComponents(m_i, s, k)``: the tensor is cut into chunks of ``h x w``
   (``h``, ``w`` = the largest divisors of its dimensions that are at most ``s``; 1-D tensors are
   cut into 1-D chunks; a conv kernel ``[out, in, kh, kw]`` is seen as the matrix
   ``[out, in * kh * kw]``, which the reference, written for transformers, does not handle),
   each chunk goes through the orthonormal 2-D DCT-II, and the ``k`` components of largest
   magnitude of each chunk are kept (all of them if the chunk has fewer than ``k``).
3. ``m_i <- m_i - IDCT(q_i)``: what is sent leaves the local momentum (error feedback).
4. ``Q = Synchronize(q)``: one all-gather of every node's (indices, values); each node rebuilds,
   per chunk, every component as the mean over the nodes that sent it (zero where none did),
   as the reference does (``scatter_reduce(mean, include_self=False)``), then ``IDCT``.
5. Signum step with decoupled weight decay: ``theta <- theta (1 - eta lambda) - eta sign(Q)``,
   i.e. ``theta <- theta - eta (sign(Q) + lambda theta)``. ``Q`` is the same on every node, so
   the replicas stay identical; the global model is node 0's (with node 0's buffers, if any:
   DeMo synchronises none).

Hyperparameters (the paper's symbols): ``beta`` = 0.999 (the momentum decay, the reference's
``compression_decay``), ``s`` = 64 (chunk size), ``k`` = 32 (components per chunk): the
reference implementation's defaults. ``optim.lr`` is ``eta`` (step ``t`` uses ``optim.lr *
schedule.factor(t)``, the schedule every strategy shares) and ``optim.weight_decay`` is
``lambda`` (default 0); DeMo is its own optimizer (the torch optimizer the base class builds is
never stepped), so the other ``optim.*`` settings (name, betas, eps, momentum, nesterov) must
stay at their defaults (an error otherwise). ``optim.lr`` = 1e-3, the MNIST task's default,
needs no tuning: 4 nodes, 500 steps, batch 64 per node reach 98.57% test accuracy.

Sent per step by each node: one ring all-gather, ``(N-1) * S`` bytes with
``S = sum_t chunks_t * k_t * (b_idx,t + b_val)`` over the parameter tensors ``t``: ``k_t =
min(k, h_t w_t)`` components per chunk, each an index in the smallest integer type that holds
``h_t w_t`` positions (``b_idx`` = 1 byte (uint8) up to 256, 2 (int16) up to 32,768, so a
64 x 64 chunk's 4,096 take int16, else 4) and a value in the parameter dtype (``b_val`` = 4 for
fp32). The MNIST CNN (215,370 fp32 parameters) sends ``S`` = 13,474 bytes (against ``P`` =
861,480), so ``3 S`` = 40,422 bytes per node per step at ``N`` = 4 (DDP: 1,292,220).

Absent nodes (a world): a node that does not compute a step leaves its momentum and parameters as
they are. The all-gather is among the nodes whose components arrive (a ring among those ``M``),
and they apply the combined update; a node that computed but whose components were lost, or cut
by a ``deadline``, missed an update its peers applied: it is out of sync and heals from a live
peer before the next step (its parameters and momentum copied, as DDP's replicas do).

Codecs: DeMo's payload is already sparse, so it takes no transport codec (``supports_codec``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from exogym.strategy._dct import ChunkLayout, dct_matrix
from exogym.strategy._exo_gym import exo_gym_name
from exogym.strategy.base import StackedStrategy, in_range, positive_int
from exogym.strategy.optim import OptimSpec

__all__ = ["DeMo"]

# optim.* fields DeMo has no use for (it is its own optimizer): they must keep these defaults.
_UNUSED_OPTIM = ("name", "betas", "eps", "momentum", "nesterov")


@dataclass(kw_only=True)
class DeMo(StackedStrategy):
    """Decoupled momentum: signum step on the all-gathered top-k DCT components of the momenta.

    The step size ``eta`` is ``optim.lr`` (scheduled by ``schedule.*``) and the decoupled weight
    decay ``lambda`` is ``optim.weight_decay``; the other ``optim.*`` settings are unused and must
    stay at their defaults.

    Attributes:
        beta: momentum decay, ``m <- beta m + eta g`` (the paper's beta; 0.999), in [0, 1).
        s: target chunk size; each dimension is cut into chunks of its largest divisor <= s
            (the paper's s; 64).
        k: DCT components each node sends per chunk (the paper's k; 32).
    """

    id = "demo"
    supports_codec: ClassVar[bool] = False
    beta: float = 0.999
    s: int = 64
    k: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        in_range("beta", self.beta, 0.0, 1.0, hi_open=True)
        positive_int("s", self.s)
        positive_int("k", self.k)
        defaults = OptimSpec()
        for name in _UNUSED_OPTIM:
            value, default = getattr(self.optim, name), getattr(defaults, name)
            if value != default:
                raise ValueError(
                    f"optim.{name} must stay at its default {default!r} for DeMo (its own "
                    f"optimizer: signum step of size optim.lr, decoupled weight decay "
                    f"optim.weight_decay), got {value!r}"
                )

    derived_state = ("layouts", "dct")  # from the parameter shapes, s and k

    def init_state(self) -> None:
        self._next_step = 0
        params = self.nodes.params
        # The decoupled momenta, one per node: [N, *shape], never communicated.
        self.momentum = {name: torch.zeros_like(p, requires_grad=False)
                         for name, p in params.items()}
        self.layouts = {name: ChunkLayout.of(p.shape[1:], self.s, self.k)
                        for name, p in params.items()}
        self.dct: dict[tuple[int, torch.dtype], Tensor] = {}
        for name, p in params.items():
            lay = self.layouts[name]
            for n in (lay.h, lay.w):
                if (n, p.dtype) not in self.dct:
                    self.dct[(n, p.dtype)] = dct_matrix(n, dtype=p.dtype, device=p.device)

    def _mats(self, layout: ChunkLayout, dtype: torch.dtype) -> dict[int, Tensor]:
        return {n: self.dct[(n, dtype)] for n in (layout.h, layout.w)}

    def eta(self, step: int) -> float:
        """The step size of ``step`` (0-based): ``optim.lr`` times the schedule's factor."""
        if not self.schedule.active:
            return self.optim.lr
        return self.optim.lr * self.schedule.factor(step, self.total_steps)

    @property
    def lr(self) -> float:
        """The step size ``eta`` of the next step (DeMo never steps the base's inner optimizer)."""
        return self.eta(self._next_step)

    def payload_bytes(self) -> int:
        """``S``: the bytes one node contributes to the all-gather of each step."""
        return sum(self.layouts[name].payload_bytes(p.element_size())
                   for name, p in self.nodes.params.items())

    def node_state(self) -> dict[str, Tensor]:
        """The decoupled momenta: a recovering node copies its donor's."""
        return {f"momentum.{k}": m for k, m in self.momentum.items()}

    @torch.no_grad()
    def step(self, step: int) -> None:
        if self.max_grad_norm is not None:
            self.nodes.clip_grad_norm_(self.max_grad_norm)
        active = self.active
        if active is not None:  # an absent node's momentum must not decay: restored below
            kept = {k: m.clone() for k, m in self.momentum.items()}
        members = self.arrivals()
        eta = self.eta(step)  # a Python float: no device sync
        names = list(self.nodes.params)
        indices: list[Tensor] = []
        values: list[Tensor] = []
        for name in names:
            m, lay = self.momentum[name], self.layouts[name]
            mats = self._mats(lay, m.dtype)
            m.mul_(self.beta).add_(self.nodes.grads[name], alpha=eta)         # 1
            idx, val = lay.top_k(lay.encode(m, mats))                         # 2
            m.sub_(lay.decode(lay.scatter(idx, val), mats))                   # 3
            indices.append(idx.to(lay.index_dtype))
            values.append(val)
        if active is not None:
            for k, m in self.momentum.items():
                m.copy_(torch.where(_rows(active, m), m, kept[k]))
        if members is not None and not any(members):
            self._next_step = step + 1
            return  # nothing arrived: nobody applies an update, nobody is out of sync
        if members is None:
            gathered = self.comm.all_gather(indices + values, tag="demo")    # 4
        else:
            gathered = self._gather_members(indices, values, members)
        decay = 1.0 - eta * self.optim.weight_decay
        keep = None if members is None else self.comm.local_rows(members, self.nodes.device)
        for j, name in enumerate(names):
            p, lay = self.nodes.params[name], self.layouts[name]
            q = lay.combine(gathered[j].long(), gathered[len(names) + j])
            update = lay.decode(q, self._mats(lay, p.dtype))                 # [1, *shape]
            if keep is None:
                if decay != 1.0:
                    p.mul_(decay)
                p.sub_(update.sign_(), alpha=eta)                             # 5
            else:
                p.copy_(torch.where(_rows(keep, p), p * decay - eta * update.sign(), p))
        if members is not None:  # computed, but not heard: out of sync
            active_all = self.comm.active or [True] * self.comm.num_nodes
            self.request_recovery([a and not m for a, m in zip(active_all, members,
                                                                strict=True)])
        self._next_step = step + 1

    def _gather_members(self, indices: list[Tensor], values: list[Tensor],
                        members: list[bool]) -> list[Tensor]:
        """The all-gather among ``members``, with the non-members' rows left out of the
        combination (their components did not arrive)."""
        gathered = self.comm.all_gather(indices + values, tag="demo", members=members)
        rows = torch.tensor([i for i, m in enumerate(members) if m], dtype=torch.long,
                            device=gathered[0].device)
        return [g.index_select(0, rows) for g in gathered]


def _rows(mask: Tensor, like: Tensor) -> Tensor:
    """``mask`` ``[n]`` shaped ``[n, 1, ...]`` to broadcast over ``like`` ``[n, *shape]``."""
    return mask.view(-1, *([1] * (like.dim() - 1)))


def __getattr__(name: str) -> Any:
    """EXO Gym's ``DeMoStrategy`` under its path, this module, imported on first use
    (:mod:`exogym.strategy._exo_gym`)."""
    return exo_gym_name(__name__, name, ("DeMoStrategy",))
