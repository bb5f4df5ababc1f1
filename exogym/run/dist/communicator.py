"""The communicator over ``torch.distributed``: the same strategies on real processes.

:class:`DistributedCommunicator` implements the hooks of :class:`exogym.sim.comm.Communicator` with
``torch.distributed`` collectives (gloo on CPU, nccl on CUDA). Each OS process (rank ``r`` of
``R``) holds ``n_local`` node-stacked nodes, the same number in every process; its global node ids
are ``r * n_local + i`` for ``i < n_local``, so ``N = R * n_local`` (2 processes x 4 nodes = an
8-node run). The base class does the byte accounting, the codec roundtrip and the
:class:`~exogym.sim.comm.CommRecord` log, so bytes and logs are identical to the in-process
simulator's by construction: what is *counted* is always the algorithm's ring/star formula over
``N`` nodes (``2 (N-1)/N * S`` per all-reduce, ...), not what gloo or nccl happen to move between
processes.

How each collective runs (tensors of one dtype class are flattened into one buffer, so a call
with many tensors is one ``torch.distributed`` collective per dtype class):

- all-reduce: the local rows are summed first (fp32 accumulation for 16-bit floats, fp64 for
  fp64, int64 for integers, as the in-process reduction), then ``all_reduce(SUM)`` across ranks,
  then divided by ``N`` for a mean (an integer mean truncates toward zero, as in-process). The
  result equals the in-process reduction up to float round-off (the summation order differs).
- all-gather: every rank's ``[n_local, ...]`` rows, in rank order, give ``[N, ...]`` in global
  node order (exact).
- broadcast: the rank holding node ``src`` sends that row (exact).

A codec is applied by the base class to each local row before the collective, exactly as in the
simulator; the processes then exchange the dense reconstructions (the codec is simulated, its
compressed size is what is counted).

:func:`local_batch` gives a process only its nodes' batches of the run's shared data order, and
:func:`gather_global_state` builds the model to evaluate when a strategy's ``global_state()``
depends on nodes of other processes (evaluation traffic is not counted).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils._pytree import tree_map

from exogym.run.dist.ranks import local_node_ids
from exogym.sim.comm import (
    Attendance,
    Communicator,
    OnRecord,
    ReduceOp,
    accumulate_rows,
    finish_reduce,
)
from exogym.sim.compute import work_cpu_mark, work_cpu_since
from exogym.sim.engine import NodeStack
from exogym.sim.sharding import NodeBatches, fetch

__all__ = ["DistributedCommunicator", "WallSpans", "accumulator_dtype", "dtype_groups",
           "gather_all_nodes", "gather_global_state", "local_batch"]

def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a reduction of ``dtype`` accumulates in (as the in-process reduction)."""
    if dtype == torch.float64:
        return torch.float64
    if dtype.is_floating_point:
        return torch.float32
    if dtype == torch.bool or dtype.is_complex:
        raise ValueError(f"all_reduce takes floating-point or integer tensors, got {dtype}")
    return torch.int64


def dtype_groups(dtypes: Sequence[torch.dtype]) -> dict[torch.dtype, list[int]]:
    """Tensor indices grouped by dtype, first appearance order (one collective per group)."""
    groups: dict[torch.dtype, list[int]] = {}
    for j, dt in enumerate(dtypes):
        groups.setdefault(dt, []).append(j)
    return groups


class WallSpans:
    """This rank's real run on the wall clock, for its trace (``fit(trace=True)`` in a process
    run; :func:`exogym.run.output.trace.real_trace`): when each training step started and ended and
    each real collective inside it (with its record's index in the communicator's log), in
    seconds since the epoch (``perf_counter`` plus this process's offset to ``time.time``, read
    once, so that the ranks of one machine share a time axis)."""

    def __init__(self) -> None:
        self.offset = time.time() - time.perf_counter()
        self.steps: list[tuple[int, float, float]] = []
        self.comms: list[tuple[float, float, int]] = []
        self._open: tuple[int, float] | None = None

    def begin(self, step: int) -> None:
        self._open = (step, time.perf_counter() + self.offset)

    def end(self) -> None:
        if self._open is not None:
            step, start = self._open
            self.steps.append((step, start, time.perf_counter() + self.offset))
            self._open = None

    def collective(self, start: float, end: float, index: int) -> None:
        """A real collective from ``start`` to ``end`` (``perf_counter`` seconds)."""
        self.comms.append((start + self.offset, end + self.offset, index))

    def to_dict(self) -> dict[str, Any]:
        return {"steps": [list(s) for s in self.steps], "comms": [list(c) for c in self.comms]}


_F = TypeVar("_F", bound=Callable[..., Any])


def _transport(method: _F) -> _F:
    """Add the wall time of a real collective to ``self.transport_s``, its CPU time to
    ``self.transport_cpu_s`` (and the collective to ``self.wall``, when the run's real trace is
    recorded)."""
    @functools.wraps(method)
    def timed(self: DistributedCommunicator, *args: Any, **kwargs: Any) -> Any:
        cpu = work_cpu_mark()
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            end = time.perf_counter()
            self.transport_s += end - start
            self.transport_cpu_s += work_cpu_since(cpu)
            if self.wall is not None:
                self.wall.collective(start, end, len(self.log) - 1)
    return timed  # type: ignore[return-value]


class DistributedCommunicator(Communicator):
    """Collectives over ``torch.distributed`` ranks, each holding ``n_local`` stacked nodes.

    Args:
        num_nodes: ``N``, nodes in the whole run; must be ``world_size * len(node_ids)``.
        node_ids: the global ids of this process's nodes in row order; must be
            ``local_node_ids(rank, n_local)`` (contiguous, every rank the same count).
        group: the process group (None: the default group, which must be initialised).
        attendance: who takes part in the step being computed (as
            :class:`~exogym.sim.comm.Communicator`'s).
        seats: the rows are a population's seats (as :class:`~exogym.sim.comm.Communicator`'s).
        on_record: told of every record's bytes per row (as
            :class:`~exogym.sim.comm.Communicator`'s).
        wall: this rank's real steps and collectives on the wall clock (:class:`WallSpans`:
            the run's real trace), or None.

    Bytes and the log are the base class's (identical to :class:`InProcessCommunicator`'s for
    the same ``N``); every process holds the counters of all ``N`` nodes.
    """

    def __init__(
        self, num_nodes: int, node_ids: Sequence[int], group: dist.ProcessGroup | None = None,
        *, attendance: Attendance | None = None, seats: bool = False,
        on_record: OnRecord | None = None, wall: WallSpans | None = None,
        server: bool = False,
    ) -> None:
        super().__init__(num_nodes, node_ids, attendance=attendance, seats=seats,
                         on_record=on_record, server=server)
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("DistributedCommunicator needs torch.distributed initialised "
                               "(torch.distributed.init_process_group) before it is built")
        self.group = group
        self.wall = wall
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        n_local = len(self.node_ids)
        if n_local < 1 or num_nodes != self.world_size * n_local:
            raise ValueError(
                f"num_nodes must be world_size * len(node_ids) = {self.world_size} * {n_local} "
                f"= {self.world_size * n_local}, got {num_nodes}"
            )
        expected = local_node_ids(self.rank, n_local)
        if self.node_ids != expected:
            raise ValueError(f"rank {self.rank} with {n_local} nodes must hold node_ids "
                             f"{expected}, got {self.node_ids}")

    def _global_rank(self, group_rank: int) -> int:
        if self.group is None:
            return group_rank
        return dist.get_global_rank(self.group, group_rank)

    @torch.no_grad()
    def mean_rows(self, xs: Sequence[Tensor]) -> list[Tensor]:
        """The mean of every node's row of each ``x`` of ``xs`` over all ``N`` nodes of the
        run, the same on every rank: every rank's rows gathered, summed in node order as one
        process sums them. Not traffic (what evaluation reads), and not a transport time."""
        xs = list(xs)
        if self.world_size == 1 or not xs:
            return super().mean_rows(xs)
        full = []
        for x in xs:
            parts = [torch.empty_like(x) for _ in range(self.world_size)]
            dist.all_gather(parts, x.detach().contiguous(), group=self.group)
            full.append(torch.cat(parts, dim=0))
        return finish_reduce(accumulate_rows(None, full), "mean", self.num_nodes,
                             [x.dtype for x in xs])

    # -- hooks -------------------------------------------------------------------------------
    @_transport
    def _all_reduce(self, tensors: list[Tensor], op: ReduceOp) -> list[Tensor]:
        accs = [accumulator_dtype(t.dtype) for t in tensors]
        sums = [t.sum(0, dtype=acc) for t, acc in zip(tensors, accs, strict=True)]
        if self.world_size > 1:
            for idx in dtype_groups(accs).values():
                flat = torch.cat([sums[j].reshape(-1) for j in idx])
                dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
                for j, piece in zip(idx, flat.split([sums[j].numel() for j in idx]),
                                    strict=True):
                    sums[j] = piece.view(sums[j].shape)
        out = []
        for t, s in zip(tensors, sums, strict=True):
            if op == "mean":
                s = s / self.num_nodes
            out.append(s.to(t.dtype))
        return out

    @_transport
    def _all_gather(self, tensors: list[Tensor]) -> list[Tensor]:
        if self.world_size == 1:
            return [t.clone() for t in tensors]
        out: list[Tensor | None] = [None] * len(tensors)
        n = self.n_local
        for idx in dtype_groups([t.dtype for t in tensors]).values():
            rows = [tensors[j].reshape(n, -1) for j in idx]
            flat = torch.cat(rows, dim=1).contiguous()  # [n_local, total]
            parts = [torch.empty_like(flat) for _ in range(self.world_size)]
            dist.all_gather(parts, flat, group=self.group)
            full = torch.cat(parts, dim=0)  # [N, total], global node order
            for j, piece in zip(idx, full.split([r.shape[1] for r in rows], dim=1), strict=True):
                out[j] = piece.reshape(self.num_nodes, *tensors[j].shape[1:]).clone()
        return [t for t in out if t is not None]

    @_transport
    def _broadcast(self, tensors: list[Tensor], src: int) -> list[Tensor]:
        src_rank, row = divmod(src, self.n_local)
        if self.world_size == 1:
            return [t[row].clone() for t in tensors]
        out: list[Tensor | None] = [None] * len(tensors)
        for idx in dtype_groups([t.dtype for t in tensors]).values():
            if self.rank == src_rank:
                flat = torch.cat([tensors[j][row].reshape(-1) for j in idx])
            else:
                total = sum(tensors[j][0].numel() for j in idx)
                flat = tensors[idx[0]].new_empty(total)
            dist.broadcast(flat, src=self._global_rank(src_rank), group=self.group)
            sizes = [tensors[j][0].numel() for j in idx]
            for j, piece in zip(idx, flat.split(sizes), strict=True):
                out[j] = piece.view(tensors[j].shape[1:]).clone()
        return [t for t in out if t is not None]


def local_batch(batches: NodeBatches, node_ids: Sequence[int],
                active: Sequence[bool] | None = None) -> Any:
    """This process's rows of the run's next node-stacked batch: ``[n_local, B, ...]`` per leaf.

    ``batches`` is the :class:`NodeBatches` of the whole run (all ``N`` nodes, same seed in every
    process), so every node draws exactly the samples it draws in the simulator; only the rows
    ``node_ids`` are fetched. ``active`` (``N`` booleans, the same on every process): only those
    nodes consume data (:meth:`NodeBatches.next_indices`).
    """
    rows = torch.tensor(list(node_ids), dtype=torch.long)
    idx = batches.next_indices(active)[rows]  # [n_local, B]
    n, b = idx.shape
    if batches.shared is not None:
        flat = fetch(batches.shared, idx.reshape(-1))
        return tree_map(
            lambda t: t.reshape(n, b, *t.shape[1:]) if isinstance(t, Tensor) else t, flat)
    per_node = [fetch(batches.datasets[i], idx[k]) for k, i in enumerate(node_ids)]
    return tree_map(lambda *ts: torch.stack(ts), *per_node)


def _same_on_every_rank(state: dict[str, Tensor], group: dist.ProcessGroup | None) -> bool:
    """Whether every float tensor of ``state`` is bitwise equal on all ranks (max == min)."""
    floats = [v.reshape(-1).double() for v in state.values() if v.is_floating_point()]
    if not floats:
        return True
    flat = torch.cat(floats)
    hi, lo = flat.clone(), flat.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=group)
    return bool(torch.equal(hi, lo))


@torch.no_grad()
def gather_all_nodes(nodes: NodeStack, comm: DistributedCommunicator) -> NodeStack:
    """A :class:`NodeStack` of all ``N`` nodes (their current parameters and buffers), on every
    rank. Not counted in the communicator's bytes (evaluation only). Memory: ``N`` replicas."""
    full = NodeStack(nodes.module, comm.num_nodes, device=nodes.device, engine="loop")
    for src, dst in ((nodes.params, full.params), (nodes.buffers, full.buffers)):
        for name, t in src.items():
            parts = [torch.empty_like(t) for _ in range(comm.world_size)]
            dist.all_gather(parts, t.detach().contiguous(), group=comm.group)
            dst[name].data.copy_(torch.cat(parts, dim=0))
    return full


@torch.no_grad()
def gather_global_state(strategy: Any, comm: DistributedCommunicator) -> dict[str, Tensor]:
    """``strategy.global_state()`` of the whole run, the same on every rank (a collective).

    If every rank's ``global_state()`` is already the same (DDP, FedAvg, DiLoCo and the other
    methods that keep a global copy), it is returned as is. Otherwise (a method whose global
    model is a function of all nodes, e.g. SPARTA's node mean) all nodes' parameters and buffers
    are gathered into a temporary ``N``-node :class:`NodeStack` and ``global_state()`` is called
    with it in place of ``strategy.nodes`` (restored afterwards). Evaluation traffic: not counted.
    """
    state = strategy.global_state()
    if comm.world_size == 1 or _same_on_every_rank(state, comm.group):
        return state
    local = strategy.nodes
    strategy.nodes = gather_all_nodes(local, comm)
    try:
        return strategy.global_state()
    finally:
        strategy.nodes = local
