"""The world's say before a lockstep step: who computes, and who recovers from whom first.

:class:`WorldStep` is what a lockstep scheduler in a world asks before each step (its
:class:`~exogym.run.loop.schedule.WorldGate`), and who is heard at a synchronisation (the
communicator's :attr:`~exogym.sim.comm.Attendance.heard`). The world's decisions are
:class:`~exogym.sim.presence.Presence`'s (failures, rejoins, the quorum, late nodes, lost
messages, deadline cuts); what this adds is the run's part: with partial participation the
round's participants among the up nodes and who joins the round, then every recovery the step
needs, executed on every copy of the strategy (a paged run passes over its groups once), timed
on the clock and counted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exogym.run.loop.clocking import ClockFeed
    from exogym.run.loop.schedule import Select
    from exogym.run.nodes.holders import Holder
    from exogym.sim.participation import Participation
    from exogym.sim.presence import Presence
    from exogym.strategy.base import StackedStrategy

__all__ = ["WorldStep"]


class WorldStep:
    """Before each step of a lockstep run in a world (module docstring).

    Args:
        presence: the world's state in this run.
        held: where the nodes live (recoveries run on every copy of the strategy).
        feed: the run's clock feed (a recovery's transfer is timed on the clock).
        participation: the run's partial participation, or None.
    """

    def __init__(self, presence: Presence, held: Holder, feed: ClockFeed,
                 participation: Participation | None) -> None:
        self.presence, self.held, self.feed = presence, held, feed
        self.participation = participation

    def __call__(self, step: int, select: Select | None = None) -> list[bool] | None:
        """Before ``step``: the world says who computes (:meth:`Presence.before_step`;
        ``select``: the round's participants among the up nodes, and who joins the round);
        nodes that rejoined, joined, or were out of sync, recover from a live peer when they
        compute again (a late node heals once it has caught up, from the state the others hold
        then); the nodes that compute this step (None: all)."""
        active, rejoined = self.presence.before_step(step, self.feed.clock)
        strategies = self.held.strategies  # every copy (a paged run: one per group)
        joining: dict[int, int] = {}
        if select is not None:
            active, joining, staying = select(step, active)
            if staying:
                self.held.call(lambda strategy: _restart(strategy, staying))
        if rejoined or joining:
            for strategy in strategies:
                strategy.request_recovery(rejoined + list(joining))
        pending = [i for i in strategies[0].pending_recovery if active[i]]
        pairs = [(n, joining.get(n, d) if joining.get(n, -1) >= 0 else d, n in joining)
                 for n, d in (self.presence.donors(pending) if pending else [])]
        if pairs:
            self._recover(pairs)
        for strategy in strategies:
            strategy.pending_recovery = [i for i in strategy.pending_recovery if not active[i]]
        return None if all(active) else active

    def _recover(self, pairs: list[tuple[int, int, bool]]) -> None:
        """Every recovery of the step ``(node, donor, joining)``, then the clock: a paged run
        passes over its groups once; the records and their order are those of one recovery at
        a time; a joining client's recovery lasts from when its donor can send (before, it was
        not part of the run)."""
        comm, part = self.held.comm, self.participation
        before = [(comm.bytes_received[n], self._time(n), self._comm(n), comm.bytes_sent[d])
                  for n, d, _ in pairs]

        def recover_all(strategy: StackedStrategy) -> None:
            for n, d, j in pairs:
                with _client_recovery(strategy, part, j):
                    strategy.recover(n, d)

        self.held.call(recover_all)
        self.feed.feed()
        for (node, donor, joining), (received, start, busy, gave) in zip(pairs, before,
                                                                         strict=True):
            # a joining client's recovery is its transfer (before it, it was not in the run);
            # through a server a recovery the donor sent nothing for came from the server
            seconds = (self._comm(node) - busy if joining else self._time(node) - start)
            source = -1 if comm.server and comm.bytes_sent[donor] == gave else donor
            self.presence.recovered(node, source, comm.bytes_received[node] - received, seconds)

    def heard(self, active: list[bool] | None, deadline: str | None) -> list[bool] | None:
        """Who is heard at a synchronisation of the step being computed (the communicator's
        :data:`~exogym.sim.comm.Heard`): ``active`` minus lost messages and deadline cuts
        (:meth:`Presence.arrivals`)."""
        self.presence.step = self.held.comm.step
        return self.presence.arrivals(active, deadline, self.feed.clock)

    def _time(self, node: int) -> float:
        clock = self.feed.clock
        return clock.t[node] if clock is not None else 0.0

    def _comm(self, node: int) -> float:
        """``node``'s time communicating on the clock so far."""
        clock = self.feed.clock
        return clock.node_comm[node] if clock is not None else 0.0


@contextlib.contextmanager
def _client_recovery(strategy: StackedStrategy, participation: Participation | None,
                     joining: bool) -> Iterator[None]:
    """A client joining a round recovers with its ``client_state``: a fresh inner optimizer
    state (``recovery="restart"``) or its own (``"keep"``); any other recovery as set."""
    if participation is None or not joining:
        yield
        return
    before = strategy.recovery
    strategy.recovery = "restart" if participation.client_state == "fresh" else "keep"
    try:
        yield
    finally:
        strategy.recovery = before


def _restart(strategy: StackedStrategy, nodes: list[int]) -> None:
    """``nodes`` (global ids) start their own state afresh (a client that keeps none)."""
    for node in nodes:
        row = strategy._row(node)
        if row is not None:
            strategy.restart_row(row)
