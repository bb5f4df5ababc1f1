"""What the simulated clock saw, span by span: the source of a run's timeline (its Chrome trace,
:mod:`exogym.run.output.trace`, and its picture, :mod:`exogym.run.output.trace_plot`).

:class:`SpanLog` is filled by :class:`exogym.sim.clock.SimClock` when the clock is given one
(``clock.spans = SpanLog(N)``; no log, no cost). The clock adds a span wherever it moves a node's
time, with the same start and length it adds to that node's compute, communication, idle or down
total, so each node's spans tile its timeline from 0 to the run's end and add up to its
simulated time (``compute + comm + idle + down = total``, :class:`exogym.sim.clock.ClockReport`):

- ``compute``: one step of the node (its own step count, and the run's step);
- ``comm``: a blocking collective from when its last member arrived until it ended (the network
  time and the wait for a busy link in its args), a point-to-point receive, the wait for an
  overlapped collective's result, an asynchronous push (until it reached the server) and pull;
- ``idle``: the straggler wait before a collective (whom it waited for), waiting to receive,
  waiting for a quorum, and the end of the run while the slowest node finishes;
- ``down``: a world's failure, from the node's time until it is back.

Besides the nodes' own timelines: each member's *network lane* shows an overlapped collective
while it runs under compute; the parameter server's links (receiving pushes, sending models)
have lanes of their own; and *flows* join a send to its receive, a push to the server, a reply
to its node.

Large runs stay small: a node's spans are grouped by step (from one compute to the next), and
consecutive steps with the same operations (the same kinds, names and arguments; their times
may differ) form one :class:`Block` with a count, its times summed per kind and its first step
kept in detail. A 1,000-step DDP run of a node is one block. Steps in which the node was down
are never merged: a failure stays where it happened.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["KINDS", "Block", "Flow", "Span", "SpanLog", "node_ranges"]

KINDS = ("compute", "comm", "idle", "down")
"""What a node's time is spent on; its totals are the :class:`ClockReport`'s split."""

_SAME = 1e-9  # relative: two durations this close are the same (a block's steps "identical")


@dataclass(frozen=True)
class Span:
    """One stretch of a timeline.

    Attributes:
        kind: one of :data:`KINDS` (a lane's span: ``comm``).
        start: when it started, simulated seconds.
        end: when it ended.
        name: what it was (``"compute"``, ``"all_reduce grads"``, ``"straggler wait"``, ...).
        args: more about it, as ``(key, value)`` pairs (bytes, members, codec, whom it waited
            for, ...); part of what makes two steps the same.
        step: a compute span's step of the node itself (0-based), else None.
        run_step: the run's step at which it happened (an asynchronous run: the fastest
            node's count), else None.
    """

    kind: str
    start: float
    end: float
    name: str
    args: tuple[tuple[str, Any], ...] = ()
    step: int | None = None
    run_step: int | None = None

    @property
    def key(self) -> tuple[str, str, tuple[tuple[str, Any], ...]]:
        """What two steps must share to be merged (not times or step numbers)."""
        return self.kind, self.name, self.args


@dataclass
class Block:
    """Consecutive steps of one node with the same operations (:attr:`Span.key` in order).

    Attributes:
        spans: the first step's spans, in detail.
        count: how many steps.
        start: where the block starts on the node's timeline.
        end: where it ends.
        totals: seconds per kind (:data:`KINDS` order) over all its steps.
        steps: the node's own steps ``(first, last)`` (None: no compute in it).
        same: every step took exactly the first one's times (the block is the first step
            repeated ``count`` times); False: their times differ (measured compute, ...).
    """

    spans: tuple[Span, ...]
    count: int
    start: float
    end: float
    totals: list[float]
    steps: tuple[int, int] | None
    same: bool = True

    @property
    def key(self) -> tuple[Any, ...]:
        return tuple(s.key for s in self.spans)


@dataclass(frozen=True)
class Flow:
    """An arrow between two lanes: ``(node, 0)`` a node's timeline, ``(node, 1)`` its network
    lane, ``("server", 0)`` / ``("server", 1)`` the server's receiving / sending link."""

    name: str
    src: tuple[Any, int]
    src_time: float
    dst: tuple[Any, int]
    dst_time: float


@dataclass
class SpanLog:
    """Every node's spans as the clock adds them (module docstring); :meth:`finish` closes the
    last steps. ``blocks[i]``: node ``i``'s timeline; ``lanes``: ``(node, span)`` of the
    network lanes; ``server``: ``(link, span)``, link 0 receiving, 1 sending; ``flows``."""

    num_nodes: int
    blocks: list[list[Block]] = field(default_factory=list)
    lanes: list[tuple[int, Span]] = field(default_factory=list)
    server: list[tuple[int, Span]] = field(default_factory=list)
    flows: list[Flow] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.blocks:
            self.blocks = [[] for _ in range(self.num_nodes)]
        self._group: list[list[Span]] = [[] for _ in range(self.num_nodes)]
        self._computed = [0] * self.num_nodes  # each node's own steps so far

    def add(self, node: int, kind: str, start: float, end: float, name: str,
            args: Sequence[tuple[str, Any]] = (), run_step: int | None = None) -> None:
        """Node ``node`` spent ``[start, end)`` on ``kind`` (nothing if empty). A compute span
        after another one starts the node's next step."""
        if not end > start:
            return
        group = self._group[node]
        step = None
        if kind == "compute":
            if any(s.kind == "compute" for s in group):
                self._close(node)
                group = self._group[node]
            step = self._computed[node]
            self._computed[node] += 1
        group.append(Span(kind, start, end, name, tuple(args), step, run_step))

    def lane(self, node: int, start: float, end: float, name: str,
             args: Sequence[tuple[str, Any]] = ()) -> None:
        """An overlapped collective on node ``node``'s network lane."""
        if end > start:
            self.lanes.append((node, Span("comm", start, end, name, tuple(args))))

    def link(self, link: int, start: float, end: float, name: str,
             args: Sequence[tuple[str, Any]] = ()) -> None:
        """A message on the server's link (0 receiving, 1 sending)."""
        if end > start:
            self.server.append((link, Span("comm", start, end, name, tuple(args))))

    def flow(self, name: str, src: tuple[Any, int], src_time: float, dst: tuple[Any, int],
             dst_time: float) -> None:
        self.flows.append(Flow(name, src, src_time, dst, dst_time))

    def finish(self) -> SpanLog:
        """Close every node's last step; the log."""
        for node in range(self.num_nodes):
            self._close(node)
        return self

    def cut(self, node: int, at: float) -> None:
        """Node ``node``'s timeline ends at ``at`` (its clock was set back there: a client let
        go in the middle of its work): what it recorded after ``at`` goes, a span across ``at``
        ends there. A block across ``at`` keeps its whole steps before ``at`` and the step
        ``at`` falls in, cut (a block of steps with different times, :attr:`Block.same`
        False, is cut as if each took their mean time)."""
        self._group[node] = _clipped(self._group[node], at)
        blocks = self.blocks[node]
        while blocks and blocks[-1].end > at:
            b = blocks.pop()
            if b.start >= at:
                continue
            period = (b.end - b.start) / b.count
            whole = min(int((at - b.start) // period), b.count - 1)
            if whole:
                blocks.append(Block(b.spans, whole, b.start, b.start + whole * period,
                                    [v * whole / b.count for v in b.totals],
                                    None if b.steps is None
                                    else (b.steps[0], b.steps[0] + whole - 1), b.same))
            shift = whole * period
            last = _clipped([dataclasses.replace(
                s, start=s.start + shift, end=s.end + shift,
                step=None if s.step is None else s.step + whole) for s in b.spans], at)
            if last:
                totals = [0.0] * len(KINDS)
                for s in last:
                    totals[KINDS.index(s.kind)] += s.end - s.start
                steps = [s.step for s in last if s.step is not None]
                blocks.append(Block(tuple(last), 1, last[0].start, last[-1].end, totals,
                                    (steps[0], steps[0]) if steps else None))
            break

    def totals(self, node: int) -> list[float]:
        """Node ``node``'s seconds per kind (:data:`KINDS`) in its closed blocks."""
        out = [0.0] * len(KINDS)
        for b in self.blocks[node]:
            out = [a + v for a, v in zip(out, b.totals, strict=True)]
        return out

    def _close(self, node: int) -> None:
        """The node's current step joins its last block if it has the same operations, else
        starts a block."""
        group, self._group[node] = self._group[node], []
        if not group:
            return
        totals = [0.0] * len(KINDS)
        for s in group:
            totals[KINDS.index(s.kind)] += s.end - s.start
        steps = [s.step for s in group if s.step is not None]
        blocks = self.blocks[node]
        last = blocks[-1] if blocks else None
        if last is not None and last.key == tuple(s.key for s in group) and not any(
                s.kind == "down" for s in group):  # a failure is shown where it happened
            last.count += 1
            last.end = group[-1].end
            last.totals = [a + v for a, v in zip(last.totals, totals, strict=True)]
            if steps and last.steps is not None:
                last.steps = (last.steps[0], steps[-1])
            last.same = last.same and all(
                _close_to(a.end - a.start, b.end - b.start)
                for a, b in zip(last.spans, group, strict=True))
            return
        blocks.append(Block(tuple(group), 1, group[0].start, group[-1].end, totals,
                            (steps[0], steps[-1]) if steps else None))

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain lists (a checkpoint's clock holds them, so a resumed run's timeline is
        whole)."""
        return {"blocks": [[_block_list(b) for b in node] for node in self.blocks],
                "group": [[_span_list(s) for s in g] for g in self._group],
                "computed": list(self._computed),
                "lanes": [[i, _span_list(s)] for i, s in self.lanes],
                "server": [[k, _span_list(s)] for k, s in self.server],
                "flows": [[f.name, list(f.src), f.src_time, list(f.dst), f.dst_time]
                          for f in self.flows]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.blocks = [[_block_of(b) for b in node] for node in state["blocks"]]
        self._group = [[_span_of(s) for s in g] for g in state["group"]]
        self._computed = [int(v) for v in state["computed"]]
        self.lanes = [(int(i), _span_of(s)) for i, s in state["lanes"]]
        self.server = [(int(k), _span_of(s)) for k, s in state["server"]]
        self.flows = [Flow(name, (src[0], int(src[1])), float(t0), (dst[0], int(dst[1])),
                           float(t1)) for name, src, t0, dst, t1 in state["flows"]]


def node_ranges(ids: Sequence[int]) -> str:
    """Node ids as short ranges: ``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"``."""
    out: list[str] = []
    ids = sorted(ids)
    k = 0
    while k < len(ids):
        j = k
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[k]) if j == k else f"{ids[k]}-{ids[j]}")
        k = j + 1
    return ",".join(out)


def _clipped(spans: Sequence[Span], at: float) -> list[Span]:
    """The spans that started before ``at``, each ending no later than ``at``."""
    return [s if s.end <= at else dataclasses.replace(s, end=at)
            for s in spans if s.start < at]


def _close_to(a: float, b: float) -> bool:
    return abs(a - b) <= _SAME * max(abs(a), abs(b))


def _span_list(s: Span) -> list[Any]:
    return [s.kind, s.start, s.end, s.name, [list(a) for a in s.args], s.step, s.run_step]


def _span_of(item: Sequence[Any]) -> Span:
    kind, start, end, name, args, step, run_step = item
    return Span(kind, float(start), float(end), name,
                tuple((str(k), tuple(v) if isinstance(v, list) else v) for k, v in args),
                step, run_step)


def _block_list(b: Block) -> list[Any]:
    return [[_span_list(s) for s in b.spans], b.count, b.start, b.end, list(b.totals),
            list(b.steps) if b.steps is not None else None, b.same]


def _block_of(item: Sequence[Any]) -> Block:
    spans, count, start, end, totals, steps, same = item
    return Block(tuple(_span_of(s) for s in spans), int(count), float(start), float(end),
                 [float(v) for v in totals], (int(steps[0]), int(steps[1])) if steps else None,
                 bool(same))
