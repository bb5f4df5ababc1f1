"""A population's rounds (:mod:`exogym.run.nodes.population`): :class:`Rounds`, the scheduler,
and :class:`PopulationSeating`, the :class:`~exogym.run.loop.schedule.Seating` it drives.

At a round's first step the round's clients are seated (drawn among those available; a client
new to the seats receives the global model, a recovery counted and recorded as a client's
event), every seat computes each step of the round, and at its end the clients that keep state
write it back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exogym.run.loop.clocking import ClockFeed
    from exogym.run.loop.schedule import Compute, Seating
    from exogym.run.nodes.seats import Seats
    from exogym.sim.presence import Presence

__all__ = ["PopulationSeating", "Rounds"]


class Rounds:
    """A population's rounds of ``period`` steps over a run of ``total_steps``.

    Args:
        compute: computes a step.
        seating: seats a round's clients.
        period: a round's steps (the strategy's synchronisation period).
        total_steps: the run's length (its last round may be cut short).
    """

    steered = True  # who is seated is drawn with the clients' availability in time

    def __init__(self, compute: Compute, seating: Seating, period: int,
                 total_steps: int) -> None:
        self.compute, self.seating = compute, seating
        self.period, self.total_steps = period, total_steps

    def advance(self, step: int) -> int:
        if step % self.period == 0 or not self.seating.seated:
            self.seating.start_round(step)
        self.compute(step, self.seating.active)
        if (step + 1) % self.period == 0 or step + 1 == self.total_steps:
            self.seating.end_round()
        return step + 1

    def state_dict(self) -> dict[str, Any] | None:
        return None  # the population's state is the holder's (the run's checkpoint)

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        pass


class PopulationSeating:
    """The seats of a population as :class:`Rounds` asks for them: a round's clients seated
    with the clock of their seats, each join timed (the clock's feed), recorded as an event and
    counted with the world's counts (a run with a row per client writes the same).

    Args:
        seats: the holder of the seats.
        presence: the world's state (its step, its counts).
        feed: the run's clock feed.
        event: records an event.
    """

    def __init__(self, seats: Seats, presence: Presence, feed: ClockFeed,
                 event: Callable[[dict[str, Any]], None]) -> None:
        self.seats, self.presence, self.feed, self.event = seats, presence, feed, event

    def start_round(self, step: int) -> None:
        self.presence.step = step  # the joins' events carry the round's first step
        self.seats.start_round(step, self.feed.clock, self.feed.feed, self.event,
                               self.presence.counts)

    def end_round(self) -> None:
        self.seats.end_round()

    @property
    def active(self) -> list[bool] | None:
        return self.seats.active

    @property
    def seated(self) -> bool:
        return self.seats.seated
