"""What :meth:`exogym.Trainer.fit` is asked to do: its arguments as one validated object.

:class:`FitOptions` holds every argument of ``fit`` under the same name, documented here, and
checks what it can on its own (types and ranges; what depends on the model, the data or the
strategy is checked when the run is built). ``fit`` keeps them as explicit keyword arguments, so
that editors and ``help()`` show them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from exogym.run.sinks import Sink
from exogym.sim.engine import EngineName, Precision
from exogym.sim.network import Network
from exogym.sim.partition import Partition
from exogym.sim.world import World
from exogym.strategy import Strategy
from exogym.utils.validation import check_int

__all__ = ["FitOptions"]


@dataclass(frozen=True)
class FitOptions:
    """The arguments of :meth:`exogym.Trainer.fit`.

    Attributes:
        strategy: a :class:`Strategy` instance, or a registry id (``"diloco"``).
        num_nodes: N, the simulated nodes.
        max_steps: training steps (each node takes one batch per step); or give
        num_epochs: passes over each node's shard (may be fractional).
        batch_size: per node.
        partition: how a shared training set is split among the nodes
            (:mod:`exogym.sim.partition`): ``"iid"`` (a random 1/N, new each epoch),
            ``"dirichlet:ALPHA"`` (label skew) or ``"contiguous"`` (the i-th block of
            samples; for text, node i's own span). Sizes and label histograms go to
            ``config.json`` (``partition_stats``).
        eval_interval: evaluate the global model every this many steps (and always at the
            end); default: about ten evaluations per run.
        eval_batch_size: batch size of evaluation.
        eval_samples: evaluations during training use a fixed random subset of this many
            samples of the evaluation set (drawn once with seed 0: the same for every run),
            the final one the whole set (``result.final``); None: the whole set every time.
            The rows' ``eval_*`` metrics are on the subset (``result.eval_during_training``
            says which), ``final`` on the whole set (``result.eval_set``).
        eval_at_start: also evaluate the initial model, as a first row at ``step`` 0 (no
            ``train_loss``), where every curve of :mod:`exogym.lab.compare` starts.
        log_interval: write a metrics row every this many steps (and on evaluation steps).
        engine: ``"loop"``, ``"vmap"``, ``"threads"`` or ``"auto"`` (vmap on CUDA;
            threads on a CPU for several nodes and intra-op threads; else the loop).
        micro_batch_size: split each node's batch into micro-batches of this many rows and
            accumulate their gradients (the whole-batch gradient for a per-sample mean loss,
            less activation memory); None: the whole batch at once.
        precision: ``"fp32"``, or ``"bf16"``: forward passes under bfloat16 autocast
            (parameters, gradients, optimizer state and evaluation stay fp32).
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.
        seed: seeds data order and randomness in the model (dropout); same seed, same numbers.
        out_dir: if given, ``metrics.jsonl``, ``config.json``, ``summary.json`` and
            ``model.pt`` (the global model's ``state_dict`` at each evaluation and at the end)
            go there. It must not exist or be an empty folder (checked before any work).
        sinks: more places for the same rows (:mod:`exogym.run.sinks`: ``CSVSink()``,
            ``TensorBoardSink()``, ``WandbSink(project)``); each is started with the config
            and ``out_dir``, gets every row, and is finished with the summary (None if the
            run fails).
        run_info: more entries for ``config.json`` (the CLI records ``{"task": id}``, which
            ``exogym sample`` reads); they may not replace the run's own keys.
        progress: show a progress bar.
        network: the simulated network under the run's clock (:mod:`exogym.sim.network`): a
            profile name (``"datacenter"``, ``"home-100mbps"``, ...), a spec string
            (``"bw=1Gbps,latency=5ms"``) or a :class:`Network`; None: no simulated clock.
        world: the world the nodes train in (:mod:`exogym.sim.world`): per-node speeds,
            failures and rejoins (MTBF/MTTR, explicit events, a trace), lost messages, a
            quorum; a spec string (``"speed=1:1:0.5:0.25,mtbf=30min,mttr=5min,seed=3"``)
            or a :class:`World`; None: a perfect world (every node up at speed 1, nothing
            lost: the numbers of a run without one). Failures by simulated time and a
            strategy's ``deadline`` need a ``network``. What happened goes to
            ``events.jsonl`` and ``result.world``.
        participation: partial participation (:mod:`exogym.sim.participation`): ``K`` (an
            integer) or a fraction ``C`` in (0, 1] of the nodes take part in each round (the
            strategy's ``H`` steps), drawn at random among the nodes that are up, seeded by
            ``seed``; only they compute, send and are charged, and a client selected again
            receives the global model. None: every node every round. FedAvg, FedProx, the
            FedOpt family, DiLoCo, MuLoCo and SPARTA-DiLoCo take it.
        client_state: with ``participation``, whether a client's own state (inner optimizer
            state, residuals) starts ``"fresh"`` each round it takes part in (Flower's
            default: nothing is stored per client) or is kept from its previous round
            (``"keep"``: stored once it has trained, in ``client_store``).
        concurrency: an asynchronous strategy's clients in flight over a population of
            ``num_nodes`` clients (FedBuff's concurrency, :mod:`exogym.run.population`): at
            most ``C`` train at once; when the server receives one's update, the next client is
            drawn among the available ones not in flight (seeded by ``seed``), with its own
            speed (the world's) and data. None: every node is a client that is always there.
        clients_in_memory: with ``participation``, which clients the run holds
            (:mod:`exogym.run.population`): ``"round"``, only the round's ``K`` participants
            (seats filled from the global model each round: time and memory set by ``K``, not
            ``N``); ``"all"``, a row for every client (what a world where participants fail
            during a round needs); ``"auto"`` (default): ``"round"`` where it applies (a world
            of speeds and availability only, one process, no paging), else ``"all"``.
        client_store: where clients that keep state keep it (``client_state="keep"`` with
            ``clients_in_memory="round"``): ``"SIZE"`` of host memory, the rest on disk in the
            run folder's ``client-store`` (a temporary folder without one), or ``"SIZE:DIR"``.
        resident: at most this many nodes' state in memory at once (:mod:`exogym.run.paging`):
            the nodes compute in groups of ``resident``, one group at a time, the others'
            state paged out to ``offload``; the numbers are those of the run with every node
            in memory, bit for bit. None: every node in memory. Synchronous strategies, the
            loop and threads engines, one process.
        offload: where paged-out groups live: ``"host"`` (host memory: on a GPU run, the
            device holds one group), ``"disk"`` (files in a temporary folder) or
            ``"disk:DIR"``. On a CPU only ``"disk"`` lowers the memory a run needs.
        step_time: one node's compute per step, seconds (or ``"1.5s"``); default: measured
            from the run's own training steps (per process in a multi-process run; see
            :mod:`exogym.sim.clock`); or
        flops_per_sample, device_flops: training FLOPs per sample and the device's FLOP/s,
            ``step time = flops_per_sample * batch_size / device_flops``.
        distributed: run as one rank of a multi-process job over ``torch.distributed``:
            the ``N`` nodes are split evenly over the processes (``N / world_size`` stacked
            in each) and collectives cross processes. None (default): yes when
            ``torch.distributed`` is initialised or the process was launched by
            ``torchrun`` (it then joins torchrun's group, and leaves it at the end); False:
            simulate all ``N`` nodes in this process regardless.

        allow_nonfinite: a NaN or infinite training loss (any node) or eval loss stops the run
            with :class:`exogym.run.result.NonFiniteLossError` naming the step, the nodes and
            the strategy, after the metrics so far are written; True trains on regardless (the
            summary records where it first happened).
        allow_unsynced: a run shorter than the strategy's period ``H`` never (fully) updates
            the global model and is an error; True runs it anyway.
        checkpoint_every: write a checkpoint every this many steps, and at the end
            (:mod:`exogym.run.checkpoint`, ``out_dir/checkpoints/step-NNNNNNNN/``); None:
            none (but a Ctrl-C still writes one).
        checkpoint_interval: and/or every this much wall time (seconds, or ``"10min"``).
        keep_checkpoints: how many complete checkpoints are kept (the oldest are deleted).
        async_checkpoint: copy the state to host memory, then write it in a background
            thread while training goes on (one process; multi-process runs write
            synchronously).
        resume: a run folder to continue from its newest usable checkpoint: every setting
            comes from the checkpoint (the strategy too, if none is given); arguments given
            here must agree with it, except ``max_steps``, which may extend the run. The
            continued run is bit-identical to one that never stopped (every metrics row,
            bytes, collectives, the simulated clock, the final model; wall-clock times
            aside).
        handle_signals: in the main thread, SIGINT (Ctrl-C) and SIGTERM end the run cleanly
            at the next step (in a multi-process run: the next logged step): a checkpoint
            when there is an ``out_dir``, metrics flushed, then
            :class:`exogym.run.state.RunInterrupted` says how to resume; a second signal
            aborts at once.
        trace: write the run's timeline as a Chrome trace, ``out_dir/trace.json`` (open it in
            https://ui.perfetto.dev or chrome://tracing; :mod:`exogym.run.trace`): every
            node's compute, collectives, straggler waits, down time and recoveries on the
            simulated clock, and the world's events. Needs ``out_dir`` and a ``network``. A
            real multi-process run also writes ``trace_real.json``, its ranks on the wall
            clock. ``timeline.png`` (its picture) is drawn beside every run with a world,
            nodes that differ or an asynchronous strategy, and with ``trace``.

    The simulated clock (:mod:`exogym.sim.clock`) never changes a training number: every row
    gains ``sim_time_s``, the result its :class:`exogym.sim.clock.ClockReport`.

    ``exogym.Trainer`` (:class:`exogym.compat.exo_gym.trainer.Trainer`, a subclass) also
    takes EXO Gym's strategies and its form of this call (its arguments, the model returned).

    In a multi-process run every rank returns the same :class:`FitResult`; rank 0 alone
    shows progress, evaluates the global model (once per evaluation step, the metrics sent
    to the other ranks) and writes ``out_dir``.
    """

    strategy: Strategy | str = "ddp"
    num_nodes: int = 1
    max_steps: int | None = None
    num_epochs: float | None = None
    batch_size: int = 64
    partition: Partition | str = "iid"
    eval_interval: int | None = None
    eval_batch_size: int = 1000
    eval_samples: int | None = 2000
    eval_at_start: bool = False
    log_interval: int = 10
    engine: EngineName = "auto"
    micro_batch_size: int | None = None
    precision: Precision = "fp32"
    device: str | torch.device = "auto"
    seed: int = 0
    out_dir: str | Path | None = None
    progress: bool = True
    network: Network | str | None = "datacenter"
    world: World | str | None = None
    participation: int | float | str | None = None
    client_state: str = "fresh"
    concurrency: int | None = None
    clients_in_memory: str = "auto"
    client_store: str = "512MB"
    resident: int | None = None
    offload: str = "host"
    step_time: float | str | None = None
    flops_per_sample: float | None = None
    device_flops: float | None = None
    distributed: bool | None = None
    sinks: Sequence[Sink] = ()
    run_info: Mapping[str, Any] | None = None
    allow_nonfinite: bool = False
    allow_unsynced: bool = False
    checkpoint_every: int | None = None
    checkpoint_interval: float | str | None = None
    keep_checkpoints: int = 2
    async_checkpoint: bool = True
    resume: str | Path | None = None
    handle_signals: bool = True
    trace: bool = False

    def __post_init__(self) -> None:
        for name in ("allow_nonfinite", "async_checkpoint", "allow_unsynced", "eval_at_start",
                     "handle_signals", "progress", "trace"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.distributed not in (None, True, False):
            raise ValueError(f"distributed must be None, True or False, got "
                             f"{self.distributed!r}")
        if self.checkpoint_every is not None:
            check_int("checkpoint_every (or None)", self.checkpoint_every, 1)
        check_int("keep_checkpoints", self.keep_checkpoints, 1)
        if self.trace and self.out_dir is None and self.resume is None:
            raise ValueError("trace=True writes trace.json into the run folder: give out_dir")
        if self.trace and self.network is None:
            raise ValueError("trace=True: a run's trace is the timeline of its simulated "
                             "clock; give the run a network")

    def given(self, name: str, names: frozenset[str], default: Any) -> Any:
        """The argument ``name`` if the caller gave it (``names``), else ``default``."""
        return getattr(self, name) if name in names else default

