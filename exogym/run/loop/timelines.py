"""Asynchronous strategies: per-node timelines (:class:`PerNodeTimelines`, the scheduler), the
parameter server as they see it (:class:`ParameterServer`, the
:class:`~exogym.run.loop.schedule.Server` it drives), and how the steps the timelines find due are
computed (:class:`BatchedSteps`; :class:`ImmediateSteps` for a bare
:class:`~exogym.run.loop.schedule.Compute`).

Events run in simulated time order until the fastest node has taken one more step: the next
event is the earliest of the free nodes' clocks and the pushes in flight; an arrival due no
later than every free node's clock is applied first, else the free nodes due at that instant
take one step together (a *group*). At the end of the run the pushes in flight are delivered.
The state between two steps is :class:`~exogym.run.loop.events.Timelines`.

A group's step is *counted* when it is due (its data taken, the clock told, the strategy's local
counts and pushes made: everything the event loop and the records read) and *computed* later:
a node's step depends on nothing but its own parameters, optimizer state and data until the
server replies to it, so the steps counted since the last computation run as few batched steps
of the node-stacked engine, each taking the next counted step of every node that has one,
whatever its simulated time. They are all computed before the server reads or writes a node
(a delivery), and at the end of each run step, where their losses are accounted group by group
in the order the groups were due; so a delivery, an evaluation, a metrics row and a checkpoint
see exactly what computing each group at once would give (docs/design/async.md).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from exogym.run.loop.clocking import ClockFeed
from exogym.run.loop.events import SAME_INSTANT, Timelines, same_or_before
from exogym.run.loop.losses import TrainLoss
from exogym.run.nodes.memory import InMemory
from exogym.run.nodes.seats import Seats
from exogym.strategy.server import ServerStrategy

if TYPE_CHECKING:
    from exogym.run.dist.ranks import RankContext
    from exogym.run.loop.schedule import ClockSource, Compute, Server
    from exogym.sim.network import Network
    from exogym.sim.world import World

__all__ = ["BatchedSteps", "ImmediateSteps", "ParameterServer", "PerNodeTimelines"]


class PerNodeTimelines:
    """The event loop of an asynchronous run over ``num_rows`` nodes (a population's seats).

    Args:
        compute: computes a step of the nodes due: the run's
            :class:`~exogym.run.loop.losses.TrainLoss` over nodes in memory, whose steps are
            batched (:class:`BatchedSteps`), or any :class:`~exogym.run.loop.schedule.Compute`,
            called for each group as it is due (:class:`ImmediateSteps`).
        server: the parameter server (the pushes, their delivery).
        clocks: the simulated clock (each node's time).
        num_rows: the nodes (seats) the run computes, over every process.
        total_steps: the run's length (the fastest node's steps).
    """

    steered = True

    def __init__(self, compute: Compute, server: Server, clocks: ClockSource, num_rows: int,
                 total_steps: int) -> None:
        self.compute, self.server, self.clocks = compute, server, clocks
        self.num_rows, self.total_steps = num_rows, total_steps
        self.timelines = Timelines(num_rows)
        self.due: BatchedSteps | ImmediateSteps = (BatchedSteps.of(compute, server, clocks)
                                                    or ImmediateSteps(compute))

    @staticmethod
    def check(sid: str, network: Network | None, w: World, ranks: RankContext | None,
              population: bool = False) -> None:
        """An asynchronous strategy runs in one process, on a simulated network, in a world
        of node speeds (no failures or losses yet); a population's availability decides whom
        the server draws (``population``)."""
        if ranks is not None:
            raise ValueError(f"{sid} is asynchronous: its parameter server and per-node "
                             "timelines run in one process; allowed: the simulator "
                             "(engine loop or vmap, not --engine process or torchrun)")
        if network is None:
            raise ValueError(f"{sid} is asynchronous: when an update reaches the server is "
                             "decided by a simulated network; give the run one (--network)")
        drawn_only = population and not (w.mtbf_s or w.events)  # availability: at the draw
        if (w.availability_varies and not drawn_only) or w.drop:
            raise ValueError(f"{sid} is asynchronous: its world may give node speeds "
                             f"(speed=..., speed_sigma=...), not failures, rejoins or message "
                             f"loss; got world {w.spec()!r}")

    def advance(self, step: int) -> int:
        tl, clock, due = self.timelines, self.clocks.clock, self.due
        assert clock is not None
        self.server.fill()  # a population's first clients in flight (once)
        n, target = self.num_rows, step + 1
        fastest = tl.fastest
        while fastest < target:
            t, waiting = clock.t, tl.waiting
            free = [i for i in range(n) if not waiting[i]]
            start = min((t[i] for i in free), default=math.inf)
            arrival = tl.next_arrival()
            for node, at in clock.serve_pushes(min(start, arrival[0] if arrival else math.inf)):
                tl.arrive(node, at)
            arrival = tl.next_arrival()
            if arrival is not None and same_or_before(arrival[0], start):
                at, _, node = tl.pop_arrival()
                due.catch_up()  # the server reads and writes the node: its steps come first
                self._deliver(step, at, node)
                continue
            # the free nodes due at that instant (same_or_before, inline: it is the hot loop)
            rows = [i for i in free
                    if t[i] <= start + SAME_INSTANT * max(1.0, abs(t[i]), abs(start))]
            due.take(step, rows, None if len(rows) == n else _mask(rows, n))
            for i in rows:
                tl.steps[i] += 1
                fastest = max(fastest, tl.steps[i])
            for node, size in self.server.pushes():
                clock.push(node, size)
                waiting[node] = True
        if target >= self.total_steps:
            due.catch_up()
            for node, at in clock.serve_pushes(math.inf, final=True):
                tl.arrive(node, at)
            while tl.in_flight:
                at, _, node = tl.pop_arrival()
                self._deliver(step, at, node, final=True)
        due.settle()
        return fastest

    def row(self) -> dict[str, Any]:
        """A metrics row's view of the timelines (:meth:`Timelines.row`)."""
        return self.timelines.row(self.server.staleness)

    def summary(self) -> dict[str, Any]:
        """The result's view of the timelines (:meth:`Timelines.summary`), with the ``H`` the
        run used (the given one, or the one its setting decided: FedBuff's ``H=None``)."""
        return {**self.timelines.summary(self.server.staleness),
                "H": self.server.period}

    def _deliver(self, step: int, arrival: float, node: int, final: bool = False) -> None:
        """A push reaches the server: it applies the update and replies to the node (a
        population's seat: its next client, drawn among those available at the arrival)."""
        clock = self.clocks.clock
        assert clock is not None
        clock.reply(node, self.server.deliver(node, arrival, step, final), arrival)
        self.timelines.waiting[node] = False

    def state_dict(self) -> dict[str, Any]:
        return self.timelines.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        assert state is not None
        self.timelines.load_state_dict(state)


class ParameterServer:
    """An asynchronous strategy's server (:class:`~exogym.strategy.server.ServerStrategy`) and
    the nodes it serves, as :class:`PerNodeTimelines` asks for them.

    Args:
        strategy: the server strategy.
        clocks: the simulated clock.
        seats: a population's seats, whose clients change at every reply (None: the nodes are
            always there).
    """

    def __init__(self, strategy: ServerStrategy, clocks: ClockSource,
                 seats: Seats | None = None) -> None:
        self.strategy, self.clocks, self.seats = strategy, clocks, seats

    def fill(self) -> None:
        if self.seats is not None:
            self.seats.fill(self.clocks.clock)

    def pushes(self) -> list[tuple[int, float]]:
        outbox = self.strategy.outbox
        out = [(int(node), float(size)) for node, size in outbox]
        outbox.clear()
        return out

    @property
    def staleness(self) -> list[int]:
        return self.strategy.staleness

    @property
    def period(self) -> int | None:
        """The fastest node's round, ``H`` as the run uses it (FedBuff's follows the setting)."""
        return self.strategy.sync_period

    def deliver(self, node: int, at: float, step: int, final: bool) -> float:
        self.strategy.receive(node)
        if not final and self.seats is not None:
            self.seats.next_client(node, self.clocks.clock, step, at)
        return self.strategy.restart(node)


class ImmediateSteps:
    """Each group's step computed as it is due: ``compute(step, active)`` (a bare
    :class:`~exogym.run.loop.schedule.Compute`, which also tells the clock; the protocol's
    fakes, a holder not in memory, a strategy whose ``step`` is its own)."""

    def __init__(self, compute: Compute) -> None:
        self.compute = compute

    def take(self, step: int, rows: list[int], active: list[bool] | None) -> None:
        self.compute(step, active)

    def catch_up(self) -> None:
        pass

    def settle(self) -> None:
        pass


@dataclass(eq=False)
class _Group:
    """A group's step, counted and not yet accounted: its run step, who took it (None: every
    node), its data (a population's: each node's sample ids, fetched with the batched step's;
    else the leaves of the batch its nodes took, flattened) and, once computed, ``(node,
    batched step)`` of each of its nodes."""

    step: int
    active: list[bool] | None
    rows: list[int]
    ids: list[Tensor] | None = None
    leaves: list[Any] | None = None
    spec: TreeSpec | None = None
    computed: list[tuple[int, int]] = field(default_factory=list)


class BatchedSteps:
    """The run's steps on per-node timelines, counted when due and computed batched (module
    docstring): :meth:`take` counts a group's step as the run's step does (the data, the clock,
    the strategy's local counts and pushes: :meth:`ServerStrategy.count_steps`, the
    communicator's attendance), :meth:`catch_up` computes the steps counted so far, as few
    masked steps of the engine (each the oldest counted step of every node that has one),
    :meth:`settle` also accounts their losses (:class:`~exogym.run.loop.losses.TrainLoss`,
    group by group in the order they were due, as when each is computed at once).

    Each node's row computes the same numbers in any mask (the engines compute a node's row
    from its own parameters, data and optimizer state; ``tests/run/test_async_engine.py``), so
    the run's numbers are those of computing each group as it is due, bit for bit. A batch
    whose nodes all took a step of a group of every node is computed unmasked (the optimizer's
    own step while no node has missed one), any other with its mask, as those groups were. A
    model that draws random numbers (dropout) would draw other ones in other batches: the
    first run step of each session computes each group at once and watches the random
    generators; if the model moved them, every group is computed at once from then on (the
    numbers of the engine before, at its speed).

    Args:
        compute: the run's loss accounting; its holder, the nodes (in memory or a
            population's seats) and their data.
        strategy: the server strategy (inner steps, local counts).
        feed: the run's clock feed (told of each group's compute when it is due).
    """

    def __init__(self, compute: TrainLoss, strategy: ServerStrategy, feed: ClockFeed) -> None:
        assert isinstance(compute.held, InMemory)
        self.compute, self.held, self.strategy, self.feed = compute, compute.held, strategy, feed
        self.nodes, self.comm = self.held.nodes, self.held.comm
        self.seats = self.held if isinstance(self.held, Seats) else None
        # each node's counted steps not yet computed: (group, its row in the group's data)
        self.queues: list[deque[tuple[_Group, int]]] = [
            deque() for _ in range(self.nodes.num_nodes)]
        self.groups: list[_Group] = []  # counted since the last settle, in order
        self.losses: list[Tensor] = []  # each batched step's, [n] (0 for the nodes not in it)
        self.members: list[int] = []  # how many nodes each batched step computed
        # the session's first run step computes each group at once, watching the generators;
        # a model that draws random numbers is computed so to the end (the class docstring)
        self.probing, self.each_at_once = True, False

    @classmethod
    def of(cls, compute: Compute, server: Server, clocks: ClockSource) -> BatchedSteps | None:
        """Batched steps over the run's parts, or None where a step cannot be counted apart
        from its compute: a bare Compute, nodes not all in memory (paged), a strategy that
        overrides ``step``."""
        if not (isinstance(compute, TrainLoss) and isinstance(compute.held, InMemory)
                and isinstance(server, ParameterServer) and isinstance(clocks, ClockFeed)):
            return None
        if type(server.strategy).step is not ServerStrategy.step:
            return None
        return cls(compute, server.strategy, clocks)

    def take(self, step: int, rows: list[int], active: list[bool] | None) -> None:
        """The nodes ``rows`` (``active``: their mask, None: all) take ``step``: counted now,
        computed later."""
        attendance = self.comm.attendance
        attendance.step, attendance.active = step, active
        if self.seats is not None:
            # the computing seats' clients' next sample ids (every client's position and the
            # epoch move on now); their samples are fetched with the batched step's
            ids = self.seats.population.take(rows)
            group, index = _Group(step, active, rows, ids=ids), range(len(rows))
        else:
            leaves, spec = tree_flatten(self.held.next_batch(active))
            group, index = _Group(step, active, rows, leaves=leaves, spec=spec), rows
        self.feed.computed(step, active)
        self.strategy.count_steps()
        self.groups.append(group)
        for row, j in zip(rows, index, strict=True):
            self.queues[row].append((group, j))
        if self.probing or self.each_at_once:
            self.catch_up()

    def catch_up(self) -> None:
        """Compute every step counted so far (before the server reads or writes a node)."""
        while self._batched_step():
            pass

    def settle(self) -> None:
        """Compute every step counted so far and account their losses, group by group in the
        order they were due (the end of a run step: a metrics row or a checkpoint may
        follow)."""
        self.catch_up()
        if not self.groups:
            return
        attendance = self.comm.attendance
        for g, loss in zip(self.groups, self._group_losses(), strict=True):
            attendance.step, attendance.active = g.step, g.active  # as computing it sets them
            self.compute.account(g.step, g.active, loss)
        self.groups, self.losses, self.members = [], [], []
        self.probing = False

    def _batched_step(self) -> bool:
        """One masked step of the engine: the oldest counted step of every node that has one;
        False when none has."""
        rows = [i for i, q in enumerate(self.queues) if q]
        if not rows:
            return False
        taken = [self.queues[i].popleft() for i in rows]
        n = self.nodes.num_nodes
        every = len(rows) == n and all(g.active is None for g, _ in taken)
        mask = None if every else _mask(rows, n)
        batch = self._batch(dict(zip(rows, taken, strict=True)))
        attendance = self.comm.attendance
        counted = attendance.active
        attendance.active = mask  # whom the inner step moves (the strategy's active rows)
        before = _generators(self.nodes.device) if self.probing else None
        try:
            losses = self.nodes.forward_backward(self.nodes.to_batch_device(batch), mask)
            with torch.no_grad():
                self.strategy.inner_step()
                if mask is None:
                    self.nodes.zero_grad()
                else:  # the others' gradients are zero still (forward_backward's contract)
                    index = torch.tensor(rows, device=self.nodes.device)
                    for g in self.nodes.grads.values():
                        g.index_fill_(0, index, 0.0)
        finally:
            attendance.active = counted
        if before is not None and not all(
                torch.equal(a, b) for a, b in zip(before, _generators(self.nodes.device),
                                                  strict=True)):
            self.each_at_once = True  # the model draws random numbers
        k = len(self.losses)
        self.losses.append(losses)
        self.members.append(len(rows))
        for i, (g, _) in zip(rows, taken, strict=True):
            g.computed.append((i, k))
        return True

    def _batch(self, taken: dict[int, tuple[_Group, int]]) -> Any:
        """The ``[n, B, ...]`` batch of a batched step: each computing node's counted samples;
        a node not in it repeats the first one's (it is not computed, or is discarded)."""
        first = next(iter(taken.values()))
        pick = [taken.get(i, first) for i in range(self.nodes.num_nodes)]
        if self.seats is not None:
            return self.seats.population.batches.fetch([g.ids[j] for g, j in pick])  # type: ignore[index]
        group = first[0]
        assert group.leaves is not None and group.spec is not None
        leaves = [torch.stack([g.leaves[k][j] for g, j in pick])  # type: ignore[index]
                  if isinstance(leaf, Tensor) else leaf for k, leaf in enumerate(group.leaves)]
        return tree_unflatten(leaves, group.spec)

    def _group_losses(self) -> list[Tensor]:
        """Each group's ``[n]`` losses as computing it at once gives them: its nodes' losses,
        0 for the others. A group computed alone is its batched step's; the others are gathered
        at once, and a group of every node gets a tensor of its own (as computing it would)."""
        computed = torch.stack(self.losses)  # [batched steps, n]
        which: list[int] = []
        rows: list[int] = []
        steps: list[int] = []
        for j, g in enumerate(self.groups):
            for i, k in g.computed:
                which.append(j)
                rows.append(i)
                steps.append(k)
        device = computed.device
        row = torch.tensor(rows, device=device)
        out = computed.new_zeros(len(self.groups), computed.shape[1])
        out[torch.tensor(which, device=device), row] = computed[torch.tensor(steps, device=device),
                                                                row]
        given = []
        for j, g in enumerate(self.groups):
            k = g.computed[0][1]
            if all(k == c for _, c in g.computed) and self.members[k] == len(g.rows):
                given.append(self.losses[k])  # computed alone: that batched step's
            else:
                given.append(out[j] if g.active is not None else out[j].clone())
        return given


def _generators(device: torch.device) -> list[Tensor]:
    """The states of the random generators a step on ``device`` may draw from."""
    states = [torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return states


def _mask(rows: Sequence[int], n: int) -> list[bool]:
    """``n`` booleans, True at ``rows``."""
    mask = [False] * n
    for i in rows:
        mask[i] = True
    return mask


