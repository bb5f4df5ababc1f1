"""NoLoCo: DiLoCo without an all-reduce; nodes average with a random partner every H steps.

Reference: J. Kolehmainen, N. Blagoev, J. Donaghy, O. Ersoy, C. Nies, "NoLoCo: No-all-reduce Low
Communication Training Method for Large Models", arXiv:2506.10911. Checked against the authors'
code, jkolehm/noloco at commit 37d1a8a11adf5070ec544d63d0d0e6d97e6c5b08:
``src/noloco/sparse_optimizer_c.py`` (the outer step, the pairing) and the ``*_noloco_mean_*``
configs of ``configs/no_reduce_exp`` (the settings).

Every node ``i`` keeps slow weights ``phi_i`` (its last outer model), fast weights ``theta_i``
(the parameters its inner optimizer moves) and an outer momentum ``delta_i``; unlike DiLoCo, the
nodes' slow weights differ. Every ``H`` steps (the outer step ``t``, 0-based):

1. the nodes are split into groups of ``n`` (the paper's local group size; 2: pairs) by a random
   permutation drawn from ``numpy.random.default_rng([seed, t])``, the same on every node: group
   ``g`` holds the permuted ids ``perm[g], perm[g + G], ...`` with ``G = N // n`` groups (the
   authors' ``batched``); when ``n`` does not divide ``N`` (the authors' code refuses it) the last
   ``N mod n`` permuted ids form one smaller group, so with pairs and an odd ``N`` one node per
   round is alone;
2. inside its group every node sends every other member its slow weights ``phi_j`` and its
   pseudo-gradient ``Delta_j = phi_j - theta_j`` (DiLoCo's sign) point to point; no collective
   over all nodes;
3. each node applies the paper's modified Nesterov step with the means over its group ``G_i``::

       delta_i <- alpha delta_i - beta mean_{j in G_i} Delta_j
                  - gamma (phi_i - mean_{j in G_i} phi_j)
       phi_i   <- phi_i + delta_i
       theta_i <- phi_i

   In the authors' code (``outer_step``: ``m += (outer_momentum - 1) m + outer_lr mean_g +
   outer_lr (mean - p_old)`` with ``mean_g`` the mean of ``theta - phi``) ``alpha`` is
   ``outer_momentum``, ``beta`` is ``outer_lr`` and the pull coefficient ``gamma`` is tied to
   ``beta``; here ``gamma=None`` (the default) ties it too, and a number unties it. The step is
   heavy-ball in form (``phi`` moves by the new ``delta``), as there; with ``n = N`` every
   ``phi_i`` stays equal, the pull term vanishes, and NoLoCo is DiLoCo with the heavy-ball outer
   optimizer (``outer_optimizer="sgd"``, ``outer_lr=beta``, ``outer_momentum=alpha``).

Defaults are the authors' settings for every NoLoCo run in their configs: ``H = 50``
(``number_of_local_steps``), ``n = 2`` (``local_group_size``), ``alpha = 0.5``
(``outer_momentum``), ``beta = 0.7`` (``outer_lr``). Their inner optimizer is ``torch.optim.Adam``
(lr 6e-4 at 125M parameters, 2e-4 at 1B, 1.2e-4 at 6.8B); the inner optimizer here is exogym's
default ``optim`` (AdamW), as for DiLoCo, so that the two compare on one setting. The paper's other
ingredient, random routing of activations between pipeline stages, needs pipeline parallelism,
which exogym does not simulate: this is NoLoCo's data-parallel outer optimizer.

Float buffers (BatchNorm statistics) travel with the slow weights and become the group mean
(the paper's models have none); integer buffers stay each node's own. No node holds a global
model: the one evaluated and deployed is the node mean of the parameters and float buffers (node
0's integer buffers), what one all-reduce of the nodes' models would give: right after an outer
step the mean of the slow weights, between two the mean of the fast ones (as SPARTA and DES-LOC;
in a process run the same mean over every rank's nodes). Computing it is an evaluation-side
view, not traffic.

Absent nodes (a world): the pairing is drawn over all ``N`` nodes whatever the world, so it does
not depend on who is up. A node that did not compute the step (down, recovering) takes no outer
step and sends nothing; an active node averages over itself and the members of its group whose
messages arrive (:meth:`StackedStrategy.arrivals`: lost messages and a ``deadline`` cut only the
sender's contribution, so a pair can hear each other asymmetrically); a node that hears nobody takes
the step with a group of one (no pull term, its own pseudo-gradient). A node back up copies its
donor's fast and slow weights, momentum and inner optimizer state (the default recovery).

Sent per outer step by each node of a group whose members all take part, ``P`` = parameter bytes,
``B`` = float buffer bytes: ``(n - 1) (2 P + B)`` (one point-to-point message to each other member,
logged as ``op="send"``, tag ``"gossip"``), as many received; a node alone sends nothing,
and a lost message is not counted (as a collective counts its members only). Per step
on average, ``(n - 1)(2 P + B) / H``, for any ``N`` (DiLoCo's ring all-reduce: ``2 (N-1)/N (P + B)
/ H``). MNIST CNN (``P`` = 861,480 bytes, no buffers), ``n = 2``: 1,722,960 bytes per node per
outer step, 34,459.2 per step at ``H = 50``. The clock times a message when both ends are there
and both links are free, so a pair's two messages follow each other (as the authors' code, where
one member sends to the other and gets the means back) and disjoint pairs run at the same time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from exogym.strategy.base import StackedStrategy, in_range, positive_int
from exogym.utils.validation import check_int

__all__ = ["NoLoCo"]


@dataclass(kw_only=True)
class NoLoCo(StackedStrategy):
    """Local steps, then a modified Nesterov outer step averaged with a random partner.

    Attributes:
        H: inner steps per outer step (the authors' number_of_local_steps, 50).
        n: local group size, the nodes that average together at an outer step (2: pairs).
        alpha: outer momentum (the authors' outer_momentum, 0.5).
        beta: outer learning rate on the group's mean pseudo-gradient (outer_lr, 0.7).
        gamma: pull of a node's slow weights toward its group's mean; None ties it to beta,
            as the authors' code does.
        seed: seed of the random grouping (one permutation of the N nodes per outer step).
    """

    id = "noloco"
    supports_codec: ClassVar[bool] = False
    H: int = 50
    n: int = 2
    alpha: float = 0.5
    beta: float = 0.7
    gamma: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int("H", self.H)
        check_int("n (the local group size)", self.n, 2)
        in_range("alpha", self.alpha, 0.0, 1.0, hi_open=True)
        in_range("beta", self.beta, 0.0, float("inf"), lo_open=True)
        if self.gamma is not None:
            in_range("gamma (or None: tied to beta)", self.gamma, 0.0, float("inf"))
        check_int("seed", self.seed, 0, 2**31 - 1)

    @property
    def pull(self) -> float:
        """``gamma``, or ``beta`` when it is tied."""
        return self.beta if self.gamma is None else self.gamma

    def init_state(self) -> None:
        self.slow = {k: p.detach().clone() for k, p in self.nodes.params.items()}  # phi
        self.momentum = {k: torch.zeros_like(p) for k, p in self.nodes.params.items()}

    def node_state(self) -> dict[str, Tensor]:
        """The slow weights and the outer momentum (a recovering node copies its donor's)."""
        out = {f"slow.{k}": v for k, v in self.slow.items()}
        out.update({f"momentum.{k}": v for k, v in self.momentum.items()})
        return out

    def groups(self, t: int) -> list[list[int]]:
        """The groups of outer step ``t``: a permutation of the ``N`` node ids from
        ``numpy.random.default_rng([seed, t])``, dealt as the authors' ``batched`` deals it
        (group ``g``: ``perm[g], perm[g + G], ...``, ``G = N // n``); the last ``N mod n`` ids
        form one smaller group."""
        num = self.comm.num_nodes
        perm = [int(i) for i in np.random.default_rng([self.seed, t]).permutation(num)]
        full = num // self.n
        out = [perm[g:full * self.n:full] for g in range(full)]
        if num % self.n:
            out.append(perm[full * self.n:])
        return out

    @torch.no_grad()
    def step(self, step: int) -> None:
        self.inner_step()
        if (step + 1) % self.H == 0:
            self.outer_step((step + 1) // self.H - 1)

    @torch.no_grad()
    def outer_step(self, t: int) -> None:
        """Outer step ``t`` (0-based): exchange slow weights and pseudo-gradients inside each
        group, then every active node's modified Nesterov step."""
        active = self.comm.active
        heard = self.arrivals()  # whose messages arrive (None: everyone's)
        names = list(self.nodes.params)
        buffer_names = list(self.nodes.float_buffers)
        # what node j sends: phi_j, Delta_j = phi_j - theta_j, its float buffers (node-stacked)
        payload = [self.slow[k] for k in names]
        payload += [self.slow[k] - self.nodes.params[k] for k in names]
        payload += [self.nodes.float_buffers[k] for k in buffer_names]
        local = {node: row for row, node in enumerate(self.comm.node_ids)}
        received: dict[tuple[int, int], list[Tensor]] = {}  # (src, dst) -> src's payload
        group_of: dict[int, list[int]] = {}
        for group in self.groups(t):
            for i in group:
                if active is not None and not active[i]:
                    continue
                group_of[i] = [i] + [j for j in group if j != i and (heard is None or heard[j])
                                     and (active is None or active[j])]
                for j in group_of[i][1:]:
                    received[(j, i)] = self.comm.send(payload, j, i, tag="gossip")
        for i, members in group_of.items():
            row = local.get(i)
            if row is None:
                continue  # another process holds node i
            order = sorted(members)  # one summation order for every member of a group
            rows = [[x[row] for x in payload] if j == i else received[(j, i)] for j in order]
            means = [_mean([r[m] for r in rows]) for m in range(len(payload))]
            self._apply(row, names, buffer_names, means)

    def _apply(self, row: int, names: list[str], buffer_names: list[str],
               means: list[Tensor]) -> None:
        """Node ``row``'s step from its group's means (``phi``, ``Delta``, float buffers)."""
        k_params = len(names)
        for m, k in enumerate(names):
            phi, delta = self.slow[k][row], self.momentum[k][row]
            mean_phi, mean_delta = means[m], means[k_params + m]
            # delta <- alpha delta - beta mean(Delta) - gamma (phi - mean(phi))
            delta.mul_(self.alpha).sub_(mean_delta, alpha=self.beta)
            delta.sub_(phi - mean_phi, alpha=self.pull)
            phi.add_(delta)
            self.nodes.params[k][row].copy_(phi)
        for m, k in enumerate(buffer_names):
            mean = means[2 * k_params + m]
            self.nodes.float_buffers[k][row].copy_(mean)

    def global_state(self) -> dict[str, Tensor]:
        """The node mean of the parameters and float buffers; node 0's integer buffers."""
        return self.node_mean_state()


def _mean(values: list[Tensor]) -> Tensor:
    """The mean of ``values``, summed in the given order."""
    total = values[0].clone()
    for v in values[1:]:
        total.add_(v)
    return total / len(values)
