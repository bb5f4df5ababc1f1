"""The run's state as one object: everything the training loop carries between two steps.

A :class:`Run` holds the N node-stacked replicas (:class:`~exogym.sim.engine.NodeStack`), the
strategy with its optimizers and global copies, the communicator's counters and log, every
node's position in the data, the simulated clock, the metrics so far and the random generators.
The trainer (:meth:`exogym.Trainer.fit`) drives it with a few calls::

    run = Run(...)                      # everything built, step 0
    run.open()                          # run folder and sinks (or, resumed: continue them)
    run.evaluate_initial()              # optional: the initial model as a row at step 0
    while not run.done:
        run.train_step()                # one step of every node, the strategy, the clock
        if run.log_due:
            run.log()                   # a metrics row (and an evaluation when due)
    result = run.finish()

The run is four parts, each in its own room (docs/design.md, "The parts of a run"), that
:class:`Run` drives and whose state it holds: who computes next (:mod:`exogym.run.loop.schedule`:
lockstep or per-node timelines), who is up, late, cut or recovering (:mod:`exogym.sim.presence`),
what it costs (:mod:`exogym.run.loop.clocking` feeding :mod:`exogym.sim.clock`), and what is
recorded (:mod:`exogym.run.output.record`).

:meth:`Run.state_dict` is the checkpoint: restored with :meth:`Run.load_state_dict` into a Run
built with the same settings, the run continues bit for bit as if it had never stopped (every
metrics row, the bytes and collectives, the simulated clock, the final model), in a fresh
process too. Wall-clock measurements (``wall_s``, ``train_time_s``) are the only values that
differ. The same mechanism will hand one node's state to another (live recovery).

Anchors: torchtitan's checkpoint component (every stateful part registers itself), torchft's
resume-and-compare-hashes tests, torchdata's StatefulDataLoader (the data position is state).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import random
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import Dataset

from exogym.run.dist.ranks import RankContext
from exogym.run.loop.clocking import ClockFeed, not_recostable
from exogym.run.loop.evaluation import Evaluation, describe_eval_set, load_state
from exogym.run.loop.events import Timelines
from exogym.run.loop.schedule import Lockstep, PerNodeTimelines, Rounds, Scheduler
from exogym.run.nodes.holders import Seats, hold
from exogym.run.options import settings
from exogym.run.output.checkpoint import Parts
from exogym.run.output.record import Recorder
from exogym.run.output.result import FitResult, NonFiniteLossError
from exogym.run.output.sinks import MultiSink
from exogym.run.output.trace import picture_due
from exogym.sim.client_data import ClientBatches
from exogym.sim.clock import ClockReport, ClockTrace, SimClock
from exogym.sim.comm import Communicator
from exogym.sim.engine import EngineName, Precision
from exogym.sim.network import Network
from exogym.sim.participation import Participation
from exogym.sim.partition import Partition
from exogym.sim.presence import Presence
from exogym.sim.sharding import DatasetFactory, NodeBatches
from exogym.sim.world import PERFECT, World, speeds_of
from exogym.strategy.base import StackedStrategy
from exogym.utils.plugins import source_of

__all__ = ["RUN_CONFIG_KEYS", "STATE_FORMAT", "Run", "RunInterrupted", "RunSettings"]

STATE_FORMAT = 1
"""Version of :meth:`Run.state_dict`'s layout; a checkpoint of another version is refused."""

_DERIVED_KEYS = ("strategy_class", "hyperparameters", "steps_per_epoch", "partition_stats",
                 "processes", "parameters", "eval_set", "compute_source")
# the settings' keys, and what follows from them (the strategy's class and hyperparameters, the
# data's epochs and shards, the processes, the model's size, the evaluation set, the price's
# source)

RUN_CONFIG_KEYS = tuple(dict.fromkeys(
    [str(s.record).split(".")[0] for s in settings().values() if s.record] + [*_DERIVED_KEYS]))
"""The keys of ``config.json`` that are the run's own (``run_info`` may add others): every
setting's (:mod:`exogym.run.options`) and the derived ones."""

_RECORDED_AS_HELD = tuple((name, s.record) for name, s in settings().items()
                          if s.record and "." not in s.record)
"""The settings recorded under a key of their own; ``config.json`` holds their
:class:`RunSettings` value but where :func:`_config` writes a resolved one (the network's
spec)."""


class RunInterrupted(KeyboardInterrupt):
    """The run was stopped (Ctrl-C, SIGTERM) and ended cleanly: metrics flushed, and a checkpoint
    written when the run has a folder. ``str(err)`` says how to continue it."""


@dataclass(frozen=True)
class RunSettings:
    """How a run trains: everything fixed from its start (validated by :meth:`exogym.Trainer.
    fit`; see its arguments). ``total_steps`` and ``eval_interval`` are resolved numbers."""

    num_nodes: int
    total_steps: int
    batch_size: int
    partition: Partition
    eval_interval: int
    eval_samples: int | None
    eval_at_start: bool
    eval_batch_size: int
    log_interval: int
    engine: EngineName
    micro_batch_size: int | None
    precision: Precision
    seed: int
    network: Network | None
    step_time_s: float | None
    compute_source: str
    allow_nonfinite: bool
    allow_unsynced: bool
    world: World = PERFECT
    participation: Participation | None = None
    trace: bool = False
    resident: int | None = None  # nodes in memory at once (exogym.run.nodes.paging); None: all
    offload: str = "host"
    seats: bool = False  # only the round's participants in memory (exogym.run.nodes.population)
    client_store: str = "512MB"  # where clients that keep state keep it (seats)

    @classmethod
    def of(cls, values: Mapping[str, Any], **resolved: Any) -> RunSettings:
        """The settings of ``fit``'s arguments ``values`` (by name: :meth:`FitOptions.values`
        or ``resumed``), every field of this class that is one of them taken as it is, and the
        ``resolved`` ones (a parsed network, the total steps, what follows from them)."""
        own = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: v for k, v in values.items() if k in own}, **resolved})


class Run:
    """One training run between two steps (see the module docstring).

    Args:
        model: the user's module (a template: never modified).
        train_data, val_data: the training data (a Dataset or a factory) and the evaluation set.
        strategy: a fresh :class:`StackedStrategy`; :meth:`StackedStrategy.setup` is called here.
        settings: :class:`RunSettings`.
        device: where the nodes compute.
        ranks: this process's place in a multi-process run, or None to simulate every node.
        out_dir: the run folder (rank 0 writes it), or None.
        sink: more places for the rows (rank 0 only).
        progress: show a progress bar (rank 0 only).
        run_info: more ``config.json`` entries (the task id, a vocabulary).
        batches: the run's :class:`NodeBatches` if already built (with the settings' seed,
            N, batch size and partition); None: built here.
        checkpointing: how the run writes checkpoints (recorded in ``config.json``, so that a
            resumed run goes on writing them the same way).
    """

    def __init__(
        self, model: nn.Module, train_data: Dataset | DatasetFactory, val_data: Dataset | None,
        strategy: StackedStrategy, settings: RunSettings, *, device: torch.device,
        ranks: RankContext | None, out_dir: str | Path | None, sink: MultiSink,
        progress: bool, run_info: dict[str, Any], batches: NodeBatches | None = None,
        checkpointing: Mapping[str, Any] | None = None,
    ) -> None:
        s = settings
        self.model, self.settings, self.device, self.ranks = model, s, device, ranks
        self.lead = ranks is None or ranks.rank == 0
        self.strategy = strategy
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.wall_start = time.perf_counter()
        # Where this session continued the run from ({"step", "checkpoint"}), set by the
        # trainer after load_state_dict; None: the run started here.
        self.resumed_from: dict[str, Any] | None = None
        torch.manual_seed(s.seed)
        self.batches: NodeBatches | ClientBatches = batches if batches is not None else (
            ClientBatches if s.seats else NodeBatches)(
            train_data, s.num_nodes, s.batch_size, seed=s.seed, partition=s.partition)
        # where the nodes live: in memory, paged groups, a population's seats
        self.held = hold(model, strategy, s, self.batches, ranks, device, self.out_dir,
                         self._steps_to_evaluation)
        self.nodes, self.comm = self.held.nodes, self.held.comm
        self.evaluation = Evaluation(model, val_data, s.eval_samples, s.eval_batch_size,
                                     device, ranks)
        self.eval_full, self.eval_set = self.evaluation.full, self.evaluation.during
        self.config = _config(self, run_info, dict(checkpointing or {}))

        # The state that changes from step to step (state_dict() saves exactly this).
        self.step = 0  # steps done by every node (asynchronous: by the fastest)
        self.loss_sum = torch.zeros((), device=device)
        self.loss_count = 0
        self.loss_nodes = 0  # node-steps in loss_sum (the nodes that computed)
        self.node_steps = 0  # node-steps computed so far (absent nodes take none)
        # First step (0-based) at which each local node's loss was not finite, -1 while it is:
        # tracked on the device (no host sync per step), read at log steps.
        self.first_bad = torch.full((self.comm.n_local,), -1, dtype=torch.long, device=device)
        self.nonfinite: dict[str, Any] | None = None
        self.train_time_s = 0.0  # wall time of the training steps (not state of the numbers)
        self.record = Recorder(out_dir, self.config, sink, lead=self.lead, progress=progress,
                               total_steps=s.total_steps, trace=s.trace)
        self.scheduler = self._scheduler()
        # Whether nodes can be absent at a step (a world that is not perfect, or a deadline);
        # an asynchronous run's world gives speeds only, which its timelines follow.
        worldly = isinstance(self.scheduler, Lockstep) and self.scheduler.worldly
        # a population's seats take their clients' speeds and availability each round
        world = PERFECT if s.seats else s.world
        self.feed = ClockFeed(s.network, world, self.rows, s.step_time_s, s.compute_source,
                              strategy.overlap_steps, comm=self.comm, ranks=ranks,
                              device=device, record_ops=worldly, trace=s.trace,
                              spans=self.lead and out_dir is not None and (s.trace or picture_due(
                                  s.world, s.network, self.rows, self.timelines is not None)))
        self.presence = Presence(world, self.rows, self.record.event, self.feed.ops)
        if worldly:
            self.comm.timeline = self
        self._log_now = False

    def _scheduler(self) -> Scheduler:
        """Per-node timelines for an asynchronous strategy (checked here); a population's
        rounds; else lockstep."""
        s = self.settings
        asynchronous = getattr(self.strategy, "asynchronous", False)
        if s.participation is not None and not asynchronous:
            _check_participation(self.strategy, s)
        if s.seats and not asynchronous:
            return Rounds(self.strategy.sync_period or 1)
        if not asynchronous:
            return Lockstep(not s.world.perfect or getattr(self.strategy, "deadline", None)
                            is not None, s.participation, self.strategy.sync_period or 1)
        PerNodeTimelines.check(self.strategy.id, s.network, s.world, self.ranks, s.seats)
        assert s.network is not None
        if not s.seats:  # a population's clients give their speeds when seated
            self.strategy.set_speeds(  # type: ignore[attr-defined]
                speeds_of(s.world, s.network.node_speeds(s.num_nodes)))
        return PerNodeTimelines(self.rows)

    # -- the loop's calls ----------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.step >= self.settings.total_steps

    @property
    def log_due(self) -> bool:
        """Whether the step just taken ends with a metrics row."""
        return self._log_now

    @property
    def clock(self) -> SimClock | None:
        return self.feed.clock

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.record.history

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.record.events

    @property
    def timelines(self) -> Timelines | None:
        return (self.scheduler.timelines if isinstance(self.scheduler, PerNodeTimelines)
                else None)

    def open(self, *, resumed: bool = False) -> None:
        """Create the run folder and start the sinks; ``resumed``: continue them from the rows
        of the loaded state (``metrics.jsonl`` cut back to them, nothing duplicated or lost)."""
        self.record.open(self.step, resumed=resumed)

    def evaluate_initial(self) -> None:
        """The initial model as a row at step 0 (``eval_at_start``), where curves start."""
        if self.eval_set is None or not self.settings.eval_at_start or self.step != 0:
            return
        row: dict[str, Any] = {"step": 0, "epoch": 0, "samples": 0, **self.held.most_bytes(),
                               "wall_s": time.perf_counter() - self.wall_start}
        if self.settings.network is not None:
            row["sim_time_s"] = 0.0
        row.update(self.evaluate(self.eval_set))
        self._emit(row)

    def train_step(self) -> None:
        """The scheduler has the nodes compute one more step (the world, the strategy, the
        clock); at log steps the clock catches up."""
        s = self.settings
        t0 = time.perf_counter()
        self.comm.step = self.step
        if s.network is not None and self.clock is None:
            t0 += self._start_clock()  # pricing the step before the run is not training time
        with self.nodes.stepping():
            self.step = done = self.scheduler.advance(self)
        self._log_now = (done % s.log_interval == 0 or done == s.total_steps
                         or self._eval_due)
        if self._log_now and self.device.type == "cuda":
            # Only where the time is read: queued kernels of earlier steps finish here and count
            # as training time; a sync every step would stall the launch queue.
            torch.cuda.synchronize(self.device)
        self.train_time_s += time.perf_counter() - t0
        if self.feed.measured and (self._log_now or done >= s.total_steps):
            self.feed.catch_up(self.step, self.comm.n_local)
        self.feed.feed()
        self.record.advanced()

    # -- what the schedulers ask (exogym.run.loop.schedule.Stepped) --------------------------------
    @property
    def total_steps(self) -> int:
        return self.settings.total_steps

    @property
    def rows(self) -> int:
        """The nodes (a population's seats) the run computes, over every process."""
        return self.comm.num_nodes

    def compute(self, step: int, active: list[bool] | None) -> None:
        """The ``active`` nodes (None: all) compute one step; the strategy updates and
        communicates; the clock advances their time."""
        losses = self.held.step(step, active, self.feed)
        # the computing nodes' losses only (others' rows are 0): a run holding the round's
        # clients in seats sums the very same values in the same order
        self.loss_sum += (losses if active is None else
                          losses[self.comm.local_rows(active, losses.device)]).sum()
        self.loss_count += 1
        computed = self.comm.num_nodes if active is None else sum(active)
        self.loss_nodes += computed
        self.node_steps += computed
        if not self.settings.allow_nonfinite or self.nonfinite is None:
            self.first_bad.masked_fill_((self.first_bad < 0) & ~torch.isfinite(losses), step)

    def start_round(self, step: int) -> None:
        """A population's round starts at ``step``: its clients are drawn and seated, and those
        not in the previous round receive the global model."""
        self.comm.step = self.presence.step = step
        self._seats.start_round(step, self.clock, self.feed.feed, self.record.event,
                                self.presence.counts)

    def end_round(self) -> None:
        self._seats.end_round()

    @property
    def round_active(self) -> list[bool] | None:
        """The seats that compute in this round (None: all)."""
        return self._seats.active

    @property
    def seated(self) -> bool:
        return self._seats.seated

    @property
    def _seats(self) -> Seats:
        assert isinstance(self.held, Seats), "rounds of a population's seats"
        return self.held

    def fill_seats(self) -> None:
        """Before an asynchronous server's first step: its first clients in flight."""
        self.comm.step = self.step
        self.held.fill(self.clock)

    def pushes(self) -> list[tuple[int, float]]:
        """The updates pushed to the server at this step (``(node, bytes)``), taken."""
        outbox = self.strategy.outbox  # type: ignore[attr-defined]
        out = [(int(node), float(size)) for node, size in outbox]
        outbox.clear()
        return out

    def deliver(self, node: int, at: float, final: bool = False) -> float:
        """A push reaches the server at ``at``: it applies the update; the node (a
        population's seat: its next client, unless the run is ending) receives the server's
        model; the bytes of that reply."""
        self.strategy.receive(node)  # type: ignore[attr-defined]
        if not final:
            self.held.next_client(node, self.clock, self.step, at)
        return self.strategy.restart(node)  # type: ignore[attr-defined, no-any-return]

    @property
    def between_rounds(self) -> bool:
        """Whether the run's state is that of its step (a paged run mid-round has computed
        ahead: no checkpoint can be taken there)."""
        return self.held.between_rounds

    def log(self) -> None:
        """The metrics row of the step just taken, with an evaluation when one is due. A
        non-finite loss stops the run here (unless allowed), the row written first."""
        s = self.settings
        if self.ranks is not None:  # every node's losses: the mean over all N nodes
            dist.all_reduce(self.loss_sum)
        lr, epoch = self.held.view()
        row: dict[str, Any] = {
            "step": self.step,
            "epoch": epoch,
            "train_loss": float(self.loss_sum) / max(self.loss_nodes, 1),
            "lr": lr,
            "samples": self.node_steps * s.batch_size,
            **self.held.most_bytes(),
            "wall_s": time.perf_counter() - self.wall_start,
        }
        if self.clock is not None:
            row["sim_time_s"] = self.clock.now
        if self.timelines is not None:
            row.update(self.timelines.row(self.strategy.staleness))  # type: ignore[attr-defined]
        self.loss_sum.zero_()
        self.loss_count = 0
        self.loss_nodes = 0
        if self.nonfinite is None:
            self._check_nonfinite(row)
        if self._eval_due:
            assert self.eval_set is not None
            row.update(self.evaluate(self.eval_set))
            self.feed.feed()  # a strategy may communicate to build its global model
        self._emit(row)
        self.record.advanced(row)

    def agree(self, *flags: bool) -> tuple[bool, ...]:
        """Flags every rank acts on together (any rank's True is everyone's): a stop request or
        a time-based checkpoint must happen at the same step in every process. A collective in
        a multi-process run (call it on every rank at the same step); the flags as they are in
        one process."""
        if self.ranks is None or self.ranks.world_size == 1:
            return flags
        t = torch.tensor([int(f) for f in flags], dtype=torch.int64, device=self.loss_sum.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return tuple(bool(v) for v in t.tolist())

    def finish(self) -> FitResult:
        """The final evaluation on the whole set, the clock's report, the global model: the
        :class:`FitResult` (written to ``summary.json``; the sinks finished)."""
        final = self.evaluation.final(self.history[-1] if self.history else None,
                                      self.held.global_state, self.settings.allow_nonfinite,
                                      self.strategy.id, self._save_model)
        report = trace = None
        if self.feed.measured:
            self.feed.catch_up(self.step, self.comm.n_local)
        if self.clock is not None and self.feed.step_time_s is not None:
            self.feed.feed()
            down = [i for i, d in enumerate(self.presence.down) if d]
            if self.feed.ops is not None:
                self.feed.ops.extend(["e", i] for i in down)
            report = self.clock.finish(down)
            trace = self.feed.trace(
                self.settings.total_steps,
                tuple(self.clock.speeds) if not self.settings.world.perfect else None,
                not_recostable(self.strategy, self.settings.world,
                               self.timelines is not None))
        self.record.timeline(self.feed.timeline(trace, self.events, self.strategy.id,
                                                self.timelines is None),
                             self.feed.real_timeline(self.strategy.id, self.settings.total_steps))
        model = copy.deepcopy(self.model).to(self.device)
        load_state(model, self.held.global_state())
        self.record.save_model(model.state_dict())
        result = _result(self, model, final, report, trace)
        self.close(result.to_dict())
        return result

    def close(self, summary: dict[str, Any] | None) -> None:
        """Close the metrics file (writing ``summary.json`` if given), the sinks (``None``: the
        run did not finish) and the progress bar. Safe to call twice."""
        self.record.close(summary)
        self.held.close()

    # -- evaluation ----------------------------------------------------------------------------
    def evaluate(self, dataset: Dataset) -> dict[str, float]:
        """The global model on ``dataset`` (rank 0 computes, every rank gets it); the
        checkpoint ``model.pt`` is written."""
        return self.evaluation(self.held.global_state(), dataset, self._save_model)

    @property
    def _save_model(self) -> Any:
        return self.record.save_model if self.record.writer is not None else None

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the run exactly (tensors by reference; a checkpoint
        copies them to host memory). Only tensors, dicts, lists, tuples and plain values, so
        that ``torch.load(weights_only=True)`` reads it back."""
        if self.feed.measured:  # the clock is complete in a checkpoint
            self.feed.catch_up(self.step, self.comm.n_local)
        return {
            "format": STATE_FORMAT,
            "config": _plain(self.config),
            "step": self.step,
            **self.held.state_dict(),
            "comm": self.comm.state_dict(),
            "data": self.batches.state_dict(),
            "rng": _rng_state(self.device),
            **self.feed.state_dict(),
            "metrics": {"history": _plain(self.history), "loss_sum": self.loss_sum,
                        "loss_count": self.loss_count, "loss_nodes": self.loss_nodes,
                        "node_steps": self.node_steps,
                        "first_bad": self.first_bad, "nonfinite": _plain(self.nonfinite),
                        "train_time_s": self.train_time_s,
                        "wall_time_s": time.perf_counter() - self.wall_start},
            "world": {**self.presence.state_dict(), "events": _plain(self.events),
                      "ops": _plain(self.feed.ops)},
            "timelines": self.scheduler.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any], folder: Path | None = None) -> None:
        """Restore :meth:`state_dict` into a Run built with the same settings (before
        :meth:`open`); tensors are expected on this run's device. ``folder``: the checkpoint's,
        where a paged run's groups are (:meth:`checkpoint_parts`)."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"checkpoint format {state.get('format')!r} is not this exogym's "
                             f"({STATE_FORMAT})")
        self.held.load_state_dict(state, folder)
        self.comm.load_state_dict(state["comm"])
        self.batches.load_state_dict(state["data"])
        self.step = int(state["step"])
        self.feed.load_state_dict(dict(state), self.step)
        self.held.resumed(self.clock)
        w = state["world"]
        self.record.events[:] = [dict(e) for e in w["events"]]
        self.presence.load_state_dict(w, self.record.events)
        if w["ops"] is not None:
            assert self.feed.ops is not None
            self.feed.ops[:] = [list(op) for op in w["ops"]]
        self.scheduler.load_state_dict(state["timelines"])
        m = state["metrics"]
        self.record.history[:] = [dict(row) for row in m["history"]]
        self.loss_sum.copy_(m["loss_sum"])
        self.loss_count = int(m["loss_count"])
        self.loss_nodes = int(m["loss_nodes"])
        self.node_steps = int(m.get("node_steps", self.step * self.settings.num_nodes))
        self.first_bad.copy_(m["first_bad"])
        self.nonfinite = m["nonfinite"]
        self.train_time_s = float(m["train_time_s"])
        # wall time goes on from the sessions before (rows' wall_s stay increasing)
        self.wall_start = time.perf_counter() - float(m.get("wall_time_s", 0.0))
        _set_rng_state(state["rng"], self.device)

    def checkpoint_parts(self) -> Parts | None:
        """The files a checkpoint holds besides :meth:`state_dict`: a paged run's groups."""
        return self.held.parts()

    # -- internals -----------------------------------------------------------------------------
    def _steps_to_evaluation(self, step: int) -> int:
        """Steps from ``step`` to the next evaluation, that step included (a paged round ends
        there: an evaluation reads the groups' state of its step, which a round computed
        further ahead has left behind; eager DiLoCo's global model, the nodes' mean, changes
        every step)."""
        if self.eval_set is None:
            return self.settings.total_steps - step
        return self.settings.eval_interval - step % self.settings.eval_interval

    @property
    def _eval_due(self) -> bool:
        s, done = self.settings, self.step
        return self.eval_set is not None and done > 0 and (
            done % s.eval_interval == 0 or done == s.total_steps)

    def _start_clock(self) -> float:
        """Create the simulated clock before the first step; the seconds it took (pricing a
        step before the run, when time steers it, is not training time)."""
        m0 = time.perf_counter()
        steered = not isinstance(self.scheduler, Lockstep) or self.scheduler.worldly
        self.feed.start(self.step, steered, lambda: self.feed.price_before_run(
            self.model, self.batches.peek(0), self.strategy.optim, self.nodes, self.settings,
            lead=self.lead))
        return time.perf_counter() - m0

    # -- the world (the lockstep scheduler's and the strategies' calls) --------------------------
    def world_step(self, select: Any = None) -> list[bool] | None:
        """Before a step: the world says who computes (:meth:`Presence.before_step`; ``select``:
        the round's participants among the up nodes, and who joins the round); nodes that
        rejoined, joined, or were out of sync, recover from a live peer when they compute again
        (a late node heals once it has caught up, from the state the others hold then); the
        nodes that compute this step (None: all)."""
        active, rejoined = self.presence.before_step(self.step, self.clock)
        joining: dict[int, int] = {}
        if select is not None:
            active, joining, staying = select(self.step, active)
            if staying:
                self.held.call(lambda strategy: _restart(strategy, staying))
        if rejoined or joining:
            for strategy in self.held.strategies:
                strategy.request_recovery(rejoined + list(joining))
        pending = [i for i in self.strategy.pending_recovery if active[i]]
        pairs = [(n, joining.get(n, d) if joining.get(n, -1) >= 0 else d, n in joining)
                 for n, d in (self.presence.donors(pending) if pending else [])]
        part = self.settings.participation
        if pairs:  # every recovery of the step, then the clock: a paged run passes over its
            # groups once; the records and their order are those of one recovery at a time;
            # a joining client's recovery lasts from when its donor can send (before, it was
            # not part of the run)
            before = [(self.comm.bytes_received[n],
                       max(self._time(n), self._time(d)) if j else self._time(n))
                      for n, d, j in pairs]

            def recover_all(strategy: StackedStrategy) -> None:
                for n, d, j in pairs:
                    _recover(strategy, n, d, part, j)

            self.held.call(recover_all)
            self.feed.feed()
            for (node, donor, _), (received, start) in zip(pairs, before, strict=True):
                self.presence.recovered(node, donor, self.comm.bytes_received[node] - received,
                                        self._time(node) - start)
        for strategy in self.held.strategies:
            strategy.pending_recovery = [i for i in strategy.pending_recovery if not active[i]]
        return None if all(active) else active

    def arrivals(self, active: list[bool] | None, deadline: str | None) -> list[bool] | None:
        """The :class:`~exogym.sim.comm.Timeline` the strategies ask at a synchronisation: the
        ``active`` nodes (None: all) minus lost messages and deadline cuts
        (:meth:`Presence.arrivals`)."""
        self.presence.step = self.step
        return self.presence.arrivals(active, deadline, self.clock)

    def _time(self, node: int) -> float:
        return self.clock.t[node] if self.clock is not None else 0.0

    def _emit(self, row: dict[str, Any]) -> None:
        """Record a metrics row; a non-finite eval loss then stops the run (unless allowed)."""
        self.record.row(row)
        loss = row.get("eval_loss", 0.0)
        if not self.settings.allow_nonfinite and not math.isfinite(loss):
            raise NonFiniteLossError(
                f"the global model's eval loss is {loss} after step {row['step']} "
                f"(strategy {self.strategy.id}, {self.settings.num_nodes} nodes): the run "
                "diverged; metrics so far are written. Lower the learning rate(s), clip "
                "gradients (--set max_grad_norm=1), or pass allow_nonfinite=True "
                "(--allow-nonfinite) to train on regardless")

    def _check_nonfinite(self, row: dict[str, Any]) -> None:
        bad = _first_bad_steps(self.first_bad, self.comm, self.ranks)
        if not bad:
            return
        first = min(bad.values())
        nodes = [self.held.node_of(i, first) for i, s in bad.items() if s == first]
        self.nonfinite = {"step": first + 1, "nodes": sorted(nodes)}
        message = (f"non-finite training loss at step {first + 1} on node(s) "
                   f"{', '.join(map(str, self.nonfinite['nodes']))} of "
                   f"{self.settings.num_nodes} (strategy {self.strategy.id}): the run diverged")
        if not self.settings.allow_nonfinite:
            self.record.row(row)
            raise NonFiniteLossError(
                f"{message}; metrics so far are written. Lower the learning rate(s), clip "
                "gradients (--set max_grad_norm=1), or pass allow_nonfinite=True "
                "(--allow-nonfinite) to train on regardless")
        if self.lead:
            warnings.warn(f"{message}; training on (allow_nonfinite=True)", RuntimeWarning,
                          stacklevel=4)


# -- helpers ---------------------------------------------------------------------------------------
def _config(run: Run, run_info: dict[str, Any], checkpointing: dict[str, Any]) -> dict[str, Any]:
    """The ``config.json`` content: the run's settings, resolved."""
    s, strategy = run.settings, run.strategy
    config = {
        "strategy": strategy.id,
        "strategy_class": source_of(type(strategy)),
        "hyperparameters": strategy.hyperparameters(),
        "steps": s.total_steps, "steps_per_epoch": run.batches.steps_per_epoch,
        "partition": s.partition.spec, "partition_stats": run.batches.partition_stats(),
        "engine": run.nodes.engine, "device": str(run.device),
        "processes": 1 if run.ranks is None else run.ranks.world_size,
        "parameters": run.nodes.num_parameters(),
        "eval_set": getattr(run.eval_full, "test_set", None),
        "network": s.network.spec() if s.network is not None else None,
        "step_time_s": s.step_time_s, "compute_source": s.compute_source,
        "checkpointing": checkpointing, "world": s.world.spec(),
        "participation": None if s.participation is None else s.participation.to_dict(),
        "paging": None if s.resident is None or s.seats or run.ranks is not None
        else {"resident": s.resident, "offload": s.offload},
        "population": None if s.participation is None else {
            "clients_in_memory": "round" if s.seats else "all",
            **({"concurrency": s.participation.count}
               if getattr(strategy, "asynchronous", False) else {}),
            **({"client_store": s.client_store} if s.seats
               and s.participation.client_state == "keep" else {})},
    }
    for name, key in _RECORDED_AS_HELD:  # the rest of the settings, as the run holds them
        if key not in config:
            config[key] = getattr(s, name)
    assert set(config) == set(RUN_CONFIG_KEYS), set(config) ^ set(RUN_CONFIG_KEYS)
    clash = sorted(set(run_info) & set(config))
    if clash:
        raise ValueError(f"run_info may not replace the run's own config keys {clash}")
    config.update(run_info)
    return config


def _plain(value: Any) -> Any:
    """JSON-like data with only the types ``torch.load(weights_only=True)`` reads (tuples kept,
    paths as strings)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, Path):
        return str(value)
    return value


def _rng_state(device: torch.device) -> dict[str, Any]:
    """Every random generator a run draws from: torch's (CPU, and the GPUs'), Python's and
    NumPy's global ones (a user's dataset or model may use them)."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": (torch.cuda.get_rng_state_all() if device.type == "cuda" else None),
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]),
    }


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
    version, *rest = state["python"]
    random.setstate((version, tuple(rest[0]), rest[1]))
    name, keys, *tail = state["numpy"]
    np.random.set_state((name, keys.cpu().numpy().astype(np.uint32), *tail))


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


def _result(run: Run, model: nn.Module, final: dict[str, float], report: ClockReport | None,
            trace: ClockTrace | None) -> FitResult:
    """The run's :class:`FitResult` (its holder adds its own fields: bytes, paging,
    population)."""
    s, tl, strategy, comm = run.settings, run.timelines, run.strategy, run.comm
    return FitResult(
        model=model, history=run.history, final=final, strategy=strategy.id,
        hyperparameters=strategy.hyperparameters(), num_nodes=s.num_nodes,
        steps=s.total_steps, batch_size=s.batch_size, samples=run.node_steps * s.batch_size,
        train_time_s=run.train_time_s, wall_time_s=time.perf_counter() - run.wall_start,
        engine=run.nodes.engine, device=str(run.device), seed=s.seed,
        out_dir=run.out_dir, comm_log=list(comm.log),
        eval_set=describe_eval_set(run.eval_full),
        eval_during_training=(describe_eval_set(run.eval_set)
                              if run.eval_set is not run.eval_full else None),
        network=s.network, clock=report, trace=trace,
        processes=1 if run.ranks is None else run.ranks.world_size,
        nonfinite=run.nonfinite, resumed_from=run.resumed_from,
        world=(None if run.feed.ops is None and not s.seats else
               {"spec": s.world.spec(), "description": s.world.describe(),
                **run.presence.counts, "events": len(run.events)}),
        events=list(run.events),
        asynchronous=(None if tl is None else
                      {**tl.summary(strategy.staleness),  # type: ignore[attr-defined]
                       "server_bytes_received": comm.server_bytes_received,
                       "server_bytes_sent": comm.server_bytes_sent}),
        **run.held.result(),
    )


def _restart(strategy: StackedStrategy, nodes: list[int]) -> None:
    """``nodes`` (global ids) start their own state afresh (a client that keeps none)."""
    for node in nodes:
        row = strategy._row(node)
        if row is not None:
            strategy.restart_row(row)


def _recover(strategy: StackedStrategy, node: int, donor: int, participation: Participation | None,
             joining: bool) -> None:
    with _client_recovery(strategy, participation, joining):
        strategy.recover(node, donor)


def _row0(t: Any) -> Any:
    """Node 0's part of a node-stacked batch leaf."""
    return t[0] if isinstance(t, Tensor) else t


def _first_bad_steps(first_bad: Tensor, comm: Communicator,
                     ranks: RankContext | None) -> dict[int, int]:
    """``{global node id: first 0-based step with a non-finite loss}`` over the whole run (a
    collective across processes, so that every rank stops at the same step)."""
    if ranks is not None:
        full = torch.full((comm.num_nodes,), -1, dtype=torch.long, device=first_bad.device)
        full[comm.node_ids] = first_bad
        dist.all_reduce(full, op=dist.ReduceOp.MAX)
        ids: list[int] = list(range(comm.num_nodes))
    else:
        full, ids = first_bad, comm.node_ids
    values = full.tolist()
    return {i: s for i, s in zip(ids, values, strict=True) if s >= 0}


