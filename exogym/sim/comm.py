"""The communicator: the only way strategies exchange tensors between nodes.

Every collective takes a *node-stacked* tensor ``x`` of shape ``[n_local, *shape]`` (row ``i`` is
what local node ``i`` contributes) and returns a tensor that is identical on every node, so a
strategy writes it back where it needs it (``x.copy_(result.expand_as(x))``). The in-process
implementation below reduces over dim 0; a ``torch.distributed`` implementation reduces the local
rows first and then across ranks, with the same signatures and the same byte accounting, so a
strategy never touches ``torch.distributed``.

Byte accounting. ``S`` is the payload of ONE node: ``x[0].numel() * x.element_size()``; ``N`` the
number of nodes in the run. Each collective adds to ``bytes_sent[i]`` and ``bytes_received[i]`` of
every node ``i``:

=============  =========================================  =========================================
collective     sent by each node                          received by each node
=============  =========================================  =========================================
all_reduce     ``2 (N-1)/N * S``  (ring: reduce-scatter    ``2 (N-1)/N * S``
               then all-gather)
all_gather     ``(N-1) * S``  (ring)                      ``(N-1) * S``
broadcast      source: ``(N-1) * S``, others: 0 (star)    source: 0, others: ``S``
=============  =========================================  =========================================

With one node nothing is sent. Every call is also appended to :attr:`Communicator.log` as a
:class:`CommRecord`, which a network model can turn into time.

Members (the world's absent nodes, docs/design/world.md). Every collective takes
``members=``: a sequence of ``N`` booleans (global node order, the same on every process), the
nodes that take part; None means all. Only members' rows are reduced (a mean divides by their
number ``M``) or gathered (the others' rows come back as zeros); the bytes are those of a ring
(or star) among the ``M`` members, ``2 (M-1)/M * S`` per member for an all-reduce, and nothing
for the others; the record carries the members so that the clock times a ring of ``M``. What the
result means for a node that is not a member is the strategy's business (a replicated method
may hand it the result anyway, a DiLoCo-style method leaves it on its own parameters).

Point to point: :meth:`Communicator.send` moves node ``src``'s row to node ``dst`` (live
recovery, gossip, a parameter server): ``S`` bytes sent by ``src`` and received by ``dst``,
logged as ``op="send"`` with both ends. Through a server (``server=True``), state the server
holds (the global model a joining client or a recovering node needs) is a download:
:meth:`Communicator.download`, ``S`` bytes received by ``dst`` and sent by the server, none by
any node, logged as ``op="send"`` with ``src=-1``.

Codecs (lossy transport, :mod:`exogym.sim.codecs`). Every collective takes ``codec=``: each node's
row of tensor ``j`` goes through ``codec.roundtrip(t, key=(tag, j))`` (a broadcast: the source's row
only, key ``(tag, j, "broadcast", src)``), the receivers work with the reconstructions (an
all-reduce sums or averages them in fp32, fp64 for fp64 tensors), and ``S`` becomes the compressed
payload ``sum_j codec.payload_bytes(t_j[0].numel(), t_j.dtype)``. A *sparse* codec (top-k: every
node its own indices) cannot be summed along a ring, so its all-reduce travels as an all-gather of
the payloads: ``(N-1) * S`` sent and received per node, logged with ``op="all_gather"``. With one
node nothing is sent and the codec is not applied (a collective of one row returns that row).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

if TYPE_CHECKING:
    from exogym.sim.codecs import Codec

__all__ = [
    "Attendance",
    "CommRecord",
    "Communicator",
    "Heard",
    "InProcessCommunicator",
    "OnRecord",
    "accumulate_rows",
    "all_gather_bytes",
    "all_reduce_bytes",
    "broadcast_bytes",
    "finish_reduce",
    "member_mask",
    "payload_bytes",
    "server_bytes",
]

ReduceOp = Literal["mean", "sum"]
_REDUCE_OPS = ("mean", "sum")


def all_reduce_bytes(payload: int, num_nodes: int) -> float:
    """Bytes each node sends (and receives) in a ring all-reduce of ``payload`` bytes."""
    return 2.0 * (num_nodes - 1) / num_nodes * payload


def all_gather_bytes(payload: int, num_nodes: int) -> float:
    """Bytes each node sends (and receives) in a ring all-gather of ``payload`` bytes per node."""
    return float((num_nodes - 1) * payload)


def broadcast_bytes(payload: int, num_nodes: int) -> tuple[float, float]:
    """``(sent by the source, received by every other node)`` for a star broadcast."""
    return float((num_nodes - 1) * payload), float(payload) if num_nodes > 1 else 0.0


def server_bytes(op: str, payload: int, num_nodes: int, members: int = -1,
                 src: int = -1) -> tuple[list[float], list[float]]:
    """Each node's bytes sent and received in a collective through a server (``topology=
    "server"``): an all-reduce, its payload up and the result down; an all-gather, its payload
    up and every member's down; a broadcast, the source's up and to each other member down.
    ``members``: a bit mask (-1: every node); ``src``: a broadcast's source (-1: the first
    member)."""
    member = [members < 0 or bool(members >> i & 1) for i in range(num_nodes)]
    if op == "broadcast":
        source = src if src >= 0 else member.index(True)
        return ([float(payload) if i == source else 0.0 for i in range(num_nodes)],
                [float(payload) if member[i] and i != source else 0.0
                 for i in range(num_nodes)])
    back = payload * (sum(member) if op == "all_gather" else 1)
    return ([float(payload) if member[i] else 0.0 for i in range(num_nodes)],
            [float(back) if member[i] else 0.0 for i in range(num_nodes)])


def accumulate_rows(accs: list[Tensor] | None, tensors: Sequence[Tensor]) -> list[Tensor]:
    """``acc + t[0] + t[1] + ...`` for every node-stacked ``t`` of ``tensors`` and its
    accumulator, one row after the other in row order (one ``_foreach_add_`` per row for all
    the tensors: an element's sum is the same as tensor by tensor).

    The reduction order of every collective in one process: a fixed order, so that a run whose
    nodes are computed a group at a time (:mod:`exogym.run.nodes.paging`, each group adding its rows
    to the sums in turn) gets the very same bits as the run with every node in memory. An
    accumulator is fp32 for half-precision payloads and int64 for integers (as NCCL and gloo
    reduce them), else the payload's own dtype; ``accs`` None starts new sums.
    """
    rows = [t.unbind(0) for t in tensors]
    start = 0
    if accs is None:
        accs = [r[0].to(_accumulator_dtype(r[0].dtype), copy=True) for r in rows]
        start = 1
    if len(accs) != len(rows) or len({len(r) for r in rows}) > 1:
        raise ValueError(f"accumulate_rows: {len(accs)} accumulators for tensors of "
                         f"{[len(r) for r in rows]} rows: one per tensor, equal row counts")
    for i in range(start, len(rows[0]) if rows else 0):
        torch._foreach_add_(accs, [r[i] for r in rows])
    return accs


def _accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return dtype if dtype.is_floating_point else torch.int64


def finish_reduce(accs: Sequence[Tensor], op: ReduceOp, num_nodes: int,
                  dtypes: Sequence[torch.dtype]) -> list[Tensor]:
    """Sums from :func:`accumulate_rows` as the collective's results: divided by ``num_nodes``
    for a mean (an integer mean truncates toward zero), each in its payload's dtype."""
    out = []
    for acc, dtype in zip(accs, dtypes, strict=True):
        if op == "mean":
            acc = (acc / num_nodes if acc.is_floating_point()
                   else torch.div(acc, num_nodes, rounding_mode="trunc"))
        out.append(acc.to(dtype))
    return out


@dataclass(frozen=True)
class CommRecord:
    """One collective as the network sees it.

    Attributes:
        op: ``"all_reduce"``, ``"all_gather"``, ``"broadcast"``, ``"send"`` (point to point), or
            ``"push"`` / ``"pull"`` (a node to / from the parameter server).
        payload_bytes: ``S``, the bytes one node contributes (summed over the tensors of a call).
        step: the training step during which it ran (``-1`` outside the loop).
        tag: a free label set by the strategy (``"grads"``, ``"pseudo_grads"``, ...).
        overlap: whether the strategy lets it run under compute (for a network clock).
        codec: the name of the transport codec (``"int8"``, ``"topk:0.1+ef"``), ``""`` if none;
            ``payload_bytes`` is then the compressed payload, and an all-reduce with a sparse
            codec is recorded as the ``"all_gather"`` that carries it.
        members: the nodes that took part, as a bit mask (bit ``i``: node ``i``); ``-1``: all.
        src: the sending end of a point-to-point ``"send"`` (``-1``: the server, a download,
            :meth:`Communicator.download`), or a broadcast's source (``-1`` otherwise).
        dst: the receiving end of a point-to-point ``"send"`` (``-1`` otherwise).
    """

    op: str
    payload_bytes: int
    step: int
    tag: str
    overlap: bool = False
    codec: str = ""
    members: int = -1
    src: int = -1
    dst: int = -1

    def member_ids(self, num_nodes: int) -> list[int]:
        """The ids of the nodes that took part."""
        if self.members < 0:
            return list(range(num_nodes))
        return [i for i in range(num_nodes) if self.members >> i & 1]


def member_mask(members: Sequence[bool] | Tensor | None, num_nodes: int) -> list[bool] | None:
    """``members`` as a list of ``N`` booleans, or None when every node is a member (the fast
    path, exactly the collectives without members)."""
    if members is None:
        return None
    flags = [bool(m) for m in (members.tolist() if isinstance(members, Tensor) else members)]
    if len(flags) != num_nodes:
        raise ValueError(f"members must list {num_nodes} booleans (one per node), got "
                         f"{len(flags)}")
    return None if all(flags) else flags


def _bits(flags: Sequence[bool]) -> int:
    return sum(1 << i for i, f in enumerate(flags) if f)


def payload_bytes(tensors: Sequence[Tensor], codec: Codec | None = None) -> int:
    """``S`` of a collective over the node-stacked ``tensors``: one node's bytes (its row of
    each), or their compressed size with ``codec``."""
    if codec is None:
        return sum(t[0].numel() * t.element_size() for t in tensors)
    return sum(codec.payload_bytes(t[0].numel(), t.dtype) for t in tensors)


Heard = Callable[[list[bool] | None, str | None], list[bool] | None]
"""Who is heard at a synchronisation: ``heard(active, deadline)`` gives the nodes of ``active``
(None: all) whose messages arrive, None when all of them do (the run's world and clock:
:meth:`exogym.sim.presence.Presence.arrivals`)."""

OnRecord = Callable[[str, list[float], list[float], int, int], None]
"""Told of every record's bytes per row: ``(op, sent, received, src, dst)`` (a population
credits them to the seats' clients)."""


@dataclass
class Attendance:
    """Who takes part in the step being computed, as a communicator sees it. The communicator is
    given one when it is built; the loop that drives the nodes keeps it current, and nothing
    else writes it: in a simulated run, the run sets the step before each scheduler step (so the
    records of a recovery made before the compute carry it) and the step's compute sets the step
    and who computes it (:class:`exogym.run.loop.losses.TrainLoss`; a paged round, each step it
    computes ahead); a worker's loop (:func:`exogym.run.launch.fit_worker`, a torchft replica)
    sets the step. The collectives and the strategies read it (:attr:`Communicator.step`,
    :attr:`Communicator.active`, :meth:`Communicator.arrivals`); the communicator never reaches
    the run: this is all it knows of it.

    Attributes:
        step: the training step being computed, stamped on each record (``-1`` outside the
            loop).
        active: the nodes that compute it (``N`` booleans, global order; None: all).
        heard: who is heard at a synchronisation (:data:`Heard`); None: everyone the step's
            ``active`` says (a perfect world, where a deadline needs a simulated network).
        examples: each node's training examples (``N`` numbers, global order: its shard's
            size, a population's seat its client's), what FedAvg weights a node's model by
            (McMahan et al.'s ``n_k``); None: every node the same.
    """

    step: int = -1
    active: list[bool] | None = None
    heard: Heard | None = None
    examples: list[int] | None = None


class Communicator(abc.ABC):
    """Collectives over the nodes of a run, with byte accounting.

    Args:
        num_nodes: ``N``, nodes in the whole run.
        node_ids: the global ids of the nodes stacked in this process, in row order.
        attendance: who takes part in the step being computed (:class:`Attendance`; None: a
            fresh one, every node always).
        seats: the rows are seats of a population's clients (:mod:`exogym.run.nodes.population`):
            a seat's previous client may then send to its next one (``send`` with
            ``src == dst``).
        on_record: told of every record's bytes per row (:data:`OnRecord`), or None.
        server: the network's topology is a server's (``topology="server"``): a collective's
            bytes are then each member's upload and download (an all-reduce: its payload each
            way; an all-gather: its payload up, every member's down; a broadcast: the source's
            up, to each other member down), and the server's are counted too.

    Attributes:
        bytes_sent / bytes_received: per global node, cumulative (floats: ring formulas divide).
        log: every collective, in order.
    """

    def __init__(self, num_nodes: int, node_ids: Sequence[int], *,
                 attendance: Attendance | None = None, seats: bool = False,
                 on_record: OnRecord | None = None, server: bool = False) -> None:
        if num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
        self.num_nodes = num_nodes
        self.node_ids = list(node_ids)
        self.bytes_sent = [0.0] * num_nodes
        self.bytes_received = [0.0] * num_nodes
        # A parameter server's traffic (asynchronous strategies: push/pull), not a node's.
        self.server_bytes_sent = 0.0
        self.server_bytes_received = 0.0
        self.server = server
        self.log: list[CommRecord] = []
        self.attendance = attendance if attendance is not None else Attendance()
        # Wall and CPU seconds this process spent in a real transport (a process run's
        # torch.distributed calls; 0 in one process): the trainer takes them out of the measured
        # compute time (the wall time on a GPU, the CPU time on a CPU).
        self.transport_s = 0.0
        self.transport_cpu_s = 0.0
        self.seats = seats
        self.on_record = on_record

    @property
    def n_local(self) -> int:
        return len(self.node_ids)

    @property
    def step(self) -> int:
        """The training step being computed (:attr:`Attendance.step`)."""
        return self.attendance.step

    @property
    def active(self) -> list[bool] | None:
        """The nodes that compute the current step (:attr:`Attendance.active`; None: all)."""
        return self.attendance.active

    def arrivals(self, deadline: str | None = None) -> list[bool] | None:
        """Whose contributions reach a synchronisation now (``N`` booleans): the active nodes
        minus lost messages and the ones ``deadline`` cuts (the attendance's
        :attr:`~Attendance.heard` decides); None when everyone's do."""
        heard = self.attendance.heard
        if heard is None:
            if deadline is not None:
                raise ValueError(f"deadline={deadline!r} needs a simulated network (a clock to "
                                 "tell who is late): give the run a network")
            return self.active
        return heard(self.active, deadline)

    def state_dict(self) -> dict[str, Any]:
        """The counters and the log (records as tuples of their fields), for a checkpoint."""
        return {"bytes_sent": list(self.bytes_sent), "bytes_received": list(self.bytes_received),
                "server": [self.server_bytes_sent, self.server_bytes_received],
                "log": [astuple(r) for r in self.log], "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["bytes_sent"]) != self.num_nodes:
            raise ValueError(f"the saved counters are of {len(state['bytes_sent'])} nodes, "
                             f"this run has {self.num_nodes}")
        self.bytes_sent = [float(v) for v in state["bytes_sent"]]
        self.bytes_received = [float(v) for v in state["bytes_received"]]
        self.server_bytes_sent, self.server_bytes_received = (
            float(v) for v in state.get("server", (0.0, 0.0)))
        self.log = [CommRecord(*r) for r in state["log"]]
        self.attendance.step = int(state["step"])

    # -- the public collectives -------------------------------------------------------------
    def all_reduce(
        self, x: Tensor | Sequence[Tensor], op: ReduceOp = "mean", *, tag: str = "",
        overlap: bool = False, codec: Codec | None = None,
        members: Sequence[bool] | Tensor | None = None,
    ) -> Tensor | list[Tensor]:
        """Reduce ``x`` over all nodes (or the ``members``); returns ``x.shape[1:]`` (a list for
        a list input).

        Bytes: each node sends and receives ``2(N-1)/N * S`` (ring all-reduce); with a sparse
        codec ``(N-1) * S`` (all-gather of the payloads); with members, ``M`` in place of ``N``
        for the members and nothing for the others. ``codec``: each sending row goes through it
        (key ``(tag, tensor index)``) and the reconstructions are reduced in fp32.
        """
        tensors = self._check(x, codec, op)
        mask = member_mask(members, self.num_nodes)
        if mask is None:
            self._account_reduce(tensors, tag, overlap, codec)
            out = self._all_reduce(self._encode(tensors, tag, codec), op)
        else:
            out = self._all_reduce_members(tensors, op, tag, overlap, codec, mask)
        return out if isinstance(x, (list, tuple)) else out[0]

    def all_reduce_(
        self, x: Tensor | Sequence[Tensor], op: ReduceOp = "mean", *, tag: str = "",
        overlap: bool = False, codec: Codec | None = None,
        members: Sequence[bool] | Tensor | None = None,
    ) -> None:
        """In place: every row of ``x`` becomes the reduction (``torch.distributed`` style).

        Same bytes and codec handling as :meth:`all_reduce`; saves the strategy a copy back into
        the stack. With ``members``, every row (members' and others') becomes the members'
        reduction.
        """
        mask = member_mask(members, self.num_nodes)
        if mask is not None:
            tensors = self._check(x, codec, op)
            reduced = self._all_reduce_members(tensors, op, tag, overlap, codec, mask)
            for t, r in zip(tensors, reduced, strict=True):
                t.copy_(r.expand_as(t))
            return
        tensors = self._check(x, codec, op)
        self._account_reduce(tensors, tag, overlap, codec)
        if codec is None or self.num_nodes == 1:
            self._all_reduce_inplace(tensors, op)
            return
        reduced = self._all_reduce(self._encode(tensors, tag, codec), op)
        for t, r in zip(tensors, reduced, strict=True):
            t.copy_(r.expand_as(t))

    def all_gather(
        self, x: Tensor | Sequence[Tensor], *, tag: str = "", overlap: bool = False,
        codec: Codec | None = None, members: Sequence[bool] | Tensor | None = None,
    ) -> Tensor | list[Tensor]:
        """Gather every node's row: ``[n_local, *shape] -> [N, *shape]`` (global node order).

        Bytes: each node sends and receives ``(N-1) * S`` (ring all-gather). With ``codec`` the
        rows gathered are the reconstructions (key ``(tag, tensor index)``). With ``members``:
        ``(M-1) * S`` per member, and the rows of the others are zeros.
        """
        tensors = self._check(x, codec)
        mask = member_mask(members, self.num_nodes)
        m = self.num_nodes if mask is None else sum(mask)
        s = all_gather_bytes(payload_bytes(tensors, codec), m)
        each = [s if mask is None or mask[i] else 0.0 for i in range(self.num_nodes)]
        self._account("all_gather", tensors, tag, overlap, sent=each, received=each,
                      codec=codec, members=mask)
        if mask is None:
            out = self._all_gather(self._encode(tensors, tag, codec))
        else:
            rows = self._rows(mask, tensors[0].device)
            sending = [self._zero_others(t, mask) for t in
                       self._encode(tensors, tag, codec, rows)]
            out = self._all_gather(sending)
        return out if isinstance(x, (list, tuple)) else out[0]

    def broadcast(
        self, x: Tensor | Sequence[Tensor], src: int = 0, *, tag: str = "", overlap: bool = False,
        codec: Codec | None = None, members: Sequence[bool] | Tensor | None = None,
    ) -> Tensor | list[Tensor]:
        """Node ``src``'s row, ``x.shape[1:]``, on every node.

        Bytes: the source sends ``(N-1) * S``; each other node receives ``S`` (star); with
        ``members``, ``(M-1) * S`` and the members only. With ``codec`` the source's row goes
        through it (key ``(tag, tensor index, "broadcast", src)``) and every node, the source
        included, gets the reconstruction.
        """
        if not 0 <= src < self.num_nodes:
            raise ValueError(f"src must be a node id in [0, {self.num_nodes}), got {src}")
        tensors = self._check(x, codec)
        mask = member_mask(members, self.num_nodes)
        if mask is not None and not mask[src]:
            raise ValueError(f"the source of a broadcast must be a member, node {src} is not")
        m = self.num_nodes if mask is None else sum(mask)
        src_sent, recv = broadcast_bytes(payload_bytes(tensors, codec), m)
        sent = [src_sent if i == src else 0.0 for i in range(self.num_nodes)]
        received = [0.0 if i == src or (mask is not None and not mask[i]) else recv
                    for i in range(self.num_nodes)]
        self._account("broadcast", tensors, tag, overlap, sent=sent, received=received,
                      codec=codec, members=mask, src=src)
        if codec is not None and self.num_nodes > 1 and src in self.node_ids:
            row = self.node_ids.index(src)
            encoded = []
            for j, t in enumerate(tensors):
                e = t.clone()
                e[row] = codec.roundtrip(t[row:row + 1], (tag, j, "broadcast", src))[0]
                encoded.append(e)
            tensors = encoded
        out = self._broadcast(tensors, src)
        return out if isinstance(x, (list, tuple)) else out[0]

    def send(self, x: Tensor | Sequence[Tensor], src: int, dst: int, *,
             tag: str = "") -> Tensor | list[Tensor]:
        """Point to point: node ``src``'s row of ``x``, ``x.shape[1:]`` (on every process; the
        caller puts it where ``dst`` keeps it). Bytes: ``S`` sent by ``src``, received by
        ``dst``; logged as ``op="send"``."""
        for name, node in (("src", src), ("dst", dst)):
            if not 0 <= node < self.num_nodes:
                raise ValueError(f"{name} must be a node id in [0, {self.num_nodes}), got {node}")
        if src == dst and not self.seats:
            raise ValueError(f"a node does not send to itself (src = dst = {src})")
        tensors = self._check(x)
        s = float(payload_bytes(tensors))
        sent = [s if i == src else 0.0 for i in range(self.num_nodes)]
        received = [s if i == dst else 0.0 for i in range(self.num_nodes)]
        pair = [i in (src, dst) for i in range(self.num_nodes)]
        self._account("send", tensors, tag, False, sent=sent, received=received, members=pair,
                      src=src, dst=dst)
        out = self._broadcast(tensors, src)
        return out if isinstance(x, (list, tuple)) else out[0]

    def download(self, x: Tensor | Sequence[Tensor], dst: int, *, tag: str = "") -> None:
        """The server sends node ``dst`` state it holds, of the shape of a row of ``x`` (every
        process already holds the values: a global model): ``S`` bytes received by ``dst`` and
        sent by the server, none sent by any node; logged as ``op="send"`` with ``src=-1``. The
        clock times it over ``dst``'s downlink from the server's last release. Only through a
        server (``server=True``): among peers, state travels from a peer (:meth:`send`)."""
        if not self.server:
            raise ValueError("a download needs a server (topology='server'); among peers the "
                             "state comes from a peer: send(x, src, dst)")
        if not 0 <= dst < self.num_nodes:
            raise ValueError(f"dst must be a node id in [0, {self.num_nodes}), got {dst}")
        tensors = self._check(x)
        s = float(payload_bytes(tensors))
        self._account("send", tensors, tag, False, sent=[0.0] * self.num_nodes,
                      received=[s if i == dst else 0.0 for i in range(self.num_nodes)],
                      members=[i == dst for i in range(self.num_nodes)], src=-1, dst=dst)

    def push(self, x: Tensor | Sequence[Tensor], node: int, *, tag: str = "") -> float:
        """Node ``node`` sends its row of ``x`` to the parameter server (asynchronous
        strategies, in one process: the strategy reads the row itself). Bytes: ``S`` sent by
        the node, received by the server; logged as ``op="push"`` with ``src=node``. Its time
        is the run's event loop's (:meth:`exogym.sim.clock.SimClock.push`), not a
        collective's. Returns ``S``."""
        return self._point_to_server("push", x, node, tag)

    def pull(self, x: Tensor | Sequence[Tensor], node: int, *, tag: str = "") -> float:
        """The parameter server sends node ``node`` a model of the shape of a row of ``x``.
        Bytes: ``S`` sent by the server, received by the node; ``op="pull"``, ``dst=node``.
        Returns ``S``."""
        return self._point_to_server("pull", x, node, tag)

    def _point_to_server(self, op: str, x: Tensor | Sequence[Tensor], node: int,
                         tag: str) -> float:
        if not 0 <= node < self.num_nodes:
            raise ValueError(f"node must be a node id in [0, {self.num_nodes}), got {node}")
        tensors = self._check(x)
        s = float(payload_bytes(tensors))
        one = [s if i == node else 0.0 for i in range(self.num_nodes)]
        none = [0.0] * self.num_nodes
        if op == "push":
            self.server_bytes_received += s
            self._account(op, tensors, tag, False, sent=one, received=none,
                          members=[i == node for i in range(self.num_nodes)], src=node)
        else:
            self.server_bytes_sent += s
            self._account(op, tensors, tag, False, sent=none, received=one,
                          members=[i == node for i in range(self.num_nodes)], dst=node)
        return s

    def mean_rows(self, xs: Sequence[Tensor]) -> list[Tensor]:
        """The mean of every node's row of each node-stacked ``x`` of ``xs`` (``x.shape[1:]``),
        summed in node order, and not traffic: what evaluation reads (the global model of a
        method whose nodes never hold one; a multi-process run gathers every node's rows
        first). A paged run's communicator adds the other groups' rows (all of ``xs`` in one
        pass over the groups)."""
        if not xs:
            return []
        return finish_reduce(accumulate_rows(None, xs), "mean", xs[0].shape[0],
                             [x.dtype for x in xs])

    def fetch_row(self, x: Tensor, src: int) -> Tensor:
        """Node ``src``'s row of node-stacked ``x`` on every process, not counted as traffic:
        bookkeeping that a real system carries inside a message counted elsewhere (a
        recovering node's optimizer step count, sent with the optimizer state). Every process
        calls it (a collective in a multi-process run)."""
        return self._broadcast([x], src)[0]

    def local_rows(self, mask: Sequence[bool] | Tensor, device: torch.device) -> Tensor:
        """A global ``[N]`` mask as this process's ``[n_local]`` bool tensor on ``device``."""
        flags = mask.tolist() if isinstance(mask, Tensor) else list(mask)
        return torch.tensor([bool(flags[i]) for i in self.node_ids], dtype=torch.bool,
                            device=device)

    @property
    def total_bytes_sent(self) -> float:
        return sum(self.bytes_sent)

    # -- implementation hooks -----------------------------------------------------------------
    @abc.abstractmethod
    def _all_reduce(self, tensors: list[Tensor], op: ReduceOp) -> list[Tensor]: ...

    def _all_reduce_inplace(self, tensors: list[Tensor], op: ReduceOp) -> None:
        for t, r in zip(tensors, self._all_reduce(tensors, op), strict=True):
            t.copy_(r.expand_as(t))

    @abc.abstractmethod
    def _all_gather(self, tensors: list[Tensor]) -> list[Tensor]: ...

    @abc.abstractmethod
    def _broadcast(self, tensors: list[Tensor], src: int) -> list[Tensor]: ...

    # -- helpers ------------------------------------------------------------------------------
    def _check(
        self, x: Tensor | Sequence[Tensor], codec: Codec | None = None,
        op: ReduceOp | None = None,
    ) -> list[Tensor]:
        if op is not None and op not in _REDUCE_OPS:
            raise ValueError(f"op must be one of {_REDUCE_OPS}, got {op!r}")
        tensors = list(x) if isinstance(x, (list, tuple)) else [x]
        for t in tensors:
            if not isinstance(t, Tensor) or t.dim() == 0 or t.shape[0] != self.n_local:
                shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(
                    f"collectives take node-stacked tensors of shape [n_local={self.n_local}, ...],"
                    f" got {shape}"
                )
            if codec is not None and not t.is_floating_point():
                raise ValueError(f"codec {codec.name!r} takes floating-point tensors, got a "
                                 f"{t.dtype} tensor of shape {tuple(t.shape)}")
        return tensors

    def _encode(self, tensors: list[Tensor], tag: str, codec: Codec | None,
                rows: Tensor | None = None) -> list[Tensor]:
        """What the receivers reconstruct from each row (the tensors themselves without codec);
        ``rows``: only those local rows send (see :meth:`Codec.roundtrip`)."""
        if codec is None or self.num_nodes == 1:
            return tensors
        return [codec.roundtrip(t, (tag, j), rows) for j, t in enumerate(tensors)]

    def _rows(self, mask: Sequence[bool], device: torch.device) -> Tensor:
        """This process's member rows, int64 indices on ``device``."""
        return torch.tensor([r for r, node in enumerate(self.node_ids) if mask[node]],
                            dtype=torch.long, device=device)

    def _zero_others(self, t: Tensor, mask: Sequence[bool]) -> Tensor:
        """``t`` with the rows of non-members zeroed (never multiplied: a NaN stays out)."""
        keep = self.local_rows(mask, t.device).view(-1, *([1] * (t.dim() - 1)))
        return torch.where(keep, t, torch.zeros((), dtype=t.dtype, device=t.device))

    def _all_reduce_members(self, tensors: list[Tensor], op: ReduceOp, tag: str, overlap: bool,
                            codec: Codec | None, mask: list[bool]) -> list[Tensor]:
        """An all-reduce among the members: bytes of a ring of ``M``; the members' sum, or the
        sum divided by ``M`` (an integer mean truncates toward zero, as without members)."""
        m = sum(mask)
        payload = payload_bytes(tensors, codec)
        if codec is not None and codec.sparse:
            kind, s = "all_gather", all_gather_bytes(payload, m)
        else:
            kind, s = "all_reduce", all_reduce_bytes(payload, m)
        each = [s if mask[i] else 0.0 for i in range(self.num_nodes)]
        self._account(kind, tensors, tag, overlap, sent=each, received=each, codec=codec,
                      members=mask)
        if m == 0:
            raise ValueError(f"an all-reduce ({tag!r}) with no member")
        rows = self._rows(mask, tensors[0].device)
        sending = [self._zero_others(t, mask) for t in self._encode(tensors, tag, codec, rows)]
        sums = self._all_reduce(sending, "sum")
        if op == "sum":
            return sums
        return [(s / m).to(s.dtype) if s.is_floating_point() else torch.div(
            s, m, rounding_mode="trunc") for s in sums]

    def _account_reduce(
        self, tensors: list[Tensor], tag: str, overlap: bool, codec: Codec | None
    ) -> None:
        payload = payload_bytes(tensors, codec)
        if codec is not None and codec.sparse:
            op, s = "all_gather", all_gather_bytes(payload, self.num_nodes)
        else:
            op, s = "all_reduce", all_reduce_bytes(payload, self.num_nodes)
        self._account(op, tensors, tag, overlap, sent=[s] * self.num_nodes,
                      received=[s] * self.num_nodes, codec=codec)

    def _account(
        self, op: str, tensors: list[Tensor], tag: str, overlap: bool, *,
        sent: list[float], received: list[float], codec: Codec | None = None,
        members: Sequence[bool] | None = None, src: int = -1, dst: int = -1,
    ) -> None:
        self._record(op, payload_bytes(tensors, codec), tag, overlap, sent=sent, received=received,
                     codec=codec.name if codec is not None else "",
                     members=-1 if members is None else _bits(members), src=src, dst=dst)

    def _record(self, op: str, payload: int, tag: str, overlap: bool, *, sent: list[float],
                received: list[float], codec: str, members: int, src: int, dst: int) -> None:
        """Count a collective's bytes and log it at the current :attr:`step`."""
        if self.server and op in ("all_reduce", "all_gather", "broadcast"):
            sent, received = server_bytes(op, payload, self.num_nodes, members, src)
            self.server_bytes_received += sum(sent)
            self.server_bytes_sent += sum(received)
        elif op == "send" and src < 0:  # a download from the server
            self.server_bytes_sent += sum(received)
        for i in range(self.num_nodes):
            self.bytes_sent[i] += sent[i]
            self.bytes_received[i] += received[i]
        if self.on_record is not None:
            self.on_record(op, sent, received, src, dst)
        self.log.append(CommRecord(op, payload, self.step, tag, overlap, codec, members, src,
                                   dst))


class InProcessCommunicator(Communicator):
    """All ``N`` nodes live in this process, stacked along dim 0: collectives are reductions."""

    def __init__(self, num_nodes: int, *, attendance: Attendance | None = None,
                 seats: bool = False, on_record: OnRecord | None = None,
                 server: bool = False) -> None:
        super().__init__(num_nodes, range(num_nodes), attendance=attendance, seats=seats,
                         on_record=on_record, server=server)

    def _all_reduce(self, tensors: list[Tensor], op: ReduceOp) -> list[Tensor]:
        return finish_reduce(accumulate_rows(None, tensors), op, self.num_nodes,
                             [t.dtype for t in tensors])

    def _all_reduce_inplace(self, tensors: list[Tensor], op: ReduceOp) -> None:
        if self.num_nodes == 1:
            return  # the reduction of one row is that row
        for t, out in zip(tensors, self._all_reduce(tensors, op), strict=True):
            t.copy_(out.unsqueeze(0).expand_as(t))

    def _all_gather(self, tensors: list[Tensor]) -> list[Tensor]:
        return [t.clone() for t in tensors]

    def _broadcast(self, tensors: list[Tensor], src: int) -> list[Tensor]:
        return [t[src].clone() for t in tensors]
