"""Who computes next: one small object per way of running the nodes (shared/DESIGN.md section 9).

A scheduler takes the run from one step to the next (:meth:`Scheduler.advance`); the run keeps
the state and does the work it is asked for (:meth:`exogym.run.state.Run.compute`: the given
nodes compute one step, the strategy updates and communicates):

- :class:`Lockstep` (synchronous strategies): step ``k`` of every node that computes is step
  ``k``; in a world, the world decides before each step who is up (and who recovers first);
- :class:`PerNodeTimelines` (asynchronous strategies): each node on its own simulated clock; the
  event loop below decides which nodes compute next and when a push reaches the server.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

from exogym.run.events import Timelines, same_or_before

if TYPE_CHECKING:
    from exogym.run.dist import RankContext
    from exogym.run.state import Run, RunSettings
    from exogym.sim.participation import Participation

__all__ = ["Lockstep", "PerNodeTimelines", "Rounds", "Scheduler"]


class Scheduler(Protocol):
    """Takes a run one step further (its ``step`` count)."""

    def advance(self, run: Run) -> int:
        """Have the run compute until its step count grows by one; the new count."""
        ...

    def state_dict(self) -> dict[str, Any] | None: ...

    def load_state_dict(self, state: dict[str, Any] | None) -> None: ...


class Lockstep:
    """Synchronous runs: every node that computes takes the step together. ``worldly``: nodes
    may be absent (a world that is not perfect, a deadline, partial participation): the run's
    world decides before each step who is up (:meth:`exogym.run.state.Run.world_step`), and
    with ``participation`` only the round's participants among them compute
    (:mod:`exogym.sim.participation`; a round is ``period`` steps)."""

    def __init__(self, worldly: bool, participation: Participation | None = None,
                 period: int = 1) -> None:
        self.worldly = worldly or participation is not None
        self.participation, self.period = participation, period
        self.participants: list[bool] | None = None  # this round's

    def advance(self, run: Run) -> int:
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
    """A population's rounds (:mod:`exogym.run.population`): at a round's first step the run
    seats the round's clients (:meth:`exogym.run.state.Run.start_round`), every seat computes
    each step of the round, and at its end clients that keep state write it back."""

    def __init__(self, period: int) -> None:
        self.period = period

    def advance(self, run: Run) -> int:
        step, population = run.step, run.population
        assert population is not None
        if step % self.period == 0 or not population.seated:
            run.start_round(step)
        run.compute(step, population.active)
        if (step + 1) % self.period == 0 or step + 1 == run.settings.total_steps:
            population.end_round(run.strategy, run.comm.node_ids)
        return step + 1

    def state_dict(self) -> dict[str, Any] | None:
        return None  # the population's state is the run's (Run.state_dict)

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        pass


class PerNodeTimelines:
    """Asynchronous strategies: per-node timelines (:mod:`exogym.run.events`). Events run in
    simulated time order until the fastest node has taken one more step: the next event is the
    earliest of the free nodes' clocks and the pushes in flight; an arrival due no later than
    every free node's clock is applied first, else the free nodes due at that instant compute
    one step together (one masked step of the node-stacked engine). At the end of the run the
    pushes in flight are delivered."""

    def __init__(self, num_nodes: int) -> None:
        self.timelines = Timelines(num_nodes)

    @staticmethod
    def check(sid: str, s: RunSettings, ranks: RankContext | None,
              population: bool = False) -> None:
        """An asynchronous strategy runs in one process, on a simulated network, in a world
        of node speeds (no failures or losses yet); a population's availability decides whom
        the server draws (``population``)."""
        if ranks is not None:
            raise ValueError(f"{sid} is asynchronous: its parameter server and per-node "
                             "timelines run in one process; allowed: the simulator "
                             "(engine loop or vmap, not --engine process or torchrun)")
        if s.network is None:
            raise ValueError(f"{sid} is asynchronous: when an update reaches the server is "
                             "decided by a simulated network; give the run one (--network)")
        w = s.world
        drawn_only = population and not (w.mtbf_s or w.events)  # availability: at the draw
        if (w.availability_varies and not drawn_only) or w.drop:
            raise ValueError(f"{sid} is asynchronous: its world may give node speeds "
                             f"(speed=..., speed_sigma=...), not failures, rejoins or message "
                             f"loss; got world {w.spec()!r}")

    def advance(self, run: Run) -> int:
        tl, clock, strategy = self.timelines, run.clock, run.strategy
        assert clock is not None
        if run.population is not None and not run.population.seated:
            run.fill_seats()
        n, target = run.comm.num_nodes, run.step + 1
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
            pushed = strategy.outbox  # type: ignore[attr-defined]
            if pushed:
                sizes = [r.payload_bytes for r in run.comm.log[-len(pushed):]]
                for node, size in zip(pushed, sizes, strict=True):
                    clock.push(node, size)
                    tl.waiting[node] = True
                pushed.clear()
        if target >= run.settings.total_steps:
            for node, at in clock.serve_pushes(math.inf, final=True):
                tl.arrive(node, at)
            while tl.in_flight:
                self._deliver(run, *tl.pop_arrival())
        return tl.fastest

    def _deliver(self, run: Run, arrival: float, seq: int, node: int) -> None:
        """A push reaches the server: it applies the update and replies to the node."""
        assert run.clock is not None
        run.strategy.receive(node)  # type: ignore[attr-defined]
        if run.population is not None:  # a population's seat takes its next client
            run.next_client(node)
        run.strategy.restart(node)  # type: ignore[attr-defined]
        run.clock.reply(node, run.comm.log[-1].payload_bytes, arrival)
        self.timelines.waiting[node] = False

    def state_dict(self) -> dict[str, Any]:
        return self.timelines.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        assert state is not None
        self.timelines.load_state_dict(state)
