"""A federated system's topology (``topology=server``): every transfer between a node and a
server over the node's own links, the server's no bottleneck; times worked by hand."""

from __future__ import annotations

import pytest

from exogym.sim.clock import SimClock
from exogym.sim.comm import CommRecord
from exogym.sim.network import parse_network

# payload rates exactly the links' (efficiency 1), one 10 ms latency per message, no hop cost
LINKS = ("bw=10Mbps,latency=10ms,efficiency=1,hop_latency=0s,node_up=10Mbps:20Mbps:40Mbps,"
         "node_down=40Mbps:20Mbps:10Mbps")
MB = 1_000_000  # 8 Mbit: 0.8 s at 10 Mbit/s, 0.4 s at 20, 0.2 s at 40


def _clock(topology: str = "server") -> SimClock:
    # nodes computing 1, 1.5 and 2 s: step time 1 s at speeds 1, 2/3, 1/2
    clock = SimClock(parse_network(f"{LINKS},topology={topology}"), 3, 1.0,
                     speeds=(1.0, 1 / 1.5, 0.5))
    clock.compute(0)
    return clock


def test_a_round_through_the_server_by_hand() -> None:
    clock = _clock()
    clock.collective(CommRecord("all_reduce", MB, 0, "grads"))
    # uploads: 1 + 0.8 + 0.01 = 1.81, 1.5 + 0.4 + 0.01 = 1.91, 2 + 0.2 + 0.01 = 2.21: the
    # server has them all at 2.21; downloads from then: + 0.2, 0.4, 0.8 (+ 0.01)
    assert clock.t == pytest.approx([2.42, 2.62, 3.02])
    assert clock.node_idle == pytest.approx([0.4, 0.3, 0.0])  # waiting for the last upload
    assert clock.node_comm == pytest.approx([0.81 + 0.21, 0.41 + 0.41, 0.21 + 0.81])
    assert clock.last_release == pytest.approx(2.21)
    for i in range(3):  # every node's time splits exactly
        assert clock.node_compute[i] + clock.node_comm[i] + clock.node_idle[i] == \
            pytest.approx(clock.t[i])


def test_peers_run_the_same_round_as_a_ring() -> None:
    clock = _clock("peer")
    clock.collective(CommRecord("all_reduce", MB, 0, "grads"))
    # the ring's slowest link (10 Mbit/s) sets every step: 2 (N - 1) (8S / N B + L) after the
    # last node (2 s)
    ring = 2 * 2 * (8 * MB / 3 / 10e6 + 0.01)
    assert clock.t == pytest.approx([2 + ring] * 3)


def test_an_all_gather_and_a_broadcast_through_the_server() -> None:
    clock = _clock()
    clock.collective(CommRecord("all_gather", MB, 0, "sparse"))
    # uploads as a round's; each downloads every member's payload, 3 MB: 0.6, 1.2, 2.4 s
    assert clock.t == pytest.approx([2.21 + 0.61, 2.21 + 1.21, 2.21 + 2.41])
    clock = _clock()
    clock.collective(CommRecord("broadcast", MB, 0, "model", src=1))
    # node 1 uploads (1.5 + 0.4 + 0.01 = 1.91) and goes on; nodes 0 and 2 download from then,
    # node 2 once it is done computing (2 s)
    assert clock.t == pytest.approx([1.91 + 0.21, 1.91, 2 + 0.81])
    assert clock.node_idle == pytest.approx([0.91, 0.0, 0.0])


def test_a_seat_downloads_its_new_client_state_from_the_server() -> None:
    clock = _clock()
    clock.collective(CommRecord("send", MB, 0, "join", src=0, dst=2))
    # node 2, done at 2 s, downloads over its 10 Mbit/s downlink; node 0 is not involved
    assert clock.t == pytest.approx([1.0, 1.5, 2.81])
    assert clock.node_comm == pytest.approx([0.0, 0.0, 0.81])


def test_a_join_downloads_from_the_server_s_last_release() -> None:
    """The server holds the state since its last release (2.21 s, the round above): a new
    client there at 1 s starts its download then, not when the donor (node 0, 2.42 s) is."""
    clock = _clock()
    clock.collective(CommRecord("all_reduce", MB, 0, "grads"))
    clock.t[2] = clock.link_free[2] = 1.0  # a new client in seat 2, there since 1 s
    clock.collective(CommRecord("send", MB, 1, "join", src=0, dst=2))
    assert clock.t[2] == pytest.approx(2.21 + 0.8 + 0.01)  # its 10 Mbit/s downlink


def test_pushes_to_a_server_do_not_queue_behind_each_other() -> None:
    legacy, server = _clock("peer"), _clock()
    for clock in (legacy, server):
        clock.push(0, MB)  # ready at 1 s
        clock.push(1, MB)  # ready at 1.5 s
    # peers' parameter server: one link of the network's base rate (10 Mbit/s), first come
    # first served: 1 + 0.8 + 0.01, then from 1.8: + 0.8 + 0.01
    assert legacy.serve_pushes(10.0, final=True) == [(0, pytest.approx(1.81)),
                                                     (1, pytest.approx(2.61))]
    # a server: each over its own uplink, in arrival order
    assert server.serve_pushes(10.0, final=True) == [(0, pytest.approx(1.81)),
                                                     (1, pytest.approx(1.91))]
    server.reply(0, MB, 1.81)  # over node 0's 40 Mbit/s downlink
    assert server.t[0] == pytest.approx(1.81 + 0.21)


def test_a_push_is_served_only_when_nothing_can_arrive_before_it() -> None:
    clock = _clock()
    clock.push(0, MB)  # arrives at 1.81
    assert clock.serve_pushes(1.5) == []  # another node may still push before it arrives
    assert clock.serve_pushes(1.9) == [(0, pytest.approx(1.81))]
    assert clock.push_queue == []


def test_the_topology_is_a_network_setting() -> None:
    net = parse_network("home-100mbps,topology=server")
    assert net.topology == "server" and "topology=server" in net.spec()
    assert "a server" in net.describe()
    assert parse_network("home-100mbps").topology is None  # the run decides
    with pytest.raises(ValueError, match=r"topology must be one of \('peer', 'server'\)"):
        parse_network("home-100mbps,topology=star")


def test_a_population_goes_through_a_server_by_default() -> None:
    from support.runs import client_run

    from exogym.strategy import make

    r = client_run(make("fedavg", H=3), nodes=40, participation=4, clients_in_memory="round")
    assert r.network is not None and r.network.topology == "server"
    # each client of a round uploads its payload and downloads the result: the same bytes
    payload = r.comm_log[0].payload_bytes
    assert r.comm_log[0].op == "all_reduce"
    trained = [c for c in range(40) if r.bytes_sent[c] > 0]
    assert all(r.bytes_sent[c] % payload == 0 for c in trained)


def test_a_population_through_a_server_trains_the_same_numbers() -> None:
    from support.runs import client_run

    from exogym.strategy import make

    runs = {topology: client_run(make("fedavg", H=3), nodes=40, participation=4,
                                 clients_in_memory="round",
                                 network=f"home-100mbps,topology={topology}")
            for topology in ("peer", "server")}
    peer, server = runs["peer"], runs["server"]
    # the clock changes no training number in a perfect world
    assert [r["train_loss"] for r in peer.history] == [r["train_loss"] for r in server.history]
    assert peer.final == server.final
    # 4 clients a round over 100 Mbit/s, 20 ms: a ring pays 2 (K - 1) latencies per all-reduce,
    # a server 2 (an upload, a download)
    assert server.clock.comm_s < peer.clock.comm_s
    assert server.network is not None and server.network.topology == "server"


def test_bytes_through_a_server_are_each_members_upload_and_download() -> None:
    from exogym.sim.comm import server_bytes

    # members 0 and 2 of 3 (mask 0b101)
    assert server_bytes("all_reduce", 100, 3, 0b101) == ([100.0, 0.0, 100.0],
                                                         [100.0, 0.0, 100.0])
    assert server_bytes("all_gather", 100, 3) == ([100.0] * 3, [300.0] * 3)
    assert server_bytes("broadcast", 100, 3, -1, 1) == ([0.0, 100.0, 0.0], [100.0, 0.0, 100.0])
