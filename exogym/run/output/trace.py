"""A run's timeline as a Chrome trace: ``trace.json``, opened in https://ui.perfetto.dev or
chrome://tracing (docs/design/trace.md).

The format is the trace event format's JSON object form (``{"traceEvents": [...],
"displayTimeUnit": "ms", "otherData": {...}}``; times in microseconds, to the nanosecond, a
viewer's resolution), the one PyTorch's profiler, JAX and ASTRA-sim write. One process per
simulated node (its name says its speed), one for the parameter server of an asynchronous
strategy; on each node's first thread its timeline from the clock (:mod:`exogym.sim.spans`):
``X`` spans whose category is ``compute``, ``comm``, ``idle`` or ``down``, which tile the
node's time from 0 to the run's end and add up to its simulated time (to the nanosecond); its
second thread shows overlapped collectives while they run. The world's
events (``events.jsonl``: failures, rejoins, lost messages, deadline cuts, quorum waits,
recoveries) are instant events on their node; flow arrows join a send to its receive and a push
or a reply to the server's link.

Consecutive steps of a node with the same operations are one span of category ``steps``
(``"merged steps"``, args: ``count``, the steps, seconds per kind and what was merged), with its
first step inside it in detail (``otherData["merged steps"]`` says so). A run whose trace would
still pass :data:`MAX_BYTES` is shown with less detail, in this order: no detail inside merged
spans, no flows and no overlap lanes; then consecutive spans of a node (and messages of the
server) are merged into windows of the same kind of summary, fewer until it fits.
``otherData["detail"]`` says which was done. Each node's top-level spans add up to its
simulated time at every level.

:func:`run_trace` builds it from a run's clock; :func:`rebuild` from a finished run's folder
(``exogym trace RUN_DIR``): ``summary.json`` holds the clock's trace (:class:`~exogym.sim.clock.
ClockTrace`), whose replay on the run's own network records the same spans, and
``events.jsonl`` the world's events. An asynchronous run's clock is not replayable (the event
loop timed its pushes): its trace is recorded while it trains (``fit(trace=True)``).

:func:`real_trace` is the same format for a real ``torch.distributed`` run (``--engine process``,
torchrun): one process per rank, its compute and collectives as timed by the wall clock
(:class:`exogym.run.dist.WallSpans`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from exogym.sim.clock import ClockTrace
from exogym.sim.comm import CommRecord
from exogym.sim.network import Network, parse_network
from exogym.sim.spans import KINDS, Block, Span, SpanLog, node_ranges
from exogym.sim.world import World

__all__ = ["MAX_BYTES", "PICTURE_FILE", "REAL_TRACE_FILE", "TRACE_FILE", "NotReplayable",
           "node_names", "picture_due", "read_events", "real_trace", "rebuild", "run_trace",
           "timeline_links", "trace_meta", "write_trace"]

TRACE_FILE = "trace.json"
REAL_TRACE_FILE = "trace_real.json"
PICTURE_FILE = "timeline.png"

MAX_BYTES = 19_000_000
"""The most a trace may take as written: a run's trace stays under 20 MB."""

_EVENT_NAMES = {"fail": "failure", "rejoin": "rejoin", "lost": "message lost",
                "late": "deadline cut", "quorum_wait": "quorum wait",
                "resume_own": "resumes from its own state", "recovery": "recovered"}
_MERGED = ("a span of category steps is `count` consecutive steps of a node with the same "
           "operations (kinds, names, arguments), their seconds summed per kind (compute_s, "
           "comm_s, idle_s, down_s; a kind not listed: none); the first of them is shown inside "
           "it; same: every one took exactly the first one's times")


class NotReplayable(ValueError):
    """A run whose clock cannot be replayed (an asynchronous strategy's): its trace is the one
    recorded while it trained, if any."""


def picture_due(world: World, network: Network | None, num_nodes: int,
                asynchronous: bool) -> bool:
    """Whether a run gets ``timeline.png`` by itself: a world, a network whose nodes differ
    (speeds or bandwidths), or an asynchronous strategy."""
    if network is None:
        return False
    if asynchronous or not world.perfect:
        return True
    up, down = network.node_bandwidths(num_nodes)
    return any(len(set(v)) > 1 for v in (network.node_speeds(num_nodes), up, down))


def node_names(speeds: Sequence[float]) -> list[str]:
    """``node 3`` (``node 3, speed 0.25`` where it is not 1)."""
    return [f"node {i}" + (f", speed {v:g}" if v != 1.0 else "") for i, v in enumerate(speeds)]


# -- the simulated run ---------------------------------------------------------------------------
def run_trace(log: SpanLog, events: Sequence[dict[str, Any]], names: Sequence[str],
              meta: dict[str, Any], *, max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    """The Chrome trace of a run whose clock recorded ``log`` (finished); ``events`` the
    world's, ``names`` each node's process name, ``meta`` what ``otherData`` says of the run.
    In full detail if it fits ``max_bytes`` (as written), else with less (module docstring)."""
    trace = _build(log, events, names, meta, True, 1, 1)
    if _size(trace) <= max_bytes:
        return trace
    trace = _build(log, events, names, meta, False, 1, 1)
    blocks = sum(len(b) for b in log.blocks)
    room = 100_000  # events: about 10 MB of merged spans
    while _size(trace) > max_bytes and room >= 2 * log.num_nodes:
        server_room = min(len(log.server), room // 10) or 1
        window = math.ceil(blocks / max(room - server_room, log.num_nodes))
        trace = _build(log, events, names, meta, False, window,
                       max(math.ceil(len(log.server) / server_room), 1))
        room //= 2
    return trace


def _build(log: SpanLog, events: Sequence[dict[str, Any]], names: Sequence[str],
           meta: dict[str, Any], full: bool, window: int, server_window: int) -> dict[str, Any]:
    """The trace at one level of detail: ``full`` (merged steps' detail, flows, overlap
    lanes) or not; ``window`` (``server_window``) > 1: that many consecutive stretches of a
    node's timeline (messages of the server) per span."""
    n = log.num_nodes
    detail = "full" if full else "merged steps without their detail; no flows, no overlap lanes"
    if window > 1 or server_window > 1:
        detail += (f"; every {window} consecutive stretches of a node's timeline and "
                   f"{server_window} messages of the server merged into one")
    out = _metadata(names, log)
    for i in range(n):
        out += _node_events(i, log.blocks[i], full, window)
    if full:
        out += [_x(s, i, 1) for i, s in log.lanes]
        out += _flows(log, n)
    out += _server_events(log.server, n, server_window)
    out += [_instant(e) for e in events]
    return {"traceEvents": _ordered(out), "displayTimeUnit": "ms",
            "otherData": {"exogym": meta, "time": "simulated seconds, in microseconds",
                          "detail": detail, "merged steps": _MERGED}}


def _size(trace: dict[str, Any]) -> int:
    """Bytes of ``trace`` as :func:`write_trace` writes it."""
    return len(_dumps(trace).encode())


def _dumps(trace: dict[str, Any]) -> str:
    return json.dumps(trace, separators=(",", ":")) + "\n"


def _metadata(names: Sequence[str], log: SpanLog) -> list[dict[str, Any]]:
    """Process and thread names, in node order (the server last)."""
    out: list[dict[str, Any]] = []
    lanes = {i for i, _ in log.lanes}
    for i, name in enumerate(names):
        out += [_meta("process_name", i, None, name), _meta("process_sort_index", i, None, i),
                _meta("thread_name", i, 0, "timeline")]
        if i in lanes:
            out.append(_meta("thread_name", i, 1, "network (overlapped collectives)"))
    if log.server:
        s = len(names)
        out += [_meta("process_name", s, None, "server"), _meta("process_sort_index", s, None, s),
                _meta("thread_name", s, 0, "receiving (pushes)"),
                _meta("thread_name", s, 1, "sending (models)")]
    return out


def _meta(kind: str, pid: int, tid: int | None, value: Any) -> dict[str, Any]:
    key = "sort_index" if kind.endswith("sort_index") else "name"
    return {"name": kind, "ph": "M", "pid": pid, "tid": 0 if tid is None else tid,
            "args": {key: value}}


def _node_events(node: int, blocks: Sequence[Block], detail: bool,
                 window: int) -> list[dict[str, Any]]:
    """A node's timeline: single steps in detail, merged steps as one span (their first step
    inside when ``detail``); ``window`` > 1: that many blocks per span."""
    if window > 1:
        return [_merged(node, blocks[k:k + window]) for k in range(0, len(blocks), window)]
    out = []
    for b in blocks:
        if b.count > 1:
            out.append(_merged(node, [b]))
        if b.count == 1 or detail:
            out += [_x(s, node, 0) for s in b.spans]
    return out


def _merged(node: int, group: Sequence[Block]) -> dict[str, Any]:
    """One span for consecutive blocks: their count, steps and seconds per kind."""
    count = sum(b.count for b in group)
    steps = [b.steps for b in group if b.steps is not None]
    totals = [sum(b.totals[k] for b in group) for k in range(len(KINDS))]
    args: dict[str, Any] = {"count": count}
    if steps:
        args["steps"] = f"{steps[0][0]}-{steps[-1][1]}"
    args.update({f"{kind}_s": v for kind, v in zip(KINDS, totals, strict=True) if v})
    args["same"] = len(group) == 1 and group[0].same
    start, end = group[0].start, group[-1].end
    return {"name": "merged steps", "cat": "steps", "ph": "X", "ts": _us(start),
            "dur": _dur(start, end), "pid": node, "tid": 0, "args": args}


def _x(s: Span, pid: int, tid: int) -> dict[str, Any]:
    args = dict(s.args)
    if s.step is not None:  # a compute span: the node's own step, and the run's if another
        args["step"] = s.step
        if s.run_step is not None and s.run_step != s.step:
            args["run_step"] = s.run_step
    elif s.run_step is not None:
        args["step"] = s.run_step
    return {"name": s.name, "cat": s.kind, "ph": "X", "ts": _us(s.start),
            "dur": _dur(s.start, s.end), "pid": pid, "tid": tid, "args": args}


def _us(t: float) -> float:
    """Seconds as microseconds, to the nanosecond (a trace viewer's resolution): consecutive
    spans meet exactly, and a node's durations add up to its end to within a nanosecond."""
    return round(t * 1e9) / 1000


def _dur(start: float, end: float) -> float:
    return (round(end * 1e9) - round(start * 1e9)) / 1000


def _server_events(spans: Sequence[tuple[int, Span]], server: int,
                   window: int) -> list[dict[str, Any]]:
    """The server's links; ``window`` > 1: that many messages of a link per span."""
    if window == 1:
        return [_x(s, server, link) for link, s in spans]
    out = []
    for link in (0, 1):
        mine = [s for k, s in spans if k == link]
        for k in range(0, len(mine), window):
            group = mine[k:k + window]
            start, end = group[0].start, group[-1].end
            out.append({"name": "messages", "cat": "comm", "ph": "X", "ts": _us(start),
                        "dur": _dur(start, end), "pid": server, "tid": link,
                        "args": {"count": len(group),
                                 "busy_s": sum(s.end - s.start for s in group)}})
    return out


def _flows(log: SpanLog, server: int) -> list[dict[str, Any]]:
    out = []
    for k, f in enumerate(log.flows):
        for ph, (who, tid), t in (("s", f.src, f.src_time), ("f", f.dst, f.dst_time)):
            event = {"name": f.name, "cat": "flow", "ph": ph, "id": k, "ts": _us(t),
                     "pid": server if who == "server" else who, "tid": tid}
            if ph == "f":
                event["bp"] = "e"
            out.append(event)
    return out


def _instant(event: dict[str, Any]) -> dict[str, Any]:
    return {"name": _EVENT_NAMES.get(event["event"], event["event"]), "cat": "world",
            "ph": "i", "s": "t", "ts": _us(float(event["time_s"])), "pid": event["node"],
            "tid": 0, "args": dict(event)}


def _ordered(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Metadata first, then every track in time order (a span before the spans inside it)."""
    meta = [e for e in events if e["ph"] == "M"]
    rest = [e for e in events if e["ph"] != "M"]
    rest.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], -e.get("dur", 0.0)))
    return meta + rest


# -- files ----------------------------------------------------------------------------------------
def write_trace(trace: dict[str, Any], path: str | Path) -> Path:
    """Write ``trace`` as compact JSON (through a temporary file); its path."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(_dumps(trace), encoding="utf-8")
    tmp.replace(path)
    return path


def timeline_links(run_dir: str | Path, root: str | Path) -> str:
    """Markdown links to a run's timeline files that are there (its picture, its trace, a real
    run's trace), relative to ``root`` (a results folder holding ``results.md``); ``""`` if
    none: ``"[timeline](runs/ddp-seed0/timeline.png), [trace](runs/ddp-seed0/trace.json)"``."""
    run_dir, root = Path(run_dir), Path(root)
    out = []
    for label, name in (("timeline", PICTURE_FILE), ("trace", TRACE_FILE),
                        ("real trace", REAL_TRACE_FILE)):
        if (run_dir / name).is_file():
            where = Path(os.path.relpath(run_dir / name, root)).as_posix()
            out.append(f"[{label}]({where})")
    return ", ".join(out)


def read_events(run_dir: str | Path) -> list[dict[str, Any]]:
    """The world's events of a run folder (``events.jsonl``; none: ``[]``)."""
    path = Path(run_dir) / "events.jsonl"
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def trace_meta(strategy: str, num_nodes: int, steps: int, network: str, world: str,
               total_s: float, time_key: str = "sim_time_s") -> dict[str, Any]:
    """What ``otherData["exogym"]`` says of a run (``time_key``: its length's name)."""
    return {"strategy": strategy, "num_nodes": num_nodes, "steps": steps, "network": network,
            "world": world, time_key: total_s}


def rebuild(run_dir: str | Path) -> dict[str, Any]:
    """The Chrome trace of a finished run, from its folder: its clock replayed on its own
    network with span recording on, and its events.

    Raises:
        NotReplayable: an asynchronous run (its trace is recorded while it trains:
            ``fit(trace=True)``, ``exogym run --trace``).
        ValueError: not a finished run with a simulated clock.
    """
    from exogym.run.output.result import read_json

    run_dir = Path(run_dir)
    summary = read_json(run_dir / "summary.json", "RUN_DIR must be a finished run's folder")
    config = read_json(run_dir / "config.json", "RUN_DIR must be a finished run's folder")
    if not summary.get("clock"):
        raise ValueError(f"{run_dir} has no simulated clock (it ran without a network): "
                         "there is no timeline to trace")
    if summary.get("asynchronous"):
        raise NotReplayable(
            f"{run_dir} is a run of {summary['strategy']}, an asynchronous strategy: its clock "
            "cannot be replayed (the event loop timed every push and reply as it ran), so its "
            f"trace is recorded while it trains and {TRACE_FILE} is not in this folder; train "
            "it again with --trace (Python: fit(..., trace=True))")
    try:
        clock = ClockTrace.from_dict(summary["clock"]["trace"])
        net = parse_network(summary["network"]["spec"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{run_dir}/summary.json is not a complete exogym run summary "
                         f"({type(err).__name__}: {err})") from None
    log = SpanLog(clock.num_nodes)
    report = clock.cost(net, spans=log)
    speeds = clock.speeds or net.node_speeds(clock.num_nodes)
    meta = trace_meta(summary["strategy"], clock.num_nodes, clock.steps, net.spec(),
                      str(config.get("world", "perfect")), report.total_s)
    return run_trace(log, read_events(run_dir), node_names(speeds), meta)


# -- a real run -----------------------------------------------------------------------------------
def real_trace(ranks: Sequence[dict[str, Any]], log: Sequence[CommRecord],
               nodes_per_process: int, meta: dict[str, Any]) -> dict[str, Any]:
    """The Chrome trace of a real ``torch.distributed`` run: ``ranks[r]`` is rank ``r``'s
    :meth:`exogym.run.dist.WallSpans.to_dict` (wall-clock seconds since the epoch), ``log`` the
    communicator's records (every rank's is the same). Each rank is a process; each step's
    time outside its real collectives is ``compute`` (forward, backward, the strategy's own
    arithmetic), each real collective ``comm``, named by its record."""
    origin = min((s[1] for r in ranks for s in r["steps"]), default=0.0)
    out: list[dict[str, Any]] = []
    for rank, spans in enumerate(ranks):
        first = rank * nodes_per_process
        ids = node_ranges(range(first, first + nodes_per_process))
        out += [_meta("process_name", rank, None, f"rank {rank} (nodes {ids})"),
                _meta("process_sort_index", rank, None, rank),
                _meta("thread_name", rank, 0, "wall clock")]
        comms = sorted(spans["comms"])
        for step, start, end in spans["steps"]:
            inside = [c for c in comms if start <= c[0] and c[1] <= end]
            at = start
            for c0, c1, k in inside:
                out.append(_wall("compute", "compute", at, c0, rank, origin, {"step": step}))
                rec = log[k] if 0 <= k < len(log) else None
                name = f"{rec.op} {rec.tag}".strip() if rec is not None else "collective"
                args = {"step": step} if rec is None else {
                    "step": step, "op": rec.op, "tag": rec.tag, "bytes": rec.payload_bytes}
                out.append(_wall(name, "comm", c0, c1, rank, origin, args))
                at = c1
            out.append(_wall("compute", "compute", at, end, rank, origin, {"step": step}))
    return {"traceEvents": _ordered([e for e in out if e.get("dur", 1.0) > 0]),
            "displayTimeUnit": "ms",
            "otherData": {"exogym": meta, "time": "wall clock of the real run, in "
                          "microseconds since its first step started", "detail": "full"}}


def _wall(name: str, cat: str, start: float, end: float, rank: int, origin: float,
          args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "cat": cat, "ph": "X", "ts": _us(start - origin),
            "dur": _dur(start - origin, end - origin), "pid": rank, "tid": 0, "args": args}
