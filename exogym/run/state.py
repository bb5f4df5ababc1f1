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

The run is four parts, each in its own room (shared/DESIGN.md section 9), that :class:`Run`
drives and whose state it holds: who computes next (:mod:`exogym.run.schedule`: lockstep or
per-node timelines), who is up, late, cut or recovering (:mod:`exogym.sim.presence`), what it
costs (:mod:`exogym.run.clocking` feeding :mod:`exogym.sim.clock`), and what is recorded
(:mod:`exogym.run.record`).

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
from torch.func import functional_call
from torch.utils._pytree import tree_map
from torch.utils.data import Dataset

from exogym.run.checkpoint import Parts, read_part
from exogym.run.client_store import ClientStore, parse_client_store
from exogym.run.clocking import ClockFeed, not_recostable
from exogym.run.dist import (
    DistributedCommunicator,
    RankContext,
    gather_global_state,
    local_batch,
)
from exogym.run.events import Timelines
from exogym.run.paging import Paged
from exogym.run.population import Population
from exogym.run.record import Recorder
from exogym.run.result import FitResult, NonFiniteLossError
from exogym.run.schedule import Lockstep, PerNodeTimelines, Rounds, Scheduler
from exogym.run.sinks import MultiSink
from exogym.run.trace import picture_due
from exogym.sim.client_data import ClientBatches
from exogym.sim.clock import ClockReport, ClockTrace, SimClock
from exogym.sim.comm import Communicator, InProcessCommunicator
from exogym.sim.engine import EngineName, NodeStack, Precision, auto_engine, metrics_of
from exogym.sim.network import Network
from exogym.sim.participation import Participation
from exogym.sim.partition import Partition
from exogym.sim.presence import Presence
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
    "world", "participation", "paging", "population",
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
    participation: Participation | None = None
    trace: bool = False
    resident: int | None = None  # nodes in memory at once (exogym.run.paging); None: all
    offload: str = "host"
    seats: bool = False  # only the round's participants in memory (exogym.run.population)
    client_store: str = "512MB"  # where clients that keep state keep it (seats)


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
        self.batches: NodeBatches | ClientBatches = batches if batches is not None else (
            ClientBatches if s.seats else NodeBatches)(
            train_data, s.num_nodes, s.batch_size, seed=s.seed, partition=s.partition)
        self.paged: Paged | None = None
        self.population: Population | None = None
        # A paged run's round computed ahead: per step (losses, (lr, epoch), price); the global
        # model until its synchronisation; the step's (lr, epoch) for its row.
        self._ahead: dict[int, tuple[Tensor, tuple[float, int], float | None]] = {}
        self._view: tuple[float, int] = (0.0, 0)
        self.nodes, self.comm = self._build_nodes(model)
        if self.paged is None:
            strategy.setup(self.nodes, self.comm, s.total_steps)
        self.eval_full = self.eval_set = val_data
        if val_data is not None and s.eval_samples is not None and s.eval_samples < len(
                val_data):  # type: ignore[arg-type]
            self.eval_set = FixedSubset(val_data, s.eval_samples)
        self.eval_module = copy.deepcopy(model).to(device).eval()
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
        rows = self.comm.num_nodes  # N, or a population's K seats
        # a population's seats take their clients' speeds and availability each round
        world = PERFECT if self.population is not None else s.world
        self.feed = ClockFeed(s.network, world, rows, s.step_time_s, s.compute_source,
                              strategy.overlap_steps, comm=self.comm, ranks=ranks,
                              device=device, record_ops=worldly, trace=s.trace,
                              spans=self.lead and out_dir is not None and (s.trace or picture_due(
                                  s.world, s.network, rows, self.timelines is not None)))
        self.presence = Presence(world, rows, self.record.event, self.feed.ops)
        if worldly:
            self.comm.timeline = self
        self._log_now = False

    def _build_nodes(self, model: nn.Module) -> tuple[NodeStack, Communicator]:
        """The node-stacked replicas this process computes and their communicator."""
        s, ranks = self.settings, self.ranks
        n_here = s.num_nodes if ranks is None else ranks.nodes_per_process
        if s.seats:
            return self._build_seats(model)
        if s.resident is not None and ranks is None:
            hub = InProcessCommunicator(s.num_nodes)
            engine = s.engine
            if engine == "auto":  # vmap (auto's choice on CUDA) batches what it holds: loop
                engine = auto_engine(self.device, s.num_nodes)
                engine = "loop" if engine == "vmap" else engine
            self.paged = Paged(model, self.strategy, hub, resident=s.resident,
                               offload=s.offload, device=self.device, engine=engine,
                               micro_batch_size=s.micro_batch_size, precision=s.precision,
                               total_steps=s.total_steps)
            return self.paged.groups[0].nodes, hub
        nodes = NodeStack(model, n_here, device=self.device, engine=s.engine,
                          micro_batch_size=s.micro_batch_size, precision=s.precision)
        if ranks is None:
            return nodes, InProcessCommunicator(s.num_nodes)
        return nodes, DistributedCommunicator(s.num_nodes, ranks.node_ids)

    def _build_seats(self, model: nn.Module) -> tuple[NodeStack, Communicator]:
        """A population's ``K`` seats (:mod:`exogym.run.population`) and their communicator."""
        s = self.settings
        assert s.participation is not None and isinstance(self.batches, ClientBatches)
        k = s.participation.per_round(s.num_nodes)
        ranks = self.ranks  # a process's share of the seats (the trainer sized it)
        nodes = NodeStack(model, k if ranks is None else ranks.nodes_per_process,
                          device=self.device, engine=s.engine,
                          micro_batch_size=s.micro_batch_size, precision=s.precision)
        comm = (InProcessCommunicator(k) if ranks is None
                else DistributedCommunicator(k, ranks.node_ids))
        comm.seats = True
        store = None
        if s.participation.client_state == "keep":
            memory, folder = parse_client_store(s.client_store)
            if folder is None and self.out_dir is not None:
                folder = self.out_dir / "client-store"
            if folder is not None and ranks is not None and ranks.world_size > 1:
                folder = folder / f"rank-{ranks.rank}"  # each process stores its seats'
            store = ClientStore(memory, folder)
        self.population = Population(
            s.num_nodes, s.participation, self.strategy.sync_period or 1, self.batches,
            store=store, availability=s.world.availability,
            speeds=s.world.client_speeds(s.num_nodes),
            asynchronous=getattr(self.strategy, "asynchronous", False))
        comm.on_record = self.population.on_record
        return nodes, comm

    def _scheduler(self) -> Scheduler:
        """Per-node timelines for an asynchronous strategy (checked here), else lockstep."""
        s = self.settings
        asynchronous = getattr(self.strategy, "asynchronous", False)
        if s.participation is not None and not asynchronous:
            _check_participation(self.strategy, s)
        if self.population is not None and not asynchronous:
            return Rounds(self.population.period)
        if not asynchronous:
            return Lockstep(not s.world.perfect or getattr(self.strategy, "deadline", None)
                            is not None, s.participation, self.strategy.sync_period or 1)
        PerNodeTimelines.check(self.strategy.id, s, self.ranks, self.population is not None)
        assert s.network is not None
        if self.population is not None:  # the seats' clients give their speeds when seated
            return PerNodeTimelines(self.comm.num_nodes)
        self.strategy.set_speeds(  # type: ignore[attr-defined]
            speeds_of(s.world, s.network.node_speeds(s.num_nodes)))
        return PerNodeTimelines(s.num_nodes)

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
        row: dict[str, Any] = {"step": 0, "epoch": 0, "samples": 0,
                               **self._most_bytes(),
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

    def compute(self, step: int, active: list[bool] | None) -> None:
        """The ``active`` nodes (None: all) compute one step; the strategy updates and
        communicates; the clock advances their time (the schedulers' call)."""
        s, nodes = self.settings, self.nodes
        if self.paged is not None:
            self.comm.active = active
            losses = self._paged_step(step, active)
        else:
            marks = self.feed.begin_step()
            self.comm.active = active
            local = None if active is None else [active[i] for i in self.comm.node_ids]
            batch = nodes.to_batch_device(self._next_batch(active))
            losses = nodes.forward_backward(batch, local)
            self.feed.computed(step, active)
            self.strategy.step(step)
            nodes.zero_grad()
            self.feed.end_step(marks, self.comm.n_local)
        # the computing nodes' losses only (others' rows are 0): a run holding the round's
        # clients in seats sums the very same values in the same order
        self.loss_sum += (losses if active is None else
                          losses[self.comm.local_rows(active, losses.device)]).sum()
        self.loss_count += 1
        computed = self.comm.num_nodes if active is None else sum(active)
        self.loss_nodes += computed
        self.node_steps += computed
        if not s.allow_nonfinite or self.nonfinite is None:
            self.first_bad.masked_fill_((self.first_bad < 0) & ~torch.isfinite(losses), step)

    def _paged_step(self, step: int, active: list[bool] | None) -> Tensor:
        """A paged run's step (:mod:`exogym.run.paging`): computed now, with the steps up to
        the next synchronisation when the strategy says none of them communicates and no world
        can change who computes (each group then computes the round while it is in memory), or
        computed earlier with its round (its losses, learning rate, epoch and price kept until
        the run reaches it; the round's collectives are counted at its last step)."""
        paged = self.paged
        assert paged is not None
        if step in self._ahead:
            losses, self._view, price = self._ahead.pop(step)
            self.feed.computed(step, active)
            self.feed.priced(price)
            if not self._ahead:
                paged.flush()
            return losses
        # a world (or a deadline) may change who computes at any step; partial participation
        # only at a round's first step, where a round computed ahead starts anyway
        s = self.settings
        worldly = not s.world.perfect or getattr(self.strategy, "deadline", None) is not None
        n = 1 if worldly else min(paged.round_length(step, s.total_steps),
                                  self._steps_to_evaluation(step))
        marks, cpu = self.feed.begin_step(), paged.store.cpu_seconds
        ids, epochs = [], []
        for _ in range(n):
            ids.append(self.batches.next_indices(active))
            epochs.append(self.batches.epoch)
        # the clock learns of the step's compute before its collectives ask who arrives (a
        # deadline reads the clock), as in memory
        self.feed.computed(step, active)
        out = paged.compute(list(range(step, step + n)),
                            lambda k, lo, hi: self.batches.rows(ids[k], lo, hi), active)
        price = self.feed.end_step(marks, self.comm.n_local, steps=n,
                                   exclude_cpu_s=paged.store.cpu_seconds - cpu)
        for k in range(1, n):
            self._ahead[step + k] = (out[k][0], (out[k][1], epochs[k]), price)
        self._view = (out[0][1], epochs[0])
        return out[0][0]

    def start_round(self, step: int) -> None:
        """A population's round starts at ``step``: its clients are drawn and seated, and those
        not in the previous round receive the global model (:meth:`Population.start_round`)."""
        assert self.population is not None
        self.comm.step = step
        self.presence.step = step
        self.population.start_round(step, self.strategy, self.nodes, self.comm, self.clock,
                                    self._joined, self.feed.feed)

    def fill_seats(self) -> None:
        """An asynchronous server's first clients take its seats (its concurrency)."""
        assert self.population is not None
        self.comm.step = self.step
        self.population.fill(self.strategy, self.nodes, self.clock, self.comm.node_ids)
        self._seat_speeds()

    def next_client(self, seat: int) -> None:
        """An asynchronous server received ``seat``'s update: the seat's next client."""
        assert self.population is not None
        self.population.replace(seat, self.strategy, self.nodes, self.clock, self.comm.node_ids)
        self._seat_speeds()

    def _seat_speeds(self) -> None:
        """An asynchronous strategy's view of its seats' speeds (DyLU sizes rounds by them)."""
        pop = self.population
        assert pop is not None
        if pop.speeds is not None:
            self.strategy.set_speeds(  # type: ignore[attr-defined]
                [float(pop.speeds[c]) for c in pop.seated_rows()])

    def _joined(self, seat: int, client: int, donor: int, received: float,
                seconds: float) -> None:
        """A client joined its round (the global model received from ``donor``): an event, in
        the form a run with every client in memory writes (client ids, not seats)."""
        counts = self.presence.counts
        counts["recoveries"] += 1
        counts["recovery_bytes"] += received
        counts["recovery_time_s"] += seconds
        self.record.event({"step": self.step, "time_s": self._time(seat), "node": client,
                           "event": "recovery", "donor": donor, "bytes": received,
                           "duration_s": seconds})

    def _most_bytes(self) -> dict[str, float]:
        """The bytes sent and received by the busiest node (client) so far."""
        if self.population is not None:
            sent, received = self.population.totals()
            return {"bytes_sent": float(sent.max()), "bytes_received": float(received.max())}
        return {"bytes_sent": max(self.comm.bytes_sent),
                "bytes_received": max(self.comm.bytes_received)}

    @property
    def between_rounds(self) -> bool:
        """Whether the run's state is that of its step (a paged run mid-round has computed
        ahead: no checkpoint can be taken there)."""
        return not self._ahead

    def log(self) -> None:
        """The metrics row of the step just taken, with an evaluation when one is due. A
        non-finite loss stops the run here (unless allowed), the row written first."""
        s = self.settings
        if self.ranks is not None:  # every node's losses: the mean over all N nodes
            dist.all_reduce(self.loss_sum)
        lr, epoch = (self.strategy.lr, self.batches.epoch) if self.paged is None else self._view
        row: dict[str, Any] = {
            "step": self.step,
            "epoch": epoch,
            "train_loss": float(self.loss_sum) / max(self.loss_nodes, 1),
            "lr": lr,
            "samples": self.node_steps * s.batch_size,
            **self._most_bytes(),
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
        final = self._final_evaluation()
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
        _load_state(model, self.global_state())
        self.record.save_model(model.state_dict())
        result = self._result(model, final, report, trace)
        self.close(result.to_dict())
        return result

    def _final_evaluation(self) -> dict[str, float]:
        """The last evaluation again, on the whole evaluation set."""
        s = self.settings
        final: dict[str, float] = {}
        if self.eval_set is not None and self.history:
            final = {k: v for k, v in self.history[-1].items() if k.startswith("eval_")}
            if self.eval_set is not self.eval_full:
                assert self.eval_full is not None
                final = self.evaluate(self.eval_full)
                if not s.allow_nonfinite and not math.isfinite(final.get("eval_loss", 0.0)):
                    raise NonFiniteLossError(
                        f"the global model's eval loss on the whole evaluation set is "
                        f"{final['eval_loss']} at the end (strategy {self.strategy.id})")
        return final

    def _result(self, model: nn.Module, final: dict[str, float], report: ClockReport | None,
                trace: ClockTrace | None) -> FitResult:
        s, tl = self.settings, self.timelines
        pop = self.population
        sent, received = ((list(self.comm.bytes_sent), list(self.comm.bytes_received))
                          if pop is None else (pop.sent.tolist(), pop.received.tolist()))
        return FitResult(
            model=model, history=self.history, final=final, strategy=self.strategy.id,
            hyperparameters=self.strategy.hyperparameters(), num_nodes=s.num_nodes,
            steps=s.total_steps, batch_size=s.batch_size,
            samples=self.node_steps * s.batch_size,
            train_time_s=self.train_time_s, wall_time_s=time.perf_counter() - self.wall_start,
            bytes_sent=sent, bytes_received=received,
            engine=self.nodes.engine, device=str(self.device), seed=s.seed,
            out_dir=self.out_dir, comm_log=list(self.comm.log),
            eval_set=_describe_eval_set(self.eval_full),
            eval_during_training=(_describe_eval_set(self.eval_set)
                                  if self.eval_set is not self.eval_full else None),
            network=s.network, clock=report, trace=trace,
            processes=1 if self.ranks is None else self.ranks.world_size,
            nonfinite=self.nonfinite, resumed_from=self.resumed_from,
            paging=None if self.paged is None else self.paged.report(),
            world=(None if self.feed.ops is None and pop is None else
                   {"spec": s.world.spec(), "description": s.world.describe(),
                    **self.presence.counts, "events": len(self.events)}),
            population=None if pop is None else pop.report(),
            rounds=None if pop is None else pop.rounds,
            draw_seats=None if pop is None else pop.draw_seats,
            events=list(self.events),
            asynchronous=(None if tl is None else
                          {**tl.summary(self.strategy.staleness),  # type: ignore[attr-defined]
                           "server_bytes_received": self.comm.server_bytes_received,
                           "server_bytes_sent": self.comm.server_bytes_sent}),
        )

    def close(self, summary: dict[str, Any] | None) -> None:
        """Close the metrics file (writing ``summary.json`` if given), the sinks (``None``: the
        run did not finish) and the progress bar. Safe to call twice."""
        self.record.close(summary)
        if self.paged is not None:
            self.paged.close()
        if self.population is not None and self.population.store is not None:
            self.population.store.close()

    # -- evaluation ----------------------------------------------------------------------------
    def global_state(self) -> dict[str, Tensor]:
        """The model to evaluate; across processes a collective (every rank calls it)."""
        if self.paged is not None:
            # evaluations end a round (_steps_to_evaluation), the run ends between rounds
            assert not self._ahead, "a paged run's global model read inside a round"
            return self.paged.global_state()
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
        if self.record.writer is not None:
            _load_state(self.eval_module, state)  # a state_dict with tied names too
            self.record.save_model(self.eval_module.state_dict())
        return metrics

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
            **self._nodes_state(),
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
            "population": None if self.population is None else self.population.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any], folder: Path | None = None) -> None:
        """Restore :meth:`state_dict` into a Run built with the same settings (before
        :meth:`open`); tensors are expected on this run's device. ``folder``: the checkpoint's,
        where a paged run's groups are (:meth:`checkpoint_parts`)."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"checkpoint format {state.get('format')!r} is not this exogym's "
                             f"({STATE_FORMAT})")
        if self.paged is not None:
            if folder is None or "groups" not in state:
                raise ValueError("a paged run resumes from a checkpoint folder of a paged run "
                                 "(its groups are files beside the state)")
            self.paged.load_groups(lambda name: read_part(folder, name, self.device),
                                   _load_nodes)
        else:
            _load_nodes(self.nodes, state["nodes"])
            self.strategy.load_state_dict(state["strategy"])
        self.comm.load_state_dict(state["comm"])
        self.batches.load_state_dict(state["data"])
        self.step = int(state["step"])
        self.feed.load_state_dict(dict(state), self.step)
        w = state["world"]
        self.record.events[:] = [dict(e) for e in w["events"]]
        self.presence.load_state_dict(w, self.record.events)
        if w["ops"] is not None:
            assert self.feed.ops is not None
            self.feed.ops[:] = [list(op) for op in w["ops"]]
        self.scheduler.load_state_dict(state["timelines"])
        if self.population is not None:
            self.population.load_state_dict(state["population"])
            self.nodes.row_ids = self.population.seated_rows(self.comm.node_ids)
            self.population.apply_speeds(self.clock)
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

    def _nodes_state(self) -> dict[str, Any]:
        """The replicas and the strategy's state; a paged run's, group by group (copied out
        of each group while it is in memory)."""
        if self.paged is not None:  # the groups are the checkpoint's parts
            return {"groups": {"files": self.paged.group_files()}}
        return {"nodes": _nodes_state(self.nodes), "strategy": self.strategy.state_dict()}

    def checkpoint_parts(self) -> Parts | None:
        """The files a checkpoint holds besides :meth:`state_dict`: a paged run's groups."""
        paged = self.paged
        if paged is None:
            return None
        return lambda folder, write: paged.write_groups(folder, write, _nodes_state)

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

    def _next_batch(self, active: list[bool] | None) -> Any:
        """This process's rows of the next node-stacked batch (``active``: only those nodes
        consume data)."""
        if self.population is not None:
            return self.population.batch(active, self.comm.node_ids)
        if self.ranks is None:
            return self.batches.batch(active)
        return local_batch(self.batches, self.ranks.node_ids, active)

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
                self._restart(staying)
        paged = self.paged
        if rejoined or joining:
            for strategy in self._strategies:
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

            def recover_all(strategy: Strategy) -> None:
                for n, d, j in pairs:
                    _recover(strategy, n, d, part, j)

            if paged is None:
                recover_all(self.strategy)
            else:
                paged.call(lambda g: recover_all(g.strategy))
            self.feed.feed()
            for (node, donor, _), (received, start) in zip(pairs, before, strict=True):
                self.presence.recovered(node, donor, self.comm.bytes_received[node] - received,
                                        self._time(node) - start)
        for strategy in self._strategies:
            strategy.pending_recovery = [i for i in strategy.pending_recovery if not active[i]]
        return None if all(active) else active

    def _restart(self, nodes: list[int]) -> None:
        """``nodes`` (global ids) start their own state afresh (a client that keeps none)."""
        def restart(strategy: Strategy) -> None:
            for node in nodes:
                row = strategy._row(node)
                if row is not None:
                    strategy.restart_row(row)

        if self.paged is None:
            restart(self.strategy)
        else:
            self.paged.call(lambda g: restart(g.strategy))

    @property
    def _strategies(self) -> list[Strategy]:
        """The run's strategy, or every group's copy of it in a paged run."""
        return [self.strategy] if self.paged is None else self.paged.strategies

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
        nodes = [i for i, s in bad.items() if s == first]
        if self.population is not None:
            nodes = [self.population.client_of(i, first) for i in nodes]
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
        "num_nodes": s.num_nodes, "steps": s.total_steps, "batch_size_per_node": s.batch_size,
        "steps_per_epoch": run.batches.steps_per_epoch, "eval_interval": s.eval_interval,
        "eval_samples": s.eval_samples, "eval_at_start": s.eval_at_start,
        "eval_batch_size": s.eval_batch_size, "log_interval": s.log_interval,
        "partition": s.partition.spec, "partition_stats": run.batches.partition_stats(),
        "engine": run.nodes.engine, "device": str(run.device), "seed": s.seed,
        "micro_batch_size": s.micro_batch_size, "precision": s.precision,
        "processes": 1 if run.ranks is None else run.ranks.world_size,
        "parameters": run.nodes.num_parameters(),
        "eval_set": getattr(run.eval_full, "test_set", None),
        "network": s.network.spec() if s.network is not None else None,
        "step_time_s": s.step_time_s, "compute_source": s.compute_source,
        "allow_nonfinite": s.allow_nonfinite, "allow_unsynced": s.allow_unsynced,
        "checkpointing": checkpointing, "world": s.world.spec(),
        "participation": None if s.participation is None else s.participation.to_dict(),
        "paging": None if run.paged is None else {"resident": s.resident,
                                                   "offload": s.offload},
        "population": None if s.participation is None else {
            "clients_in_memory": "round" if s.seats else "all",
            **({"concurrency": s.participation.count}
               if getattr(strategy, "asynchronous", False) else {}),
            **({"client_store": s.client_store} if s.seats
               and s.participation.client_state == "keep" else {})},
    }
    assert set(config) == set(RUN_CONFIG_KEYS)
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


def _check_participation(strategy: Strategy, s: RunSettings) -> None:
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
def _client_recovery(strategy: Strategy, participation: Participation | None,
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


def _nodes_state(nodes: NodeStack) -> dict[str, Any]:
    return {"params": {k: p.detach() for k, p in nodes.params.items()},
            "buffers": dict(nodes.buffers), "engine": nodes.engine}


def _load_nodes(nodes: NodeStack, saved: Mapping[str, Any]) -> None:
    with torch.no_grad():
        for kind in ("params", "buffers"):
            own = getattr(nodes, kind)
            if set(saved[kind]) != set(own):
                raise ValueError(f"the checkpoint's model has other {kind} "
                                 f"({sorted(set(saved[kind]) ^ set(own))}) than this model")
            for k, t in own.items():
                t.copy_(saved[kind][k])
    if saved["engine"] != nodes.engine:  # vmap fell back to the loop
        nodes.engine = saved["engine"]
    nodes._vmap_checked = True


def _recover(strategy: Strategy, node: int, donor: int, participation: Participation | None,
             joining: bool) -> None:
    with _client_recovery(strategy, participation, joining):
        strategy.recover(node, donor)


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
