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

:meth:`Run.state_dict` is the checkpoint: restored with :meth:`Run.load_state_dict` into a Run
built with the same settings, the run continues bit for bit as if it had never stopped (every
metrics row, the bytes and collectives, the simulated clock, the final model), in a fresh
process too. Wall-clock measurements (``wall_s``, ``train_time_s``) are the only values that
differ. The same mechanism will hand one node's state to another (live recovery).

Anchors: torchtitan's checkpoint component (every stateful part registers itself), torchft's
resume-and-compare-hashes tests, torchdata's StatefulDataLoader (the data position is state).
"""

from __future__ import annotations

import copy
import math
import os
import random
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.func import functional_call
from torch.utils._pytree import tree_map
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from exogym.run.dist import (
    DistributedCommunicator,
    RankContext,
    gather_global_state,
    local_batch,
)
from exogym.run.events import Timelines, same_or_before
from exogym.run.result import FitResult, MetricsWriter, NonFiniteLossError
from exogym.run.sinks import MultiSink
from exogym.sim.clock import ClockTrace, SimClock, node_processes
from exogym.sim.comm import Communicator, InProcessCommunicator
from exogym.sim.compute import StepMeter, calibrate_step_time, host_cores
from exogym.sim.engine import EngineName, NodeStack, Precision, metrics_of
from exogym.sim.network import Network
from exogym.sim.partition import Partition
from exogym.sim.sharding import DatasetFactory, FixedSubset, NodeBatches, iterate_batches
from exogym.sim.world import PERFECT, World, speeds_of
from exogym.strategy.base import Strategy
from exogym.utils.plugins import source_of

__all__ = ["RUN_CONFIG_KEYS", "STATE_FORMAT", "Run", "RunInterrupted", "RunSettings"]

STATE_FORMAT = 1
"""Version of :meth:`Run.state_dict`'s layout; a checkpoint of another version is refused."""

RUN_CONFIG_KEYS = (
    "strategy", "strategy_class", "hyperparameters", "num_nodes", "steps", "batch_size_per_node",
    "steps_per_epoch", "eval_interval", "eval_samples", "eval_at_start", "eval_batch_size",
    "log_interval", "partition", "partition_stats", "engine", "device", "seed",
    "micro_batch_size", "precision", "processes", "parameters", "eval_set", "network",
    "step_time_s", "compute_source", "allow_nonfinite", "allow_unsynced", "checkpointing",
    "world",
)
"""The keys of ``config.json`` that are the run's own (``run_info`` may add others)."""


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


class Run:
    """One training run between two steps (see the module docstring).

    Args:
        model: the user's module (a template: never modified).
        train_data, val_data: the training data (a Dataset or a factory) and the evaluation set.
        strategy: a fresh :class:`Strategy`; :meth:`Strategy.setup` is called here.
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
        strategy: Strategy, settings: RunSettings, *, device: torch.device,
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
        self.batches = batches if batches is not None else NodeBatches(
            train_data, s.num_nodes, s.batch_size, seed=s.seed, partition=s.partition)
        self.comm: Communicator
        if ranks is None:
            self.nodes = NodeStack(model, s.num_nodes, device=device, engine=s.engine,
                                   micro_batch_size=s.micro_batch_size, precision=s.precision)
            self.comm = InProcessCommunicator(s.num_nodes)
        else:
            self.nodes = NodeStack(model, ranks.nodes_per_process, device=device,
                                   engine=s.engine, micro_batch_size=s.micro_batch_size,
                                   precision=s.precision)
            self.comm = DistributedCommunicator(s.num_nodes, ranks.node_ids)
        strategy.setup(self.nodes, self.comm, s.total_steps)
        self.eval_full = val_data
        self.eval_set = val_data
        if val_data is not None and s.eval_samples is not None and s.eval_samples < len(
                val_data):  # type: ignore[arg-type]
            self.eval_set = FixedSubset(val_data, s.eval_samples)
        self.eval_module = copy.deepcopy(model).to(device).eval()
        self.config = self._config(run_info, dict(checkpointing or {}))

        # The state that changes from step to step (state_dict() saves exactly this).
        self.step = 0  # steps done by every node
        self.history: list[dict[str, Any]] = []
        self.loss_sum = torch.zeros((), device=device)
        self.loss_count = 0
        # First step (0-based) at which each local node's loss was not finite, -1 while it is:
        # tracked on the device (no host sync per step), read at log steps.
        self.first_bad = torch.full((self.nodes.num_nodes,), -1, dtype=torch.long, device=device)
        self.nonfinite: dict[str, Any] | None = None
        self.train_time_s = 0.0  # wall time of the training steps (not state of the numbers)
        self.clock: SimClock | None = None
        self.step_time_s = s.step_time_s
        # Measured compute (the default, where time does not steer the run): every step's real
        # compute per node, per process (step_seconds[step][rank]), given to the clock at log
        # steps; until then this process's values wait in _timing, from step _timing_from on
        # (_window: the wall clock and transport time when the first of them started).
        self.measured = False
        self.meter = StepMeter(device, host_cores(torch.get_num_threads(), 1 if ranks is None
                                                  else _processes_here(ranks)))
        self.compute_method: str | None = None  # how measured compute was priced
        self.step_seconds: list[list[float]] = []
        self._timing: list[float] = []
        self._timing_from = 0
        self._window = (0.0, 0.0)
        self._fed = 0  # records of comm.log already given to the clock
        self.loss_nodes = 0  # node-steps in loss_sum (the nodes that computed)
        # The world (shared/DESIGN.md section 7): which nodes are down, what happened so far
        # (the event log), and how many synchronisations drew message losses.
        self.world = s.world
        self.down = [False] * s.num_nodes
        # Nodes a deadline cut at a synchronisation: still finishing the round they were cut
        # from, they sit out steps until the others' clocks reach theirs (see _world_step).
        self.late = [False] * s.num_nodes
        self.events: list[dict[str, Any]] = []
        self.counts = {"failures": 0, "rejoins": 0, "recoveries": 0, "recovery_bytes": 0.0,
                       "recovery_time_s": 0.0, "messages_lost": 0, "stragglers_cut": 0,
                       "late_steps": 0, "quorum_wait_s": 0.0}
        self._syncs = 0
        # Asynchronous strategies: per-node timelines (the event loop's state, exogym.run.events).
        self.timelines: Timelines | None = None
        if getattr(strategy, "asynchronous", False):
            self._check_asynchronous()
            assert s.network is not None
            self.timelines = Timelines(s.num_nodes)
            strategy.set_speeds(  # type: ignore[attr-defined]
                speeds_of(s.world, s.network.node_speeds(s.num_nodes)))
        # Whether nodes can be absent at a step (a world that is not perfect, or a deadline);
        # an asynchronous run's world gives speeds only, which its timelines follow.
        self._worldly = self.timelines is None and (
            not s.world.perfect or getattr(strategy, "deadline", None) is not None)
        if self._worldly:
            self.comm.timeline = self
        # The clock's operations in order (re-costing replays them) when nodes can be absent.
        self._ops: list[list[Any]] | None = [] if self._worldly else None

        self.writer: MetricsWriter | None = None
        self.sink = sink if self.lead else MultiSink(())  # rank 0 alone writes
        self._bar: Any = None
        self._progress = progress
        self._log_now = False
        self._closed = True  # until open()

    # -- the loop's calls ----------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.step >= self.settings.total_steps

    @property
    def log_due(self) -> bool:
        """Whether the step just taken ends with a metrics row."""
        return self._log_now

    def open(self, *, resumed: bool = False) -> None:
        """Create the run folder and start the sinks; ``resumed``: continue them from the rows
        of the loaded state (``metrics.jsonl`` cut back to them, nothing duplicated or lost)."""
        if self.lead and self.out_dir is not None:
            if resumed:
                self.writer = MetricsWriter.resume(self.out_dir, self.config, self.history,
                                                   self.events)
            else:
                self.writer = MetricsWriter(self.out_dir, self.config)
        run_dir = self.writer.dir if self.writer is not None else None
        self._closed = False
        try:
            if resumed:
                self.sink.resume(self.config, run_dir, self.history)
            else:
                self.sink.start(self.config, run_dir)
        except BaseException:
            if self.writer is not None:
                self.writer.close()
            raise
        self._bar = tqdm(total=self.settings.total_steps, initial=self.step,
                         disable=not (self._progress and self.lead), dynamic_ncols=True,
                         unit="step")

    def evaluate_initial(self) -> None:
        """The initial model as a row at step 0 (``eval_at_start``), where curves start."""
        if self.eval_set is None or not self.settings.eval_at_start or self.step != 0:
            return
        row: dict[str, Any] = {"step": 0, "epoch": 0, "samples": 0,
                               "bytes_sent": max(self.comm.bytes_sent),
                               "bytes_received": max(self.comm.bytes_received),
                               "wall_s": time.perf_counter() - self.wall_start}
        if self.settings.network is not None:
            row["sim_time_s"] = 0.0
        row.update(self.evaluate(self.eval_set))
        self._emit(row)

    def train_step(self) -> None:
        """The world decides who computes; they compute one step; the strategy updates and
        communicates; the clock."""
        s, step = self.settings, self.step
        t0 = time.perf_counter()
        self.comm.step = step
        if s.network is not None and self.clock is None:
            t0 += self._start_clock()  # measuring the step time is not training time
        with self.nodes.stepping():
            if self.timelines is not None:
                self._asynchronous_step()
                self.step = done = self.timelines.fastest
            else:
                self._compute(step, self._world_step() if self._worldly else None)
                self.step = done = step + 1
        self._log_now = (done % s.log_interval == 0 or done == s.total_steps
                         or self._eval_due)
        if self._log_now and self.device.type == "cuda":
            # Only where the time is read: queued kernels of earlier steps finish here and count
            # as training time; a sync every step would stall the launch queue.
            torch.cuda.synchronize(self.device)
        self.train_time_s += time.perf_counter() - t0
        if self.measured and (self._log_now or done >= s.total_steps):
            self._catch_up()
        self._feed()
        if self._bar is not None:
            self._bar.update(1)

    def _compute(self, step: int, active: list[bool] | None) -> None:
        """The ``active`` nodes (None: all) compute one step; the strategy updates and
        communicates; the clock advances their time."""
        s, nodes = self.settings, self.nodes
        start, transport = time.perf_counter(), self.comm.transport_s
        mark = self.meter.start() if self.measured else None
        self.comm.active = active
        local = None if active is None else [active[i] for i in self.comm.node_ids]
        batch = nodes.to_batch_device(self._next_batch(active))
        losses = nodes.forward_backward(batch, local)
        if self.clock is not None and not self.measured:
            self.clock.compute(step, active)
            if self._ops is not None:
                self._ops.append(["c", step, _bits(active)])
        self.strategy.step(step)
        nodes.zero_grad()
        if mark is not None:  # this step's compute per node, real transport excluded (no sync:
            # on a GPU, _catch_up scales the host times to the synchronised window)
            if not self._timing:
                self._window = (start, transport)
            self._timing.append(self.meter.stop(mark, nodes.num_nodes,
                                                self.comm.transport_s - transport))
        self.loss_sum += losses.sum()
        self.loss_count += 1
        self.loss_nodes += s.num_nodes if active is None else sum(active)
        if not s.allow_nonfinite or self.nonfinite is None:
            self.first_bad.masked_fill_((self.first_bad < 0) & ~torch.isfinite(losses), step)

    def _asynchronous_step(self) -> None:
        """Per-node timelines (:mod:`exogym.run.events`): events in simulated time order until
        the fastest node has taken one more step; at the end of the run, the pushes in flight
        are delivered."""
        tl, clock, strategy = self.timelines, self.clock, self.strategy
        assert tl is not None and clock is not None
        n, target = self.settings.num_nodes, self.step + 1
        while tl.fastest < target:
            free = [i for i in range(n) if not tl.waiting[i]]
            start = min((clock.t[i] for i in free), default=math.inf)
            arrival = tl.next_arrival()
            for node, at in clock.serve_pushes(min(start, arrival[0] if arrival else math.inf)):
                tl.arrive(node, at)
            arrival = tl.next_arrival()
            if arrival is not None and same_or_before(arrival[0], start):
                self._deliver(*tl.pop_arrival())
                continue
            group = [not tl.waiting[i] and same_or_before(clock.t[i], start) for i in range(n)]
            self._compute(self.step, None if all(group) else group)
            for i in range(n):
                tl.steps[i] += group[i]
            pushed = strategy.outbox  # type: ignore[attr-defined]
            if pushed:
                sizes = [r.payload_bytes for r in self.comm.log[-len(pushed):]]
                for node, size in zip(pushed, sizes, strict=True):
                    clock.push(node, size)
                    tl.waiting[node] = True
                pushed.clear()
        if target >= self.settings.total_steps:
            for node, at in clock.serve_pushes(math.inf, final=True):
                tl.arrive(node, at)
            while tl.in_flight:
                self._deliver(*tl.pop_arrival())

    def _deliver(self, arrival: float, seq: int, node: int) -> None:
        """A push reaches the server: it applies the update and replies to the node."""
        tl, clock = self.timelines, self.clock
        assert tl is not None and clock is not None
        self.strategy.deliver(node)  # type: ignore[attr-defined]
        clock.reply(node, self.comm.log[-1].payload_bytes, arrival)
        tl.waiting[node] = False

    def _check_asynchronous(self) -> None:
        """An asynchronous strategy runs in one process, on a simulated network, in a world
        of node speeds (no failures or losses yet)."""
        s, sid = self.settings, self.strategy.id
        if self.ranks is not None:
            raise ValueError(f"{sid} is asynchronous: its parameter server and per-node "
                             "timelines run in one process; allowed: the simulator "
                             "(engine loop or vmap, not --engine process or torchrun)")
        if s.network is None:
            raise ValueError(f"{sid} is asynchronous: when an update reaches the server is "
                             "decided by a simulated network; give the run one (--network)")
        w = s.world
        if w.availability_varies or w.drop:
            raise ValueError(f"{sid} is asynchronous: its world may give node speeds "
                             f"(speed=..., speed_sigma=...), not failures, rejoins or message "
                             f"loss; got world {w.spec()!r}")

    def log(self) -> None:
        """The metrics row of the step just taken, with an evaluation when one is due. A
        non-finite loss stops the run here (unless allowed), the row written first."""
        s = self.settings
        if self.ranks is not None:  # every node's losses: the mean over all N nodes
            dist.all_reduce(self.loss_sum)
        row: dict[str, Any] = {
            "step": self.step,
            "epoch": self.batches.epoch,
            "train_loss": float(self.loss_sum) / max(self.loss_nodes, 1),
            "lr": self.strategy.lr,
            "samples": self.step * s.num_nodes * s.batch_size,
            "bytes_sent": max(self.comm.bytes_sent),
            "bytes_received": max(self.comm.bytes_received),
            "wall_s": time.perf_counter() - self.wall_start,
        }
        if self.clock is not None:
            row["sim_time_s"] = self.clock.now
        if self.timelines is not None:
            row["samples"] = sum(self.timelines.steps) * s.batch_size
            row.update(self.timelines.row(self.strategy.staleness))  # type: ignore[attr-defined]
        self.loss_sum.zero_()
        self.loss_count = 0
        self.loss_nodes = 0
        if self.nonfinite is None:
            self._check_nonfinite(row)
        if self._eval_due:
            assert self.eval_set is not None
            row.update(self.evaluate(self.eval_set))
            self._feed()  # a strategy may communicate to build its global model
        self._emit(row)
        if self._bar is not None:
            self._bar.set_postfix({k: f"{v:.4g}" for k, v in row.items()
                                   if k in ("train_loss", "eval_loss", "eval_accuracy")})

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
        s = self.settings
        final: dict[str, float] = {}
        if self.eval_set is not None and self.history:
            final = {k: v for k, v in self.history[-1].items() if k.startswith("eval_")}
            if self.eval_set is not self.eval_full:  # the last evaluation again, whole set
                assert self.eval_full is not None
                final = self.evaluate(self.eval_full)
                if not s.allow_nonfinite and not math.isfinite(final.get("eval_loss", 0.0)):
                    raise NonFiniteLossError(
                        f"the global model's eval loss on the whole evaluation set is "
                        f"{final['eval_loss']} at the end (strategy {self.strategy.id})")
        report = trace = None
        if self.measured:
            self._catch_up()
        if self.clock is not None and self.step_time_s is not None:
            self._feed()
            report = self.clock.finish()
            trace = ClockTrace(
                num_nodes=s.num_nodes, steps=s.total_steps, step_time_s=self.step_time_s,
                compute_source=s.compute_source, overlap_steps=self.strategy.overlap_steps,
                records=tuple(self.comm.log[:self._fed]),
                speeds=tuple(self.clock.speeds) if not s.world.perfect else None,
                ops=tuple(tuple(op) for op in self._ops) if self._ops is not None else None,
                not_recostable=self._not_recostable(), compute_method=self.compute_method,
                step_seconds=(tuple(tuple(row) for row in self.step_seconds)
                              if self.measured else None))
        model = copy.deepcopy(self.model).to(self.device)
        _load_state(model, self.global_state())
        if self.writer is not None:
            self.writer.save_model(model.state_dict())
        result = FitResult(
            model=model, history=self.history, final=final, strategy=self.strategy.id,
            hyperparameters=self.strategy.hyperparameters(), num_nodes=s.num_nodes,
            steps=s.total_steps, batch_size=s.batch_size,
            samples=(s.total_steps * s.num_nodes if self.timelines is None
                     else sum(self.timelines.steps)) * s.batch_size,
            train_time_s=self.train_time_s, wall_time_s=time.perf_counter() - self.wall_start,
            bytes_sent=list(self.comm.bytes_sent), bytes_received=list(self.comm.bytes_received),
            engine=self.nodes.engine, device=str(self.device), seed=s.seed,
            out_dir=self.out_dir, comm_log=list(self.comm.log),
            eval_set=_describe_eval_set(self.eval_full),
            eval_during_training=(_describe_eval_set(self.eval_set)
                                  if self.eval_set is not self.eval_full else None),
            network=s.network, clock=report, trace=trace,
            processes=1 if self.ranks is None else self.ranks.world_size,
            nonfinite=self.nonfinite, resumed_from=self.resumed_from,
            world=(None if not self._worldly else
                   {"spec": s.world.spec(), "description": s.world.describe(),
                    **self.counts, "events": len(self.events)}),
            events=list(self.events),
            asynchronous=(None if self.timelines is None else
                          {**self.timelines.summary(self.strategy.staleness),  # type: ignore[attr-defined]
                           "server_bytes_received": self.comm.server_bytes_received,
                           "server_bytes_sent": self.comm.server_bytes_sent}),
        )
        self.close(result.to_dict())
        return result

    def close(self, summary: dict[str, Any] | None) -> None:
        """Close the metrics file (writing ``summary.json`` if given), the sinks (``None``: the
        run did not finish) and the progress bar. Safe to call twice."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._closed:
            return
        self._closed = True
        if self.writer is not None:
            self.writer.close(summary)
        self.sink.finish(summary)

    # -- evaluation ----------------------------------------------------------------------------
    def global_state(self) -> dict[str, Tensor]:
        """The model to evaluate; across processes a collective (every rank calls it)."""
        if self.ranks is None:
            return self.strategy.global_state()
        assert isinstance(self.comm, DistributedCommunicator)
        return gather_global_state(self.strategy, self.comm)

    def evaluate(self, dataset: Dataset) -> dict[str, float]:
        """The global model on ``dataset`` (rank 0 computes, every rank gets it); the
        checkpoint ``model.pt`` is written."""
        state = self.global_state()
        metrics: dict[str, float] = {}
        if self.lead:
            metrics = _evaluate(self.eval_module, state, dataset, self.settings.eval_batch_size,
                                self.device)
        metrics = _from_lead(metrics, self.ranks)
        if self.writer is not None:
            _load_state(self.eval_module, state)  # a state_dict with tied names too
            self.writer.save_model(self.eval_module.state_dict())
        return metrics

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the run exactly (tensors by reference; a checkpoint
        copies them to host memory). Only tensors, dicts, lists, tuples and plain values, so
        that ``torch.load(weights_only=True)`` reads it back."""
        if self.measured:  # the clock is complete in a checkpoint
            self._catch_up()
        clock = None
        if self.clock is not None:
            clock = self.clock.state_dict()
        return {
            "format": STATE_FORMAT,
            "config": _plain(self.config),
            "step": self.step,
            "nodes": {"params": {k: p.detach() for k, p in self.nodes.params.items()},
                      "buffers": dict(self.nodes.buffers), "engine": self.nodes.engine},
            "strategy": self.strategy.state_dict(),
            "comm": self.comm.state_dict(),
            "data": self.batches.state_dict(),
            "rng": _rng_state(self.device),
            "clock": clock,
            "step_time_s": self.step_time_s,
            "measured": {"on": self.measured, "step_seconds": _plain(self.step_seconds),
                         "method": self.compute_method},
            "fed": self._fed,
            "metrics": {"history": _plain(self.history), "loss_sum": self.loss_sum,
                        "loss_count": self.loss_count, "loss_nodes": self.loss_nodes,
                        "first_bad": self.first_bad, "nonfinite": _plain(self.nonfinite),
                        "train_time_s": self.train_time_s,
                        "wall_time_s": time.perf_counter() - self.wall_start},
            "world": {"down": list(self.down), "late": list(self.late),
                      "events": _plain(self.events), "counts": dict(self.counts),
                      "syncs": self._syncs, "ops": _plain(self._ops)},
            "timelines": self.timelines.state_dict() if self.timelines is not None else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` into a Run built with the same settings (before
        :meth:`open`); tensors are expected on this run's device."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"checkpoint format {state.get('format')!r} is not this exogym's "
                             f"({STATE_FORMAT})")
        with torch.no_grad():
            for kind in ("params", "buffers"):
                own = getattr(self.nodes, kind)
                saved = state["nodes"][kind]
                if set(saved) != set(own):
                    raise ValueError(f"the checkpoint's model has other {kind} "
                                     f"({sorted(set(saved) ^ set(own))}) than this model")
                for k, t in own.items():
                    t.copy_(saved[k])
        if state["nodes"]["engine"] != self.nodes.engine:  # vmap fell back to the loop
            self.nodes.engine = state["nodes"]["engine"]
        self.nodes._vmap_checked = True
        self.strategy.load_state_dict(state["strategy"])
        self.comm.load_state_dict(state["comm"])
        self.batches.load_state_dict(state["data"])
        self.step = int(state["step"])
        self.step_time_s = state["step_time_s"]
        measured = state.get("measured") or {"on": False, "step_seconds": []}
        self.measured = bool(measured["on"])
        self.step_seconds = [[float(v) for v in row] for row in measured["step_seconds"]]
        self.compute_method = measured.get("method")
        self._timing, self._timing_from = [], self.step
        self._fed = int(state["fed"])
        if state["clock"] is not None:
            assert self.settings.network is not None and self.step_time_s is not None
            self.clock = self._new_clock(self.step_time_s)
            self.clock.load_state_dict(state["clock"])
        w = state["world"]
        self.down = [bool(d) for d in w["down"]]
        self.late = [bool(d) for d in w["late"]]
        self.events = [dict(e) for e in w["events"]]
        self.counts = dict(w["counts"])
        self._syncs = int(w["syncs"])
        self._ops = [list(op) for op in w["ops"]] if w["ops"] is not None else None
        if self.timelines is not None:
            self.timelines.load_state_dict(state["timelines"])
        m = state["metrics"]
        self.history = [dict(row) for row in m["history"]]
        self.loss_sum.copy_(m["loss_sum"])
        self.loss_count = int(m["loss_count"])
        self.loss_nodes = int(m["loss_nodes"])
        self.first_bad.copy_(m["first_bad"])
        self.nonfinite = m["nonfinite"]
        self.train_time_s = float(m["train_time_s"])
        # wall time goes on from the sessions before (rows' wall_s stay increasing)
        self.wall_start = time.perf_counter() - float(m.get("wall_time_s", 0.0))
        _set_rng_state(state["rng"], self.device)

    # -- internals -----------------------------------------------------------------------------
    @property
    def _eval_due(self) -> bool:
        s, done = self.settings, self.step
        return self.eval_set is not None and done > 0 and (
            done % s.eval_interval == 0 or done == s.total_steps)

    def _next_batch(self, active: list[bool] | None) -> Any:
        """This process's rows of the next node-stacked batch (``active``: only those nodes
        consume data)."""
        if self.ranks is None:
            return self.batches.batch(active)
        return local_batch(self.batches, self.ranks.node_ids, active)

    def _start_clock(self) -> float:
        """Create the simulated clock, or start timing the first training steps when the step
        time is to be measured from them; the seconds it took."""
        m0 = time.perf_counter()
        s = self.settings
        assert s.network is not None
        if self.step_time_s is None and self.timelines is None and not self._worldly:
            # Measured from this run's own steps, each as it took (nobody's presence depends on
            # time, so the clock can lag and catch up at log steps).
            self.measured, self._timing_from = True, self.step
            self.compute_method = f"{self.meter.method}, each step as it took"
            self.clock = self._new_clock(1.0)  # step_time_s: the running mean, at catch-up
            self._feed()  # set-up collectives (step -1)
            return time.perf_counter() - m0
        if self.step_time_s is None:  # time steers the run from its first step
            self.step_time_s = self._calibrate()
        self.clock = self._new_clock(self.step_time_s)
        self._feed()  # set-up collectives (step -1)
        return time.perf_counter() - m0

    def _calibrate(self) -> float:
        """``c`` priced before the run from real training steps of its engine on a copy of the
        model (:func:`calibrate_step_time`); rank 0's price in a process run."""
        s, nodes = self.settings, min(self.nodes.num_nodes, 2 * self.meter.cores)
        value = None
        if self.lead:
            batch = tree_map(lambda t: t.to(self.device) if isinstance(t, Tensor) else t,
                             self.batches.peek(0))
            with warnings.catch_warnings():  # an engine's fallback warns once, in the run
                warnings.simplefilter("ignore")
                value = calibrate_step_time(
                    self.model, batch, self.strategy.optim, self.device, nodes=nodes,
                    engine=self.nodes.engine, cores=self.meter.cores,
                    micro_batch_size=s.micro_batch_size, precision=s.precision)
        self.compute_method = (f"{self.meter.method}, the median of timed training steps "
                               f"before the run ({self.nodes.engine} engine, {nodes} "
                               f"node{'s' * (nodes != 1)}, after warm-up)")
        return float(_from_lead(value, self.ranks))

    def _catch_up(self) -> None:
        """Give the clock the steps computed since the last call, each with its measured compute
        per node (a process run's ranks exchange theirs here, at steps they all log), and their
        collectives; ``step_time_s`` becomes the mean so far."""
        clock, n = self.clock, self.settings.num_nodes
        assert clock is not None
        own, self._timing = self._timing, []
        if own and self.device.type == "cuda":
            # The host times of queued kernels are launch times: scale them to the window's wall
            # time, read after the synchronisation the run makes at log steps anyway.
            torch.cuda.synchronize(self.device)
            start, transport = self._window
            wall = time.perf_counter() - start - (self.comm.transport_s - transport)
            host = sum(own) * self.nodes.num_nodes
            if host > 0:
                own = [t * wall / host for t in own]
        if self.ranks is not None and self.ranks.world_size > 1:
            every: list[list[float]] = [[] for _ in range(self.ranks.world_size)]
            dist.all_gather_object(every, own)
        else:
            every = [own]
        log, k = self.comm.log, self._fed
        where = node_processes(n, len(every))
        before = len(self.step_seconds)
        total = (self.step_time_s or 0.0) * n * before
        for j, step in enumerate(range(self._timing_from, self.step)):
            row = [times[j] for times in every]
            self.step_seconds.append(row)
            seconds = [row[r] for r in where]
            total += sum(seconds)
            clock.compute(step, None, seconds)
            while k < len(log) and log[k].step <= step:
                clock.collective(log[k])
                k += 1
        self._fed, self._timing_from = k, self.step
        if self.step_seconds:
            self.step_time_s = total / (n * len(self.step_seconds))
            clock.set_step_time(self.step_time_s)

    def _new_clock(self, step_time_s: float) -> SimClock:
        s = self.settings
        assert s.network is not None
        speeds = speeds_of(s.world, s.network.node_speeds(s.num_nodes))
        return SimClock(s.network, s.num_nodes, step_time_s,
                        overlap_steps=self.strategy.overlap_steps,
                        compute_source=s.compute_source, speeds=speeds)

    # -- the world -----------------------------------------------------------------------------
    def _time(self, node: int) -> float:
        return self.clock.t[node] if self.clock is not None else 0.0

    def _not_recostable(self) -> str | None:
        """Why this run's clock cannot be replayed on another network, or None."""
        if self.timelines is not None:
            return (f"{self.strategy.id} is asynchronous: when each update arrives, and so "
                    "which model each node trains from, is decided by the network")
        if self.world.time_dependent:
            return (f"its world ({self.world.spec()}) decides who is up by simulated time, "
                    "which another network would change")
        if getattr(self.strategy, "deadline", None) is not None:
            return (f"its deadline ({self.strategy.deadline}) decides who is late by simulated "
                    "time, which another network would change")
        return None

    def _event(self, kind: str, node: int, **extra: Any) -> None:
        event = {"step": self.step, "time_s": self._time(node), "node": node, "event": kind,
                 **extra}
        self.events.append(event)
        if self.writer is not None:
            self.writer.write_event(event)

    def _world_step(self) -> list[bool] | None:
        """Before a step: failures and rejoins by each node's own clock, the quorum, the live
        recoveries; the nodes that compute this step (None: all)."""
        world, n, step = self.world, self.settings.num_nodes, self.step
        for i in range(n):
            if not self.down[i] and not world.is_up(i, self._time(i), step):
                self.down[i] = True
                self.counts["failures"] += 1
                self._event("fail", i)
        self._rejoin()
        waited = 0.0
        while sum(not d for d in self.down) < world.min_nodes:
            waited += self._wait_for_quorum()
            self._rejoin()
        if waited:
            self.counts["quorum_wait_s"] += waited
        active = [not d for d in self.down]
        if any(self.late):
            self._sit_out_late(active)
        # Recovery when a node computes again: a late node heals once it has caught up, from
        # the state the others hold then.
        pending = [i for i in self.strategy.pending_recovery if active[i]]
        if pending:
            self._recover(pending)
        self.strategy.pending_recovery = [i for i in self.strategy.pending_recovery
                                          if not active[i]]
        return None if all(active) else active

    def _sit_out_late(self, active: list[bool]) -> None:
        """Nodes a deadline cut are still busy with the round they were cut from: each sits out
        (``active[i] = False``) while its clock is ahead of the most advanced of the other up
        nodes (the time at which they start this step), and computes again from the step at
        which they have caught up with it. Without this, a node too slow for the deadline
        would still take every step of the lockstep loop and the run would wait for it."""
        n = self.settings.num_nodes
        now = max((self._time(j) for j in range(n) if active[j] and not self.late[j]),
                  default=None)
        for i in range(n):
            if not (self.late[i] and active[i]):
                continue
            if now is None or self._time(i) <= now * (1 + 1e-12):
                self.late[i] = False
            else:
                active[i] = False
                self.counts["late_steps"] += 1

    def _rejoin(self) -> None:
        """Down nodes whose time to come back has come (the run's "now": the clock of its most
        advanced node that is up) rejoin, and will recover."""
        n = self.settings.num_nodes
        ups = [self._time(j) for j in range(n) if not self.down[j]]
        now = max(ups) if ups else min(
            (b for i in range(n) if self.down[i]
             and (b := self.world.next_up(i, self._time(i), self.step)) is not None),
            default=math.inf)
        for i in range(n):
            if not self.down[i]:
                continue
            back = self.world.next_up(i, self._time(i), self.step)
            if back is None or back > now:
                continue
            if self.clock is not None:
                up = [not d for d in self.down]
                if back <= self._time(i):
                    # back at a step (no time of its own passed): it returns "now", when the
                    # most advanced node that is up is
                    back = max([back] + [self.clock.t[j] for j in range(
                        self.settings.num_nodes) if up[j]])
                    if self._ops is not None:
                        self._ops.append(["n", i, _bits(up)])
                elif self._ops is not None:
                    self._ops.append(["d", i, back])
                self.clock.down(i, back)
            self.down[i] = False
            self.counts["rejoins"] += 1
            self._event("rejoin", i)
            self.strategy.request_recovery([i])

    def _wait_for_quorum(self) -> float:
        """Fewer than ``min_nodes`` nodes are up: the run waits until the next one returns (its
        up nodes idle); the seconds waited. Raises RuntimeError if none ever does, or not
        within ``max_wait``."""
        world, n = self.world, self.settings.num_nodes
        returns = [world.next_up(i, self._time(i), self.step) for i in range(n) if self.down[i]]
        times = [t for t in returns if t is not None]
        up = [i for i in range(n) if not self.down[i]]
        now = max((self._time(i) for i in up), default=0.0)
        if not times or self.clock is None:
            raise RuntimeError(
                f"the quorum min_nodes={world.min_nodes} cannot be met at step {self.step}: "
                f"{len(up)} node(s) up and no down node comes back by itself (a step-based "
                "failure holds until its step, which the run cannot reach without a quorum)")
        until = min(times)
        if until - now > world.max_wait_s:
            raise RuntimeError(
                f"the quorum min_nodes={world.min_nodes} is not met within max_wait="
                f"{world.max_wait_s:g} s at step {self.step}: the next node returns "
                f"{until - now:.0f} s later")
        for i in up:
            self.clock.wait(i, until)
            if self._ops is not None:
                self._ops.append(["w", i, until])
        self._event("quorum_wait", up[0] if up else 0, until_s=until)
        return max(until - now, 0.0)

    def _recover(self, nodes: list[int]) -> None:
        """Live recovery of ``nodes`` from a live peer each (the lowest-numbered node that is
        up and in sync), point to point, charged on the clock. When every node that is up is
        coming back (all were down at once), none is in sync: the one that failed last holds
        the newest state, goes on from its own (event ``resume_own``), and the others recover
        from it."""
        n = self.settings.num_nodes
        synced = [j for j in range(n) if not self.down[j] and j not in nodes]
        if not synced and n > 1:
            newest = max(nodes, key=lambda j: (self._last_failure(j), -j))
            self._event("resume_own", newest)
            synced, nodes = [newest], [j for j in nodes if j != newest]
        for node in nodes:
            if not synced:
                continue
            donor = synced[0]
            received = self.comm.bytes_received[node]
            start = self._time(node)
            self.strategy.recover(node, donor)
            self._feed()
            got = self.comm.bytes_received[node] - received
            took = self._time(node) - start
            self.counts["recoveries"] += 1
            self.counts["recovery_bytes"] += got
            self.counts["recovery_time_s"] += took
            self._event("recovery", node, donor=donor, bytes=got, duration_s=took)

    def _last_failure(self, node: int) -> int:
        """The step of ``node``'s last failure (-1: none)."""
        return max((e["step"] for e in self.events if e["node"] == node
                    and e["event"] == "fail"), default=-1)

    def arrivals(self, active: list[bool] | None, deadline: str | None) -> list[bool] | None:
        """The :class:`~exogym.sim.comm.Timeline` the strategies ask at a synchronisation: the
        ``active`` nodes (None: all) minus those whose message is lost (the world's ``drop``,
        one draw per synchronisation) and those the ``deadline`` cuts (by the clock)."""
        n = self.settings.num_nodes
        heard = list(active) if active is not None else [True] * n
        lost = self.world.lost(self._syncs, n)
        self._syncs += 1
        for i in range(n):
            if heard[i] and lost[i]:
                heard[i] = False
                self.counts["messages_lost"] += 1
                self._event("lost", i)
        if deadline is not None:
            if self.clock is None:
                raise ValueError(f"deadline={deadline!r} needs a simulated network (a clock to "
                                 "tell who is late): give the run a network")
            kept = self.clock.arrivals(heard, deadline)
            for i in range(n):
                if heard[i] and not kept[i]:
                    self.counts["stragglers_cut"] += 1
                    self.late[i] = True
                    self._event("late", i, deadline=deadline)
            heard = kept
        return None if all(heard) else heard

    def _feed(self) -> None:
        """Give the clock the collectives logged since the last call (measured compute: at
        catch-up only, after the compute of their steps)."""
        if self.clock is None or self._timing:
            return
        log = self.comm.log
        for k in range(self._fed, len(log)):
            self.clock.collective(log[k])
            if self._ops is not None:
                self._ops.append(["r", k])
        self._fed = len(log)

    def _emit(self, row: dict[str, Any]) -> None:
        """Record a metrics row; a non-finite eval loss then stops the run (unless allowed)."""
        self.history.append(row)
        if self.writer is not None:
            self.writer.write(row)
        self.sink.log(row)
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
        self.nonfinite = {"step": first + 1,
                          "nodes": sorted(i for i, s in bad.items() if s == first)}
        message = (f"non-finite training loss at step {first + 1} on node(s) "
                   f"{', '.join(map(str, self.nonfinite['nodes']))} of "
                   f"{self.settings.num_nodes} (strategy {self.strategy.id}): the run diverged")
        if not self.settings.allow_nonfinite:
            self.history.append(row)
            if self.writer is not None:
                self.writer.write(row)
            self.sink.log(row)
            raise NonFiniteLossError(
                f"{message}; metrics so far are written. Lower the learning rate(s), clip "
                "gradients (--set max_grad_norm=1), or pass allow_nonfinite=True "
                "(--allow-nonfinite) to train on regardless")
        if self.lead:
            warnings.warn(f"{message}; training on (allow_nonfinite=True)", RuntimeWarning,
                          stacklevel=4)

    def _config(self, run_info: dict[str, Any], checkpointing: dict[str, Any]) -> dict[str, Any]:
        """The ``config.json`` content: the run's settings, resolved."""
        s, strategy = self.settings, self.strategy
        config = {
            "strategy": strategy.id,
            "strategy_class": source_of(type(strategy)),
            "hyperparameters": strategy.hyperparameters(),
            "num_nodes": s.num_nodes, "steps": s.total_steps, "batch_size_per_node": s.batch_size,
            "steps_per_epoch": self.batches.steps_per_epoch, "eval_interval": s.eval_interval,
            "eval_samples": s.eval_samples, "eval_at_start": s.eval_at_start,
            "eval_batch_size": s.eval_batch_size, "log_interval": s.log_interval,
            "partition": s.partition.spec, "partition_stats": self.batches.partition_stats(),
            "engine": self.nodes.engine, "device": str(self.device), "seed": s.seed,
            "micro_batch_size": s.micro_batch_size, "precision": s.precision,
            "processes": 1 if self.ranks is None else self.ranks.world_size,
            "parameters": self.nodes.num_parameters(),
            "eval_set": getattr(self.eval_full, "test_set", None),
            "network": s.network.spec() if s.network is not None else None,
            "step_time_s": s.step_time_s, "compute_source": s.compute_source,
            "allow_nonfinite": s.allow_nonfinite, "allow_unsynced": s.allow_unsynced,
            "checkpointing": checkpointing, "world": s.world.spec(),
        }
        assert set(config) == set(RUN_CONFIG_KEYS)
        clash = sorted(set(run_info) & set(config))
        if clash:
            raise ValueError(f"run_info may not replace the run's own config keys {clash}")
        config.update(run_info)
        return config


# -- helpers ---------------------------------------------------------------------------------------
def _bits(flags: list[bool] | None) -> int:
    """Booleans as a bit mask (bit ``i``: ``flags[i]``); None (all) as -1."""
    return -1 if flags is None else sum(1 << i for i, f in enumerate(flags) if f)



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


def _processes_here(ranks: RankContext) -> int:
    """This run's processes on this host: torchrun's ``LOCAL_WORLD_SIZE``, else every rank
    (exogym's own launcher starts them all here)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", ranks.world_size))


def _from_lead(value: Any, ranks: RankContext | None) -> Any:
    """Rank 0's ``value`` on every rank (a broadcast); as is in one process."""
    if ranks is None or ranks.world_size == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


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


def _describe_eval_set(dataset: Dataset | None) -> str | None:
    """What an evaluation set is: its ``test_set`` attribute, else its size."""
    if dataset is None:
        return None
    name = getattr(dataset, "test_set", None)
    return name if name is not None else f"{len(dataset):,} samples"  # type: ignore[arg-type]


def _to(batch: Any, dev: torch.device) -> Any:
    return tree_map(lambda t: t.to(dev) if isinstance(t, Tensor) else t, batch)


@torch.no_grad()
def _evaluate(module: nn.Module, state: dict[str, Tensor], dataset: Dataset, batch_size: int,
              dev: torch.device) -> dict[str, float]:
    """Sample-weighted means of the model's scalar metrics over ``dataset``, ``eval_*``."""
    sums: dict[str, Tensor] = {}
    count = 0
    for batch, size in iterate_batches(dataset, batch_size):
        batch = _to(batch, dev)
        metrics = metrics_of(functional_call(module, state, (batch,)))
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0) + v.detach().float().reshape(()) * size
        count += size
    out = {f"eval_{k}": float(v) / count for k, v in sums.items()}
    if "eval_perplexity" in out:
        # Perplexity does not average over batches: it is exp of the mean loss.
        out["eval_perplexity"] = math.exp(out["eval_loss"])
    return out


@torch.no_grad()
def _load_state(module: nn.Module, state: dict[str, Tensor]) -> None:
    for name, value in state.items():
        try:
            target = module.get_parameter(name)
        except AttributeError:
            target = module.get_buffer(name)
        target.copy_(value)
