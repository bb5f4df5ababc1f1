"""A federated system's transfers (``topology="server"``, :class:`exogym.sim.network.Network`):
every node sends to and receives from a server only, over its own uplink and downlink, and the
server's link is no bottleneck (as FLSim and FedScale price a client's round: its compute, its
upload, its download). The rules of :class:`exogym.sim.clock.SimClock` for collectives, a
point-to-point transfer (a seat's new client downloads the state it needs from the server) and
an asynchronous method's pushes and replies, on the clock's own per-node times and links."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from exogym.sim.comm import CommRecord

if TYPE_CHECKING:
    from exogym.sim.clock import SimClock

__all__ = ["from_server", "serve_to_server", "server_round", "to_server"]


def to_server(clock: SimClock, node: int, size: float, at: float) -> float:
    """When ``size`` bytes that ``node`` sends from ``at`` reach the server: over the node's
    uplink (from when it is free; the server's link is no bottleneck), then one latency."""
    net = clock.network
    start = max(at, clock.link_free[node])
    done = start + net.transfer_s(size, clock.up_bps[node], math.inf)
    clock.link_free[node] = done
    return done + net.message_latency_s


def from_server(clock: SimClock, node: int, size: float, at: float) -> float:
    """When ``size`` bytes the server sends ``node`` from ``at`` have arrived, over the node's
    downlink (from when it is free), then one latency."""
    net = clock.network
    start = max(at, clock.link_free[node])
    done = start + net.transfer_s(size, math.inf, clock.down_bps[node])
    clock.link_free[node] = done
    return done + net.message_latency_s


def server_round(clock: SimClock, rec: CommRecord, members: Sequence[int]) -> None:
    """A blocking collective through a server: each sender uploads its payload when it is
    done computing, the server has them all at ``A`` (the last arrival), and each member
    downloads the result from ``A``: the reduced payload (an all-reduce), every member's
    (an all-gather), the source's (a broadcast, whose source only uploads). A member's wait
    for the last arrival is idle; its upload and download are communication."""
    size = rec.payload_bytes
    senders = [rec.src if rec.src >= 0 else members[0]] if rec.op == "broadcast" else members
    arrived = {i: to_server(clock, i, size, clock.t[i]) for i in senders}
    released = max(arrived.values())
    back = size * len(members) if rec.op == "all_gather" else size
    name = f"{rec.op} {rec.tag}".strip()
    for i in members:
        got = arrived.get(i, clock.t[i])
        end = (got if rec.op == "broadcast" and i in arrived
               else from_server(clock, i, back, max(released, got)))
        wait = max(released - got, 0.0)
        if clock.spans is not None:
            clock.spans.add(i, "comm", clock.t[i], got, f"upload {name}", (), rec.step)
            clock.spans.add(i, "idle", got, got + wait, "waiting for the round", (), rec.step)
            clock.spans.add(i, "comm", got + wait, end, f"download {name}",
                           (("bytes", back),), rec.step)
        clock.node_idle[i] += wait
        clock.node_comm[i] += end - clock.t[i] - wait
        clock.t[i] = end
    clock.last_release = released


def serve_to_server(clock: SimClock, until: float, final: bool) -> list[tuple[int, float]]:
    """:meth:`serve_pushes` with a server: each push travels over its node's own uplink,
    none waits for another's; those that arrive no later than ``until`` are served in the
    order they arrive (ties in push order), each arrival lowering the bound in turn."""
    net = clock.network
    arrivals = []
    for at, k, node, size in clock.push_queue:
        start = max(at, clock.link_free[node])
        done = start + net.transfer_s(size, clock.up_bps[node], math.inf)
        arrivals.append((done + net.message_latency_s, k, node, at))
    arrivals.sort()
    served, left = [], {k for _, k, *_ in arrivals}
    for arrival, k, node, at in arrivals:
        if arrival > until and not final:
            break
        clock.link_free[node] = arrival - net.message_latency_s
        if clock.spans is not None:
            clock.spans.flow("push", (node, 0), (at + arrival) / 2, ("server", 0), arrival)
        served.append((node, arrival))
        left.discard(k)
        if not final:
            until = min(until, arrival)
    clock.push_queue = [p for p in clock.push_queue if p[1] in left]
    return served
