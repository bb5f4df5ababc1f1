"""Virtual nodes: a run with more nodes than fit in memory, a group of them at a time.

``fit(resident=K)`` / ``--resident K`` (docs/design/paging.md) splits the ``N`` nodes into
groups of ``K`` consecutive nodes. Each group is built like one process of a multi-process run:
its own node-stacked replicas (:class:`~exogym.sim.engine.NodeStack` of ``K`` rows), its own
copy of the strategy set up over them, and a communicator whose rows are the group's
(:class:`GroupComm`). Between two of its turns a group's tensors (parameters, buffers, gradients,
the strategy's state: inner and outer optimizers, global copies, error-feedback residuals) live in
a :class:`PageStore`, in host memory or in a file of a folder (``offload="host"|"disk[:DIR]"``):
whole storages written and read as raw bytes (no pickle), the tensors' storages freed in between
(their Python objects, and the views and optimizer references to them, stay valid; FSDP frees
parameters the same way). Only the group computing is in memory: the peak is bounded by ``K``,
not ``N``.

Collectives without suspended frames. A collective needs every group's rows, but only one group
is in memory. Rather than keep ``N / K`` strategy calls suspended (each holding its temporaries,
which would bring the memory back to ``N`` nodes), a call that reaches a collective is *replayed*:

1. pass 0: each group in turn runs the call (a step: forward, backward, the strategy's step) up to
   its first collective, adds its rows to the collective (the rows' sum, kept as one running
   accumulator, :func:`exogym.sim.comm.accumulate_rows`; or its rows of a gather or a broadcast),
   and is abandoned there: its memory is freed without being written, so the group is as it was
   before the call;
2. once every group has contributed, the collective's result is known; pass 1 runs every group's
   call again from where it started, the first collective now answered from the known result, up
   to its second collective, and so on until every group's call ends (then its state is written).

A call is run once per collective plus once, from the state the group had before it (saved, with
its gradients, before the first pass; a strategy's Python-level state, its counters and
generators, is restored from a copy taken then). A step whose strategy does not communicate (the
local steps of DiLoCo, FedAvg) runs once; group 0 always saves first, and the other groups save
only when group 0 met a collective. Every group must make the same collectives in the same order
(as every process of a torch.distributed run must); a group that does not is an error.

Same numbers as in memory, bit for bit: the rows of a reduction are added one after the other in
node order in both runs (:func:`exogym.sim.comm.accumulate_rows`); every group's strategy does the
same arithmetic on its rows as the stacked one does on all of them (elementwise updates, per-node
clipping and step counts); the data, the world and the clock see the same step; the loop engine
draws each node's dropout from the global generator in node order, the threads engine seeds each
node from the generator's state and the node's global index (every group sees the same state, as
every node of the in-memory step does). Fused CPU optimizers compute an element in a SIMD vector
or in a loop's scalar tail, which round differently: with groups of a multiple of 8 nodes every
element takes the in-memory run's path (measured on the DEFAULT, AVX2 and AVX512 kernels); other
group sizes may differ in the last bit of a few elements. Not paged: the vmap engine (it
batches the nodes it holds: other kernels for ``K`` rows than for ``N``) and asynchronous
strategies (their event loop steps one node at a time; refused with a message).

Rounds. A step that :meth:`StackedStrategy.communicates` says makes no collective (DiLoCo's,
FedAvg's and FedOpt's local steps) needs no other group: with the threads engine and no world that
can change who computes, the run has each group compute the steps up to the next synchronisation
while it is in memory (:meth:`Paged.round_length`, :meth:`Paged.compute`), so a local-SGD method
is paged once per round, not once per step; the round's collectives are counted when the run
reaches its last step (:meth:`Paged.flush`), and the holder
(:class:`~exogym.run.nodes.paged.PagedNodes`) hands out the round's per-step losses, learning
rates and prices as the run reaches each step.

Costs. Each round (each step, stepping group by group) reads and writes every group's state once
(gradients are zero between steps and are not written), and once more per collective; the time
spent paging is not the nodes' compute (its CPU time is taken out of the measured step price).
Checkpoints of a paged run write one file per group, a group at a time (:meth:`Paged.write_groups`,
synchronously: the groups are read from the store in the training thread), so a checkpoint never
holds more than one group in memory either.
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import shutil
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_map

from exogym.sim.comm import (
    Communicator,
    ReduceOp,
    accumulate_rows,
    finish_reduce,
)
from exogym.sim.engine import NodeStack
from exogym.strategy.base import StackedStrategy

__all__ = ["GroupComm", "PageStore", "Paged", "PagingError", "in_memory_nodes", "parse_offload",
           "resident_check"]

T = TypeVar("T")

OFFLOADS = ("host", "disk")


class PagingError(RuntimeError):
    """A strategy's groups did not make the same collectives (a paged run needs every group to
    make the same collectives in the same order, as every process of a distributed run must)."""


def parse_offload(spec: str) -> tuple[Literal["host", "disk"], Path | None]:
    """``"host"``, ``"disk"`` (a temporary folder) or ``"disk:DIR"`` -> (kind, folder)."""
    if not isinstance(spec, str):
        raise ValueError(f"offload takes 'host', 'disk' or 'disk:DIR', got {spec!r}")
    kind, sep, folder = spec.partition(":")
    if kind not in OFFLOADS or (kind == "host" and sep):
        raise ValueError(f"offload takes 'host', 'disk' or 'disk:DIR', got {spec!r}")
    if sep and not folder:
        raise ValueError(f"offload 'disk:' needs a folder after the colon, got {spec!r}")
    return kind, (Path(folder) if folder else None)  # type: ignore[return-value]


# -- storages --------------------------------------------------------------------------------------
def _storages(tensors: Sequence[Tensor]) -> list[torch.UntypedStorage]:
    """The distinct storages under ``tensors`` (views share their base's), in first-seen order."""
    seen: dict[int, torch.UntypedStorage] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen.setdefault(s._cdata, s)
    return list(seen.values())


def _as_bytes(storage: torch.UntypedStorage) -> Tensor:
    """A uint8 tensor over the whole storage (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _host_buffer(storage: torch.UntypedStorage) -> memoryview:
    """A CPU storage's bytes as a writable memoryview (no copy). Not ``Tensor.numpy()``: a
    storage that numpy has seen can no longer be resized, and paging frees storages by
    resizing them."""
    n = storage.nbytes()
    return memoryview((ctypes.c_char * n).from_address(storage.data_ptr())).cast("B") if n \
        else memoryview(bytearray())


class PageStore:
    """Where the groups' storages live while their group is not in memory.

    ``host``: one byte buffer per group (pinned on a CUDA run, so that copies can overlap);
    ``disk``: one file per group in ``folder`` (a temporary folder if None, removed by
    :meth:`close`), written and read with plain file I/O into the storages themselves.
    """

    def __init__(self, kind: Literal["host", "disk"], folder: Path | None, *,
                 device: torch.device) -> None:
        self.kind, self.device = kind, device
        self._own_folder = kind == "disk" and folder is None
        self.folder = (Path(tempfile.mkdtemp(prefix="exogym-pages-")) if self._own_folder
                       else folder)
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
        self._host: dict[int, Tensor] = {}
        self._files: set[int] = set()
        if self._own_folder:  # removed at close, or when the store is collected, or at exit
            weakref.finalize(self, shutil.rmtree, str(self.folder), True)
        self.bytes_written = self.bytes_read = 0
        self.reads = 0  # group pages read
        self.seconds = 0.0  # wall time spent paging (not the nodes' compute)
        self.cpu_seconds = 0.0  # CPU time of the calling thread spent paging

    def path(self, key: int) -> Path:
        assert self.folder is not None
        return self.folder / f"group-{key:06d}.bin"

    def save(self, key: int, storages: Sequence[torch.UntypedStorage]) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        total = sum(s.nbytes() for s in storages)
        if self.kind == "host":
            buf = self._host.get(key)
            if buf is None or buf.numel() != total:
                buf = torch.empty(total, dtype=torch.uint8,
                                  pin_memory=self.device.type == "cuda")
                self._host[key] = buf
            at = 0
            for s in storages:
                n = s.nbytes()
                buf[at:at + n].copy_(_as_bytes(s), non_blocking=True)
                at += n
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        else:
            self._files.add(key)
            with open(self.path(key), "wb") as f:
                for s in storages:
                    # a device storage's host copy is held while it is written: the memoryview
                    # of _host_buffer does not keep it alive (it read freed memory on CUDA)
                    host = s if s.device.type == "cpu" else s.cpu()
                    f.write(_host_buffer(host))
                    del host
        self.bytes_written += total
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += time.thread_time() - c0

    def load(self, key: int, storages: Sequence[torch.UntypedStorage],
             sizes: Sequence[int]) -> None:
        """Give each (freed) storage back its ``sizes`` bytes, read from the store."""
        t0, c0 = time.perf_counter(), time.thread_time()
        for s, n in zip(storages, sizes, strict=True):
            s.resize_(n)
        if self.kind == "host":
            buf, at = self._host[key], 0
            for s, n in zip(storages, sizes, strict=True):
                _as_bytes(s).copy_(buf[at:at + n], non_blocking=True)
                at += n
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        else:
            with open(self.path(key), "rb") as f:
                for s, n in zip(storages, sizes, strict=True):
                    if s.device.type == "cpu":
                        got = f.readinto(_host_buffer(s))
                    else:
                        host = torch.UntypedStorage(n)
                        got = f.readinto(_host_buffer(host))
                        _as_bytes(s).copy_(_as_bytes(host))
                    if got != n:
                        raise OSError(f"page file {self.path(key)} is truncated: read {got} "
                                      f"of {n} bytes")
        self.bytes_read += sum(sizes)
        self.reads += 1
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += time.thread_time() - c0

    def close(self) -> None:
        """Forget the pages: the host buffers, the files written (and the folder, if it was a
        temporary one; a folder given stays)."""
        self._host.clear()
        if self._own_folder and self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        elif self.folder is not None:
            for key in self._files:
                self.path(key).unlink(missing_ok=True)
        self._files.clear()


# -- the collectives ----------------------------------------------------------------------------
class _Contributed(BaseException):
    """Raised through a strategy's call once its group has added its rows to a collective (a
    BaseException: a strategy's own ``except Exception`` must not catch it)."""


@dataclass
class _Rendezvous:
    """The collectives of the call being run: the results known so far, and the one the groups
    are contributing to."""

    groups: int
    results: list[tuple[str, list[Tensor]]] = field(default_factory=list)
    arrivals: list[list[bool] | None] = field(default_factory=list)
    cursor: int = 0
    arrivals_cursor: int = 0
    kind: str | None = None
    deferred: list[tuple[Any, ...]] | None = None  # a round's accounting, until its last step
    arg: Any = None
    parts: list[Any] | None = None
    contributions: int = 0

    def begin(self) -> None:
        self.results.clear()
        self.arrivals.clear()
        self.kind = self.parts = None
        self.contributions = 0

    def contribute(self, kind: str, tensors: list[Tensor], arg: Any, comm: GroupComm) -> None:
        if self.kind is None:
            self.kind, self.arg, self.contributions = kind, arg, 0
            self.parts = [None] * len(tensors)
        elif (kind, arg) != (self.kind, self.arg) or len(tensors) != len(self.parts or ()):
            raise PagingError(f"group {comm.group} made a {kind} where group 0 made a "
                              f"{self.kind}: every group must make the same collectives")
        assert self.parts is not None
        if kind == "reduce":  # the running sums, this group's rows added in node order
            self.parts = accumulate_rows(self.parts if self.contributions else None,
                                         [t.detach() for t in tensors])
        elif kind == "gather":
            self.parts = [[*(blocks or []), t.detach().clone()]
                          for blocks, t in zip(self.parts, tensors, strict=True)]
        elif arg in comm.node_ids:  # broadcast: the source's row
            self.parts = [t[comm.node_ids.index(arg)].detach().clone() for t in tensors]
        self.contributions += 1

    def complete(self, num_nodes: int) -> None:
        """Every group has contributed: the collective's result, for the next pass."""
        if self.contributions != self.groups:
            raise PagingError(f"{self.contributions} of {self.groups} groups reached the "
                              f"{self.kind}: every group must make the same collectives")
        assert self.parts is not None and self.kind is not None
        if self.kind == "reduce":
            op, dtypes = self.arg
            out = finish_reduce(self.parts, op, num_nodes, dtypes)
        elif self.kind == "gather":
            out = [torch.cat(blocks) for blocks in self.parts]
        else:
            out = list(self.parts)
        self.results.append((self.kind, out))
        self.kind = self.parts = None
        self.contributions = 0


def _hub_attribute(name: str) -> Any:
    """A communicator attribute that a group's communicator reads and writes on the run's."""
    return property(lambda self: getattr(self.hub, name),
                    lambda self, value: setattr(self.hub, name, value))


class GroupComm(Communicator):
    """A group's communicator: its rows are the group's nodes; the counters, the log and the
    attendance (the step, who computes it, who is heard) are the run's (``hub``'s); the
    collectives meet the other groups' in a rendezvous (the module docstring)."""

    def __init__(self, hub: Communicator, node_ids: Sequence[int], group: int,
                 rendezvous: _Rendezvous) -> None:
        # Communicator.__init__ would create counters of its own: this one shares the hub's.
        self.hub, self.group, self.rv = hub, group, rendezvous
        self.num_nodes = hub.num_nodes
        self.node_ids = list(node_ids)
        self.attendance = hub.attendance  # the run's: who computes, who is heard
        self.seats, self.on_record = hub.seats, hub.on_record

    # the run's state, shared by every group
    bytes_sent = _hub_attribute("bytes_sent")
    bytes_received = _hub_attribute("bytes_received")
    server_bytes_sent = _hub_attribute("server_bytes_sent")
    server_bytes_received = _hub_attribute("server_bytes_received")
    server = _hub_attribute("server")
    log = _hub_attribute("log")
    transport_s = _hub_attribute("transport_s")
    transport_cpu_s = _hub_attribute("transport_cpu_s")

    def arrivals(self, deadline: str | None = None) -> list[bool] | None:
        """The hub's answer, asked once per call and synchronisation (every group and every
        pass gets the same: the world draws its message losses once)."""
        rv, k = self.rv, self.rv.arrivals_cursor
        rv.arrivals_cursor += 1
        if k == len(rv.arrivals):
            rv.arrivals.append(self.hub.arrivals(deadline))
        got = rv.arrivals[k]
        return None if got is None else list(got)

    def _record(self, op: str, payload: int, tag: str, overlap: bool, **kw: Any) -> None:
        # once per collective: by group 0, the first time it reaches it; in a round computed
        # ahead, when the run reaches the round's last step (Paged.flush)
        if self.group == 0 and self.rv.cursor == len(self.rv.results):
            if self.rv.deferred is not None:
                self.rv.deferred.append((op, payload, tag, overlap, kw))
            else:
                self.hub._record(op, payload, tag, overlap, **kw)

    def _collect(self, kind: str, tensors: list[Tensor], arg: Any) -> list[Tensor]:
        rv, c = self.rv, self.rv.cursor
        rv.cursor += 1
        if c < len(rv.results):
            done, out = rv.results[c]
            if done != kind:
                raise PagingError(f"group {self.group} made a {kind} where the run made a "
                                  f"{done}: every group must make the same collectives")
            return [r.clone() for r in out]
        rv.contribute(kind, tensors, arg, self)
        raise _Contributed

    def _all_reduce(self, tensors: list[Tensor], op: ReduceOp) -> list[Tensor]:
        return self._collect("reduce", tensors, (op, tuple(t.dtype for t in tensors)))

    def mean_rows(self, xs: Sequence[Tensor]) -> list[Tensor]:
        xs = list(xs)
        return self._collect("reduce", xs, ("mean", tuple(x.dtype for x in xs))) if xs else []

    def _all_gather(self, tensors: list[Tensor]) -> list[Tensor]:
        return self._collect("gather", tensors, None)

    def _broadcast(self, tensors: list[Tensor], src: int) -> list[Tensor]:
        return self._collect("broadcast", tensors, src)



# -- the groups ---------------------------------------------------------------------------------
@dataclass(eq=False)
class Group:
    """``ids`` (consecutive global node ids): their replicas, their copy of the strategy, their
    communicator, and where their storages are while they are not in memory."""

    index: int
    ids: list[int]
    nodes: NodeStack
    strategy: StackedStrategy
    comm: GroupComm
    storages: list[torch.UntypedStorage] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    zeroed: list[tuple[torch.UntypedStorage, int]] = field(default_factory=list)
    python: Any = None  # the strategy's state at the last snapshot (tensors are the live ones)

    def state(self) -> tuple[list[Tensor], list[Tensor], dict[str, Any]]:
        """(the tensors of its state, its gradients, the strategy's ``state_dict``)."""
        sd = self.strategy.state_dict()
        leaves = [t for t in tree_flatten(sd)[0] if isinstance(t, Tensor)]
        n = self.nodes
        return [*n.params.values(), *n.buffers.values(), *leaves], list(n.grads.values()), sd


class Paged:
    """The groups of a paged run and the calls that run strategy code on all of them (the module
    docstring).

    Args:
        model: the template module; strategy: the run's strategy, not set up (group 0's; the
            others get deep copies); hub: the run's communicator (counters, log, world);
        resident: nodes per group (``K``); offload: ``"host"``, ``"disk"`` or ``"disk:DIR"``;
        the others as :class:`~exogym.sim.engine.NodeStack` takes them (``engine`` resolved).
    """

    def __init__(self, model: nn.Module, strategy: StackedStrategy, hub: Communicator, *,
                 resident: int, offload: str, device: torch.device, engine: str,
                 micro_batch_size: int | None, precision: Any, total_steps: int,
                 seed: int = 0) -> None:
        kind, folder = parse_offload(offload)
        if engine == "vmap":
            raise ValueError("a paged run (resident=) computes with the loop or threads engine, "
                             "got engine='vmap' (vmap batches the nodes it holds: other kernels "
                             "for a group than for all nodes)")
        n = hub.num_nodes
        self.num_nodes, self.resident, self.offload = n, resident, offload
        self.engine = engine
        self.store = PageStore(kind, folder, device=device)
        self.rv = _Rendezvous(groups=-(-n // resident))
        self.hub = hub
        self._deferred: list[tuple[Any, ...]] = []
        # Whether the model draws random numbers in a training step (threads engine: the
        # global generator moves on by one draw after such a step); None until a step says.
        self.random: bool | None = None
        template = copy.deepcopy(strategy)  # before setup: hyperparameters only
        self.groups: list[Group] = []
        for g, lo in enumerate(range(0, n, resident)):
            ids = list(range(lo, min(lo + resident, n)))
            nodes = NodeStack(model, len(ids), device=device, engine=engine,  # type: ignore[arg-type]
                              micro_batch_size=micro_batch_size, precision=precision)
            nodes.first_node = lo
            if self.groups:
                # one template module for all groups (its own tensors are never computed with:
                # functional_call swaps a node's in; a copy per group was a model per K nodes)
                nodes.module = self.groups[0].nodes.module
                nodes.share_pool(self.groups[0].nodes)
            own = strategy if g == 0 else copy.deepcopy(template)
            comm = GroupComm(hub, ids, g, self.rv)
            try:
                own.setup(nodes, comm, total_steps, seed=seed)
            except _Contributed:
                raise PagingError(f"{type(own).__name__}.setup() communicates; a paged run "
                                  "needs a strategy whose setup does not") from None
            group = Group(g, ids, nodes, own, comm)
            self._save(group)
            self.groups.append(group)

    @property
    def strategies(self) -> list[StackedStrategy]:
        return [g.strategy for g in self.groups]

    # -- paging --------------------------------------------------------------------------------
    def _save(self, g: Group, *, grads: bool = False, keep: bool = False) -> None:
        """Write ``g``'s state to the store (``grads``: its gradients too, a step's before its
        strategy step) and free its storages; ``keep``: a snapshot before a call, kept in
        memory, its strategy's Python values copied (a replay restores them)."""
        tensors, grad_tensors, sd = g.state()
        main = _storages(tensors)
        ids = {s._cdata for s in main}
        grad_storages = [s for s in _storages(grad_tensors) if s._cdata not in ids]
        saved = main + grad_storages if grads else main
        self.store.save(g.index, saved)
        g.storages, g.sizes = saved, [s.nbytes() for s in saved]
        g.zeroed = [] if grads else [(s, s.nbytes()) for s in grad_storages]
        if keep:
            memo = {id(t): t for t in tensors}
            g.python = copy.deepcopy(sd, memo)
        if not keep:
            self._free(g)

    def _free(self, g: Group) -> None:
        for s in [*g.storages, *(s for s, _ in g.zeroed)]:
            s.resize_(0)
        if self.store.kind == "disk":
            _give_back()

    def _load(self, g: Group, *, restore: bool = False) -> None:
        """Bring ``g`` back into memory (``restore``: to its state at the last snapshot, its
        strategy's Python values included)."""
        self.store.load(g.index, g.storages, g.sizes)
        for s, n in g.zeroed:
            s.resize_(n)
            _as_bytes(s).zero_()
        if restore:
            _restore(g.strategy, g.python)

    # -- running strategy code on every group -----------------------------------------------------
    def call(self, fn: Callable[[Group], T], *, prepare: Callable[[Group], None] | None = None,
             query: bool = False, silent: bool = False) -> list[T]:
        """``fn(group)`` on every group in turn, its collectives met by the rendezvous (the
        module docstring); ``prepare(group)`` once per group before it (a step's forward and
        backward). ``query``: ``fn`` changes nothing (a global model), so when group 0's call
        makes no collective the others are not run (their entries are None). ``silent``: the
        strategy says the call makes no collective (:meth:`StackedStrategy.communicates`), so group
        0 is not saved before it either."""
        rv = self.rv
        rv.begin()
        out: list[Any] = [None] * len(self.groups)
        communicating = False
        # a query changes nothing: it is never saved, and a pass starts from the group's page
        for g in self.groups:
            self._load(g)
            if prepare is not None:
                prepare(g)
            if not query and ((g.index == 0 and not silent) or communicating):
                # a step's gradients are state until its strategy step; between steps, zeros
                self._save(g, grads=prepare is not None, keep=True)
            # (a silent call's group 0 cannot contribute, so it never becomes communicating)
            if self._run(g, fn, out, not silent):
                self._done(g, query)
                if communicating:
                    raise self._uneven(g)
                if query:
                    return out
            elif g.index > 0 and not communicating:
                raise self._uneven(g)
            else:
                communicating = True
        while rv.kind is not None:
            rv.complete(self.num_nodes)
            for g in self.groups:
                self._load(g, restore=not query)
                if self._run(g, fn, out, True):
                    self._done(g, query)
        return out

    def _done(self, g: Group, query: bool) -> None:
        """A group's call ended: write it out (a query's group is unchanged: freed only)."""
        if query:
            self._free(g)
        else:
            self._save(g)

    def _run(self, g: Group, fn: Callable[[Group], Any], out: list[Any],
             replayable: bool) -> bool:
        """``fn(g)`` to its end (True: state kept in memory for the caller to save) or to the
        collective it contributed to (False: the group is dropped, as it was before the call;
        an error unless the call can be ``replayable``: saved before it, or a query)."""
        self.rv.cursor = self.rv.arrivals_cursor = 0
        try:
            out[g.index] = fn(g)
        except _Contributed:
            if not replayable:
                raise PagingError(f"{type(g.strategy).__name__} made a collective at step "
                                  f"{g.comm.step}, where its communicates() said it makes "
                                  "none") from None
            self._free(g)
            return False
        return True

    def _uneven(self, g: Group) -> PagingError:
        return PagingError(f"group {g.index} (nodes {g.ids[0]}-{g.ids[-1]}) of "
                           f"{type(g.strategy).__name__} made other collectives than group 0 "
                           "in the same call: a paged run needs every group to make the same "
                           "collectives in the same order")

    # -- what the run asks ----------------------------------------------------------------------
    def round_length(self, step: int, total_steps: int) -> int:
        """How many steps from ``step`` to compute at once: up to the first step that may
        communicate (:meth:`StackedStrategy.communicates`), so that each group computes a round's
        local steps while it is in memory and is paged once per round; 1 (step by step) with
        the loop engine, whose dropout draws follow the nodes' order step by step."""
        if self.engine != "threads":
            return 1
        strategy, t = self.groups[0].strategy, step
        while t < total_steps - 1 and strategy.communicates(t) is False:
            t += 1
        return t - step + 1

    def compute(self, steps: list[int], batch_of: Callable[[int, int, int], Any],
                active: list[bool] | None) -> list[tuple[Tensor, float]]:
        """Steps ``steps`` of every group: one step, or a round whose steps but the last make
        no collective (each group computes them all while it is in memory). ``batch_of(k, lo,
        hi)``: the batch of nodes ``lo`` to ``hi - 1`` at ``steps[k]``. Per step, the ``[N]``
        losses and the learning rate after it. The round's collectives are counted when the
        run reaches its last step (:meth:`flush`)."""
        last = len(steps) - 1
        losses: list[dict[int, Tensor]] = [{} for _ in steps]
        lrs = [0.0] * len(steps)
        rng = _Randomness(self) if self.engine == "threads" else None

        def prepare(g: Group) -> None:
            lo, hi = g.ids[0], g.ids[-1] + 1
            local = None if active is None else active[lo:hi]
            for k, t in enumerate(steps):
                self.hub.attendance.step = t
                if local is None or any(local):
                    if rng is not None:
                        rng.before(k)
                    batch = g.nodes.to_batch_device(batch_of(k, lo, hi))
                    losses[k][g.index] = g.nodes.forward_backward(batch, local)
                    if rng is not None:
                        rng.after(k)
                if k < last:
                    self._silent_step(g, t)
                    lrs[k] = g.strategy.lr

        def last_step(g: Group) -> None:
            self.hub.attendance.step = steps[-1]
            g.strategy.step(steps[-1])
            g.nodes.zero_grad()

        silent = self.groups[0].strategy.communicates(steps[-1]) is False
        self.rv.deferred = [] if last else None
        try:
            self.call(last_step, prepare=prepare, silent=silent)
        finally:
            self._deferred, self.rv.deferred = self.rv.deferred or [], None
            self.hub.attendance.step = steps[0]
        if rng is not None:
            rng.finish(len(steps))
        lrs[last] = self.groups[0].strategy.lr
        like = next(t for step in losses for t in step.values())
        return [(torch.cat([step.get(g.index, like.new_zeros(len(g.ids)))
                            for g in self.groups]), lr) for step, lr in zip(losses, lrs,
                                                                             strict=True)]

    def _silent_step(self, g: Group, step: int) -> None:
        """A step the strategy says makes no collective, within a round."""
        self.rv.cursor = self.rv.arrivals_cursor = 0
        try:
            g.strategy.step(step)
        except _Contributed:
            raise PagingError(f"{type(g.strategy).__name__} made a collective at step {step}, "
                              "where its communicates() said it makes none") from None
        g.nodes.zero_grad()

    def flush(self) -> None:
        """Count the collectives of the round computed ahead, now that the run is at its last
        step (the log's records carry that step)."""
        for op, payload, tag, overlap, kw in self._deferred:
            self.hub._record(op, payload, tag, overlap, **kw)
        self._deferred = []

    def global_state(self) -> dict[str, Tensor]:
        """The strategy's global model (group 0's, after every group took part in any
        collective it needs), copied out of the group's storages."""
        def state(g: Group) -> dict[str, Tensor]:
            return {k: v.detach().clone() for k, v in g.strategy.global_state().items()}
        return self.call(state, query=True)[0]

    def iter_groups(self) -> Iterator[Group]:
        """Each group in memory in turn (read only: nothing is written back)."""
        for g in self.groups:
            self._load(g)
            try:
                yield g
            finally:
                self._free(g)

    def group_files(self) -> list[str]:
        """The file names of the groups in a checkpoint folder."""
        return [f"group-{g.index:06d}.pt" for g in self.groups]

    def write_groups(self, folder: Path, write: Callable[[Path, Any], str],
                     nodes_state: Callable[[NodeStack], dict[str, Any]]) -> dict[str, str]:
        """A checkpoint's groups, a file each (``write(path, state)``; their sha256 by name):
        every group's replicas (``nodes_state`` of its stack) and strategy state, written
        while the group is in memory, one group at a time."""
        digests = {}
        for g, name in zip(self.iter_groups(), self.group_files(), strict=True):
            state = {"nodes": nodes_state(g.nodes), "strategy": g.strategy.state_dict()}
            digests[name] = write(folder / name, state)
        return digests

    def load_groups(self, read: Callable[[str], Any],
                    load_nodes: Callable[[NodeStack, Any], None]) -> None:
        """:meth:`write_groups`' files back into the groups (``read(name)``), a group at a
        time."""
        for g, name in zip(self.groups, self.group_files(), strict=True):
            state = read(name)
            self._load(g)
            load_nodes(g.nodes, state["nodes"])
            # copies: an optimizer adopts the tensors it is given, and a loaded tensor's
            # storage (a checkpoint file's) cannot be freed by resizing
            g.strategy.load_state_dict(tree_map(
                lambda v: v.clone() if isinstance(v, Tensor) else v, state["strategy"]))
            self._save(g)

    def report(self) -> dict[str, Any]:
        """What paging did: the settings, the groups, the bytes written and read, the wall
        seconds it took (``summary.json``'s ``paging``)."""
        st = self.store
        return {"resident": self.resident, "offload": self.offload, "groups": len(self.groups),
                "bytes_written": st.bytes_written, "bytes_read": st.bytes_read,
                "seconds": round(st.seconds, 3)}

    def close(self) -> None:
        self.store.close()


def _libc() -> Any:
    name = ctypes.util.find_library("c") if sys.platform == "linux" else None
    try:
        return ctypes.CDLL(name) if name is not None else None
    except OSError:
        return None


_LIBC = _libc()


def _give_back() -> None:
    """Return the freed group's memory to the operating system (glibc's ``malloc_trim``):
    glibc keeps large freed blocks once it has raised its mmap threshold past their size, and
    a paged run would otherwise hold the memory of every group it freed (measured: FedAvg,
    1,000 MNIST clients in groups of 16, peak RSS 2.2 GB without; the paging study,
    docs/benchmarks/paging-cpu2-202611.md, measures paged runs with it)."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


class _Randomness:
    """The global generator across a paged step or round (threads engine). In memory, every
    node of step ``t`` is seeded from the generator's state ``S_t`` (and its index), and the
    generator then moves on by one draw if the model drew random numbers; here each group
    computes step ``t`` from ``S_t`` too, ``S_{t+1}`` derived from ``S_t`` by that rule, and
    the run goes on from the state after the last step."""

    def __init__(self, paged: Paged) -> None:
        self.paged = paged
        self.states = [torch.get_rng_state()]

    def _state(self, k: int) -> Tensor:
        while len(self.states) <= k:
            state = self.states[-1]
            if self.paged.random:
                torch.set_rng_state(state)
                torch.randint(2, ())
                state = torch.get_rng_state()
            self.states.append(state)
        return self.states[k]

    def before(self, k: int) -> None:
        torch.set_rng_state(self._state(k))

    def after(self, k: int) -> None:
        moved = not torch.equal(torch.get_rng_state(), self.states[k])
        self.paged.random = moved or bool(self.paged.random)

    def finish(self, steps: int) -> None:
        torch.set_rng_state(self._state(steps))


def _restore(strategy: StackedStrategy, saved: dict[str, Any]) -> None:
    """A strategy's state back to a snapshot taken in the same run (its tensors are the live
    ones, just read back): :meth:`StackedStrategy.load_state_dict`, but an attribute that was None
    then (a lazily built step count) is None again."""
    state = dict(saved)
    for name, value in saved.items():
        if value is None:
            setattr(strategy, name, None)
    strategy.load_state_dict(state)


def in_memory_nodes(num_nodes: int, resident: int | None, offload: str,
                    device: torch.device) -> int:
    """How many nodes' state a run holds in ``device``'s memory: every node, unless it pages
    (``resident < N``) to disk, or from a GPU to host memory (host memory is a CPU run's
    device memory: paging there saves nothing)."""
    if resident is None or resident >= num_nodes:
        return num_nodes
    kind, _ = parse_offload(offload)
    return resident if kind == "disk" or device.type != "cpu" else num_nodes


def resident_check(resident: int | None, num_nodes: int) -> int | None:
    """``resident`` validated; None when every node fits (no paging)."""
    if resident is None:
        return None
    if isinstance(resident, bool) or not isinstance(resident, int) or resident < 1:
        raise ValueError(f"resident must be an integer >= 1 (nodes in memory at once), got "
                         f"{resident!r}")
    return None if resident >= num_nodes else resident

