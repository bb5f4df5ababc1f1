"""Each scheduler driven through its declared interface with fakes (exogym/run/loop/schedule.py):
what it asks, in which order, and what it returns, with no run, model or strategy behind it."""

from __future__ import annotations

from typing import Any

import pytest

from exogym.run.loop.rounds import Rounds
from exogym.run.loop.schedule import Lockstep, Select
from exogym.run.loop.timelines import PerNodeTimelines
from exogym.sim.clock import SimClock
from exogym.sim.network import Network
from exogym.sim.participation import parse_participation


class Calls:
    """A fake Compute: records ``(step, active)`` of every call."""

    def __init__(self, clock: SimClock | None = None) -> None:
        self.calls: list[tuple[int, list[bool] | None]] = []
        self.clock = clock

    def __call__(self, step: int, active: list[bool] | None) -> None:
        self.calls.append((step, None if active is None else list(active)))
        if self.clock is not None:  # the nodes that compute advance their simulated time
            self.clock.compute(step, active)


class World:
    """A fake WorldGate: node 1 is down at odd steps; records the selects it was given."""

    def __init__(self, n: int) -> None:
        self.n, self.selects = n, []

    def __call__(self, step: int, select: Select | None = None) -> list[bool] | None:
        up = [not (i == 1 and step % 2) for i in range(self.n)]
        self.selects.append(select)
        if select is not None:
            up, _, _ = select(step, up)
        return None if all(up) else up


def test_lockstep_without_a_world_computes_every_node_every_step() -> None:
    compute = Calls()
    sched = Lockstep(compute)
    assert sched.advance(0) == 1 and sched.advance(1) == 2
    assert compute.calls == [(0, None), (1, None)]
    assert not sched.steered and sched.state_dict() is None


def test_lockstep_in_a_world_computes_who_the_world_says() -> None:
    compute, world = Calls(), World(3)
    sched = Lockstep(compute, world)
    for step in range(3):
        assert sched.advance(step) == step + 1
    assert compute.calls == [(0, None), (1, [True, False, True]), (2, None)]
    assert sched.steered and world.selects == [None, None, None]


def test_lockstep_with_participation_draws_a_round_and_hands_joiners_a_donor() -> None:
    # 4 nodes, 2 per round of 2 steps (FedAvg's H = 2), every node up
    part = parse_participation(2, client_state="fresh", seed=0)
    sched = Lockstep(Calls(), World(4), part, period=2)
    up = [True] * 4
    first, joining, staying = sched.select(0, up)
    assert sum(first) == 2 and joining == {} and staying == []  # no previous round
    assert sched.select(1, up) == (first, {}, [])  # inside the round: the same participants
    second, joining, staying = sched.select(2, up)
    assert sum(second) == 2
    new = [i for i in range(4) if second[i] and not first[i]]
    stay = [i for i in range(4) if second[i] and first[i]]
    # each new participant receives the global model from one of the previous round's, in turn
    previous = [i for i in range(4) if first[i]]
    assert joining == {node: previous[k % 2] for k, node in enumerate(new)}
    assert staying == stay  # client_state="fresh": a client keeps nothing to its next round
    assert sched.state_dict() == {"participants": second}
    other = Lockstep(Calls(), World(4), part, period=2)
    other.load_state_dict(sched.state_dict())
    assert other.participants == second


def test_lockstep_refuses_participation_without_a_world() -> None:
    part = parse_participation(2, client_state="fresh", seed=0)
    with pytest.raises(ValueError, match="partial participation is the world's say"):
        Lockstep(Calls(), None, part)


class Seating:
    """A fake Seating: records the calls; seats 0 and 2 of 3 compute."""

    def __init__(self) -> None:
        self.log: list[Any] = []
        self.seated = False

    def start_round(self, step: int) -> None:
        self.log.append(("start", step))
        self.seated = True

    def end_round(self) -> None:
        self.log.append("end")

    @property
    def active(self) -> list[bool] | None:
        return [True, False, True]


def test_rounds_seat_each_round_at_its_first_step_and_end_it_at_its_last() -> None:
    compute, seating = Calls(), Seating()
    sched = Rounds(compute, seating, period=2, total_steps=5)
    step = 0
    while step < 5:
        step = sched.advance(step)
    assert step == 5 and sched.steered
    # rounds of steps 0-1, 2-3 and the last one cut short at 4
    assert seating.log == [("start", 0), "end", ("start", 2), "end", ("start", 4), "end"]
    assert compute.calls == [(s, [True, False, True]) for s in range(5)]


def test_rounds_resumed_inside_a_round_seat_its_clients_first() -> None:
    seating = Seating()  # a run resumed from a checkpoint: nobody seated yet
    Rounds(Calls(), seating, period=4, total_steps=8).advance(1)
    assert seating.log == [("start", 1)]


class Server:
    """A fake Server: every computing node pushes 100 bytes after each of its steps (H = 1);
    records the deliveries; replies with 10 bytes."""

    def __init__(self, compute: Calls) -> None:
        self.compute = compute
        self.delivered: list[tuple[int, float, int, bool]] = []
        self.fills = 0
        self.staleness: list[int] = []
        self.period = 1

    def fill(self) -> None:
        self.fills += 1

    def pushes(self) -> list[tuple[int, float]]:
        _, active = self.compute.calls[-1]
        return [(i, 100.0) for i in range(2) if active is None or active[i]]

    def deliver(self, node: int, at: float, step: int, final: bool) -> float:
        self.delivered.append((node, at, step, final))
        self.staleness.append(len(self.delivered) - 1)
        return 10.0


def test_per_node_timelines_run_events_in_simulated_time_order() -> None:
    # Prepare: node 0 twice as fast as node 1 (a step: 0.5 s and 1 s); 100 bytes = 800 bits
    # take 1 s over the 800 bit/s links (no latency, full efficiency), a 10-byte reply 0.1 s;
    # the server's link serves one push at a time, first come first served
    net = Network(name="test", up_bps=800.0, latency_s=0.0, efficiency=1.0, hop_latency_s=0.0)
    clock = SimClock(net, 2, 1.0, speeds=[2.0, 1.0])

    class Clocks:
        pass

    clocks = Clocks()
    clocks.clock = clock  # type: ignore[attr-defined]
    compute = Calls(clock)
    server = Server(compute)
    sched = PerNodeTimelines(compute, server, clocks, num_rows=2,  # type: ignore[arg-type]
                             total_steps=2)
    # Execute and assert: step 0, both nodes at t = 0 compute together and push (node 0 at
    # 0.5 s, node 1 at 1 s); the fastest has taken a step: no delivery yet
    assert sched.advance(0) == 1
    assert compute.calls == [(0, None)] and server.fills == 1 and server.delivered == []
    # step 1: node 0's push arrives at 1.5 s (replied by 1.6 s); node 0, free, computes alone
    # (to 2.1 s) before node 1's push arrives (2.5 s: queued behind node 0's); the run ends:
    # the pushes in flight are delivered, node 0's second behind node 1's (2.5 + 1 s)
    assert sched.advance(1) == 2
    assert compute.calls == [(0, None), (1, [True, False])]
    assert sched.timelines.steps == [2, 1] and not sched.timelines.in_flight
    assert [(n, step, final) for n, _, step, final in server.delivered] == [
        (0, 1, False), (1, 1, True), (0, 1, True)]
    assert [at for _, at, _, _ in server.delivered] == pytest.approx([1.5, 2.5, 3.5], abs=1e-9)
    assert clock.t[0] == pytest.approx(3.6, abs=1e-9)  # its last reply: 3.5 + 0.1 s
    assert sched.summary()["node_steps"] == [2, 1] and sched.summary()["H"] == 1
