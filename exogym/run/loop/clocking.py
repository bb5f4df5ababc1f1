"""The run's side of the simulated clock: what it is given and when (docs/design.md,
"The parts of a run", what it costs: the rules are :mod:`exogym.sim.clock`, the price of a step
:mod:`exogym.sim.compute`).

:class:`ClockFeed` creates the run's :class:`~exogym.sim.clock.SimClock` at the first step and
gives it every step's compute and every collective of the communicator's log, in order:

- measured compute where nobody's presence depends on time: each step is priced as it ran
  (:class:`~exogym.sim.compute.StepMeter`); the clock lags and catches up at log steps with
  every step's price (a process run's ranks exchange theirs there), so each row's time is
  complete and the steps need no synchronisation;
- otherwise (a device's or a given price, or one measured before the run because time steers it)
  every step reaches the clock as it happens.

In a world with absent nodes the operations are recorded in order (``ops``) for re-costing.

Asked for the run's timeline (``spans``: a trace or its picture, :mod:`exogym.run.output.trace`),
the clock records its spans (:class:`~exogym.sim.spans.SpanLog`); asked for the trace of a real
process run (``wall``), each rank times its steps and real collectives
(:class:`~exogym.run.dist.WallSpans`).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_map

from exogym.run.dist.communicator import DistributedCommunicator, WallSpans
from exogym.run.dist.ranks import RankContext
from exogym.run.output.trace import node_names, real_trace, run_trace, trace_meta
from exogym.sim.clock import ClockTrace, SimClock, node_processes
from exogym.sim.comm import Communicator
from exogym.sim.compute import OptimizerBuilder, StepMeter, calibrate_step_time, host_cores
from exogym.sim.devices import Pricing
from exogym.sim.engine import NodeStack
from exogym.sim.network import Network
from exogym.sim.presence import bits
from exogym.sim.round_policy import RoundPolicy
from exogym.sim.spans import SpanLog
from exogym.sim.world import World, speeds_of
from exogym.strategy.base import StackedStrategy

__all__ = ["ClockFeed", "not_recostable"]


class ClockFeed:
    """Feeds one run's simulated clock (module docstring).

    Args:
        network: the run's simulated network (None: no clock).
        world: the run's world (node speeds).
        num_nodes: ``N``.
        step_time_s: a device's or a given price of a step (None: measured).
        compute_source: how ``step_time_s`` was obtained (``profile``, ``measured``,
            ``given``, ``flops``).
        pricing: the hardware's price of the counted step (``compute="profile"``).
        device_speeds: every node's speed from its device (None: all 1).
        overlap_steps: the strategy's ``W`` for overlapped collectives.
        comm: the run's communicator (its log and real transport time).
        ranks: this process's place in a multi-process run, or None.
        device: where the nodes compute.
        record_ops: record the clock's operations for re-costing (a world with absent nodes).
        spans: record the clock's spans (the run's timeline: its trace, its picture).
        trace: the run's trace is asked for (``fit(trace=True)``): it needs a network; in a
            multi-process run each rank also records its real steps and collectives on the
            wall clock (the real trace: the communicator's :class:`WallSpans`, built with it).
    """

    def __init__(self, network: Network | None, world: World, num_nodes: int,
                 step_time_s: float | None, compute_source: str, overlap_steps: int | None, *,
                 pricing: Pricing | None = None,
                 device_speeds: Sequence[float] | None = None,
                 comm: Communicator, ranks: RankContext | None, device: torch.device,
                 record_ops: bool, spans: bool = False, trace: bool = False) -> None:
        self.network, self.world, self.num_nodes = network, world, num_nodes
        self.compute_source, self.overlap_steps = compute_source, overlap_steps
        self.comm, self.ranks, self.device = comm, ranks, device
        self.clock: SimClock | None = None
        self.step_time_s = step_time_s
        self.meter = StepMeter(device, host_cores(torch.get_num_threads(), 1 if ranks is None
                                                  else _processes_here(ranks)))
        # how the step was priced: the hardware's price of the counted step, or (measured) set
        # when the clock starts
        self.compute_method: str | None = None if pricing is None else pricing.method
        # every node's speed from its device (compute="profile" on mixed hardware; None: 1)
        self.device_speeds = device_speeds
        # Measured compute (the default, where time does not steer the run): every step's price
        # per node, per process (step_seconds[step][rank]), given to the clock at log steps;
        # until then this process's values wait in _timing, from step _timing_from on
        # (_window: the wall clock and transport time when the first of them started).
        self.measured = False
        self.step_seconds: list[list[float]] = []
        self._timing: list[float] = []
        self._timing_from = 0
        self._window = (0.0, 0.0)
        self.fed = 0  # records of the communicator's log already given to the clock
        # The clock's operations in order (re-costing replays them) when nodes can be absent.
        self.ops: list[list[Any]] | None = [] if record_ops else None
        self.spans = spans
        # Whether the clock's spans cover the run from its start (not so in a run resumed from
        # a checkpoint written without them: its timeline then comes from a replay).
        self.spans_whole = True
        if trace and network is None:
            raise ValueError("trace=True: a run's trace is the timeline of its simulated clock; "
                             "give the run a network (--network)")
        # a process run's real trace: the distributed communicator records this rank's real
        # collectives, and the feed its steps
        self.wall: WallSpans | None = (comm.wall if isinstance(comm, DistributedCommunicator)
                                       else None)

    def start(self, step: int, steered: bool, price: Any) -> None:
        """Create the clock before step ``step``: measured from the run's own steps, or (time
        steers the run) at ``price()``, the seconds of a step priced before the run."""
        assert self.network is not None
        if self.step_time_s is None and not steered:
            self.measured, self._timing_from = True, step
            self.compute_method = f"{self.meter.method}, each step as it took"
            self.clock = self._new_clock(1.0)  # step_time_s: the running mean, at catch-up
        else:
            if self.step_time_s is None:
                self.step_time_s, self.compute_method = price()
            assert self.step_time_s is not None
            self.clock = self._new_clock(self.step_time_s)
        self.feed()  # set-up collectives (step -1)

    def price_before_run(self, model: nn.Module, batch: Any, optim: OptimizerBuilder,
                         nodes: NodeStack, settings: Any, *, lead: bool) -> tuple[float, str]:
        """``c`` priced before the run from real training steps of its engine on a copy of the
        model (:func:`calibrate_step_time`; ``batch``: one node's), rank 0's in a process run;
        how it was priced."""
        meter = self.meter
        count = min(nodes.num_nodes, max(1, math.ceil(2 * meter.cores)))
        value = None
        if lead:
            batch = tree_map(lambda t: t.to(self.device) if isinstance(t, torch.Tensor) else t,
                             batch)
            with warnings.catch_warnings():  # an engine's fallback warns once, in the run
                warnings.simplefilter("ignore")
                value = calibrate_step_time(
                    model, batch, optim, self.device, nodes=count, engine=nodes.engine,
                    cores=meter.cores, micro_batch_size=settings.micro_batch_size,
                    precision=settings.precision)
        if self.ranks is not None and self.ranks.world_size > 1:
            box = [value]
            dist.broadcast_object_list(box, src=0)
            value = box[0]
        method = (f"{meter.method}, the median of timed training steps before the run "
                  f"({nodes.engine} engine, {count} node{'s' * (count != 1)}, after warm-up)")
        return float(value), method

    def _new_clock(self, step_time_s: float) -> SimClock:
        assert self.network is not None
        speeds = speeds_of(self.world, self.network.node_speeds(self.num_nodes),
                           self.device_speeds)
        clock = SimClock(self.network, self.num_nodes, step_time_s,
                         overlap_steps=self.overlap_steps, compute_source=self.compute_source,
                         speeds=speeds)
        if self.spans:
            clock.spans = SpanLog(self.num_nodes)
        return clock

    # -- a step ----------------------------------------------------------------------------
    def begin_step(self) -> tuple[Any, float, float, float] | None:
        """Before a step's compute: the marks its price is read from (None: not measured)."""
        if self.wall is not None:
            self.wall.begin(self.comm.step)
        if not self.measured:
            return None
        return (self.meter.start(), time.perf_counter(), self.comm.transport_s,
                self.comm.transport_cpu_s)

    def computed(self, step: int, active: list[bool] | None) -> None:
        """The step's compute reaches a clock that does not lag (before its collectives)."""
        if self.clock is not None and not self.measured:
            self.clock.compute(step, active)
            if self.ops is not None:
                self.ops.append(["c", step, bits(active)])

    def end_step(self, marks: tuple[Any, float, float, float] | None, nodes: int, *,
                 steps: int = 1, exclude_cpu_s: float = 0.0) -> float | None:
        """After a step: its measured price per node, real transport excluded (its wall time on
        a GPU, its CPU time on a CPU; no sync: on a GPU, :meth:`catch_up` scales the host times
        to the synchronised window). ``steps``: the marks span that many steps computed at
        once (a paged run's round): each is priced the window's share, this one now, the others
        by :meth:`priced` when the run reaches them. ``exclude_cpu_s``: CPU time in the window
        that was not compute (paging). The price per step (None: not measured)."""
        if self.wall is not None:
            self.wall.end()
        if marks is None:
            return None
        mark, start, transport, transport_cpu = marks
        if not self._timing:
            self._window = (start, transport)
        price = self.meter.stop(
            mark, nodes, self.comm.transport_s - transport,
            exclude_cpu_s=exclude_cpu_s + self.comm.transport_cpu_s - transport_cpu) / steps
        self._timing.append(price)
        return price

    def priced(self, price: float | None) -> None:
        """A step of a round computed earlier reaches the run: its share of the round's price
        (:meth:`end_step`)."""
        if price is None:
            return
        if not self._timing:
            self._window = (time.perf_counter(), self.comm.transport_s)
        self._timing.append(price)

    def feed(self) -> None:
        """Give the clock the collectives logged since the last call (measured compute: at
        catch-up only, after the compute of their steps)."""
        if self.clock is None or self._timing:
            return
        log = self.comm.log
        for k in range(self.fed, len(log)):
            self.clock.collective(log[k])
            if self.ops is not None:
                self.ops.append(["r", k])
        self.fed = len(log)

    def catch_up(self, step: int, local_nodes: int) -> None:
        """Give the clock the steps computed since the last call, up to ``step``, each with its
        measured price per node (a process run's ranks exchange theirs here, at steps they all
        log), and their collectives; ``step_time_s`` becomes the mean so far."""
        clock, n = self.clock, self.num_nodes
        assert clock is not None
        own, self._timing = self._timing, []
        if own and self.device.type == "cuda":
            # The host times of queued kernels are launch times: scale them to the window's wall
            # time, read after the synchronisation the run makes at log steps anyway.
            torch.cuda.synchronize(self.device)
            start, transport = self._window
            wall = time.perf_counter() - start - (self.comm.transport_s - transport)
            host = sum(own) * local_nodes
            if host > 0:
                own = [t * wall / host for t in own]
        if self.ranks is not None and self.ranks.world_size > 1:
            every: list[list[float]] = [[] for _ in range(self.ranks.world_size)]
            dist.all_gather_object(every, own)
        else:
            every = [own]
        log, k = self.comm.log, self.fed
        where = node_processes(n, len(every))
        before = len(self.step_seconds)
        total = (self.step_time_s or 0.0) * n * before
        for j, s in enumerate(range(self._timing_from, step)):
            row = [times[j] for times in every]
            self.step_seconds.append(row)
            seconds = [row[r] for r in where]
            total += sum(seconds)
            clock.compute(s, None, seconds)
            while k < len(log) and log[k].step <= s:
                clock.collective(log[k])
                k += 1
        self.fed, self._timing_from = k, step
        if self.step_seconds:
            self.step_time_s = total / (n * len(self.step_seconds))
            clock.set_step_time(self.step_time_s)

    # -- the end and checkpoints -----------------------------------------------------------
    def trace(self, steps: int, speeds: tuple[float, ...] | None,
              not_recostable: str | None) -> ClockTrace:
        """What re-costing the run needs."""
        assert self.step_time_s is not None
        return ClockTrace(
            num_nodes=self.num_nodes, steps=steps, step_time_s=self.step_time_s,
            compute_source=self.compute_source, overlap_steps=self.overlap_steps,
            records=tuple(self.comm.log[:self.fed]), speeds=speeds,
            ops=tuple(tuple(op) for op in self.ops) if self.ops is not None else None,
            not_recostable=not_recostable, compute_method=self.compute_method,
            step_seconds=(tuple(tuple(row) for row in self.step_seconds)
                          if self.measured else None))

    def state_dict(self) -> dict[str, Any]:
        return {"clock": self.clock.state_dict() if self.clock is not None else None,
                "step_time_s": self.step_time_s,
                "measured": {"on": self.measured, "step_seconds": [list(r) for r in
                                                                   self.step_seconds],
                             "method": self.compute_method},
                "fed": self.fed}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        self.step_time_s = state["step_time_s"]
        measured = state.get("measured") or {"on": False, "step_seconds": []}
        self.measured = bool(measured["on"])
        self.step_seconds = [[float(v) for v in row] for row in measured["step_seconds"]]
        self.compute_method = measured.get("method")
        self._timing, self._timing_from = [], step
        self.fed = int(state["fed"])
        if state["clock"] is not None:
            assert self.network is not None and self.step_time_s is not None
            self.clock = self._new_clock(self.step_time_s)
            self.clock.load_state_dict(state["clock"])
            self.spans_whole = not self.spans or "spans" in state["clock"]


    # -- the timeline ----------------------------------------------------------------------
    def timeline(self, trace: ClockTrace | None, events: list[dict[str, Any]], strategy: str,
                 replayable: bool, *, seats: bool = False) -> dict[str, Any] | None:
        """The run's Chrome trace (:func:`exogym.run.output.trace.run_trace`) from the spans its
        clock recorded (after :meth:`SimClock.finish`), or from ``trace`` replayed where they do not
        cover the whole run (``replayable``: a synchronous run); None: no spans recorded, or
        an asynchronous run resumed from a checkpoint written without them (a warning says
        so: its clock is not replayable, and the run itself is done). ``seats``: a
        population's rows are seats, named so (their clients' speeds change)."""
        clock = self.clock
        if clock is None or clock.spans is None or trace is None:
            return None
        assert self.network is not None
        log = clock.spans
        if not self.spans_whole:
            if not replayable:
                why = "a population in seats" if seats else f"{strategy} is asynchronous"
                warnings.warn(f"{why} and this run was resumed from a checkpoint written "
                              "without its timeline: no trace or picture (its clock cannot be "
                              "replayed)", RuntimeWarning, stacklevel=2)
                return None
            log = SpanLog(self.num_nodes)
            trace.cost(self.network, spans=log)
        meta = trace_meta(strategy, self.num_nodes, trace.steps, self.network.spec(),
                          self.world.spec(), clock.now)
        names = ([f"seat {i}" for i in range(clock.num_nodes)] if seats
                 else node_names(clock.speeds))
        return run_trace(log, events, names, meta)

    def real_timeline(self, strategy: str, steps: int) -> dict[str, Any] | None:
        """A process run's real trace (:func:`exogym.run.output.trace.real_trace`): every rank's
        wall spans, gathered on rank 0 (a collective: every rank calls it); None elsewhere, or
        when none is recorded."""
        if self.wall is None or self.ranks is None:
            return None
        every: list[Any] = [None] * self.ranks.world_size
        dist.all_gather_object(every, self.wall.to_dict())
        if self.ranks.rank != 0:
            return None
        last = max((s[2] for r in every for s in r["steps"]), default=0.0)
        first = min((s[1] for r in every for s in r["steps"]), default=0.0)
        meta = trace_meta(strategy, self.num_nodes, steps, "real (torch.distributed)",
                          self.world.spec(), last - first, "wall_time_s")
        return real_trace(every, self.comm.log, self.ranks.nodes_per_process, meta)


def _processes_here(ranks: RankContext) -> int:
    """This run's processes on this host: torchrun's ``LOCAL_WORLD_SIZE``, else every rank
    (exogym's own launcher starts them all here)."""
    import os

    return int(os.environ.get("LOCAL_WORLD_SIZE", ranks.world_size))


def not_recostable(strategy: StackedStrategy, world: World, asynchronous: bool,
                   policy: RoundPolicy | None = None, seats: bool = False) -> str | None:
    """Why a run's clock cannot be replayed on another network (time decided who took part
    or when; a population's seats change clients), or None."""
    if seats and not asynchronous:
        return ("its population's seats change clients every round (their speeds, links and "
                "joins are the seats' clients', which the recorded log in seats does not "
                "carry)")
    if policy is not None and (policy.over_selection != 1.0 or policy.deadline_s is not None):
        return (f"its round policy ({policy.spec()}) keeps the reports that arrive first, which "
                "another network would change")
    if asynchronous:
        return (f"{strategy.id} is asynchronous: when each update arrives, and so which model "
                "each node trains from, is decided by the network")
    if world.time_dependent:
        return (f"its world ({world.spec()}) decides who is up by simulated time, which "
                "another network would change")
    deadline = strategy.deadline
    if deadline is not None:
        return (f"its deadline ({deadline}) decides who is late by simulated time, which "
                "another network would change")
    return None
