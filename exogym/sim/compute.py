"""What one node's training step costs on the simulated clock: the compute model.

``c``, one node's compute per step at speed 1, comes from one of three sources:

- measured (``compute="measured"``): **the time one node's step takes on the share of this
  machine one node is given.** The run's nodes on this host share its cores (``C``: the
  intra-op threads the run uses here, over all its processes on this host, at most the cores the
  process may run on; or ``EXOGYM_CORES``, where the host gives the run less than that: a
  container's CPU quota, ranks that stand for machines of their own on fewer cores); a step of
  ``n`` nodes that spends ``S`` CPU-seconds on training work is priced at ``c = S / n / C``,
  the wall time each node adds to a step when the run keeps its cores busy. A process run's
  transport (the CPU time inside its collectives: gloo's reductions, copies and socket work) is
  not training work: the network's price covers it. On a CPU it is read from CPU time, not wall
  time, so that it does not depend on how exogym runs the nodes: in one process (loop or
  threads engine) or in a process per node (``--engine process``: four processes on two cores
  each take four times as long in wall time, while their CPU time is that of the same work done
  in one process), nor on another program taking turns on the cores (time slicing adds wall
  time, not CPU time). On a GPU it is the synchronised wall time of the step per node.
  :class:`StepMeter` measures a step that way. Not covered: work that slows each instruction (a
  neighbour sharing caches or memory bandwidth, a CPU clocked down) and OpenMP threads that
  spin while they wait for cores (an engine with several intra-op threads per node on an
  oversubscribed machine; exogym's default CPU engines give each node one);
- given: ``step_time`` seconds (``--step-time 1.5s``), for clocks that repeat exactly;
- on a device (the default, ``compute="profile"``: :mod:`exogym.sim.devices`): the step's
  kernels counted once on the model (:mod:`exogym.sim.flops`), each priced on the device's
  roofline.

Where simulated time steers a run from its first step (an asynchronous strategy, a world with
failures, a deadline), the clock cannot wait for the run's own steps: :func:`calibrate_step_time`
then prices ``c`` before the run from real training steps of the run's engine on a copy of the
model (train mode, the run's first batch, its inner optimizer): warm-up steps first, then the
median of several timed steps (the global RNG saved and restored).
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from exogym.sim.engine import EngineName, NodeStack, Precision
from exogym.sim.network import parse_duration

__all__ = [
    "CORES_ENV",
    "CpuMark",
    "OptimizerBuilder",
    "StepMeter",
    "calibrate_step_time",
    "host_cores",
    "measure_step_time",
    "resolve_step_time",
    "work_cpu_mark",
    "work_cpu_since",
]


class OptimizerBuilder(Protocol):
    """What :func:`calibrate_step_time` needs of an optimizer config (``exogym.strategy.optim.
    OptimSpec`` is one): ``build(params)``; its ``repr`` identifies it in the cache."""

    def build(self, params: list[torch.Tensor]) -> torch.optim.Optimizer: ...


def resolve_step_time(step_time: float | str | None = None) -> tuple[float | None, str]:
    """``(seconds per step, source)`` from a given step time (``"given"``); ``(None,
    "measured")`` when none is given (the run then prices it: on its hardware, or measured)."""
    if step_time is None:
        return None, "measured"
    value = parse_duration(step_time) if isinstance(step_time, str) else step_time
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"step_time must be > 0 seconds (or a string like '1.5s'), "
                         f"got {step_time!r}")
    return float(value), "given"


# -- measuring a step ----------------------------------------------------------------------------
#: The environment variable that sets ``C`` (:func:`host_cores`) for the processes it reaches.
CORES_ENV = "EXOGYM_CORES"


def host_cores(threads: int, processes_here: int = 1) -> float:
    """``C``: the cores the run's nodes on this host share: its intra-op ``threads`` per
    process times its ``processes_here`` (processes on this host), at most the cores this
    process may run on; or, where the environment sets ``EXOGYM_CORES``, that number (a
    fraction allowed). Set it where the machine gives the run less than its cores say: a
    container limited by a CPU quota (``docker --cpus 4``: the CPU affinity still shows every
    core of the host), or ranks that stand for machines of their own but share fewer cores
    (four ranks on two cores: ``EXOGYM_CORES=0.5`` in each, as ``bench/clock_fidelity.py``
    sets)."""
    given = os.environ.get(CORES_ENV)
    if given is not None:
        return parse_cores(given)
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        available = os.cpu_count() or 1
    return float(max(1, min(threads * processes_here, available)))


def parse_cores(text: str) -> float:
    """``EXOGYM_CORES``'s value: a number of cores > 0 (``2``, ``0.5``)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{CORES_ENV}={text!r}: the cores the run's processes on this host share "
                         f"must be a number > 0 (e.g. 2, or 0.5 for four ranks on two cores); "
                         f"unset it to count this process's threads and cores")
    return value


def format_cores(cores: float) -> str:
    """``2 cores``, ``1 core``, ``0.5 cores``."""
    return f"{cores:g} core{'s' * (cores != 1)}"


# Threads of the process whose CPU time is training work: the caller's (and the OpenMP threads
# it starts, which Python does not see) and the threads engine's workers (exogym.sim.threads).
_TRAINING_THREADS = "exogym-node-"


def _thread_cpu(thread: threading.Thread) -> float | None:
    """CPU seconds of a Python thread so far; None where the platform cannot say."""
    ident = thread.ident
    if ident is None or not hasattr(time, "pthread_getcpuclockid"):
        return None
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(ident))
    except (OSError, OverflowError):  # ended in the meantime
        return None


# The last CPU reading of helper threads that have ended (thread_done), by thread id: a thread
# that ends between a step's two readings is no longer there to be read at the second.
_ENDED: dict[int, float] = {}


def thread_done() -> None:
    """A helper thread's last call (a checkpoint writer's): its CPU time so far, so that a step
    it ended during does not price the thread's work as the nodes'."""
    _ENDED[threading.get_ident()] = time.thread_time()


def _other_threads_cpu() -> dict[int, float]:
    """CPU seconds so far of the Python threads that are not training work (a checkpoint
    writer, a metrics sink's), by thread id."""
    own = threading.get_ident()
    out: dict[int, float] = {}
    for t in threading.enumerate():
        if t.ident == own or t.name.startswith(_TRAINING_THREADS):
            continue
        cpu = _thread_cpu(t)
        if cpu is not None and t.ident is not None:
            out[t.ident] = cpu
    return out


def _work_cpu_since(cpu: float, others: dict[int, float], *, forget: bool) -> float:
    """CPU seconds this process spent since it read ``cpu`` (``time.process_time``) and
    ``others`` (:func:`_other_threads_cpu`), less what its non-training Python threads spent;
    ``forget``: drop the last readings of threads that ended (the step's final reading)."""
    spent = time.process_time() - cpu
    now = _other_threads_cpu()
    for k, v in others.items():
        end = now[k] if k in now else (_ENDED.pop(k, None) if forget else _ENDED.get(k))
        if end is not None:
            spent -= end - v
    return spent


@dataclass(frozen=True)
class CpuMark:
    """Where :func:`work_cpu_since` counts from."""
    cpu: float
    others: dict[int, float]


def work_cpu_mark() -> CpuMark:
    return CpuMark(time.process_time(), _other_threads_cpu())


def work_cpu_since(mark: CpuMark) -> float:
    """CPU seconds this process spent since ``mark`` on anything but its non-training Python
    threads (a process run's transport: the collective's calling thread and the backend's own
    threads, which :class:`StepMeter` takes out of a step's compute)."""
    return max(_work_cpu_since(mark.cpu, mark.others, forget=False), 0.0)


@dataclass(frozen=True)
class _Mark:
    wall: float
    cpu: float
    others: dict[int, float]


class StepMeter:
    """Prices one training step of ``n`` nodes as ``c`` (the module docstring's definition).

    Args:
        device: where the nodes compute: CPU time on a CPU, wall time elsewhere (the caller
            synchronises a GPU where it reads the time).
        cores: ``C`` (:func:`host_cores`), used on a CPU.
    """

    def __init__(self, device: torch.device, cores: float) -> None:
        if isinstance(cores, bool) or not isinstance(cores, (int, float)) or not (
                math.isfinite(cores) and cores > 0):
            raise ValueError(f"cores must be a number > 0, got {cores!r}")
        self.device = torch.device(device)
        self.cores = float(cores)
        self.cpu = self.device.type == "cpu"

    @property
    def method(self) -> str:
        """How a step is priced, for summary.json and the summary line."""
        if self.cpu:
            given = f", {CORES_ENV}" if os.environ.get(CORES_ENV) is not None else ""
            return (f"CPU time of the step's training work per node / {format_cores(self.cores)} "
                    f"(the run's share of this machine{given})")
        return f"wall time of the step per node on {self.device.type}"

    def start(self) -> _Mark:
        return _Mark(time.perf_counter(), time.process_time() if self.cpu else 0.0,
                     _other_threads_cpu() if self.cpu else {})

    def stop(self, mark: _Mark, nodes: int, exclude_wall_s: float = 0.0, *,
             exclude_cpu_s: float = 0.0) -> float:
        """``c`` of the step since ``mark`` that computed ``nodes`` nodes (``exclude_wall_s``:
        wall time that was not compute, a process run's real transport, taken out on a GPU;
        ``exclude_cpu_s``: CPU time that was not compute, taken out on a CPU: the transport's
        (:func:`work_cpu_since` over each collective: gloo reduces and copies on the calling
        thread and moves bytes on its own, 8 to 12 ms of a 20 ms MNIST step over a shaped
        100 Mbit/s link, which the network's price already covers) and a paged run's copies)."""
        if not self.cpu:
            return max(time.perf_counter() - mark.wall - exclude_wall_s, 0.0) / nodes
        spent = _work_cpu_since(mark.cpu, mark.others, forget=True) - exclude_cpu_s
        return max(spent, 0.0) / nodes / self.cores


# -- pricing before the run ----------------------------------------------------------------------
_CALIBRATED: dict[tuple[Any, ...], float] = {}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _key(model: nn.Module, batch: Any, optim: OptimizerBuilder, device: torch.device,
         *extra: Any) -> tuple[Any, ...]:
    cls = type(model)
    tensors = tuple((k, tuple(v.shape), str(v.dtype)) for k, v in model.state_dict().items())
    leaves, spec = tree_flatten(batch)
    shapes = tuple((tuple(t.shape), str(t.dtype)) if isinstance(t, torch.Tensor) else repr(t)
                   for t in leaves)
    return (cls.__module__, cls.__qualname__, tensors, str(spec), shapes, repr(optim),
            str(device), torch.get_num_threads(), *extra)


def calibrate_step_time(
    model: nn.Module, batch: Any, optim: OptimizerBuilder, device: torch.device | str = "cpu",
    *, nodes: int = 1, engine: EngineName = "loop", cores: float | None = None,
    warmup: int = 4, repeats: int = 10, budget_s: float = 3.0,
    micro_batch_size: int | None = None, precision: Precision = "fp32",
) -> float:
    """``c`` priced from real training steps before a run (see the module docstring).

    Builds ``nodes`` replicas of a deep copy of ``model`` on ``engine`` (the caller's module and
    run are untouched), in train mode, with the inner optimizer ``optim``; ``batch`` is one
    node's batch on ``device``, given to every replica. Runs ``warmup`` steps, then timed steps
    (at least 3, at most ``repeats``, while they fit in ``budget_s`` seconds), each priced by
    :class:`StepMeter` with ``cores`` (default: :func:`host_cores` of this process's threads);
    returns their median, which a burst of load on a few steps does not move. The global RNG
    (CPU and CUDA) is restored afterwards. Cached per model class, tensor shapes, batch shapes,
    optimizer, device, threads, engine, nodes and cores.
    """
    for name, value, least in (("nodes", nodes, 1), ("warmup", warmup, 0),
                               ("repeats", repeats, 3)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    if not budget_s > 0:
        raise ValueError(f"budget_s must be > 0 seconds, got {budget_s!r}")
    device = torch.device(device)
    cores = host_cores(torch.get_num_threads()) if cores is None else cores
    key = _key(model, batch, optim, device, engine, nodes, cores, micro_batch_size, precision)
    if key in _CALIBRATED:
        return _CALIBRATED[key]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        stack = NodeStack(model, nodes, device=device, engine=engine,
                          micro_batch_size=micro_batch_size, precision=precision)
        opt = optim.build(list(stack.params.values()))
        stacked = tree_map(lambda t: t.unsqueeze(0).expand(nodes, *t.shape).contiguous()
                           if isinstance(t, torch.Tensor) else t, batch)
        value = _timed_median(stack, opt, stacked, StepMeter(device, cores), warmup,
                              repeats, budget_s)
    finally:
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    _CALIBRATED[key] = value
    return value


def _timed_median(stack: NodeStack, opt: torch.optim.Optimizer, batch: Any, meter: StepMeter,
                  warmup: int, repeats: int, budget_s: float) -> float:
    def step() -> None:
        stack.forward_backward(batch)
        opt.step()
        stack.zero_grad()

    with stack.stepping():
        for _ in range(warmup):
            step()
        _sync(meter.device)
        prices: list[float] = []
        began = time.perf_counter()
        while len(prices) < 3 or (len(prices) < repeats
                                  and time.perf_counter() - began < budget_s):
            mark = meter.start()
            step()
            _sync(meter.device)
            prices.append(meter.stop(mark, stack.num_nodes))
    return statistics.median(prices)


def measure_step_time(model: nn.Module, batch: Any, optim: OptimizerBuilder,
                      device: torch.device | str = "cpu", *, repeats: int = 10,
                      budget_s: float = 3.0, micro_batch_size: int | None = None,
                      precision: Precision = "fp32") -> float:
    """One node's ``c`` on the loop engine (:func:`calibrate_step_time` with ``nodes=1``)."""
    return calibrate_step_time(model, batch, optim, device, repeats=repeats, budget_s=budget_s,
                               micro_batch_size=micro_batch_size, precision=precision)

