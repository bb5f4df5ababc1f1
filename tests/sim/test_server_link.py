"""The server's own link (``Network.server_bps``): processor sharing with per-flow caps (max-min
fair) by the transfers in flight through it, each direction on its own; times worked by hand.
Every time is compared within a relative 1e-9 (float rounding of the event times)."""

from __future__ import annotations

import math

import pytest

from exogym.sim.clock import SimClock
from exogym.sim.comm import CommRecord
from exogym.sim.network import Network, parse_network
from exogym.sim.sharing import Flow, add_steps, finish_times, prune_steps, share_link, water_fill

M = 1e6  # bits/s in a Mbit/s, bits in a Mbit
MB = 1_000_000  # 8 Mbit


def close(value: object) -> object:
    return pytest.approx(value, rel=1e-9)


# -- the sharing, by hand ----------------------------------------------------------------------
def test_water_filling_leaves_a_capped_flows_rest_to_the_others() -> None:
    # 100 among 3: the 20-capped flow takes 20, the other two split the 80 left
    assert water_fill([20 * M, 100 * M, 100 * M], 100 * M) == close([20 * M, 40 * M, 40 * M])
    # 150 among 4: equal share 37.5; 10 takes 10 (140 left for 3: 46.7), 30 takes 30 (110 left
    # for 2: 55 each)
    assert water_fill([100 * M, 10 * M, 30 * M, 100 * M], 150 * M) == close(
        [55 * M, 10 * M, 30 * M, 55 * M])
    assert water_fill([10 * M, 20 * M], math.inf) == [10 * M, 20 * M]  # no bottleneck
    assert water_fill([], 100 * M) == []


def test_three_flows_of_one_megabyte_through_100_mbits() -> None:
    flows = [Flow(0.0, 8 * M, 20 * M), Flow(0.0, 8 * M, 100 * M), Flow(0.0, 8 * M, 100 * M)]
    # rates 20, 40, 40: the two uncapped flows' 8 Mbit take 8 / 40 = 0.2 s; the capped one has
    # sent 4 Mbit by then, and its other 4 at its cap (20: the link has room) take 0.2 s more
    assert finish_times(flows, 100 * M) == close([0.4, 0.2, 0.2])
    # one flow alone: min(its cap, the link)
    assert finish_times([Flow(1.0, 8 * M, 20 * M)], 100 * M) == close([1.4])
    assert finish_times([Flow(1.0, 8 * M, 200 * M)], 100 * M) == close([1.08])


def test_a_later_flow_shares_from_its_start() -> None:
    flows = [Flow(0.0, 8 * M, 100 * M), Flow(0.04, 8 * M, 100 * M)]
    # A alone at 100 until 0.04 (4 Mbit sent); both at 50 from then: A's 4 Mbit take 0.08 s
    # (done at 0.12), when B has sent 4 of its 8; B alone at 100: 0.04 s more
    assert finish_times(flows, 100 * M) == close([0.12, 0.16])
    shared = share_link(flows, 100 * M)
    # together they take all 100 from 0 to the last finish
    assert [t for t, _ in shared.used] == [-math.inf, 0.0, close(0.16)]
    assert [rate for _, rate in shared.used] == [0.0, 100 * M, 0.0]


def test_sharing_resumes_exactly_from_where_it_stopped() -> None:
    a, b = Flow(0.0, 8 * M, 100 * M), Flow(0.04, 8 * M, 100 * M)
    # A alone up to 0.04: 4 Mbit left; B joins from there: the run over both (0.12, 0.16)
    first = share_link([a], 100 * M, stop=0.04)
    assert first.finish == [math.inf] and first.left == [Flow(0.04, 4 * M, 100 * M)]
    assert finish_times([*first.left, b], 100 * M) == close([0.12, 0.16])
    # first=True stops at the first finish (0.12): B has 4 Mbit left from then
    until_first = share_link([a, b], 100 * M, first=True)
    assert until_first.finish == close([0.12, math.inf])
    assert until_first.left[1] == Flow(pytest.approx(0.12), pytest.approx(4 * M), 100 * M)


def test_a_link_partly_taken_gives_what_is_left() -> None:
    # 100 Mbit/s until 0.05, 20 from then (the rest taken by others): 5 Mbit by 0.05, the other
    # 3 at 20 take 0.15 s
    steps = [(-math.inf, 100 * M), (0.05, 20 * M)]
    assert share_link([Flow(0.0, 8 * M, 100 * M)], steps).finish == close([0.2])
    # nothing left until 0.1: a flow waits, then runs at its cap
    assert share_link([Flow(0.0, 8 * M, 40 * M)],
                      [(-math.inf, 0.0), (0.1, 100 * M)]).finish == close([0.3])
    # a rate over time adds piece by piece; what ended before a time is dropped
    load = add_steps([(-math.inf, 0.0), (1.0, 5.0), (3.0, 0.0)], [(-math.inf, 0.0), (2.0, 1.0)])
    assert load == [(-math.inf, 0.0), (1.0, 5.0), (2.0, 6.0), (3.0, 1.0)]
    assert prune_steps(load, 2.5) == [(-math.inf, 6.0), (3.0, 1.0)]


def test_an_empty_flow_finishes_as_it_starts() -> None:
    assert finish_times([Flow(2.0, 0.0, 10 * M), Flow(0.0, 8 * M, 10 * M)], 10 * M) == close(
        [2.0, 0.8])


# -- a server's rounds, by hand ------------------------------------------------------------------
# test_server_topology.py's nodes: uplinks 10, 20, 40 Mbit/s, downlinks 40, 20, 10, 10 ms a
# message, payload rate the link's (efficiency 1), computing 1, 1.5 and 2 s
LINKS = ("bw=10Mbps,latency=10ms,efficiency=1,hop_latency=0s,node_up=10Mbps:20Mbps:40Mbps,"
         "node_down=40Mbps:20Mbps:10Mbps,topology=server")


def _clock(server: str = "") -> SimClock:
    clock = SimClock(parse_network(LINKS + (f",server={server}" if server else "")), 3, 1.0,
                     speeds=(1.0, 1 / 1.5, 0.5))
    clock.compute(0)
    return clock


def test_a_round_through_a_20_mbits_server() -> None:
    clock = _clock("20Mbps")
    clock.collective(CommRecord("all_reduce", MB, 0, "grads"))
    # uploads (Mbit/s): node 0 alone at 10 from 1 s (5 Mbit by 1.5); from 1.5 nodes 0 and 1
    # split 20 (10 each): node 0's last 3 Mbit done at 1.8, node 1 has 5 left; node 1 alone at
    # 20 until 2.0 (1 left); from 2.0 nodes 1 and 2 split 20: node 1 done at 2.1, node 2 has
    # 7 left; alone at min(40, 20) = 20: done at 2.45. Arrivals + 10 ms: 1.81, 2.11, 2.46.
    # Downloads from 2.46: caps 40, 20, 10 all above 20 / 3, so each gets 20/3: 8 Mbit take
    # 1.2 s, done at 3.66, arrived at 3.67.
    assert clock.t == close([3.67, 3.67, 3.67])
    assert clock.last_release == close(2.46)
    assert clock.node_idle == close([2.46 - 1.81, 2.46 - 2.11, 0.0])
    assert clock.node_comm == close([3.67 - 1 - 0.65, 3.67 - 1.5 - 0.35, 3.67 - 2])


def test_a_round_policy_s_report_times_are_the_round_s_upload_arrivals() -> None:
    """upload_arrivals prices the uploads as the round does (the case above: 1.81, 2.11,
    2.46 through a 20 Mbit/s server; 1.81, 1.91, 2.21 alone) and commits nothing."""
    from exogym.sim.server import upload_arrivals

    for server, expected in (("20Mbps", [1.81, 2.11, 2.46]), ("", [1.81, 1.91, 2.21])):
        clock = _clock(server)
        before = (list(clock.link_free), [list(w) for w in clock.server_link.load])
        assert upload_arrivals(clock, [0, 1, 2], MB) == close(expected)
        assert (clock.link_free, clock.server_link.load) == before


def test_a_round_through_a_40_mbits_server() -> None:
    clock = _clock("40Mbps")
    clock.collective(CommRecord("all_reduce", MB, 0, "grads"))
    # uploads never exceed 40 together (10 + 20, then 40 alone): as unlimited, released 2.21.
    # Downloads from 2.21: node 2 capped at 10 (below 40 / 3), nodes 0 and 1 split the other
    # 30: 15 each, done at 2.21 + 8 / 15; node 2 at its 10 throughout: 0.8 s
    assert clock.last_release == close(2.21)
    assert clock.t == close([2.21 + 8 / 15 + 0.01, 2.21 + 8 / 15 + 0.01, 3.02])


def test_no_server_rate_is_the_unlimited_server_and_a_fast_one_the_same() -> None:
    times = {}
    for server in ("", "1Tbps"):
        clock = _clock(server)
        clock.collective(CommRecord("all_reduce", MB, 0, "grads"))
        times[server] = clock.t
    assert times[""] == close([2.42, 2.62, 3.02])  # test_server_topology.py's, by hand
    assert times["1Tbps"] == close(times[""])
    assert _clock().server_link.load == [[(-math.inf, 0.0)]] * 2  # untouched


# -- asynchronous pushes and replies ---------------------------------------------------------------
def test_pushes_in_flight_share_the_server_as_one_run_over_all_of_them() -> None:
    clock = _clock("20Mbps")
    clock.push(0, MB)  # from 1 s
    assert clock.serve_pushes(1.5) == []  # alone it arrives at 1.81: another may push before
    clock.push(1, MB)  # from 1.5, sharing with node 0's from then (the round's uploads above)
    assert clock.serve_pushes(1.9) == [(0, close(1.81))]
    clock.push(2, MB)  # from 2.0
    assert clock.serve_pushes(2.2) == [(1, close(2.11))]
    assert clock.serve_pushes(math.inf, final=True) == [(2, close(2.46))]
    # all three known at once: the same arrivals
    again = _clock("20Mbps")
    for node in range(3):
        again.push(node, MB)
    assert again.serve_pushes(math.inf, final=True) == [
        (0, close(1.81)), (1, close(2.11)), (2, close(2.46))]


def test_a_resumed_clock_goes_on_with_the_pushes_where_they_were() -> None:
    clock = _clock("20Mbps")
    clock.push(0, MB)
    clock.serve_pushes(1.5)  # node 0 has sent 4.9 Mbit by 1.49 (until less one latency)
    resumed = _clock("20Mbps")
    resumed.load_state_dict(clock.state_dict())
    assert resumed.server_link.pushes == {0: (close(1.49), close(3.1 * M))}
    resumed.push(1, MB)  # from 1.5, as before; node 1 alone from 1.8 (5 Mbit at 20): 2.05
    assert resumed.serve_pushes(math.inf, final=True) == [(0, close(1.81)), (1, close(2.06))]


def test_a_later_reply_takes_what_the_earlier_leaves() -> None:
    clock = _clock("20Mbps")
    for node in (0, 1):
        clock.push(node, MB)
    clock.serve_pushes(math.inf, final=True)  # arrivals 1.81, 2.11 (as above)
    clock.reply(0, MB, 1.81)  # alone: min(40, 20) = 20 Mbit/s, 0.4 s, arrived at 2.22
    clock.reply(1, MB, 2.11)  # nothing left until node 0's is through (2.21), then 20: 2.61
    assert clock.t[:2] == close([2.22, 2.62])


def test_a_population_waits_for_a_slow_server() -> None:
    from support.runs import client_run

    from exogym.strategy import make

    runs = {server: client_run(make("fedavg", H=3), nodes=40, participation=4,
                               clients_in_memory="round", network=f"home-100mbps{server}")
            for server in ("", ",server=100Mbps")}
    free, shared = runs[""], runs[",server=100Mbps"]
    assert shared.network is not None and shared.network.topology == "server"
    # the same training; 4 clients of 100 Mbit/s share one 100 Mbit/s server: more waiting
    assert [r["train_loss"] for r in free.history] == [r["train_loss"] for r in shared.history]
    assert shared.clock.comm_s > free.clock.comm_s


# -- the setting -------------------------------------------------------------------------------
def test_the_server_rate_is_a_network_setting() -> None:
    net = parse_network("home-100mbps,server=1Gbps")
    assert (net.server_bps, net.topology) == (1e9, "server")  # a server rate: a server
    assert "a server of 1 Gbit/s shared by the transfers in flight" in net.describe()
    assert parse_network(net.spec()).server_bps == 1e9 and "server=" in net.spec()
    assert net.to_dict()["server_bps"] == 1e9
    assert parse_network("home-100mbps,topology=server").server_bps is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("home-100mbps,server=0bps", "network server=0bps: a bandwidth must be > 0"),
        ("home-100mbps,server=5", "network server=5: unknown bandwidth unit ''"),
        ("home-100mbps,topology=peer,server=1Gbps",
         r"server_bps \(1 Gbit/s, the server's link\) needs a server: topology=server"),
    ],
)
def test_a_bad_server_rate_is_refused_by_name(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_network(spec)


@pytest.mark.parametrize("value", [0.0, -1e9, math.inf, math.nan, True])
def test_a_server_rate_is_a_finite_rate_above_zero(value: float) -> None:
    with pytest.raises(ValueError, match=r"server_bps \(the server's link\) must be a finite "
                                         r"number > 0, bits per second, got"):
        Network(up_bps=1e8, server_bps=value)
