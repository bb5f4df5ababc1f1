"""How a run's nodes are run: the execution mode a run's strategy and settings call for
(:class:`Mode`), and its scheduler built with the parts it drives (:func:`scheduler`).

- a server strategy (:class:`~exogym.strategy.server.ServerStrategy`): per-node timelines
  (:mod:`exogym.run.loop.timelines`), checked here (one process, a network, a world of speeds);
- a population's seats (``settings.seats``): rounds (:mod:`exogym.run.loop.rounds`);
- otherwise lockstep (:class:`~exogym.run.loop.schedule.Lockstep`), asking the world before each
  step (:class:`~exogym.run.loop.world_step.WorldStep`) when nodes may be absent: a world that
  decides (:func:`~exogym.run.settings.world_decides`) or partial participation, checked here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from exogym.run.loop.rounds import PopulationSeating, Rounds
from exogym.run.loop.schedule import Lockstep, Scheduler
from exogym.run.loop.timelines import ParameterServer, PerNodeTimelines
from exogym.run.loop.world_step import WorldStep
from exogym.run.nodes.reports import ReportRule
from exogym.run.nodes.seats import Seats
from exogym.run.settings import RunSettings, device_speeds, world_decides
from exogym.sim.world import speeds_of
from exogym.strategy.server import ServerStrategy

if TYPE_CHECKING:
    from exogym.run.dist.ranks import RankContext
    from exogym.run.loop.clocking import ClockFeed
    from exogym.run.loop.schedule import Compute
    from exogym.run.nodes.holders import Holder
    from exogym.sim.presence import Presence
    from exogym.strategy.base import StackedStrategy

__all__ = ["Mode", "scheduler"]


@dataclass(frozen=True)
class Mode:
    """A run's execution mode.

    Attributes:
        kind: ``"lockstep"``, ``"rounds"`` (a population's seats) or ``"timelines"``
            (asynchronous).
        worldly: lockstep where nodes may be absent at any step (the world is asked before
            each step, and the clock's operations are recorded for re-costing).
    """

    kind: Literal["lockstep", "rounds", "timelines"]
    worldly: bool = False

    @property
    def asynchronous(self) -> bool:
        return self.kind == "timelines"

    @classmethod
    def of(cls, strategy: StackedStrategy, s: RunSettings, ranks: RankContext | None) -> Mode:
        """The mode of ``strategy`` under the settings ``s``, checked (an error says what the
        mode does not allow)."""
        if isinstance(strategy, ServerStrategy):
            PerNodeTimelines.check(strategy.id, s.network, s.world, ranks, s.seats)
            return cls("timelines")
        if s.participation is not None:
            _check_participation(strategy, s)
        if s.seats:
            return cls("rounds")
        return cls("lockstep", world_decides(s, strategy) or s.participation is not None)


def scheduler(mode: Mode, strategy: StackedStrategy, held: Holder, compute: Compute,
              presence: Presence, feed: ClockFeed, event: Callable[[dict[str, Any]], None],
              s: RunSettings) -> tuple[Scheduler, PerNodeTimelines | None]:
    """The scheduler of ``mode`` over the run's parts (none of them the run), and the per-node
    timelines when it is theirs (a metrics row and the result read them). A lockstep run in a
    world tells its communicator who is heard (:meth:`WorldStep.heard`)."""
    period = strategy.sync_period or 1
    if mode.kind == "rounds":
        assert isinstance(held, Seats)
        seating = PopulationSeating(held, presence, feed, event)
        if s.round_policy is not None:  # who a round hears: its policy's outcome
            rule = ReportRule(s.round_policy, held.population, strategy, lambda: feed.clock,
                              event, lambda: held.comm.step)
            held.comm.attendance.heard = rule.heard
        return Rounds(compute, seating, period, s.total_steps), None
    if mode.kind == "timelines":
        assert isinstance(strategy, ServerStrategy) and s.network is not None
        seats = held if isinstance(held, Seats) else None
        if seats is None:  # a population's clients give their speeds when seated
            strategy.set_speeds(speeds_of(s.world, s.network.node_speeds(s.num_nodes),
                                          device_speeds(s)))
        timelines = PerNodeTimelines(compute, ParameterServer(strategy, feed, seats), feed,
                                     held.comm.num_nodes, s.total_steps)
        return timelines, timelines
    world = None
    if mode.worldly:
        world = WorldStep(presence, held, feed, s.participation)
        held.comm.attendance.heard = world.heard
    return Lockstep(compute, world, s.participation, period), None


def _check_participation(strategy: StackedStrategy, s: RunSettings) -> None:
    """Partial participation needs a method whose clients receive a global model each round."""
    if not strategy.supports_participation:
        raise ValueError(
            f"{strategy.id} does not take partial participation (participation="
            f"{s.participation.spec() if s.participation else None!r}): a client selected again "
            "must receive the method's global model; allowed: fedavg, fedprox, the FedOpt "
            "family, diloco, muloco, sparta_diloco")
    assert s.participation is not None
    s.participation.per_round(s.num_nodes)  # more participants than nodes: an error
