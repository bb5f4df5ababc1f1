"""The simulated wall clock: compute per node per step plus the network time of every collective.

Compute model. One node's training step (forward, backward, optimizer step) takes ``c`` seconds:
priced on a device (the default: the step counted once, :mod:`exogym.sim.flops`, on a profile,
:mod:`exogym.sim.devices`), measured (:mod:`exogym.sim.compute`: the time one node's step takes
on the share of this machine one node is given) or given (``step_time``). Measured compute where
nobody's presence depends on time lags behind the steps: each step's measured ``c`` reaches the
clock at log steps (:meth:`SimClock.compute` with ``seconds``), so each row's time is complete
(on a GPU the steps' host times, which are launch times, are scaled to the wall time of the steps
between two log steps, read after the synchronisation the run makes there: no synchronisation
per step). In a process run every rank measures its own nodes and the ranks exchange the values
at those steps: a slower process is a straggler the others wait for, as in the real run. ``c``
(the report's ``step_time_s``) is the mean; the trace keeps every step's values, so a replay on
the same network gives the same clock. When simulated time steers the run from its first step
(an asynchronous strategy, a world with failures, a deadline), the clock cannot lag: ``c`` is
priced before the run from real training steps (:func:`exogym.sim.compute.
calibrate_step_time`).

Node ``i`` computes at ``network.node_speeds(N)[i]`` times that speed: ``c_i = c / speed_i``.

The clock (:class:`SimClock`). Every node ``i`` has its own clock ``t_i``; each step adds ``c_i``.
Nodes only wait for each other at collectives:

- a blocking collective is a barrier: it starts when the last node arrives, ``b = max_i t_i``
  (node ``i`` is idle ``b - t_i``: the straggler's cost), and when the network is free (one
  collective at a time, in issue order); it takes the network's time ``T`` for it
  (:meth:`exogym.sim.network.Network.collective_time`); every node then continues from its end. So a
  synchronous (DDP) step lasts ``max_i c_i + T``;
- a collective marked ``overlap=True`` (Streaming DiLoCo) starts the same way but nobody waits
  for it: nodes keep computing, and stall only if it is still running when its result is needed.
  The result is needed after the compute of step ``s + W`` if the strategy defines an integer
  ``strategy.overlap_steps`` (``W``; Streaming DiLoCo: its ``tau``), and in any case
  before the next collective with the same tag is issued and at the end of the run. Only the
  part that does not fit under compute is added;
- the run ends when the slowest node is done (the others idle until then).

Every node's time splits exactly into ``compute + communication + idle`` (communication: waiting
on the network, including stalls on overlapped collectives; idle: waiting for slower nodes).
The report gives the means over nodes (equal for identical nodes) and
``utilization = compute / total``.

Given a :class:`~exogym.sim.spans.SpanLog` (``clock.spans``; None by default, at no cost), the
clock records a span wherever it moves a node's time, with the start and length it adds to
that node's split: the run's timeline (:mod:`exogym.run.output.trace`). Recording changes no number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, astuple, dataclass, fields, replace
from typing import Any

from exogym.sim.comm import CommRecord
from exogym.sim.compute import measure_step_time, resolve_step_time
from exogym.sim.network import Network, format_duration, parse_duration, parse_network
from exogym.sim.server import ServerLink, from_server, serve_to_server, server_round
from exogym.sim.spans import SpanLog, node_ranges

# measure_step_time and resolve_step_time are re-exported: the compute model lived here before
# exogym.sim.compute.
__all__ = [
    "ClockReport",
    "ClockTrace",
    "SimClock",
    "decode_comm_log",
    "encode_comm_log",
    "measure_step_time",
    "resolve_step_time",
]


# -- the clock -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClockReport:
    """Simulated time of a run on one network.

    Attributes:
        network: the network's name; ``network_spec`` its spec string.
        step_time_s: ``c``, one node's compute per step at speed 1; ``compute_source`` how it was
            obtained (``measured``, ``given``, ``flops``).
        total_s: simulated wall clock of the whole run.
        compute_s: mean over nodes of each node's compute
            (``compute + comm + idle + down = total`` for every node).
        comm_s: mean over nodes of each node's time waiting on the network.
        idle_s: mean over nodes of each node's time waiting for slower nodes.
        down_s: mean over nodes of each node's time down (a world's failures).
        utilization: ``compute_s / total_s``.
        node_compute_s: each node's compute.
        node_comm_s: each node's time waiting on the network.
        node_idle_s: each node's time waiting for slower nodes.
        node_down_s: each node's time down.
    """

    network: str
    network_spec: str
    step_time_s: float
    compute_source: str
    total_s: float
    compute_s: float
    comm_s: float
    idle_s: float
    utilization: float
    node_compute_s: tuple[float, ...]
    node_comm_s: tuple[float, ...]
    node_idle_s: tuple[float, ...]
    down_s: float = 0.0
    node_down_s: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in fields(self)}

    def line(self) -> str:
        """``"6.2 s = compute 6.1 s + comm 0.1 s + idle 0 s, utilization 98.4%"``."""
        down = f" + down {format_duration(self.down_s)}" if self.down_s else ""
        return (f"{format_duration(self.total_s)} = compute {format_duration(self.compute_s)} "
                f"+ comm {format_duration(self.comm_s)} + idle {format_duration(self.idle_s)}"
                f"{down}, utilization {100 * self.utilization:.1f}%")


@dataclass
class _Pending:
    tag: str
    end: float
    deadline_step: int | None
    members: tuple[int, ...] | None = None  # None: every node


class SimClock:
    """Advances per-node simulated clocks over compute steps and collectives (rules in the
    module docstring). Call :meth:`compute` once per step, then :meth:`collective` for each of
    the step's records in order, and :meth:`finish` at the end.

    Args:
        network: the network (a :class:`Network` or a spec string).
        num_nodes: ``N``.
        step_time_s: ``c``, seconds of one node's step at speed 1.
        overlap_steps: ``W`` for collectives marked ``overlap=True`` (None: until the next
            collective with the same tag, or the end).
        compute_source: recorded in the report.
        speeds: each node's relative compute speed (a world's); None: the network's
            ``node_speeds``.
    """

    def __init__(self, network: Network | str, num_nodes: int, step_time_s: float, *,
                 overlap_steps: int | None = None, compute_source: str = "given",
                 speeds: Sequence[float] | None = None) -> None:
        self.network = parse_network(network)
        if not (math.isfinite(step_time_s) and step_time_s > 0):
            raise ValueError(f"step_time_s must be > 0, got {step_time_s!r}")
        if overlap_steps is not None and overlap_steps < 0:
            raise ValueError(f"overlap_steps must be >= 0 or None, got {overlap_steps!r}")
        self.num_nodes = num_nodes
        self.step_time_s = float(step_time_s)
        self.compute_source = compute_source
        self.overlap_steps = overlap_steps
        if speeds is None:
            speeds = self.network.node_speeds(num_nodes)
        if len(speeds) != num_nodes:
            raise ValueError(f"speeds lists {len(speeds)} nodes, the clock has {num_nodes}")
        self.speeds = [float(v) for v in speeds]
        self.node_step_s = [step_time_s / s for s in speeds]
        self.base_links = self.network.node_bandwidths(num_nodes)  # (up, down) per node
        self.up_bps, self.down_bps = list(self.base_links[0]), list(self.base_links[1])
        self.t = [0.0] * num_nodes
        self.node_compute = [0.0] * num_nodes
        self.node_comm = [0.0] * num_nodes
        self.node_idle = [0.0] * num_nodes
        self.node_down = [0.0] * num_nodes
        # When each node's link is next free: collectives of the same nodes go one at a time;
        # with every node a member (no world) this is one value, the network's.
        self.link_free = [0.0] * num_nodes
        self.last_release = 0.0  # when the last blocking collective let its members go
        # A parameter server's link (asynchronous strategies): when its downlink (pushes in)
        # and uplink (models out) are next free; messages queue on it first come, first served.
        self.server_free = [0.0, 0.0]
        # Pushes waiting for the downlink: (ready time, sequence number, node, bytes).
        self.push_queue: list[tuple[float, int, int, float]] = []
        # topology="server": every transfer between a node and a server, over the node's link
        self.server = self.network.topology == "server"
        self.server_link = ServerLink()  # with a server rate: what its link carries
        self.pushes_queued = 0
        self.pending: list[_Pending] = []
        self._times: dict[tuple[str, int, int], float] = {}
        # Span recording (exogym.sim.spans: the run's trace and picture): None, no cost.
        self.spans: SpanLog | None = None

    def set_step_time(self, step_time_s: float) -> None:
        """``c`` becomes ``step_time_s`` (measured compute: the mean so far) for every node."""
        self.step_time_s = float(step_time_s)
        self.node_step_s = [step_time_s / v for v in self.speeds]

    def set_link(self, node: int, bps: float | None) -> None:
        """Node ``node``'s link runs at ``bps`` up and down from now on (a population's seat
        takes its new client's link); None: the network's."""
        up, down = self.base_links
        self.up_bps[node] = up[node] if bps is None else float(bps)
        self.down_bps[node] = down[node] if bps is None else float(bps)

    def set_speed(self, node: int, speed: float) -> None:
        """Node ``node`` computes at relative ``speed`` from now on (a population's seat takes
        its new client's speed)."""
        self.speeds[node] = float(speed)
        self.node_step_s[node] = self.step_time_s / speed

    @property
    def now(self) -> float:
        """Simulated seconds so far: when the slowest node finished what it was given."""
        return max(self.t)

    def state_dict(self) -> dict[str, Any]:
        """Every node's time and its split, each link's next free time, the last release and
        the overlapped collectives still in flight (the network, step time, speeds and ``W``
        are the run's settings)."""
        return {"t": list(self.t), "node_compute": list(self.node_compute),
                "node_comm": list(self.node_comm), "node_idle": list(self.node_idle),
                "node_down": list(self.node_down), "link_free": list(self.link_free),
                "last_release": self.last_release, "server_free": list(self.server_free),
                "push_queue": [list(p) for p in self.push_queue],
                "pushes_queued": self.pushes_queued, "server_link": self.server_link.state_dict(),
                "pending": [(p.tag, p.end, p.deadline_step, p.members) for p in self.pending],
                **({"spans": self.spans.state_dict()} if self.spans is not None else {})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["t"]) != self.num_nodes:
            raise ValueError(f"the saved clock has {len(state['t'])} nodes, this one "
                             f"{self.num_nodes}")
        for key in ("t", "node_compute", "node_comm", "node_idle", "node_down", "link_free"):
            setattr(self, key, [float(v) for v in state[key]])
        self.last_release = float(state["last_release"])
        self.server_free = [float(v) for v in state.get("server_free", (0.0, 0.0))]
        self.push_queue = [(float(t), int(k), int(i), float(b))
                           for t, k, i, b in state.get("push_queue", ())]
        self.pushes_queued = int(state.get("pushes_queued", 0))
        if "server_link" in state:
            self.server_link.load_state_dict(state["server_link"])
        self.pending = [_Pending(tag, float(end), deadline,
                                 tuple(members) if members is not None else None)
                        for tag, end, deadline, members in state["pending"]]
        if self.spans is not None and "spans" in state:
            self.spans.load_state_dict(state["spans"])

    # -- compute -----------------------------------------------------------------------------
    def compute(self, step: int, active: Sequence[bool] | None = None,
                seconds: Sequence[float] | None = None) -> None:
        """Every node (``active``: those that are True) computes one step (``seconds``: what
        each node's step took at speed 1, measured; None: ``step_time_s``); then overlapped
        results due after it are awaited."""
        for i, c in enumerate(self.node_step_s):
            if active is None or active[i]:
                if seconds is not None:
                    c = seconds[i] / self.speeds[i]
                if self.spans is not None:
                    self.spans.add(i, "compute", self.t[i], self.t[i] + c, "compute",
                                   run_step=step)
                self.t[i] += c
                self.node_compute[i] += c
        due = [p for p in self.pending if p.deadline_step is not None and p.deadline_step <= step]
        for p in due:
            self._await(p)

    def down(self, node: int, until: float) -> None:
        """Node ``node`` is down (a world's failure) from its time until ``until``."""
        if until > self.t[node]:
            if self.spans is not None:
                self.spans.add(node, "down", self.t[node], until, "down")
            self.node_down[node] += until - self.t[node]
            self.t[node] = until
            self.link_free[node] = max(self.link_free[node], until)

    def wait(self, node: int, until: float, why: str = "quorum wait") -> None:
        """Node ``node`` idles until ``until`` (waiting for a quorum, or ``why``)."""
        if until > self.t[node]:
            if self.spans is not None:
                self.spans.add(node, "idle", self.t[node], until, why)
            self.node_idle[node] += until - self.t[node]
            self.t[node] = until

    def arrivals(self, candidates: Sequence[bool], deadline: str | None) -> list[bool]:
        """Which ``candidates`` reach a blocking collective in time under ``deadline``
        (:func:`parse_deadline`): ``"2x"`` cuts a node whose time since the last release is
        more than twice the median of the candidates' (the median is known once half of them
        have arrived, so the rule needs no foresight); ``"30s"``, more than 30 s. None: all."""
        if deadline is None:
            return list(candidates)
        kind, value = parse_deadline(deadline)
        ids = [i for i, c in enumerate(candidates) if c]
        if not ids:
            return list(candidates)
        elapsed = {i: self.t[i] - self.last_release for i in ids}
        if kind == "x":
            ordered = sorted(elapsed.values())
            limit = value * ordered[(len(ordered) - 1) // 2]  # the lower median
        else:
            limit = value
        return [bool(c) and elapsed[i] <= limit * (1 + 1e-12) for i, c in enumerate(candidates)]

    # -- communication -----------------------------------------------------------------------
    def collective_time(self, rec: CommRecord) -> float:
        members = rec.member_ids(self.num_nodes)
        key = (rec.op, rec.payload_bytes, rec.members)
        if key not in self._times:
            if rec.members < 0:
                self._times[key] = self.network.collective_time(
                    rec.op, rec.payload_bytes, self.num_nodes)
            else:
                sub, src = _sub_network(self.network, self.num_nodes, members, rec.src)
                self._times[key] = sub.collective_time(rec.op, rec.payload_bytes, len(members),
                                                       src=src)
        return self._times[key]

    def collective(self, rec: CommRecord) -> None:
        """One record of the log: a collective among its members (blocking, or overlapping if
        ``rec.overlap``), or a point-to-point send."""
        if rec.op == "send":
            self._send(rec)
            return
        if rec.op in ("push", "pull"):
            return  # timed by the run's event loop as it happens (push, reply)
        members = rec.member_ids(self.num_nodes)
        for p in [p for p in self.pending if p.tag == rec.tag]:
            self._await(p)  # its result is applied before the next one with this tag is sent
        if self.server and not rec.overlap:
            server_round(self, rec, members)
            return
        issue = max(self.t[i] for i in members)  # when every member has joined it
        start = max(issue, max(self.link_free[i] for i in members))
        end = start + self.collective_time(rec)
        for i in members:
            self.link_free[i] = end
        if self.spans is not None:
            self._collective_spans(rec, members, issue, start, end)
        if rec.overlap:
            deadline = None if self.overlap_steps is None else rec.step + self.overlap_steps
            pending = _Pending(rec.tag, end, deadline,
                               None if rec.members < 0 else tuple(members))
            self.pending.append(pending)
            if deadline is not None and deadline <= rec.step:  # W = 0: due at once
                self._await(pending)
            return
        for i in members:
            self.node_idle[i] += issue - self.t[i]
            self.node_comm[i] += end - issue
            self.t[i] = end
        self.last_release = end

    def _send(self, rec: CommRecord) -> None:
        """``src`` sends to ``dst``: it starts when both are there and both links are free; the
        receiver waits for it (idle until it starts, comm while it lasts), the sender goes on
        computing. ``src = -1`` (a download from the server, :meth:`Communicator.download`):
        over ``dst``'s downlink alone, from when it is free."""
        src, dst = rec.src, rec.dst
        if self.server:  # the server holds the state since its last release: a download
            start = max(self.last_release, self.t[dst], self.link_free[dst])
            end = from_server(self, dst, rec.payload_bytes, start, forget=False)
            if self.spans is not None:
                self.spans.add(dst, "idle", self.t[dst], start, "waiting for the server",
                               (), rec.step)
                self.spans.add(dst, "comm", start, end, f"download {rec.tag} from the server",
                               (("bytes", rec.payload_bytes), ("tag", rec.tag)), rec.step)
            self.node_idle[dst] += start - self.t[dst]
            self.node_comm[dst] += end - start
            self.t[dst] = end
            return
        ends = [dst] if src < 0 else [src, dst]  # src < 0: the server's state, re-costed
        start = max(max(self.t[i], self.link_free[i]) for i in ends)  # among peers: dst's link
        net = self.network
        up = math.inf if src < 0 else self.up_bps[src]
        end = start + (net.transfer_s(rec.payload_bytes, up, self.down_bps[dst])
                       + net.message_latency_s)
        for i in ends:
            self.link_free[i] = end
        if self.spans is not None:
            who = "the server" if src < 0 else f"node {src}"
            name = (f"recovery from {who}" if rec.tag == "recovery"
                    else f"receive {rec.tag} from {who}")
            self.spans.add(dst, "idle", self.t[dst], start, "waiting to receive",
                           (("from", src),), rec.step)
            self.spans.add(dst, "comm", start, end, name,
                           (("bytes", rec.payload_bytes), ("tag", rec.tag)), rec.step)
            if src >= 0:
                self.spans.flow(f"send {rec.tag}", (src, 0), start, (dst, 0), (start + end) / 2)
        self.node_idle[dst] += start - self.t[dst]
        self.node_comm[dst] += end - start
        self.t[dst] = end

    def push(self, node: int, payload_bytes: float) -> None:
        """Node ``node`` sends ``payload_bytes`` to the parameter server, ready at its own time
        (its clock does not move: it waits for the reply, :meth:`reply`). The push queues for
        the server's downlink; :meth:`serve_pushes` says when it arrives."""
        self.push_queue.append((self.t[node], self.pushes_queued, node, float(payload_bytes)))
        self.pushes_queued += 1

    def serve_pushes(self, until: float, *, final: bool = False) -> list[tuple[int, float]]:
        """Serve the queued pushes that can no longer be preceded: ``[(node, arrival time)]``
        in service order. The server's downlink serves pushes first come, first served in
        simulated time (by the time each was ready, ties in push order), one at a time; each
        transfer takes ``8S / (eff * min(up_node, down_server))`` (the server's link has the
        network's base bandwidths) from when both the downlink and the node's uplink are free,
        then one latency.

        ``until`` is the earliest time at which a push not yet made could be ready: the
        earliest clock of the nodes free to compute and the earliest arrival in flight (a node
        waiting for the server computes again only after its own push has arrived). A push
        ready no later than that is served; each arrival served lowers the bound in turn.
        ``final``: no push follows (the run's end): every queued push is served."""
        if self.server:
            return serve_to_server(self, until, final)
        net = self.network
        self.push_queue.sort()
        served = []
        while self.push_queue and self.push_queue[0][0] <= until:
            at, _, node, size = self.push_queue.pop(0)
            start = max(at, self.link_free[node], self.server_free[0])
            done = start + net.transfer_s(size, self.up_bps[node], net.down_bps or net.up_bps)
            self.link_free[node] = self.server_free[0] = done
            arrival = done + net.message_latency_s
            if self.spans is not None:
                self.spans.link(0, start, done, f"push from node {node}", (("bytes", size),))
                self.spans.flow("push", (node, 0), (at + arrival) / 2, ("server", 0),
                                (start + done) / 2)
            served.append((node, arrival))
            if not final:
                until = min(until, arrival)
        return served

    def reply(self, node: int, payload_bytes: float, at: float) -> None:
        """The server sends ``payload_bytes`` (the model) to ``node`` from time ``at``, through
        its uplink (one message at a time, first come, first served); the node, waiting since
        its push, continues when it has arrived (its wait counts as communication)."""
        net = self.network
        if self.server:
            start = max(at, self.link_free[node])
            end = from_server(self, node, payload_bytes, start)
            done = end - net.message_latency_s
        else:
            start = max(at, self.server_free[1], self.link_free[node])
            done = start + net.transfer_s(payload_bytes, net.up_bps, self.down_bps[node])
            self.link_free[node] = self.server_free[1] = done
            end = done + net.message_latency_s
        if self.spans is not None:
            self._reply_spans(node, payload_bytes, at, start, done, end)
        if end > self.t[node]:
            self.node_comm[node] += end - self.t[node]
            self.t[node] = end

    def _collective_spans(self, rec: CommRecord, members: Sequence[int], issue: float,
                          start: float, end: float) -> None:
        """The spans of a collective: each member's straggler wait (until the last of them
        arrived: whom it waited for) and its wait for a busy link, then the collective itself
        (blocking: on the member's timeline; overlapped: on its network lane)."""
        assert self.spans is not None
        args: tuple[tuple[str, Any], ...] = (
            ("op", rec.op), ("tag", rec.tag), ("bytes", rec.payload_bytes),
            ("members", "all" if rec.members < 0 else node_ranges(members)))
        if rec.codec:
            args += (("codec", rec.codec),)
        name = f"{rec.op} {rec.tag}".strip()
        if rec.overlap:
            for i in members:
                self.spans.lane(i, start, end, f"{name} (overlapped)", args)
            return
        last = (("waited_for", node_ranges([i for i in members if self.t[i] == issue])),)
        for i in members:
            self.spans.add(i, "idle", self.t[i], issue, "straggler wait", last, rec.step)
            self.spans.add(i, "comm", issue, start, "waiting for the link", (), rec.step)
            self.spans.add(i, "comm", start, end, name, args, rec.step)

    def _reply_spans(self, node: int, payload_bytes: float, at: float, start: float,
                     done: float, end: float) -> None:
        """An asynchronous node's wait for the server: its push until it arrived (``at``),
        then the pull of the model; the model on the server's sending link."""
        assert self.spans is not None
        t = self.t[node]
        mid = min(max(at, t), end)
        self.spans.add(node, "comm", t, mid, "push (until it reached the server)")
        self.spans.add(node, "comm", mid, end, "pull", (("bytes", payload_bytes),))
        self.spans.link(1, start, done, f"model to node {node}", (("bytes", payload_bytes),))
        self.spans.flow("pull", ("server", 1), (start + done) / 2, (node, 0), (mid + end) / 2)

    def _await(self, p: _Pending) -> None:
        for i in (range(self.num_nodes) if p.members is None else p.members):
            if p.end > self.t[i]:
                if self.spans is not None:
                    self.spans.add(i, "comm", self.t[i], p.end, f"waiting for overlapped {p.tag}")
                self.node_comm[i] += p.end - self.t[i]
                self.t[i] = p.end
        self.pending.remove(p)

    def finish(self, down: Sequence[int] = ()) -> ClockReport:
        """Await every overlapped collective, let every node reach the slowest; the report.
        ``down``: nodes down at the end of the run (failed, never back): their wait for the
        slowest is down time, not idle."""
        for p in list(self.pending):
            self._await(p)
        total = max(self.t)
        for i in range(self.num_nodes):
            if i in down:
                self.down(i, total)
                continue
            if self.spans is not None:
                self.spans.add(i, "idle", self.t[i], total, "end of run: waiting for the slowest")
            self.node_idle[i] += total - self.t[i]
            self.t[i] = total
        if self.spans is not None:
            self.spans.finish()
        n = self.num_nodes
        compute = sum(self.node_compute) / n
        return ClockReport(
            network=self.network.name, network_spec=self.network.spec(),
            step_time_s=self.step_time_s, compute_source=self.compute_source, total_s=total,
            compute_s=compute, comm_s=sum(self.node_comm) / n, idle_s=sum(self.node_idle) / n,
            utilization=compute / total if total > 0 else float("nan"),
            node_compute_s=tuple(self.node_compute), node_comm_s=tuple(self.node_comm),
            node_idle_s=tuple(self.node_idle), down_s=sum(self.node_down) / n,
            node_down_s=tuple(self.node_down),
        )


def parse_deadline(text: str) -> tuple[str, float]:
    """A straggler deadline: ``"2x"`` (a multiple of the median time since the last
    synchronisation) -> ``("x", 2.0)``; ``"30s"`` (a duration) -> ``("s", 30.0)``.

    Raises:
        ValueError: anything else, saying what is allowed.
    """
    raw = text.strip() if isinstance(text, str) else ""
    if raw.endswith("x"):
        try:
            value = float(raw[:-1])
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 1.0:
            return "x", value
        raise ValueError(f"deadline {text!r}: a multiple of the median arrival must be a number "
                         ">= 1 followed by x, e.g. 1.5x")
    try:
        seconds = parse_duration(raw)
    except ValueError:
        seconds = math.nan
    if math.isfinite(seconds) and seconds > 0:
        return "s", seconds
    if seconds == 0:  # a deadline at the synchronisation itself would cut every node
        raise ValueError(f"deadline {text!r}: a duration must be above zero (e.g. 30s); or give "
                         "a multiple of the median arrival, >= 1 (e.g. 2x)")
    raise ValueError(f"deadline {text!r}: give a multiple of the median arrival, a number >= 1 "
                     "followed by x (e.g. 2x), or a finite duration above zero after the last "
                     "synchronisation (e.g. 30s)")


def _sub_network(network: Network, num_nodes: int, members: Sequence[int],
                 src: int) -> tuple[Network, int]:
    """The network restricted to the links of ``members`` (a collective among them only) and
    the source's position among them (0 if none)."""
    up, down = network.node_bandwidths(num_nodes)
    sub = replace(network, node_up_bps=tuple(up[i] for i in members),
                  node_down_bps=tuple(down[i] for i in members), bw_sigma=0.0,
                  node_speed=None, speed_sigma=0.0)
    return sub, members.index(src) if src in members else 0


# -- what a run records, to re-cost it ------------------------------------------------------------
def encode_comm_log(records: Iterable[CommRecord]) -> list[dict[str, Any]]:
    """The log, compressed for ``summary.json`` without losing order: the records of each step
    form a pattern, and a run of steps ``first_step + k * every`` (``k < count``) with the same
    pattern is one block. A DDP or DiLoCo run is one block."""
    groups: list[tuple[int, list[dict[str, Any]]]] = []
    for rec in records:
        item = asdict(rec)
        step = item.pop("step")
        if groups and groups[-1][0] == step:
            groups[-1][1].append(item)
        else:
            groups.append((step, [item]))
    blocks: list[dict[str, Any]] = []
    for step, pattern in groups:
        last = blocks[-1] if blocks else None
        if last is not None and last["records"] == pattern:
            prev = last["first_step"] + (last["count"] - 1) * last["every"]
            if last["count"] == 1:
                last["every"] = step - prev
            if step - prev == last["every"]:
                last["count"] += 1
                continue
        blocks.append({"first_step": step, "every": 1, "count": 1, "records": pattern})
    return blocks


def decode_comm_log(blocks: Sequence[dict[str, Any]]) -> list[CommRecord]:
    """The inverse of :func:`encode_comm_log` (fields unknown to :class:`CommRecord` dropped)."""
    known = {f.name for f in fields(CommRecord)}
    out = []
    for block in blocks:
        for k in range(block["count"]):
            step = block["first_step"] + k * block["every"]
            for item in block["records"]:
                out.append(CommRecord(**{key: v for key, v in item.items() if key in known},
                                      step=step))
    return out


def node_processes(num_nodes: int, processes: int) -> tuple[int, ...]:
    """Each node's process when ``num_nodes`` are split evenly over ``processes``, in order."""
    per = num_nodes // processes
    return tuple(i // per for i in range(num_nodes))


@dataclass(frozen=True)
class ClockTrace:
    """What re-costing a run needs: its shape, compute time per step and collectives.

    Attributes:
        num_nodes: the run's ``N``.
        steps: the run's steps.
        step_time_s: ``c`` of the run; ``compute_source`` how it was obtained.
        overlap_steps: ``W`` of overlapped collectives (None: until the next with the same tag).
        records: the communicator's log, in order.
        speeds: the nodes' compute speeds (a world's), None: the network's.
        ops: the clock's operations in order, for a run in a world with absent nodes
            (``["c", step, active bits]`` compute, ``["r", k]`` record ``k``, ``["n", node, up
            bits]`` a node back at a step (its clock jumps to the up nodes'), ``["d", node,
            until]`` down until a time, ``["w", node, until]`` waiting for a quorum, ``["e",
            node]`` down at the end of the run); None: every node computed every step.
        not_recostable: why this run cannot be re-costed on another network (its world decided
            who took part by simulated time), or None.
        step_seconds: measured compute: per step, the seconds of a node's step on each process
            (one value in a one-process run; the nodes are split evenly over the processes, in
            order: :attr:`node_process`). None: every step took ``step_time_s`` (priced on a
            device, given, or priced before the run).
        compute_method: how the step was priced (None: given).
    """

    num_nodes: int
    steps: int
    step_time_s: float
    compute_source: str
    overlap_steps: int | None
    records: tuple[CommRecord, ...]
    speeds: tuple[float, ...] | None = None
    ops: tuple[tuple[Any, ...], ...] | None = None
    not_recostable: str | None = None
    step_seconds: tuple[tuple[float, ...], ...] | None = None
    compute_method: str | None = None

    @property
    def node_process(self) -> tuple[int, ...] | None:
        """Node ``i``'s process in a run with measured compute (None: no measured compute)."""
        if not self.step_seconds:
            return None
        return node_processes(self.num_nodes, len(self.step_seconds[0]))

    def seconds(self, step: int) -> list[float] | None:
        """Each node's measured compute at ``step`` (None: ``step_time_s``)."""
        if self.step_seconds is None:
            return None
        row = self.step_seconds[step]
        return [row[r] for r in node_processes(self.num_nodes, len(row))]

    def cost(self, network: Network | str, step_time_s: float | None = None,
             spans: SpanLog | None = None) -> ClockReport:
        """Replay the run on ``network`` (optionally with another compute time per step);
        ``spans``: the replayed clock records its spans there (its timeline).

        Raises:
            ValueError: the run cannot be re-costed (:attr:`not_recostable`) on another network;
                or it is asynchronous: its clock was its event loop's (when each push arrived),
                which the recorded collectives do not replay, on any network.
        """
        if any(r.op in ("push", "pull") for r in self.records):
            raise ValueError(f"an asynchronous run's clock cannot be replayed, on its own network "
                             f"or another: {self.not_recostable or 'its event loop decided it'};"
                             " its report is the run's own (summary.json, result.clock)")
        net = parse_network(network)
        clock = SimClock(net, self.num_nodes,
                         self.step_time_s if step_time_s is None else step_time_s,
                         overlap_steps=self.overlap_steps,
                         compute_source=self.compute_source if step_time_s is None else "given",
                         speeds=self.speeds)
        clock.spans = spans
        if self.ops is not None:
            return self._replay(clock)
        records = sorted(self.records, key=lambda r: r.step)  # stable: keeps order in a step
        k = 0
        while k < len(records) and records[k].step < 0:  # before the first step (set-up)
            clock.collective(records[k])
            k += 1
        for step in range(self.steps):
            clock.compute(step, None, self.seconds(step) if step_time_s is None else None)
            while k < len(records) and records[k].step <= step:
                clock.collective(records[k])
                k += 1
        for rec in records[k:]:
            clock.collective(rec)
        return clock.finish()

    def _replay(self, clock: SimClock) -> ClockReport:
        """The recorded clock operations of a run with absent nodes, on another network."""
        n = self.num_nodes

        def flags(bits: int) -> list[bool]:
            return [bool(bits >> i & 1) for i in range(n)]

        assert self.ops is not None
        down_at_end: list[int] = []
        for op in self.ops:
            kind = op[0]
            if kind == "e":  # down at the end of the run
                down_at_end.append(int(op[1]))
            elif kind == "r":
                clock.collective(self.records[int(op[1])])
            elif kind == "c":
                clock.compute(int(op[1]), flags(int(op[2])))
            elif kind == "n":
                up = flags(int(op[2]))
                clock.down(int(op[1]), max([clock.t[int(op[1])]] +
                                           [clock.t[j] for j in range(n) if up[j]]))
            elif kind == "d":
                clock.down(int(op[1]), float(op[2]))
            elif kind == "w":
                clock.wait(int(op[1]), float(op[2]))
            else:
                raise ValueError(f"unknown clock operation {op!r}")
        return clock.finish(down_at_end)

    def check_recostable(self, network: Network) -> None:
        """Raise ValueError if the run cannot be re-costed on ``network`` (another than its
        own): its world decided by simulated time who was up or late."""
        if self.not_recostable is not None:
            raise ValueError(f"this run cannot be re-costed on another network: "
                             f"{self.not_recostable}; train it again with --network "
                             f"{network.spec()}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "num_nodes": self.num_nodes, "steps": self.steps, "step_time_s": self.step_time_s,
            "compute_source": self.compute_source, "overlap_steps": self.overlap_steps,
            "comm": encode_comm_log(self.records)}
        if self.speeds is not None:
            out["speeds"] = list(self.speeds)
        if self.ops is not None:
            out["ops"] = [list(op) for op in self.ops]
            out["records"] = [list(astuple(r)) for r in self.records]
        if self.not_recostable is not None:
            out["not_recostable"] = self.not_recostable
        if self.step_seconds is not None:
            out["step_seconds"] = [list(row) for row in self.step_seconds]
        if self.compute_method is not None:
            out["compute_method"] = self.compute_method
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClockTrace:
        ops = data.get("ops")
        records = (tuple(CommRecord(*r) for r in data["records"]) if ops is not None
                   else tuple(decode_comm_log(data["comm"])))
        return cls(num_nodes=int(data["num_nodes"]), steps=int(data["steps"]),
                   step_time_s=float(data["step_time_s"]),
                   compute_source=str(data["compute_source"]),
                   overlap_steps=data["overlap_steps"], records=records,
                   speeds=tuple(data["speeds"]) if data.get("speeds") is not None else None,
                   ops=tuple(tuple(op) for op in ops) if ops is not None else None,
                   not_recostable=data.get("not_recostable"),
                   step_seconds=(tuple(tuple(float(v) for v in row)
                                       for row in data["step_seconds"])
                                 if data.get("step_seconds") is not None else None),
                   compute_method=data.get("compute_method"))
