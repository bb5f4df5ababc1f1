"""Per-node timelines: which node computes next, and when a pushed update reaches the server.

The state of the run's event loop for asynchronous strategies (docs/design/async.md;
:mod:`exogym.strategy.server`). The loop (:class:`exogym.run.loop.timelines.PerNodeTimelines`)
repeats, in simulated time order:

1. the next event is the earliest of (a) the clocks of the nodes that are free (not waiting for
   the server's reply) and (b) the arrival times of the pushes in flight;
2. an arrival due no later than every free node's clock is applied first (the server applies
   it and replies; the node is free again when the reply has reached it). Only then can a
   step that starts later see its result; a push that is not yet in flight comes from a step
   that starts no earlier than the free nodes' clocks and arrives later still, so applying
   arrivals in this order needs no foresight of completion times (the error FedScale PR #197
   fixed);
3. otherwise the free nodes whose clocks equal the earliest (to a relative ``1e-9``) take one
   step together (a group: its data, clock and local counts now, its compute later, batched
   with other groups': :class:`exogym.run.loop.timelines.BatchedSteps`); those that finish
   their round push and wait for the reply. A push queues for the server's downlink, which
   serves pushes first come, first served by the simulated time each was ready; it is served
   (and becomes an arrival at the time the network delivers it) once no push can be ready
   before it, i.e. when the free nodes' clocks have passed its ready time
   (:meth:`exogym.sim.clock.SimClock.serve_pushes`). Ties between arrivals go in service
   order.

With equal speeds every node is due at the same instant at every step: the loop is the
lockstep loop. The run's ``step`` is the fastest node's count (``--steps`` is its budget);
one :meth:`Run.train_step` runs the loop until that count grows by one.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SAME_INSTANT", "Timelines"]

SAME_INSTANT = 1e-9  # relative: two simulated times this close are the same instant


def same_or_before(a: float, b: float) -> bool:
    """``a <= b`` up to :data:`SAME_INSTANT` (relative to the larger, at least 1 s)."""
    return a <= b + SAME_INSTANT * max(1.0, abs(a), abs(b))


@dataclass
class Timelines:
    """Each node's step count, who waits for the server, the pushes in flight, and how many
    of the server's updates the metrics rows have reported (the staleness of every update is
    the strategy's ``staleness`` list)."""

    num_nodes: int
    steps: list[int] = field(default_factory=list)
    waiting: list[bool] = field(default_factory=list)
    # (arrival time, push sequence number, node), sorted: the pushes in flight.
    in_flight: list[tuple[float, int, int]] = field(default_factory=list)
    pushes: int = 0
    reported: int = 0  # updates covered by the metrics rows so far

    def __post_init__(self) -> None:
        if not self.steps:
            self.steps = [0] * self.num_nodes
        if not self.waiting:
            self.waiting = [False] * self.num_nodes

    @property
    def fastest(self) -> int:
        return max(self.steps)

    def arrive(self, node: int, arrival: float) -> None:
        """Node ``node``'s push (it waits for the reply since it pushed) has been served by the
        server's downlink and arrives at ``arrival``."""
        bisect.insort(self.in_flight, (arrival, self.pushes, node))
        self.pushes += 1

    def next_arrival(self) -> tuple[float, int, int] | None:
        return self.in_flight[0] if self.in_flight else None

    def pop_arrival(self) -> tuple[float, int, int]:
        return self.in_flight.pop(0)

    def row(self, staleness: list[int]) -> dict[str, Any]:
        """The metrics row's asynchronous entries: the updates applied so far (``staleness``:
        of each, in order) and the staleness of those since the last row."""
        w = staleness[self.reported:]
        self.reported = len(staleness)
        return {"updates": len(staleness), "staleness": sum(w) / len(w) if w else None,
                "staleness_max": max(w) if w else None}

    def summary(self, staleness: list[int]) -> dict[str, Any]:
        s = staleness
        return {"node_steps": list(self.steps), "updates": len(s),
                "staleness_mean": sum(s) / len(s) if s else None,
                "staleness_max": max(s) if s else None,
                "staleness_counts": {str(k): s.count(k) for k in sorted(set(s))}}

    def state_dict(self) -> dict[str, Any]:
        return {"steps": list(self.steps), "waiting": list(self.waiting),
                "in_flight": [list(a) for a in self.in_flight], "pushes": self.pushes,
                "reported": self.reported}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = [int(v) for v in state["steps"]]
        self.waiting = [bool(v) for v in state["waiting"]]
        self.in_flight = [(float(t), int(k), int(i)) for t, k, i in state["in_flight"]]
        self.pushes = int(state["pushes"])
        self.reported = int(state["reported"])
