"""The run's state as one object: everything the training loop carries between two steps.

A :class:`Run` holds the parts of one training run and the state that changes from step to step.
The driver (:func:`exogym.run.loop.drive.drive`) calls it a few times::

    run = Run(...)                      # everything built, step 0
    run.open()                          # run folder and sinks (or, resumed: continue them)
    run.evaluate_initial()              # optional: the initial model as a row at step 0
    while not run.done:
        run.train_step()                # one step of every node, the strategy, the clock
        if run.log_due:
            run.log()                   # a metrics row (and an evaluation when due)
    result = run.finish()

The parts, each in its own room (docs/design.md, "The parts of a run"), built here and given
to each other, never the run itself: where the nodes live (a :class:`~exogym.run.nodes.holders.
Holder`), who computes next (a scheduler of :mod:`exogym.run.loop.schedule`, with the
:class:`~exogym.run.loop.losses.TrainLoss` that computes a step and, in a world, the
:class:`~exogym.run.loop.world_step.WorldStep` that asks :class:`~exogym.sim.presence.Presence`
who is up), what it costs (:class:`~exogym.run.loop.clocking.ClockFeed` feeding
:mod:`exogym.sim.clock`), and what is recorded (:class:`~exogym.run.output.record.Recorder`).
The communicator knows of the run only its :class:`~exogym.sim.comm.Attendance`.

:meth:`Run.state_dict` is the checkpoint: restored with :meth:`Run.load_state_dict` into a Run
built with the same settings, the run continues bit for bit as if it had never stopped (every
metrics row, the bytes and collectives, the simulated clock, the final model), in a fresh
process too. Wall-clock measurements (``wall_s``, ``train_time_s``) are the only values that
differ.

Anchors: torchtitan's checkpoint component (every stateful part registers itself), torchft's
resume-and-compare-hashes tests, torchdata's StatefulDataLoader (the data position is state).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from exogym.run.dist.ranks import RankContext
from exogym.run.loop.clocking import ClockFeed, not_recostable
from exogym.run.loop.config import plain, run_config
from exogym.run.loop.evaluation import EvalTimes, Evaluation, describe_eval_set, load_state
from exogym.run.loop.losses import TrainLoss
from exogym.run.loop.modes import Mode, scheduler
from exogym.run.loop.rng import rng_state, set_rng_state
from exogym.run.nodes.holders import hold
from exogym.run.output.checkpoint import Parts
from exogym.run.output.record import Recorder
from exogym.run.output.result import FitResult
from exogym.run.output.sinks import MultiSink
from exogym.run.output.trace import picture_due
from exogym.run.settings import RunSettings, device_speeds, priced
from exogym.sim.client_data import ClientBatches
from exogym.sim.clock import ClockReport, ClockTrace, SimClock
from exogym.sim.presence import Presence
from exogym.sim.sharding import DatasetFactory, NodeBatches
from exogym.sim.world import PERFECT
from exogym.strategy.base import StackedStrategy
from exogym.strategy.server import follow_run

__all__ = ["STATE_FORMAT", "Run"]

STATE_FORMAT = 1
"""Version of :meth:`Run.state_dict`'s layout; a checkpoint of another version is refused."""


class Run:
    """One training run between two steps (see the module docstring).

    Args:
        model: the user's module (a template: never modified).
        train_data: the training data (a Dataset or a factory).
        val_data: the evaluation set.
        strategy: a fresh :class:`StackedStrategy`; its ``setup`` is called here.
        settings: :class:`~exogym.run.settings.RunSettings`.
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
        follow_run(strategy, population=s.participation is not None,
                   steps_per_epoch=self.batches.steps_per_epoch)
        # compute="profile": one node's step counted and priced on the hardware
        s = self.settings = priced(s, model, self.batches.peek(0), strategy.optim)
        self.evaluation = Evaluation(model, val_data, s.eval_samples, s.eval_batch_size,
                                     device, ranks)
        self.evals = EvalTimes(s.eval_interval, s.total_steps, self.evaluation.during is not None)
        # where the nodes live: in memory, paged groups, a population's seats
        self.held = hold(model, strategy, s, self.batches, ranks, device, self.out_dir,
                         self.evals.steps_to_next)
        self.nodes, self.comm = self.held.nodes, self.held.comm
        self.config = run_config(s, strategy, {
            "steps_per_epoch": self.batches.steps_per_epoch,
            "partition_stats": self.batches.partition_stats(), "engine": self.nodes.engine,
            "device": str(device), "processes": 1 if ranks is None else ranks.world_size,
            "parameters": self.nodes.num_parameters(), "distributed": ranks is not None,
            "eval_set": getattr(self.evaluation.full, "test_set", None)},
            run_info, dict(checkpointing or {}))

        self.step = 0  # steps done by every node (asynchronous: by the fastest)
        self.train_time_s = 0.0  # wall time of the training steps (not state of the numbers)
        self.record = Recorder(out_dir, self.config, sink, lead=self.lead, progress=progress,
                               total_steps=s.total_steps, trace=s.trace)
        mode = Mode.of(strategy, s, ranks)
        # a population's seats take their clients' speeds and availability each round
        world = PERFECT if s.seats else s.world
        self.feed = ClockFeed(s.network, world, self.comm.num_nodes, s.step_time_s,
                              s.compute_source, strategy.overlap_steps, pricing=s.pricing,
                              device_speeds=None if s.seats else device_speeds(s),
                              comm=self.comm,
                              ranks=ranks, device=device, record_ops=mode.worldly,
                              trace=s.trace, spans=self.lead and out_dir is not None and (
                                  s.trace or picture_due(s.world, s.network, self.comm.num_nodes,
                                                         mode.asynchronous)))
        self.presence = Presence(world, self.comm.num_nodes, self.record.event, self.feed.ops)
        self.loss = TrainLoss(self.held, self.feed, ranks, allow_nonfinite=s.allow_nonfinite,
                              strategy_id=strategy.id, num_nodes=s.num_nodes, lead=self.lead)
        self.scheduler, self.timelines = scheduler(mode, strategy, self.held, self.loss,
                                                   self.presence, self.feed, self.record.event,
                                                   s)
        self._log_now = False

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
    def between_rounds(self) -> bool:
        """Whether the run's state is that of its step (a paged run mid-round has computed
        ahead: no checkpoint can be taken there)."""
        return self.held.between_rounds

    def open(self, *, resumed: bool = False) -> None:
        """Create the run folder and start the sinks; ``resumed``: continue them from the rows
        of the loaded state (``metrics.jsonl`` cut back to them, nothing duplicated or lost)."""
        self.record.open(self.step, resumed=resumed)

    def evaluate_initial(self) -> None:
        """The initial model as a row at step 0 (``eval_at_start``), where curves start."""
        during = self.evaluation.during
        if during is None or not self.settings.eval_at_start or self.step != 0:
            return
        row: dict[str, Any] = {"step": 0, "epoch": 0, "samples": 0, **self.held.most_bytes(),
                               "wall_s": time.perf_counter() - self.wall_start}
        if self.settings.network is not None:
            row["sim_time_s"] = 0.0
        row.update(self.evaluate(during))
        self.record.row(row)
        self.loss.check_eval(row)

    def train_step(self) -> None:
        """The scheduler has the nodes compute one more step (the world, the strategy, the
        clock); at log steps the clock catches up."""
        s = self.settings
        t0 = time.perf_counter()
        self.comm.attendance.step = self.step
        if s.network is not None and self.clock is None:
            t0 += self._start_clock()  # pricing the step before the run is not training time
        with self.nodes.stepping():
            self.step = done = self.scheduler.advance(self.step)
        self._log_now = (done % s.log_interval == 0 or done == s.total_steps
                         or self.evals.due(done))
        if self._log_now and self.device.type == "cuda":
            # Only where the time is read: queued kernels of earlier steps finish here and count
            # as training time; a sync every step would stall the launch queue.
            torch.cuda.synchronize(self.device)
        self.train_time_s += time.perf_counter() - t0
        if self.feed.measured and (self._log_now or done >= s.total_steps):
            self.feed.catch_up(self.step, self.comm.n_local)
        self.feed.feed()
        self.record.advanced()

    def log(self) -> None:
        """The metrics row of the step just taken, with an evaluation when one is due. A
        non-finite loss stops the run here (unless allowed), the row written first."""
        train_loss = self.loss.take()  # every node's: across processes, a collective
        lr, epoch = self.held.view()
        row: dict[str, Any] = {
            "step": self.step,
            "epoch": epoch,
            "train_loss": train_loss,
            "lr": lr,
            "samples": self.loss.node_steps * self.settings.batch_size,
            **self.held.most_bytes(),
            "wall_s": time.perf_counter() - self.wall_start,
        }
        if self.clock is not None:
            row["sim_time_s"] = self.clock.now
        if self.timelines is not None:
            row.update(self.timelines.row())
        self.loss.check(row, self.record.row)
        if self.evals.due(self.step):
            assert self.evaluation.during is not None
            row.update(self.evaluate(self.evaluation.during))
            self.feed.feed()  # a strategy may communicate to build its global model
        self.record.row(row)
        self.loss.check_eval(row)
        self.record.advanced(row)

    def agree(self, *flags: bool) -> tuple[bool, ...]:
        """Flags every rank acts on together (any rank's True is everyone's): a stop request or
        a time-based checkpoint must happen at the same step in every process. A collective in
        a multi-process run (call it on every rank at the same step); the flags as they are in
        one process."""
        if self.ranks is None or self.ranks.world_size == 1:
            return flags
        t = torch.tensor([int(f) for f in flags], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return tuple(bool(v) for v in t.tolist())

    def finish(self) -> FitResult:
        """The final evaluation on the whole set, the clock's report, the global model: the
        :class:`FitResult` (written to ``summary.json``; the sinks finished)."""
        history = self.record.history
        final = self.evaluation.final(history[-1] if history else None,
                                      self.held.global_state, self.settings.allow_nonfinite,
                                      self.strategy.id, self.record.model_writer)
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
                tuple(self.clock.speeds) if not self.settings.world.perfect
                or device_speeds(self.settings) is not None else None,
                not_recostable(self.strategy, self.settings.world, self.timelines is not None,
                               self.settings.round_policy, self.settings.seats))
        self.record.timeline(self.feed.timeline(trace, self.record.events, self.strategy.id,
                                                self.timelines is None
                                                and not self.settings.seats,
                                                seats=self.settings.seats),
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

    def evaluate(self, dataset: Dataset) -> dict[str, float]:
        """The global model on ``dataset`` (rank 0 computes, every rank gets it); the
        checkpoint ``model.pt`` is written."""
        return self.evaluation(self.held.global_state(), dataset, self.record.model_writer)

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the run exactly (tensors by reference; a checkpoint
        copies them to host memory). Only tensors, dicts, lists, tuples and plain values, so
        that ``torch.load(weights_only=True)`` reads it back."""
        if self.feed.measured:  # the clock is complete in a checkpoint
            self.feed.catch_up(self.step, self.comm.n_local)
        return {
            "format": STATE_FORMAT,
            "config": plain(self.config),
            "step": self.step,
            **self.held.state_dict(),
            "comm": self.comm.state_dict(),
            "data": self.batches.state_dict(),
            "rng": rng_state(self.device),
            **self.feed.state_dict(),
            "metrics": {"history": plain(self.record.history),
                        **plain(self.loss.state_dict()),
                        "train_time_s": self.train_time_s,
                        "wall_time_s": time.perf_counter() - self.wall_start},
            "world": {**self.presence.state_dict(), "events": plain(self.record.events),
                      "ops": plain(self.feed.ops)},
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
        self.loss.load_state_dict(m, self.step * self.settings.num_nodes)
        self.train_time_s = float(m["train_time_s"])
        # wall time goes on from the sessions before (rows' wall_s stay increasing)
        self.wall_start = time.perf_counter() - float(m.get("wall_time_s", 0.0))
        set_rng_state(state["rng"], self.device)

    def checkpoint_parts(self) -> Parts | None:
        """The files a checkpoint holds besides :meth:`state_dict`: a paged run's groups."""
        return self.held.parts()

    def _start_clock(self) -> float:
        """Create the simulated clock before the first step; the seconds it took (pricing a
        step before the run, when time steers it, is not training time)."""
        m0 = time.perf_counter()
        self.feed.start(self.step, self.scheduler.steered, lambda: self.feed.price_before_run(
            self.model, self.batches.peek(0), self.strategy.optim, self.nodes, self.settings,
            lead=self.lead))
        return time.perf_counter() - m0


def _result(run: Run, model: nn.Module, final: dict[str, float], report: ClockReport | None,
            trace: ClockTrace | None) -> FitResult:
    """The run's :class:`FitResult` (its holder adds its own fields: bytes, paging,
    population)."""
    s, tl, strategy, comm = run.settings, run.timelines, run.strategy, run.comm
    evaluation = run.evaluation
    return FitResult(
        model=model, history=run.record.history, final=final, strategy=strategy.id,
        hyperparameters=strategy.hyperparameters(), num_nodes=s.num_nodes,
        steps=s.total_steps, batch_size=s.batch_size,
        samples=run.loss.node_steps * s.batch_size,
        train_time_s=run.train_time_s, wall_time_s=time.perf_counter() - run.wall_start,
        engine=run.nodes.engine, device=str(run.device), seed=s.seed,
        out_dir=run.out_dir, comm_log=list(comm.log),
        eval_set=describe_eval_set(evaluation.full),
        eval_during_training=(describe_eval_set(evaluation.during)
                              if evaluation.during is not evaluation.full else None),
        network=s.network, clock=report, trace=trace,
        compute=None if s.pricing is None or report is None else s.pricing.to_dict(),
        processes=1 if run.ranks is None else run.ranks.world_size,
        nonfinite=run.loss.nonfinite, resumed_from=run.resumed_from,
        world=(None if run.feed.ops is None and not s.seats else
               {"spec": s.world.spec(), "description": s.world.describe(),
                **run.presence.counts, "events": len(run.record.events)}),
        events=list(run.record.events),
        asynchronous=(None if tl is None else
                      {**tl.summary(),
                       "discarded_stale": len(getattr(strategy, "discarded", ())),
                       "server_bytes_received": comm.server_bytes_received,
                       "server_bytes_sent": comm.server_bytes_sent}),
        **run.held.result(),
    )
