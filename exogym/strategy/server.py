"""Asynchronous methods with a parameter server: nodes at their own pace, updates that arrive late.

The base of :mod:`~exogym.strategy.async_local_sgd` and :mod:`~exogym.strategy.fedbuff`
(docs/design/async.md). Each node trains on
its own timeline: it starts from the server's model (version ``v``), takes its ``H_i`` local
steps, pushes its pseudo-gradient ``Delta_i = theta_base_i - theta_i`` to the server and waits
for the server's reply; the server applies it when it *arrives* (by the simulated network,
in arrival order), computed from the model the node started from, and sends the node its
current model, from which the node starts again. The update's *staleness* is the number of
server versions applied since the node's base model: ``tau = version - base_version_i``.

Who computes when is the run's event loop (:mod:`exogym.run.loop.events`): the nodes due at the
earliest simulated time compute a step together (so equal speeds are a lockstep loop), a push
becomes an arrival event at the time the network delivers it, and arrivals are applied in time
order before any step that starts later. A strategy here defines:

- :meth:`ServerStrategy.local_steps` (``H_i``; DyLU scales it by speed);
- :meth:`ServerStrategy.apply`: the server's update from one arrived pseudo-gradient.

Choices common to every server method here (each method's docstring adds its own):

- the node's inner optimizer state is kept from one round to the next (a node is a
  persistent worker: HALoS's ``worker.py`` keeps it, utnslab/halos commit 4b5bf73);
- float buffers (BatchNorm statistics) travel with the model: the server takes the arriving
  node's buffers (the freshest statistics) and sends them back with its model;
- the learning-rate schedule: the inner optimizer's lr is constant (a warm-up/cosine schedule is
  per node on per-node timelines, and this base refuses one rather than step it by the fastest
  node's count);
- a staleness cap (FLSim's ``max_staleness``, ``flsim/trainers/async_trainer.py`` at commit
  7311f2d, ``_can_participate``): an update more than ``max_staleness`` versions old is
  discarded on arrival (not applied, its staleness listed in :attr:`ServerStrategy.discarded`);
  the node is sent the current model and starts again as after any arrival;
- the run ends when the fastest node has taken ``--steps`` steps; updates already pushed are
  still delivered and applied (the network carries them), a node's unfinished local round is
  not sent;
- simulation only: one process holds the server and every node (``--engine process`` is
  refused: the server's model would have to live on one rank).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from exogym.strategy.base import StackedStrategy, positive_int

__all__ = ["NODES_H", "ServerStrategy", "follow_run"]

NODES_H = 50
"""The asynchronous methods' ``H`` over ``N`` nodes (the default of :attr:`ServerStrategy.H`)."""


@dataclass(kw_only=True)
class ServerStrategy(StackedStrategy):
    """A parameter server and nodes on their own timelines (module docstring).

    Attributes:
        H: local steps between two pushes of a node (its ``H_i`` unless
            :meth:`local_steps` says otherwise). A method whose ``follows_run`` is True takes
            None: the run sets it (:meth:`follow_run`).
        max_staleness: discard an arriving update more than this many server versions old
            (FLSim's ``max_staleness``); None: apply every update.
    """

    supports_codec: ClassVar[bool] = False
    follows_run: ClassVar[bool] = False
    """Whether ``H=None`` is allowed: the run's setting decides it (:meth:`follow_run`)."""

    H: int | None = NODES_H
    max_staleness: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.H is not None or not self.follows_run:
            positive_int("H", self.H)
        # H as the run uses it: the given one, or the one the run's setting decides
        self.session_steps: int | None = self.H
        if self.max_staleness is not None and (
                isinstance(self.max_staleness, bool) or not isinstance(self.max_staleness, int)
                or self.max_staleness < 0):
            raise ValueError(f"max_staleness must be an integer >= 0 (server versions) or None "
                             f"(no cap), got {self.max_staleness!r}")
        if self.schedule.active:
            raise ValueError(
                f"{type(self).__name__}: schedule={self.schedule!r}: an asynchronous method's "
                "nodes each have their own step count, and a learning-rate schedule over the "
                "fastest node's steps would be wrong for the others; allowed: the constant "
                "schedule (warmup=0, cosine=False)")
        if self.deadline is not None:
            raise ValueError(f"{type(self).__name__}: deadline={self.deadline!r}: an "
                             "asynchronous method never waits for a straggler; allowed: None")

    # -- state -----------------------------------------------------------------------------
    def init_state(self) -> None:
        n = self.nodes.num_nodes
        self.global_params, self.global_buffers = self.snapshot()
        # The server model each node started its round from, node-stacked, and its version.
        self.base = {k: p.detach().clone() for k, p in self.nodes.params.items()}
        self.base_version = [0] * n
        self.version = 0  # server model versions so far (updates applied, or server steps)
        self.local = [0] * n  # local steps of each node in its current round
        # [node, bytes pushed] of the nodes that finished a round at this step (the event
        # loop takes them: their pushes travel to the server)
        self.outbox: list[list[float]] = []
        self.speeds: list[float] = [1.0] * n  # the nodes' relative speeds (set by the run)
        self.staleness: list[int] = []  # of every update applied, in order
        self.discarded: list[int] = []  # of every update the staleness cap discarded, in order

    def set_speeds(self, speeds: Sequence[float]) -> None:
        """The nodes' relative compute speeds (the run's world and network), for methods whose
        ``H_i`` depends on them (DyLU)."""
        if len(speeds) != self.nodes.num_nodes:
            raise ValueError(f"speeds lists {len(speeds)} nodes, the run has "
                             f"{self.nodes.num_nodes}")
        self.speeds = [float(v) for v in speeds]

    def follow_run(self, *, population: bool, steps_per_epoch: int) -> None:
        """Set :attr:`session_steps` from the run before it reads them: the given ``H``, or,
        where ``H`` is None (a method that ``follows_run``), :meth:`default_H` of the run's
        setting (``population``: the clients are a population, drawn into the seats in
        flight; ``steps_per_epoch``: one local epoch of the mean client or node)."""
        self.session_steps = (self.H if self.H is not None
                              else self.default_H(population, steps_per_epoch))

    def default_H(self, population: bool, steps_per_epoch: int) -> int:
        """``H`` when None (only a method that ``follows_run``)."""
        raise NotImplementedError(f"{type(self).__name__} takes no H=None")

    def local_steps(self, node: int) -> int:
        """``H_i``: the local steps of node ``node``'s rounds."""
        if self.session_steps is None:
            raise RuntimeError(f"{type(self).__name__}: H=None is the run's to set "
                               "(follow_run), and no run has")
        return self.session_steps

    # -- the hooks the event loop calls ---------------------------------------------------------
    @torch.no_grad()
    def step(self, step: int) -> None:
        """The nodes that computed (``comm.active``; None: all) take their inner step and
        count it (:meth:`count_steps`)."""
        self.inner_step()
        self.count_steps()

    def count_steps(self) -> None:
        """The nodes that computed (``comm.active``; None: all) count a local step; those that
        completed their round push their pseudo-gradient (listed in :attr:`outbox`). It reads
        no parameter (a push's bytes are its shapes'): the event loop counts a step when it is
        due and may compute it later, batched with other nodes' (exogym.run.loop.timelines)."""
        mask = self.comm.active
        for i in range(self.nodes.num_nodes):
            if mask is not None and not mask[i]:
                continue
            self.local[i] += 1
            if self.local[i] >= self.local_steps(i):
                # the pseudo-gradient and the float buffers the server adopts (deliver)
                size = self.comm.push(list(self.nodes.params.values())
                                      + list(self.nodes.float_buffers.values()), i,
                                      tag="pseudo_grads")
                self.outbox.append([i, size])

    @torch.no_grad()
    def deliver(self, node: int) -> int:
        """Node ``node``'s push arrives at the server: the server applies it (:meth:`receive`)
        and replies with its current model, from which the node starts its next round
        (:meth:`restart`). Returns the update's staleness."""
        staleness = self.receive(node)
        self.restart(node)
        return staleness

    @torch.no_grad()
    def receive(self, node: int) -> int:
        """The server applies node ``node``'s arrived pseudo-gradient (:meth:`apply`) and adopts
        its float buffers; the update's staleness."""
        staleness = self.version - self.base_version[node]
        if self.max_staleness is not None and staleness > self.max_staleness:
            self.discarded.append(staleness)  # FLSim's _can_participate: not applied
            return staleness
        delta = {k: self.base[k][node] - p[node] for k, p in self.nodes.params.items()}
        self.apply(node, delta, staleness)
        self.staleness.append(staleness)
        for k, b in self.nodes.float_buffers.items():  # the node keeps its own: they are the
            self.global_buffers[k].copy_(b[node])       # server's now
        self.copy_counters(self.global_buffers)
        return staleness

    @torch.no_grad()
    def restart(self, node: int) -> float:
        """Node ``node`` starts a round from the server's current model, sent to it (a
        population's seat: the next client drawn, :mod:`exogym.run.nodes.population`); the bytes
        sent."""
        for k, p in self.nodes.params.items():
            p[node].copy_(self.global_params[k])
            self.base[k][node].copy_(self.global_params[k])
        self.base_version[node] = self.version
        self.local[node] = 0
        return self.comm.pull(list(self.nodes.params.values())
                              + list(self.nodes.float_buffers.values()), node, tag="model")

    @abc.abstractmethod
    def apply(self, node: int, delta: dict[str, Tensor], staleness: int) -> None:
        """The server's update of :attr:`global_params` from node ``node``'s pseudo-gradient
        ``delta`` (``theta_base - theta_node``, keyed like the parameters), ``staleness`` server
        versions old; advance :attr:`version` when the server model changes."""

    def recover(self, node: int, donor: int) -> None:
        raise NotImplementedError(  # the run refuses a world with failures for these methods
            f"{type(self).__name__} runs on per-node timelines without failures")

    def global_state(self) -> dict[str, Tensor]:
        out = {k: v.clone() for k, v in self.global_params.items()}
        out.update({k: v.clone() for k, v in self.global_buffers.items()})
        return out

    @property
    def sync_period(self) -> int | None:
        """``H``: the fastest node's round (the run's steps are its steps); None while ``H``
        waits for the run's setting (:meth:`follow_run`)."""
        return self.session_steps


def follow_run(strategy: StackedStrategy, *, population: bool, steps_per_epoch: int) -> None:
    """Tell an asynchronous server's method the run's setting before anything reads what
    follows it (:meth:`ServerStrategy.follow_run`; FedBuff's ``H=None``); any other method
    follows nothing."""
    if isinstance(strategy, ServerStrategy):
        strategy.follow_run(population=population, steps_per_epoch=steps_per_epoch)
