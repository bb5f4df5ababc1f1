"""Who a population's round hears (:mod:`exogym.sim.round_policy`): at the round's
synchronisation, each seat's report time on the clock, the round policy's outcome, the seats let
go, the events and counts. :class:`ReportRule` is the communicator's
:data:`~exogym.sim.comm.Heard` for seats with a round policy."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from exogym.sim.round_policy import Outcome, RoundPolicy, decide
from exogym.sim.server import upload_arrivals

if TYPE_CHECKING:
    from exogym.run.nodes.population import Population
    from exogym.sim.clock import SimClock
    from exogym.strategy.base import StackedStrategy

__all__ = ["ReportRule"]

_COUNTS = {"discarded": "discarded", "late": "late", "dropout": "dropouts",
           "abandoned": "abandoned"}


class ReportRule:
    """A population's round policy at each synchronisation (module docstring).

    Args:
        policy: the rules.
        population: the seats' clients (their availability, their counts).
        strategy: the method (the round's payload: its parameters and float buffers, through
            its codec).
        clock: the run's simulated clock (None before the first step).
        event: records an event.
        step: the step being computed.
    """

    def __init__(self, policy: RoundPolicy, population: Population, strategy: StackedStrategy,
                 clock: Callable[[], SimClock | None], event: Callable[[dict[str, Any]], None],
                 step: Callable[[], int]) -> None:
        self.policy, self.population, self.strategy = policy, population, strategy
        self.clock, self.event, self.step = clock, event, step
        policy.check(population.participation.reports(population.num_clients))
        for name in _COUNTS.values():
            population.counts.setdefault(name, 0)
        population.counts.setdefault("abandoned_rounds", 0)

    def heard(self, active: list[bool] | None, deadline: str | None) -> list[bool] | None:
        """The seats whose reports the round aggregates (None: every active one)."""
        clock = self.clock()
        if clock is None:
            raise ValueError(f"round policy {self.policy.spec()!r} decides by simulated time: "
                             "give the run a network")
        pop = self.population
        seats = [j for j in range(len(pop.seated)) if active is None or active[j]]
        reports = dict(zip(seats, upload_arrivals(clock, seats, self._payload()), strict=True))
        gone = self._dropped(reports) if self.policy.dropouts else set()
        k = pop.participation.reports(pop.num_clients)
        out = decide(self.policy, k, clock.last_release, reports, gone)
        release = out.release if out.kept else self._abandoned_at(clock, reports, gone)
        self._record(out, reports, release)
        pop.unheard = {pop.seated[seat] for seat in out.fates}
        for seat in out.fates:
            _let_go(clock, seat, release)
        if out.abandoned:
            clock.last_release = release
        heard = [j in out.kept for j in range(pop.num_seats)]
        return None if all(heard) else heard

    def _payload(self) -> float:
        """The round's upload: the method's parameters and float buffers, one row each,
        through its transport codec."""
        nodes, codec = self.strategy.nodes, self.strategy.transport_codec
        tensors = [*nodes.params.values(), *nodes.float_buffers.values()]
        return float(sum(codec.payload_bytes(t[0].numel(), t.dtype) if codec is not None
                         else t[0].numel() * t.element_size() for t in tensors))

    def _dropped(self, reports: dict[int, float]) -> set[int]:
        """The seats whose client is no longer available when its report would arrive."""
        avail = self.population.availability
        if avail is None:
            return set()
        gone = set()
        for seat, at in reports.items():
            up = avail(at)
            client = np.asarray([self.population.seated[seat]], dtype=np.int64)
            if up is not None and not bool(up(client)[0]):
                gone.add(seat)
        return gone

    def _abandoned_at(self, clock: SimClock, reports: dict[int, float], gone: set[int]) -> float:
        """When the server gives an abandoned round up: at its deadline, or else when the last
        client that could report has."""
        start = clock.last_release
        if self.policy.deadline_s is not None:
            return start + self.policy.deadline_s
        return max((at for s, at in reports.items() if s not in gone), default=start)

    def _record(self, out: Outcome, reports: dict[int, float], release: float) -> None:
        """Each client not kept: an event at the moment the server let it go (its report's
        arrival, or the release if that came first) and a count."""
        counts, pop = self.population.counts, self.population
        for seat, fate in sorted(out.fates.items()):
            counts[_COUNTS[fate]] += 1
            self.event({"step": self.step(), "time_s": min(reports[seat], release),
                        "node": pop.seated[seat], "event": fate, "report_s": reports[seat]})
        if out.abandoned:
            counts["abandoned_rounds"] += 1


def _let_go(clock: SimClock, seat: int, release: float) -> None:
    """A client the round does not keep is let go at ``release``: still computing then, its
    seat's clock and timeline stop there (the rest of its work never happens); done before, it
    waits."""
    t = clock.t[seat]
    if t > release:
        clock.node_compute[seat] -= t - release
        clock.t[seat] = release
        if clock.spans is not None:
            clock.spans.cut(seat, release)
    else:
        clock.wait(seat, release, "report not kept")
    clock.link_free[seat] = min(clock.link_free[seat], release)
