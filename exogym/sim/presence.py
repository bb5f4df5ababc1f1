"""Who is up, late, cut or recovering: the world's decisions, step by step, in one run.

:class:`~exogym.sim.world.World` says what the world is (speeds, failure laws, explicit events,
loss, the quorum); :class:`Presence` is what it did so far in a run and decides, before each
step and at each synchronisation, with the nodes' simulated clocks (docs/design/world.md;
docs/design.md, "The parts of a run"):

- before a step (:meth:`Presence.before_step`): nodes fail by their own clocks, down nodes
  whose return has come rejoin, the run waits for a quorum (the up nodes' clocks jump to the
  next return; an error past ``max_wait``), and nodes a deadline cut sit out until the others
  have caught up with them; the result is who computes;
- who recovers from whom (:meth:`Presence.donors`): the lowest-numbered node that is up and in
  sync; when all up nodes are coming back at once, the one that failed last goes on from its own
  state and the others recover from it;
- at a synchronisation (:meth:`Presence.arrivals`): whose messages are lost (one seeded draw per
  synchronisation) and whom the deadline cuts.

Every decision is an event (step, node, simulated time) handed to the run's recorder, and a
count; the clock operations that another network's replay needs (a node back at a step, down
until a time, a quorum wait) are appended to the run's ``ops`` list. Executing a recovery (the
strategy's state copied point to point) is the run's; :meth:`Presence.recovered` counts it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from exogym.sim.clock import SimClock
from exogym.sim.world import World

__all__ = ["Presence", "bits", "recovery_source"]


def bits(flags: Sequence[bool] | None) -> int:
    """Booleans as a bit mask (bit ``i``: ``flags[i]``); None (all) as -1."""
    return -1 if flags is None else sum(1 << i for i, f in enumerate(flags) if f)


def recovery_source(donor: int) -> dict[str, Any]:
    """A recovery event's source: ``{"donor": node}``, or ``{"from": "server"}`` for ``-1``
    (state downloaded from the server, :meth:`exogym.sim.comm.Communicator.download`)."""
    return {"from": "server"} if donor < 0 else {"donor": donor}


class Presence:
    """The world's state in a run (module docstring).

    Args:
        world: the world.
        num_nodes: ``N``.
        on_event: receives every event (a dict: ``step``, ``time_s``, ``node``, ``event``, ...).
        ops: the run's list of clock operations for re-costing (None: not recorded).
    """

    def __init__(self, world: World, num_nodes: int, on_event: Callable[[dict[str, Any]], None],
                 ops: list[list[Any]] | None) -> None:
        self.world, self.num_nodes = world, num_nodes
        self.on_event, self.ops = on_event, ops
        self.down = [False] * num_nodes
        # Nodes a deadline cut at a synchronisation: still finishing the round they were cut
        # from, they sit out steps until the others' clocks reach theirs (see before_step).
        self.late = [False] * num_nodes
        self.counts: dict[str, Any] = {
            "failures": 0, "rejoins": 0, "recoveries": 0, "recovery_bytes": 0.0,
            "recovery_time_s": 0.0, "messages_lost": 0, "stragglers_cut": 0, "late_steps": 0,
            "quorum_wait_s": 0.0}
        self.syncs = 0  # synchronisations that drew message losses
        self.step = 0
        self.clock: SimClock | None = None
        self._failed_at = [-1] * num_nodes  # each node's last failure (step)

    # -- before a step ---------------------------------------------------------------------
    def before_step(self, step: int, clock: SimClock | None) -> tuple[list[bool], list[int]]:
        """Failures and rejoins by each node's own clock, the quorum, late nodes sitting out:
        ``(who computes this step, the nodes that rejoined: they must recover)``."""
        self.step, self.clock = step, clock
        world, n = self.world, self.num_nodes
        for i in range(n):
            if not self.down[i] and not world.is_up(i, self._time(i), step):
                self.down[i] = True
                self._failed_at[i] = step
                self.counts["failures"] += 1
                self._event("fail", i)
        rejoined = self._rejoin()
        waited = 0.0
        while sum(not d for d in self.down) < world.min_nodes:
            waited += self._wait_for_quorum()
            rejoined += self._rejoin()
        if waited:
            self.counts["quorum_wait_s"] += waited
        active = [not d for d in self.down]
        if any(self.late):
            self._sit_out_late(active)
        return active, rejoined

    def _time(self, node: int) -> float:
        return self.clock.t[node] if self.clock is not None else 0.0

    def _event(self, kind: str, node: int, **extra: Any) -> None:
        self.on_event({"step": self.step, "time_s": self._time(node), "node": node,
                       "event": kind, **extra})

    def _sit_out_late(self, active: list[bool]) -> None:
        """Nodes a deadline cut are still busy with the round they were cut from: each sits out
        (``active[i] = False``) while its clock is ahead of the most advanced of the other up
        nodes (the time at which they start this step), and computes again from the step at
        which they have caught up with it. Without this, a node too slow for the deadline
        would still take every step of the lockstep loop and the run would wait for it."""
        n = self.num_nodes
        now = max((self._time(j) for j in range(n) if active[j] and not self.late[j]),
                  default=None)
        for i in range(n):
            if not (self.late[i] and active[i]):
                continue
            if now is None or self._time(i) <= now * (1 + 1e-12):
                self.late[i] = False
            else:
                active[i] = False
                self.counts["late_steps"] += 1

    def _rejoin(self) -> list[int]:
        """Down nodes whose time to come back has come (the run's "now": the clock of its most
        advanced node that is up) rejoin; the nodes that did."""
        n, step = self.num_nodes, self.step
        ups = [self._time(j) for j in range(n) if not self.down[j]]
        now = max(ups) if ups else min(
            (b for i in range(n) if self.down[i]
             and (b := self.world.next_up(i, self._time(i), step)) is not None),
            default=math.inf)
        back_now = []
        for i in range(n):
            if not self.down[i]:
                continue
            back = self.world.next_up(i, self._time(i), step)
            if back is None or back > now:
                continue
            if self.clock is not None:
                self._clock_back(i, back)
            self.down[i] = False
            self.counts["rejoins"] += 1
            self._event("rejoin", i)
            back_now.append(i)
        return back_now

    def _clock_back(self, node: int, back: float) -> None:
        """The node's clock: down until ``back``; back at a step (no time of its own passed), it
        returns "now", when the most advanced node that is up is."""
        assert self.clock is not None
        up = [not d for d in self.down]
        if back <= self._time(node):
            back = max([back] + [self.clock.t[j] for j in range(self.num_nodes) if up[j]])
            if self.ops is not None:
                self.ops.append(["n", node, bits(up)])
        elif self.ops is not None:
            self.ops.append(["d", node, back])
        self.clock.down(node, back)

    def _wait_for_quorum(self) -> float:
        """Fewer than ``min_nodes`` nodes are up: the run waits until the next one returns (its
        up nodes idle); the seconds waited. Raises RuntimeError if none ever does, or not
        within ``max_wait``."""
        world, n = self.world, self.num_nodes
        returns = [world.next_up(i, self._time(i), self.step) for i in range(n) if self.down[i]]
        times = [t for t in returns if t is not None]
        up = [i for i in range(n) if not self.down[i]]
        now = max((self._time(i) for i in up), default=0.0)
        if not times or self.clock is None:
            raise RuntimeError(
                f"the quorum min_nodes={world.min_nodes} cannot be met at step {self.step}: "
                f"{len(up)} node(s) up and no down node comes back by itself (a step-based "
                "failure holds until its step, which the run cannot reach without a quorum)")
        until = min(times)
        if until - now > world.max_wait_s:
            raise RuntimeError(
                f"the quorum min_nodes={world.min_nodes} is not met within max_wait="
                f"{world.max_wait_s:g} s at step {self.step}: the next node returns "
                f"{until - now:.0f} s later")
        for i in up:
            self.clock.wait(i, until)
            if self.ops is not None:
                self.ops.append(["w", i, until])
        self._event("quorum_wait", up[0] if up else 0, until_s=until)
        return max(until - now, 0.0)

    # -- recovery --------------------------------------------------------------------------
    def donors(self, nodes: Sequence[int]) -> list[tuple[int, int]]:
        """``(node, donor)`` for each of ``nodes`` (computing again, out of sync): the lowest-
        numbered node that is up and in sync. When every node that is up is coming back (all
        were down at once), none is in sync: the one that failed last holds the newest state,
        goes on from its own (event ``resume_own``), and the others recover from it."""
        n = self.num_nodes
        synced = [j for j in range(n) if not self.down[j] and j not in nodes]
        todo = list(nodes)
        if not synced and n > 1 and todo:
            newest = max(todo, key=lambda j: (self._failed_at[j], -j))
            self._event("resume_own", newest)
            synced, todo = [newest], [j for j in todo if j != newest]
        return [(node, synced[0]) for node in todo] if synced else []

    def recovered(self, node: int, donor: int, received: float, seconds: float) -> None:
        """Count a recovery the run performed (``received`` bytes, ``seconds`` on the node's
        clock) from ``donor`` (``-1``: the server, through a server topology; the event says
        ``"from": "server"`` instead of a donor)."""
        self.counts["recoveries"] += 1
        self.counts["recovery_bytes"] += received
        self.counts["recovery_time_s"] += seconds
        self._event("recovery", node, **recovery_source(donor), bytes=received,
                    duration_s=seconds)

    # -- a synchronisation -----------------------------------------------------------------
    def arrivals(self, active: list[bool] | None, deadline: str | None,
                 clock: SimClock | None) -> list[bool] | None:
        """The ``active`` nodes (None: all) minus those whose message is lost (the world's
        ``drop``, one draw per synchronisation) and those the ``deadline`` cuts (by the
        clock); None: all of them."""
        self.clock = clock
        n = self.num_nodes
        heard = list(active) if active is not None else [True] * n
        lost = self.world.lost(self.syncs, n)
        self.syncs += 1
        for i in range(n):
            if heard[i] and lost[i]:
                heard[i] = False
                self.counts["messages_lost"] += 1
                self._event("lost", i)
        if deadline is not None:
            if clock is None:
                raise ValueError(f"deadline={deadline!r} needs a simulated network (a clock to "
                                 "tell who is late): give the run a network")
            kept = clock.arrivals(heard, deadline)
            for i in range(n):
                if heard[i] and not kept[i]:
                    self.counts["stragglers_cut"] += 1
                    self.late[i] = True
                    self._event("late", i, deadline=deadline)
            heard = kept
        return None if all(heard) else heard

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"down": list(self.down), "late": list(self.late), "counts": dict(self.counts),
                "syncs": self.syncs, "failed_at": list(self._failed_at)}

    def load_state_dict(self, state: dict[str, Any], events: Sequence[dict[str, Any]]) -> None:
        """Restore :meth:`state_dict` (``events``: the run's event log, for checkpoints written
        before the last failures were kept here)."""
        self.down = [bool(d) for d in state["down"]]
        self.late = [bool(d) for d in state["late"]]
        self.counts = dict(state["counts"])
        self.syncs = int(state["syncs"])
        failed = state.get("failed_at")
        if failed is None:
            failed = [max((e["step"] for e in events if e["node"] == i
                           and e["event"] == "fail"), default=-1) for i in range(self.num_nodes)]
        self._failed_at = [int(s) for s in failed]
