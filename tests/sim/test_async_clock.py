"""The parameter server's link serves pushes first come, first served in simulated time: a
hand-computed trace where the order matters (a slow node's step starts before a fast node's and
ends after it)."""

from __future__ import annotations

import pytest
from support.async_runs import async_run, sgd

from exogym.sim.clock import SimClock
from exogym.sim.network import parse_network
from exogym.strategy import make

# w is one float32: 32 bits over 64 bit/s take 0.5 s each way, no latency.
SLOW_LINK = "bw=64bps,latency=0s,efficiency=1,hop_latency=0s"


def test_a_push_ready_earlier_is_served_first_whatever_the_call_order() -> None:
    # The event loop processes steps by when they start: node 1 (speed 1/4) starts its step at
    # t = 0 and its push is ready at 4; node 0 pushes again from a step that starts at 2 and is
    # ready at 3. Node 0's push goes first: it arrives at 3.5, not behind node 1's at 5.0.
    clock = SimClock(parse_network(SLOW_LINK), 2, 1.0, speeds=[1.0, 0.25])
    clock.t = [3.0, 4.0]
    clock.push(1, 4)  # queued first (its step was processed first)
    clock.push(0, 4)
    assert clock.serve_pushes(2.5) == []  # nothing is ready by 2.5
    assert clock.serve_pushes(4.0) == [(0, 3.5)]  # node 1's may still be preceded (by 3.5)
    assert clock.serve_pushes(10.0) == [(1, 4.5)]
    # equal ready times go in push order, one message at a time
    clock.t = [6.0, 6.0]
    clock.push(1, 4)
    clock.push(0, 4)
    assert clock.serve_pushes(6.0) == [(1, 6.5), (0, 7.0)]


def test_asynchronous_trace_with_a_slow_node_and_a_slow_server_link() -> None:
    # async_local_sgd, H = 1 (a push after every step), c = 1 s, speeds 1 : 1/4, every
    # transfer 0.5 s. By hand (arrival, node, staleness = server version - node's base):
    #   t=0: both compute; node 0 ready at 1 -> arrives 1.5 (stale 0), reply until 2.0
    #   t=2: node 0 computes; ready 3 -> arrives 3.5 (stale 0: base version 1), reply to 4.0
    #   t=4: node 1's push (ready at 4) is served -> arrives 4.5; node 0 computes, ready 5
    #   4.5: node 1 arrives (stale 2: base 0, server 2), reply until 5.0
    #   t=5: node 0's push served -> 5.5; node 1 computes until 9
    #   5.5: node 0 arrives (stale 1), reply to 6.0; t=6: node 0's 4th step, ready 7 (end)
    #   end: node 0 arrives 7.5 (stale 0), node 1 (ready 9) arrives 9.5 (stale 2), replies
    #   until 8.0 and 10.0.
    # Served in call order instead, node 0's second push would queue behind node 1's until 4.5.
    s = make("async_local_sgd", H=1, dylu=False, optim=sgd())
    r = async_run(s, nodes=2, steps=4, speeds="1:0.25", network=SLOW_LINK)
    assert s.staleness == [0, 0, 2, 1, 0, 2]
    assert r.asynchronous["node_steps"] == [4, 2]
    assert r.clock.total_s == pytest.approx(10.0, rel=1e-12)
    assert r.clock.node_compute_s == pytest.approx((4.0, 8.0), rel=1e-12)
    assert r.clock.node_comm_s == pytest.approx((4.0, 2.0), rel=1e-12)
    assert r.clock.node_idle_s == pytest.approx((2.0, 0.0), abs=1e-12)


def test_an_asynchronous_run_is_not_re_costed_even_on_its_own_network() -> None:
    # its clock was its event loop's; a replay of the recorded records dropped every push and
    # pull and reported another clock (found in review)
    r = async_run(make("async_local_sgd", H=1, dylu=False, optim=sgd()), nodes=2, steps=4,
            speeds="1:0.25", network=SLOW_LINK)
    with pytest.raises(ValueError, match="asynchronous run's clock cannot be replayed"):
        r.recost(SLOW_LINK)
