"""Running a strategy on real local processes over ``torch.distributed`` (gloo / nccl).

:func:`launch` spawns ``nprocs`` worker processes on this machine (a free TCP port found
automatically, ``threads`` intra-op threads each so that the processes do not oversubscribe the
cores), initialises one process group with a collective timeout, calls ``fn(ctx, *args)`` in every
process and returns what each rank returned. A worker that raises ends the whole run promptly:
the other workers are terminated and :class:`WorkerError` names the failing rank and carries its
traceback; a worker stuck in a collective whose peer died fails after ``timeout_s``. The first
Ctrl-C (SIGINT) or SIGTERM to the launching process is forwarded to the workers (a training run
stops cleanly at its next logged step, with a checkpoint, and :class:`RunInterrupted` says how to
resume); a second one stops every worker at once and says so.

:func:`fit_worker` is one process's training loop: it mirrors the simulator's per-step calls
(:meth:`exogym.Trainer.fit`: ``comm.step``, ``to_batch_device``, ``forward_backward``,
``strategy.step``, ``zero_grad``) on this process's nodes with a :class:`DistributedCommunicator`,
so that the same seed gives the simulator's numbers (to float round-off in the reductions) and
exactly its byte counts. Dropout masks differ: each process draws from its own global RNG.
"""

from __future__ import annotations

import contextlib
import copy
import faulthandler
import inspect
import multiprocessing.util
import os
import pickle
import signal
import socket
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import Tensor, nn
from torch.utils.data import Dataset

from exogym.run.dist.communicator import DistributedCommunicator, gather_global_state, local_batch
from exogym.run.dist.ranks import RankContext, close_group, init_group, keep_freed_memory
from exogym.run.loop.drive import RunInterrupted, defer_stop_signals
from exogym.run.output.result import FitResult, read_json
from exogym.run.resolve import seats_of
from exogym.run.trainer import Trainer
from exogym.sim.comm import CommRecord
from exogym.sim.engine import EngineName, NodeStack
from exogym.sim.sharding import DatasetFactory, NodeBatches
from exogym.strategy.base import StackedStrategy
from exogym.strategy.server import ServerStrategy
from exogym.utils.signals import Stopped, StopSignals

__all__ = [
    "RankContext", "WorkerError", "WorkerResult", "fit_processes", "fit_worker", "free_port",
    "launch",
]


class WorkerError(RuntimeError):
    """A worker process failed; the message names its rank and holds its traceback."""


@dataclass(frozen=True)
class _Interrupted:
    """What a worker returns when its run stopped cleanly on a signal (and how to resume)."""

    message: str


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(
    rank: int, world_size: int, port: int, nodes_per_process: int, backend: str,
    timeout_s: float, threads: int, out_dir: str, fn: Callable[..., Any], args: tuple[Any, ...],
    show_warning: Callable[..., None] | None = None,
) -> None:
    defer_stop_signals()  # a forwarded Ctrl-C during set-up stops the run at its first step
    if show_warning is not None:  # warnings look as the parent shows them (the command line's)
        warnings.showwarning = show_warning
    (Path(out_dir) / f"rank{rank}.ready").touch()  # launch forwards signals from now on
    faulthandler.enable()  # a worker killed by a signal (SIGABRT, SIGSEGV) prints its stacks
    keep_freed_memory()
    torch.set_num_threads(threads)
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(device)
    init_group(backend, f"tcp://127.0.0.1:{port}", rank, world_size, timeout_s)
    clean = False
    try:
        ctx = RankContext(rank, world_size, nodes_per_process, device)
        try:
            value = fn(ctx, *args)
        except RunInterrupted as err:  # a clean stop on the parent's forwarded signal
            value = _Interrupted(str(err))
        except Exception as err:
            raise WorkerError(f"exogym worker rank {rank} of {world_size} failed: "
                              f"{type(err).__name__}: {err}") from err
        torch.save(value, Path(out_dir) / f"rank{rank}.pt")
        clean = True
    finally:
        close_group(clean=clean)
    # The rank's result is on disk and its group closed: leave without the interpreter's
    # finalization. init_group removed the known cause of a rare SIGABRT there (a group kept
    # alive into shutdown); a worker has nothing left to finalize, so it takes no chance.
    multiprocessing.util._exit_function()  # multiprocessing's own clean-up (its semaphores)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# When a rank raises, its peers fail a moment later on the broken connection; the first failure
# the parent sees may be such a consequence. The peers are given this long to end on their own,
# then every rank's error is read and the cause is preferred over its consequences.
_GRACE_S = 5.0
_CONSEQUENCES = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
                 "Socket Timeout", "gloo/transport")


def _root_cause(context: Any, err: mp.ProcessRaisedException) -> tuple[int, str]:
    """``(rank, message)`` of the failure to report: the first failure seen, unless it is a broken
    connection to a peer and another rank's error is not (then the lowest such rank)."""
    if not any(c in str(err) for c in _CONSEQUENCES):
        return err.error_index, str(err)
    for rank, path in enumerate(context.error_files):
        if rank == err.error_index or path is None or not os.access(path, os.R_OK):
            continue
        try:
            with open(path, "rb") as fh:
                trace = pickle.load(fh)
        except (OSError, EOFError, pickle.UnpicklingError):
            continue
        if not any(c in trace for c in _CONSEQUENCES):
            return rank, f"\n\n-- Process {rank} terminated with the following error:\n{trace}"
    return err.error_index, str(err)


def launch(
    fn: Callable[..., Any], nprocs: int, *args: Any, nodes_per_process: int = 1,
    backend: str = "auto", timeout_s: float = 60.0, threads: int | None = None,
    port: int | None = None,
) -> list[Any]:
    """Run ``fn(ctx: RankContext, *args)`` in ``nprocs`` spawned processes; every rank's result.

    Args:
        fn: a picklable (module-level) function; its return value must be ``torch.save``-able.
        nprocs: processes (ranks) on this machine.
        nodes_per_process: simulated nodes stacked in each process (``N = nprocs * this``).
        backend: ``"gloo"``, ``"nccl"`` or ``"auto"`` (nccl when CUDA is available, else gloo).
        timeout_s: collective timeout (a rank waiting on a dead peer fails after this).
        threads: intra-op threads per process; default ``max(1, cpu_count // nprocs)``.
        port: the TCP port on 127.0.0.1 where the processes meet (the process group's
            rendezvous; EXO Gym's ``start_port``); None: a free port the OS picks.

    Raises:
        WorkerError: a worker raised or died; the message names the rank.
    """
    for name, value in (("nprocs", nprocs), ("nodes_per_process", nodes_per_process)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo', 'nccl' or 'auto', got {backend!r}")
    if backend == "nccl" and nprocs > torch.cuda.device_count():
        raise ValueError(f"nccl needs one GPU per process: nprocs={nprocs}, but "
                         f"{torch.cuda.device_count()} CUDA devices are visible (use "
                         "nodes_per_process to stack several nodes per GPU, or backend='gloo')")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                             or not 1 <= port <= 65535):
        raise ValueError(f"port must be an integer in [1, 65535] or None (a free one), got "
                         f"{port!r}")
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // nprocs)
    with tempfile.TemporaryDirectory(prefix="exogym-launch-") as out_dir:
        try:
            # entered before the spawn: no signal falls between the spawn and the forwarding
            # (the caller's handler would leave the workers running, and its exit wait for them)
            with _WorkerSignals(out_dir) as signals:
                context = _spawn(nprocs, (nprocs, free_port() if port is None else port,
                                          nodes_per_process, backend, timeout_s, threads,
                                          out_dir, fn, args, _picklable_show_warning()))
                signals.processes = context.processes
                try:
                    if signals.first is not None:  # a signal while they were spawned
                        raise Stopped(signals.first)
                    while not context.join(timeout=0.2, grace_period=_GRACE_S):
                        pass
                except Stopped:  # before every worker keeps a signal: none has trained
                    _kill(context.processes)
                    raise
                except KeyboardInterrupt:
                    signals.stop()
                    raise
        except mp.ProcessRaisedException as err:
            rank, message = _root_cause(context, err)
            raise WorkerError(f"exogym worker rank {rank} failed:\n{message}") from None
        except mp.ProcessExitedException as err:
            if signals.first is not None and err.signal_name == "SIGINT":
                # a Ctrl-C at the terminal reached a worker still starting (before _entry, which
                # keeps it for the first step) directly: it died of it before any step, and
                # torch's join stopped the others; the run stopped as asked, at its start
                raise Stopped(signals.first) from None
            raise WorkerError(f"exogym worker rank {err.error_index} died (exit code "
                              f"{err.exit_code}, signal {err.signal_name}):\n{err}") from None
        results = []
        for r in range(nprocs):
            path = Path(out_dir) / f"rank{r}.pt"
            if not path.is_file():  # a worker that stopped on the forwarded signal
                raise KeyboardInterrupt(f"worker rank {r} stopped without a result")
            results.append(torch.load(path, weights_only=False))
        stopped = [r for r in results if isinstance(r, _Interrupted)]
        if stopped:
            raise RunInterrupted(stopped[0].message)
        return results


def _picklable_show_warning() -> Callable[..., None] | None:
    """The parent's ``warnings.showwarning`` if it is one a worker can import (a module-level
    function, as the command line's one-line form is), else None (Python's own)."""
    show = warnings.showwarning
    if getattr(show, "__module__", "warnings") == "warnings" or "<" in getattr(
            show, "__qualname__", "<"):
        return None
    try:
        pickle.dumps(show)
    except Exception:  # a closure, a bound method of an unpicklable object
        return None
    return show



def _spawn(nprocs: int, args: tuple[Any, ...]) -> Any:
    """``mp.start_processes`` of ``_entry(rank, *args)`` for ``nprocs`` ranks, which leaves no
    worker running if it raises: the workers started so far would run on their own, waiting for
    peers that never come, and the parent's exit would wait for them (they are not daemons).
    They are killed (:func:`_kill`). (A signal does not interrupt it: :class:`_WorkerSignals`
    keeps one that arrives while it spawns, so that no child is left half-started.)"""
    before = set(multiprocessing.active_children())
    try:
        return mp.start_processes(_entry, nprocs=nprocs, join=False, start_method="spawn",
                                  args=args)
    except BaseException:
        _kill([p for p in multiprocessing.active_children() if p not in before])
        raise


def _kill(processes: Sequence[Any]) -> None:
    """Kill and join workers that have not trained (a SIGTERM would only be kept for their
    first step by :func:`defer_stop_signals`; there is nothing to stop cleanly)."""
    for p in processes:
        if p.is_alive():
            p.kill()
    for p in processes:
        p.join()


class _Terminated(KeyboardInterrupt):
    """The second signal to the parent: the workers are stopped at once."""


class _WorkerSignals(StopSignals):
    """While the workers run (main thread only): the first SIGINT (Ctrl-C) or SIGTERM to this
    process is forwarded as SIGINT to every worker, so that a worker running
    :meth:`exogym.Trainer.fit` stops cleanly after its next logged step (every rank at the same
    one) and writes a checkpoint; a second signal stops them at once (:meth:`stop`).

    A worker keeps a signal for its first step only once it has run :func:`_entry` (its
    ``rank{r}.ready`` file in ``out_dir``); before, SIGINT would kill it (a traceback, and a
    "died" error for the run). So a first signal before every worker is ready, or while they
    are spawned (:attr:`processes` still None; kept until they all exist: interrupting a spawn
    half-way would leave a child that no one joins), stops the run instead: :func:`launch`
    kills the workers (none has trained) and raises :class:`Stopped`. Later signals then change
    nothing."""

    def __init__(self, out_dir: str) -> None:
        super().__init__()
        self.out_dir = Path(out_dir)
        self.processes: Sequence[Any] | None = None  # None: being spawned
        self.first: signal.Signals | None = None  # the first signal received
        self.forwarded = False

    def __enter__(self) -> _WorkerSignals:
        super().__enter__()
        return self

    def handle(self, sig: signal.Signals) -> None:
        if self.first is not None:
            if self.forwarded:
                raise _Terminated()
            return  # the workers are being killed (or will be, once all are spawned)
        self.first = sig
        if self.processes is None:
            return  # being spawned: launch stops the run once they all exist
        if not all((self.out_dir / f"rank{r}.ready").exists()
                   for r in range(len(self.processes))):
            raise Stopped(sig)  # a worker is starting: none has trained; launch kills them
        self.forwarded = True
        alive = [p for p in self.processes if p.is_alive()]
        print(f"exogym: {sig.name}: asking the {len(alive)} worker process(es) to stop after "
              "their next logged step (again to stop them at once)", file=sys.stderr, flush=True)
        for p in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGINT)

    def stop(self) -> None:
        """Stop every worker now: SIGTERM, then SIGKILL after 10 s; say so on stderr."""
        processes = self.processes or ()
        alive = [p for p in processes if p.is_alive()]
        print(f"exogym: stopping {len(alive)} worker process(es)", file=sys.stderr, flush=True)
        for p in alive:
            p.terminate()
        deadline = time.monotonic() + 10.0
        for p in alive:
            p.join(timeout=max(deadline - time.monotonic(), 0.0))
        for p in alive:
            if p.is_alive():
                p.kill()
                p.join()
        print(f"exogym: all {len(processes)} workers stopped", file=sys.stderr, flush=True)


@dataclass
class WorkerResult:
    """One process's outcome of :func:`fit_worker`.

    Attributes:
        global_state: the global model (:func:`gather_global_state`; the same on every rank).
        node_params: this process's nodes' final parameters, ``[n_local, *shape]``.
        node_ids: their global ids.
        bytes_sent: per global node (every rank holds all ``N`` counters).
        bytes_received: per global node.
        comm_log: every collective, as the simulator logs it.
        train_time_s: wall time of the training steps.
    """

    global_state: dict[str, Tensor]
    node_params: dict[str, Tensor]
    node_ids: list[int]
    bytes_sent: list[float]
    bytes_received: list[float]
    comm_log: list[CommRecord] = field(default_factory=list)
    train_time_s: float = 0.0


def fit_worker(
    ctx: RankContext, model: nn.Module, train_dataset: Dataset | DatasetFactory,
    strategy: StackedStrategy, *, max_steps: int, batch_size: int, seed: int = 0,
    engine: EngineName = "auto",
) -> WorkerResult:
    """Train this process's ``ctx.nodes_per_process`` nodes for ``max_steps`` steps.

    Every process builds the run's :class:`NodeBatches` over all ``N`` nodes with ``seed`` (only
    its own rows are fetched), seeds the global RNG with ``seed`` as the simulator does, and calls
    ``strategy.setup`` with its own :class:`NodeStack` and :class:`DistributedCommunicator`.
    """
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be an integer >= 1, got {max_steps!r}")
    strategy = copy.deepcopy(strategy)  # a fresh instance per run, as a caller's is left alone
    torch.manual_seed(seed)
    batches = NodeBatches(train_dataset, ctx.num_nodes, batch_size, seed=seed)
    nodes = NodeStack(model, ctx.nodes_per_process, device=ctx.device, engine=engine)
    comm = DistributedCommunicator(ctx.num_nodes, ctx.node_ids)
    strategy.setup(nodes, comm, max_steps, seed=seed)
    t0 = time.perf_counter()
    for step in range(max_steps):
        comm.attendance.step = step
        batch = nodes.to_batch_device(local_batch(batches, ctx.node_ids))
        nodes.forward_backward(batch)
        strategy.step(step)
        nodes.zero_grad()
    train_time = time.perf_counter() - t0
    state = gather_global_state(strategy, comm)
    return WorkerResult(
        global_state={k: v.detach().cpu() for k, v in state.items()},
        node_params={k: p.detach().cpu().clone() for k, p in nodes.params.items()},
        node_ids=list(ctx.node_ids), bytes_sent=list(comm.bytes_sent),
        bytes_received=list(comm.bytes_received), comm_log=list(comm.log),
        train_time_s=train_time,
    )


def fit_strategies(
    ctx: RankContext, model: nn.Module, train_dataset: Dataset | DatasetFactory,
    strategies: Sequence[StackedStrategy], max_steps: int, batch_size: int, seed: int,
) -> list[WorkerResult]:
    """:func:`fit_worker` for each strategy in turn, in the same processes (a ``launch`` job)."""
    return [fit_worker(ctx, model, train_dataset, s, max_steps=max_steps, batch_size=batch_size,
                       seed=seed, engine="loop") for s in strategies]


# -- a whole run on local processes (the `--engine process` of `exogym run`) --------------------
def fit_processes(
    model: nn.Module, train_dataset: Dataset | DatasetFactory, val_dataset: Dataset | None, *,
    strategy: StackedStrategy | None, num_nodes: int, nodes_per_process: int = 1,
    backend: str = "auto", timeout_s: float = 300.0, threads: int | None = None,
    port: int | None = None, **fit_args: Any,
) -> FitResult:
    """:meth:`exogym.Trainer.fit` on ``num_nodes / nodes_per_process`` local processes.

    The original EXO Gym's execution model: real processes, real collectives (gloo on CPU, nccl
    with one GPU per process where CUDA is available). Every process runs ``Trainer.fit`` as one
    rank (``distributed`` mode); rank 0 logs, evaluates the global model and writes
    ``metrics.jsonl`` / ``summary.json`` line by line, so a failed run keeps the rows written so
    far. ``strategy`` may be None only with ``resume=RUN_DIR`` (the checkpoint's is used).
    ``fit_args`` are :meth:`~exogym.Trainer.fit`'s other keyword arguments (``max_steps``,
    ``batch_size``, ``out_dir``, ``network``, ...; not ``device``: this function places the
    processes) and are checked against its signature before any process starts. ``port``: the
    processes' rendezvous port on 127.0.0.1 (:func:`launch`; None: a free one). ``strategy`` is
    an exogym strategy (``Trainer.fit`` in each process is exogym's own): EXO Gym's per-node and
    built-in strategies enter as ``exogym.compat.exo_gym.as_stacked(strategy)``.
    """
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes must be an integer >= 1, got {num_nodes!r}")
    if strategy is None and fit_args.get("resume") is None:
        raise ValueError("strategy=None needs resume=RUN_DIR (the checkpoint's strategy)")
    if isinstance(strategy, ServerStrategy):
        raise ValueError(f"{strategy.id} is asynchronous: its parameter server and per-node "
                         "timelines run in one process; allowed: the simulator (engine loop or "
                         "vmap, not --engine process or torchrun)")
    # a population's processes hold the round's seats, not its clients
    rows = (seats_of(strategy, num_nodes, fit_args, train_dataset) if strategy is not None
            else None) or num_nodes
    if rows % nodes_per_process:
        raise ValueError(f"num_nodes (or a population's clients per round) must be a multiple "
                         f"of nodes_per_process={nodes_per_process}, got {rows}")
    allowed = set(inspect.signature(Trainer.fit).parameters) - {
        "self", "strategy", "num_nodes", "device", "distributed"}
    unknown = sorted(set(fit_args) - allowed)
    if unknown:
        raise TypeError(f"fit_processes got unexpected arguments {unknown}; Trainer.fit takes "
                        f"{sorted(allowed)}")
    processes = rows // nodes_per_process
    if fit_args.get("resume") is not None:  # a resumed run has the processes it was written by
        processes = int(read_json(Path(fit_args["resume"]) / "config.json", "resume takes a run "
                                  "folder that exogym wrote").get("processes", processes))
    results = launch(
        _fit_rank, processes, model, train_dataset, val_dataset, strategy,
        {**fit_args, "num_nodes": num_nodes}, nodes_per_process=nodes_per_process,
        backend=backend, timeout_s=timeout_s, threads=threads, port=port)
    return results[0]


def _fit_rank(
    ctx: RankContext, model: nn.Module, train_dataset: Dataset | DatasetFactory,
    val_dataset: Dataset | None, strategy: StackedStrategy | None, fit_args: dict[str, Any],
) -> FitResult | None:
    """One rank of :func:`fit_processes`; rank 0 returns the result, the others None."""
    if strategy is not None:
        fit_args = {**fit_args, "strategy": copy.deepcopy(strategy)}
    fit_args = {"num_nodes": ctx.num_nodes, **fit_args}  # a population's: its clients
    result = Trainer(model, train_dataset, val_dataset).fit(
        device=ctx.device, distributed=True, **fit_args)
    if ctx.rank != 0:
        return None
    result.model = result.model.cpu()
    return result
