"""Who computes next: one scheduler per way of running the nodes, each with the narrow
interfaces it needs, declared here (docs/design.md, "The parts of a run").

A scheduler owns the loop from one step to the next (:meth:`Scheduler.advance`). It never
holds the run: it is built with the parts it drives, each behind a protocol of its own mode.

- every mode: :class:`Compute`, the given nodes compute one step (the strategy updates and
  communicates, the clock advances; :class:`~exogym.run.loop.losses.TrainLoss`);
- :class:`Lockstep` (synchronous strategies): step ``k`` of every node that computes is step
  ``k``; in a world (or with partial participation) it asks a :class:`WorldGate` before each
  step who computes (:class:`~exogym.run.loop.world_step.WorldStep`);
- :class:`~exogym.run.loop.rounds.Rounds` (a population's seats): a :class:`Seating` seats a
  round's clients at its first step, every seat computes its steps, and at its end clients
  that keep state write it back;
- :class:`~exogym.run.loop.timelines.PerNodeTimelines` (asynchronous strategies): each node on
  its own simulated clock (:class:`ClockSource`); an event loop decides which nodes compute
  next and when a push reaches the :class:`Server`.

A new execution mode is a scheduler and the protocol of what it asks; none of the others, and
neither the run nor a holder, changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from exogym.sim.clock import SimClock
    from exogym.sim.participation import Participation

__all__ = ["ClockSource", "Compute", "Lockstep", "Scheduler", "Seating", "Select", "Server",
           "WorldGate"]

Select = Callable[[int, list[bool]], tuple[list[bool], dict[int, int], list[int]]]
"""Partial participation's choice at a step among the up nodes: ``(who computes, {node joining
the round: its donor}, the participants that stay and start their own state afresh)``."""


class Compute(Protocol):
    """Every mode: the given nodes compute one step."""

    def __call__(self, step: int, active: list[bool] | None) -> None:
        """The ``active`` nodes (None: all) compute ``step``: forward, backward, the
        strategy's update and collectives; the clock is told."""


class WorldGate(Protocol):
    """Lockstep in a world: the world's say before a step."""

    def __call__(self, step: int, select: Select | None = None) -> list[bool] | None:
        """Who computes ``step`` (None: all), the recoveries it needs done first."""


class Seating(Protocol):
    """A population's rounds: the clients in the seats."""

    def start_round(self, step: int) -> None:
        """The round starting at ``step``: its clients drawn and seated (those new to it
        receive the global model)."""

    def end_round(self) -> None:
        """The round's clients that keep state write it back."""

    @property
    def active(self) -> list[bool] | None:
        """The seats that compute in this round (None: all)."""

    @property
    def seated(self) -> bool:
        """Whether a round's clients are in the seats (not so before the first round, or in a
        run resumed from a checkpoint)."""


class ClockSource(Protocol):
    """Asynchronous: the simulated clock (created at the run's first step)."""

    @property
    def clock(self) -> SimClock | None: ...


class Server(Protocol):
    """Asynchronous: the parameter server and the nodes (a population's seats) it serves."""

    def fill(self) -> None:
        """Before the server's first step: its first clients in flight (a population; once)."""

    def pushes(self) -> list[tuple[int, float]]:
        """``(node, bytes)`` of the updates pushed at the step just computed, taken."""

    def deliver(self, node: int, at: float, step: int, final: bool) -> float:
        """A push reaches the server at ``at``: it applies the update; the node (a seat: its
        next client, unless ``final``, the run's end) receives the server's model; the bytes
        of that reply."""

    @property
    def staleness(self) -> list[int]:
        """The staleness of every update applied so far, in order."""


class Scheduler(Protocol):
    """Takes a run one step further (its step count)."""

    #: Whether simulated time steers who computes (the clock is then fed as the run goes, at a
    #: price of a step known before the run).
    steered: bool

    def advance(self, step: int) -> int:
        """Compute until the run's step count, ``step``, grows by one; the new count."""

    def state_dict(self) -> dict[str, Any] | None: ...

    def load_state_dict(self, state: dict[str, Any] | None) -> None: ...


class Lockstep:
    """Synchronous runs: every node that computes takes the step together. With a ``world``
    (nodes may be absent: a world that is not perfect, a deadline, partial participation) the
    world decides before each step who is up (and who recovers first), and with
    ``participation`` only the round's participants among them compute
    (:mod:`exogym.sim.participation`; a round is ``period`` steps).

    Args:
        compute: computes a step.
        world: the world's say before each step, or None (everyone computes every step).
        participation: partial participation (needs ``world``), or None.
        period: a round's steps (the strategy's synchronisation period).
    """

    def __init__(self, compute: Compute, world: WorldGate | None = None,
                 participation: Participation | None = None, period: int = 1) -> None:
        if participation is not None and world is None:
            raise ValueError("partial participation is the world's say before each step: "
                             "give Lockstep a world")
        self.compute, self.world = compute, world
        self.participation, self.period = participation, period
        self.steered = world is not None
        self.participants: list[bool] | None = None  # this round's

    def advance(self, step: int) -> int:
        active = None
        if self.world is not None:
            active = self.world(step, self.select if self.participation else None)
        self.compute(step, active)
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
