"""A federated system's transfers (``topology="server"``, :class:`exogym.sim.network.Network`):
every node sends to and receives from a server only, over its own uplink and downlink. The rules
of :class:`exogym.sim.clock.SimClock` for collectives, a point-to-point transfer (a seat's new
client downloads the state it needs from the server) and an asynchronous method's pushes and
replies, on the clock's own per-node times and links.

The server's link is no bottleneck by default (as FLSim and FedScale price a client's round: its
compute, its upload, its download): each transfer takes ``8S / (efficiency * link_i)`` over its
node's link. With a rate (``Network.server_bps``) the server's link is full duplex, its two
directions independent (uploads share its ingress, downloads its egress), and shared as TCP
flows share a bottleneck (:mod:`exogym.sim.sharing`): processor sharing with per-flow caps, at
every instant each transfer in flight at ``min(efficiency * link_i, its max-min fair share of
efficiency * server_bps)``, recomputed whenever one starts or finishes. Which transfers share:

- those priced together share max-min fairly: one round's uploads (:func:`server_round`), one
  round's downloads, the asynchronous pushes in flight (:func:`serve_to_server`, exactly,
  whenever each was made);
- a transfer priced later (the next round, a seat's join, an asynchronous reply) takes the rate
  that those priced before it leave, which keep theirs: the clock has already committed their
  times, and no transfer changes what happened before it started, so a later one never slows
  an earlier one (as a server sending first come, first served would).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from exogym.sim.comm import CommRecord
from exogym.sim.sharing import Flow, Step, add_steps, prune_steps, share_link

if TYPE_CHECKING:
    from exogym.sim.clock import SimClock

__all__ = ["ServerLink", "from_server", "serve_to_server", "server_round", "to_server",
           "upload_arrivals"]


class ServerLink:
    """What a server's link with a rate remembers between the clock's calls: the rate the
    transfers priced so far take over time, into the server (``load[0]``) and out of it
    (``load[1]``), and how far each asynchronous push in flight has got (``pushes``: push
    number -> ``(from, bits left)``)."""

    def __init__(self) -> None:
        self.load: list[list[Step]] = [[(-math.inf, 0.0)], [(-math.inf, 0.0)]]
        self.pushes: dict[int, tuple[float, float]] = {}

    def state_dict(self) -> dict[str, Any]:
        return {"load": [[list(s) for s in way] for way in self.load],
                "pushes": [[k, *v] for k, v in self.pushes.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load = [[(float(t), float(v)) for t, v in way] for way in state["load"]]
        self.pushes = {int(k): (float(t), float(b)) for k, t, b in state["pushes"]}


def to_server(clock: SimClock, node: int, size: float, at: float) -> float:
    """When ``size`` bytes that ``node`` sends from ``at`` reach the server: over the node's
    uplink (from when it is free) and the server's ingress, then one latency."""
    return _transfers(clock, 0, [node], size, [at])[0]


def from_server(clock: SimClock, node: int, size: float, at: float, *,
                forget: bool = True) -> float:
    """When ``size`` bytes the server sends ``node`` from ``at`` have arrived, over the
    server's egress and the node's downlink (from when it is free), then one latency.
    ``forget=False``: keep all the server's link remembers (a seat's join, whose two clients
    show the clock times earlier than the nodes', :func:`_share`)."""
    return _transfers(clock, 1, [node], size, [at], forget=forget)[0]


def upload_arrivals(clock: SimClock, nodes: Sequence[int], size: float) -> list[float]:
    """When each of ``nodes``' uploads of ``size`` bytes, from when it is done computing, would
    reach the server, priced as :func:`server_round` prices a round's uploads (together, on
    the server's link as it is), nothing committed: a round policy's report times."""
    starts = [max(clock.t[i], clock.link_free[i]) for i in nodes]
    done = _finishes(clock, 0, nodes, size, starts, commit=False)
    return [d + clock.network.message_latency_s for d in done]


def server_round(clock: SimClock, rec: CommRecord, members: Sequence[int]) -> None:
    """A blocking collective through a server: each sender uploads its payload when it is
    done computing, the server has them all at ``A`` (the last arrival), and each member
    downloads the result from ``A``: the reduced payload (an all-reduce), every member's
    (an all-gather), the source's (a broadcast, whose source only uploads). The uploads share
    the server's ingress, the downloads its egress. A member's wait for the last arrival is
    idle; its upload and download are communication."""
    size = rec.payload_bytes
    senders = [rec.src if rec.src >= 0 else members[0]] if rec.op == "broadcast" else members
    arrived = dict(zip(senders, _transfers(clock, 0, senders, size,
                                           [clock.t[i] for i in senders]), strict=True))
    released = max(arrived.values())
    back = size * len(members) if rec.op == "all_gather" else size
    takers = [i for i in members if not (rec.op == "broadcast" and i in arrived)]
    ends = dict(zip(takers, _transfers(clock, 1, takers, back, [
        max(released, arrived.get(i, clock.t[i])) for i in takers]), strict=True))
    name = f"{rec.op} {rec.tag}".strip()
    for i in members:
        got = arrived.get(i, clock.t[i])
        end = ends.get(i, got)
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
    """:meth:`serve_pushes` with a server: each push travels over its node's own uplink
    (and, with a rate, the server's ingress, :func:`_serve_sharing`), none waiting for
    another's; those that arrive no later than ``until`` are served in the order they arrive
    (ties in push order), each arrival lowering the bound in turn."""
    net = clock.network
    if net.server_bps is not None:
        return _serve_sharing(clock, until, final)
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


def _serve_sharing(clock: SimClock, until: float, final: bool) -> list[tuple[int, float]]:
    """The queued pushes sharing the server's ingress, exactly: a push not yet made starts no
    earlier than ``until`` (:meth:`serve_pushes`' bound), so it changes nothing before then.
    The pushes are shared until the first of them finishes (served if it arrives by
    ``until``; ties together) or until ``until`` less one latency, whichever comes first; each
    push left keeps how far it got (``ServerLink.pushes``), from which the next call, with
    the pushes made since, goes on. ``final``: every push, to the end."""
    net, queue = clock.network, clock.push_queue
    assert net.server_bps is not None
    lat, progress = net.message_latency_s, clock.server_link.pushes
    flows = [Flow(*progress.get(k, (max(at, clock.link_free[node]), 8 * size)),
                  net.efficiency * clock.up_bps[node]) for at, k, node, size in queue]
    shared = share_link(flows, net.efficiency * net.server_bps,
                        stop=math.inf if final else until - lat, first=not final)
    order = sorted(range(len(queue)), key=lambda j: (shared.finish[j], queue[j][1]))
    served: list[tuple[int, float]] = []
    for j in order:
        at, _, node, _ = queue[j]
        arrival = shared.finish[j] + lat
        if (arrival > until and not final) or arrival == math.inf:  # (not yet through)
            break
        clock.link_free[node] = shared.finish[j]
        if clock.spans is not None:
            clock.spans.flow("push", (node, 0), (at + arrival) / 2, ("server", 0), arrival)
        served.append((node, arrival))
    done = {queue[j][1] for j in order[:len(served)]}
    clock.server_link.pushes = {p[1]: (f.start, f.bits) for p, f in
                                zip(queue, shared.left, strict=True) if p[1] not in done}
    clock.push_queue = [p for p in queue if p[1] not in done]
    return served


def _transfers(clock: SimClock, way: int, nodes: Sequence[int], size: float,
               ats: Sequence[float], *, forget: bool = True) -> list[float]:
    """When each of ``nodes``' transfers of ``size`` bytes, from ``ats``, has arrived: into
    the server over the node's uplink (``way`` 0) or out of it over its downlink (1), from
    when the node's link is free, then one latency. Without a server rate each is alone;
    with one they share the server's link (:func:`_share`)."""
    starts = [max(at, clock.link_free[i]) for i, at in zip(nodes, ats, strict=True)]
    done = _finishes(clock, way, nodes, size, starts, forget=forget)
    for i, d in zip(nodes, done, strict=True):
        clock.link_free[i] = d
    return [d + clock.network.message_latency_s for d in done]


def _finishes(clock: SimClock, way: int, nodes: Sequence[int], size: float,
              starts: Sequence[float], *, forget: bool = True, commit: bool = True
              ) -> list[float]:
    """When each of ``nodes``' transfers of ``size`` bytes, from ``starts``, is through its
    node's link (``way`` 0: up, 1: down) and, with a server rate, the server's (:func:`_share`;
    ``commit``: the rate they take is added to the link's load)."""
    net = clock.network
    links = clock.up_bps if way == 0 else clock.down_bps
    if net.server_bps is None:
        return [s + net.transfer_s(size, links[i], math.inf)
                for i, s in zip(nodes, starts, strict=True)]
    return _share(clock, way, [Flow(s, 8 * size, net.efficiency * links[i])
                               for i, s in zip(nodes, starts, strict=True)], forget, commit)


def _share(clock: SimClock, way: int, flows: Sequence[Flow], forget: bool,
           commit: bool = True) -> list[float]:
    """When each of ``flows`` finishes through the server's link (``way`` 0: in, 1: out),
    sharing it max-min fairly with each other, at the rate the transfers priced before leave
    (they keep theirs); their own rate is then added to what is taken. ``forget``: what ended
    before the earliest node's time is forgotten first, as nothing priced later starts
    before it (but a seat's join: its clients' times are set back while it is priced)."""
    net, link = clock.network, clock.server_link
    assert net.server_bps is not None
    rate = net.efficiency * net.server_bps
    load = prune_steps(link.load[way], min(clock.t)) if forget and commit else link.load[way]
    shared = share_link(flows, [(t, max(rate - used, 0.0)) for t, used in load])
    if commit:
        link.load[way] = add_steps(load, shared.used)
    return shared.finish
