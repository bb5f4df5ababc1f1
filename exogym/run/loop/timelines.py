"""Asynchronous strategies: per-node timelines (:class:`PerNodeTimelines`, the scheduler) and
the parameter server as they see it (:class:`ParameterServer`, the
:class:`~exogym.run.loop.schedule.Server` it drives).

Events run in simulated time order until the fastest node has taken one more step: the next
event is the earliest of the free nodes' clocks and the pushes in flight; an arrival due no
later than every free node's clock is applied first, else the free nodes due at that instant
compute one step together (one masked step of the node-stacked engine). At the end of the run
the pushes in flight are delivered. The state between two steps is
:class:`~exogym.run.loop.events.Timelines`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from exogym.run.loop.events import Timelines, same_or_before

if TYPE_CHECKING:
    from exogym.run.dist.ranks import RankContext
    from exogym.run.loop.schedule import ClockSource, Compute, Server
    from exogym.run.nodes.seats import Seats
    from exogym.sim.network import Network
    from exogym.sim.world import World
    from exogym.strategy.server import ServerStrategy

__all__ = ["ParameterServer", "PerNodeTimelines"]


class PerNodeTimelines:
    """The event loop of an asynchronous run over ``num_rows`` nodes (a population's seats).

    Args:
        compute: computes a step of the nodes due.
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
        tl, clock = self.timelines, self.clocks.clock
        assert clock is not None
        self.server.fill()  # a population's first clients in flight (once)
        n, target = self.num_rows, step + 1
        while tl.fastest < target:
            free = [i for i in range(n) if not tl.waiting[i]]
            start = min((clock.t[i] for i in free), default=math.inf)
            arrival = tl.next_arrival()
            for node, at in clock.serve_pushes(min(start, arrival[0] if arrival else math.inf)):
                tl.arrive(node, at)
            arrival = tl.next_arrival()
            if arrival is not None and same_or_before(arrival[0], start):
                at, _, node = tl.pop_arrival()
                self._deliver(step, at, node)
                continue
            group = [not tl.waiting[i] and same_or_before(clock.t[i], start) for i in range(n)]
            self.compute(step, None if all(group) else group)
            for i in range(n):
                tl.steps[i] += group[i]
            for node, size in self.server.pushes():
                clock.push(node, size)
                tl.waiting[node] = True
        if target >= self.total_steps:
            for node, at in clock.serve_pushes(math.inf, final=True):
                tl.arrive(node, at)
            while tl.in_flight:
                at, _, node = tl.pop_arrival()
                self._deliver(step, at, node, final=True)
        return tl.fastest

    def row(self) -> dict[str, Any]:
        """A metrics row's view of the timelines (:meth:`Timelines.row`)."""
        return self.timelines.row(self.server.staleness)

    def summary(self) -> dict[str, Any]:
        """The result's view of the timelines (:meth:`Timelines.summary`)."""
        return self.timelines.summary(self.server.staleness)

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

    def deliver(self, node: int, at: float, step: int, final: bool) -> float:
        self.strategy.receive(node)
        if not final and self.seats is not None:
            self.seats.next_client(node, self.clocks.clock, step, at)
        return self.strategy.restart(node)
