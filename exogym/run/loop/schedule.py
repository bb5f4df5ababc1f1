"""Who computes next: one small object per way of running the nodes (docs/design.md,
"The parts of a run").

A scheduler takes the run from one step to the next (:meth:`Scheduler.advance`); the run keeps
the state and does the work it is asked for, through the narrow protocol :class:`Stepped`
(:class:`exogym.run.loop.run.Run` implements it; ``compute``: the given nodes compute one step,
the strategy updates and communicates):

- :class:`Lockstep` (synchronous strategies): step ``k`` of every node that computes is step
  ``k``; in a world, the world decides before each step who is up (and who recovers first);
- :class:`Rounds` (a population's seats, :mod:`exogym.run.nodes.population`): a round's clients are
  seated at its first step and every seat computes its steps;
- :class:`PerNodeTimelines` (asynchronous strategies): each node on its own simulated clock; the
  event loop below decides which nodes compute next and when a push reaches the server.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from exogym.run.loop.events import Timelines, same_or_before

if TYPE_CHECKING:
    from exogym.run.dist.ranks import RankContext
    from exogym.sim.clock import SimClock
    from exogym.sim.network import Network
    from exogym.sim.participation import Participation
    from exogym.sim.world import World

__all__ = ["Lockstep", "PerNodeTimelines", "Rounds", "Scheduler", "Stepped"]

Select = Callable[[int, list[bool]], tuple[list[bool], dict[int, int], list[int]]]


class Stepped(Protocol):
    """What a scheduler asks of the run (:class:`exogym.run.loop.run.Run`)."""

    step: int

    @property
    def total_steps(self) -> int: ...

    @property
    def rows(self) -> int:
        """The nodes (a population's seats) the run computes."""
        ...

    @property
    def clock(self) -> SimClock | None: ...

    def compute(self, step: int, active: list[bool] | None) -> None:
        """The ``active`` nodes (None: all) compute ``step``."""

    def world_step(self, select: Select | None = None) -> list[bool] | None:
        """The world's say before a step: who computes (None: all)."""

    # a population's rounds
    def start_round(self, step: int) -> None: ...

    def end_round(self) -> None: ...

    @property
    def round_active(self) -> list[bool] | None: ...

    @property
    def seated(self) -> bool: ...

    # an asynchronous server
    def fill_seats(self) -> None: ...

    def pushes(self) -> list[tuple[int, float]]:
        """``(node, bytes)`` of the updates pushed at the step just computed, taken."""
        ...

    def deliver(self, node: int, at: float, final: bool) -> float:
        """A push reaches the server at ``at``; the bytes of the model it sends back
        (``final``: the run's end, no other round follows)."""
        ...


class Scheduler(Protocol):
    """Takes a run one step further (its ``step`` count)."""

    def advance(self, run: Stepped) -> int:
        """Have the run compute until its step count grows by one; the new count."""
        ...

    def state_dict(self) -> dict[str, Any] | None: ...

    def load_state_dict(self, state: dict[str, Any] | None) -> None: ...


class Lockstep:
    """Synchronous runs: every node that computes takes the step together. ``worldly``: nodes
    may be absent (a world that is not perfect, a deadline, partial participation): the run's
    world decides before each step who is up (:meth:`exogym.run.loop.run.Run.world_step`), and
    with ``participation`` only the round's participants among them compute
    (:mod:`exogym.sim.participation`; a round is ``period`` steps)."""

    def __init__(self, worldly: bool, participation: Participation | None = None,
                 period: int = 1) -> None:
        self.worldly = worldly or participation is not None
        self.participation, self.period = participation, period
        self.participants: list[bool] | None = None  # this round's

    def advance(self, run: Stepped) -> int:
        step = run.step
        run.compute(step, run.world_step(self.select if self.participation else None)
                    if self.worldly else None)
        return step + 1

    def select(self, step: int, up: list[bool]) -> tuple[list[bool], dict[int, int], list[int]]:
        """``(who computes at step, {node joining the round now: its donor}, the participants
        that stay from the previous round and start their own state afresh)``: at a round's
        first step the participants are drawn among the ``up`` nodes; a participant that did not
        take part in the previous round joins: it receives the global model from a client of
        the previous round that is up (in turn, so that no client carries every download; the
        peer-to-peer stand-in for a server's broadcast). None is up: no donor given (the run's
        usual choice). With ``client_state="fresh"`` a participant that stays restarts its
        state (a client keeps nothing from one round to its next)."""
        assert self.participation is not None
        joining: dict[int, int] = {}
        staying: list[int] = []
        fresh = step % self.period == 0 or self.participants is None
        if fresh or not any(u and p for u, p in zip(up, self.participants, strict=True)):
            previous = self.participants  # every participant down: a new draw in the round
            self.participants = self.participation.draw(step // self.period, up,
                                                        0 if fresh else step + 1)
            if previous is not None:
                new = [i for i, p in enumerate(self.participants) if p and not previous[i]]
                donors = [i for i, p in enumerate(previous) if p and up[i]] or [-1]
                joining = {node: donors[k % len(donors)] for k, node in enumerate(new)}
                if fresh and self.participation.client_state == "fresh":
                    staying = [i for i, p in enumerate(self.participants)
                               if p and previous[i] and up[i]]
        return [u and p for u, p in zip(up, self.participants, strict=True)], joining, staying

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.participants is None else {"participants": list(self.participants)}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.participants = (None if not state else
                             [bool(p) for p in state["participants"]])


class Rounds:
    """A population's rounds (:mod:`exogym.run.nodes.population`): at a round's first step the run
    seats the round's clients (:meth:`exogym.run.loop.run.Run.start_round`), every seat computes
    each step of the round, and at its end clients that keep state write it back."""

    def __init__(self, period: int) -> None:
        self.period = period

    def advance(self, run: Stepped) -> int:
        step = run.step
        if step % self.period == 0 or not run.seated:
            run.start_round(step)
        run.compute(step, run.round_active)
        if (step + 1) % self.period == 0 or step + 1 == run.total_steps:
            run.end_round()
        return step + 1

    def state_dict(self) -> dict[str, Any] | None:
        return None  # the population's state is the run's (Run.state_dict)

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        pass


class PerNodeTimelines:
    """Asynchronous strategies: per-node timelines (:mod:`exogym.run.loop.events`). Events run in
    simulated time order until the fastest node has taken one more step: the next event is the
    earliest of the free nodes' clocks and the pushes in flight; an arrival due no later than
    every free node's clock is applied first, else the free nodes due at that instant compute
    one step together (one masked step of the node-stacked engine). At the end of the run the
    pushes in flight are delivered."""

    def __init__(self, num_nodes: int) -> None:
        self.timelines = Timelines(num_nodes)

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

    def advance(self, run: Stepped) -> int:
        tl, clock = self.timelines, run.clock
        assert clock is not None
        run.fill_seats()  # a population's first clients in flight (once)
        n, target = run.rows, run.step + 1
        while tl.fastest < target:
            free = [i for i in range(n) if not tl.waiting[i]]
            start = min((clock.t[i] for i in free), default=math.inf)
            arrival = tl.next_arrival()
            for node, at in clock.serve_pushes(min(start, arrival[0] if arrival else math.inf)):
                tl.arrive(node, at)
            arrival = tl.next_arrival()
            if arrival is not None and same_or_before(arrival[0], start):
                self._deliver(run, *tl.pop_arrival())
                continue
            group = [not tl.waiting[i] and same_or_before(clock.t[i], start) for i in range(n)]
            run.compute(run.step, None if all(group) else group)
            for i in range(n):
                tl.steps[i] += group[i]
            for node, size in run.pushes():
                clock.push(node, size)
                tl.waiting[node] = True
        if target >= run.total_steps:
            for node, at in clock.serve_pushes(math.inf, final=True):
                tl.arrive(node, at)
            while tl.in_flight:
                self._deliver(run, *tl.pop_arrival(), final=True)
        return tl.fastest

    def _deliver(self, run: Stepped, arrival: float, seq: int, node: int,
                 final: bool = False) -> None:
        """A push reaches the server: it applies the update and replies to the node (a
        population's seat: its next client, drawn among those available at the arrival)."""
        assert run.clock is not None
        run.clock.reply(node, run.deliver(node, arrival, final), arrival)
        self.timelines.waiting[node] = False

    def state_dict(self) -> dict[str, Any]:
        return self.timelines.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        assert state is not None
        self.timelines.load_state_dict(state)
