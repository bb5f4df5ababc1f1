"""Asynchronous methods on per-node timelines (exogym.run.loop.events, exogym.strategy.server):
hand-computed traces of which update reaches the server when, from which model version, and the
parameters that result; the reductions the papers state; the server's link and bytes.

The traces use a model whose gradient is 1 whatever the data (``loss = w * mean(x)``, ``x = 1``),
SGD with lr 1/8, and a network with no latency and all but infinite bandwidth: every round of
``H = 2`` steps moves a node by ``Delta = 2/8 = 1/4`` exactly, so every number below is a dyadic
fraction and compared for equality.
"""

from __future__ import annotations

import math

import pytest
from support.async_runs import FAST, Slope, async_run, ones, sgd
from torch import Tensor, nn

from exogym import Trainer
from exogym.sim.clock import SimClock
from exogym.sim.network import parse_network
from exogym.strategy import make
from exogym.strategy.async_local_sgd import dylu_steps


def test_delayed_nesterov_trace_with_speeds_1_and_half() -> None:
    """Node 0 takes 1 s per step, node 1 2 s; H = 2. By hand:

    - t=0: both compute; t=1: node 0 its 2nd step and pushes (Delta 1/4, base version 0);
    - t=2: node 0's push arrives first (staleness 0). DN, N_b = 2, t=0 (no boundary):
      theta -= eta * g / N_b = 1/8 -> 7/8, version 1; node 0 restarts from 7/8; then both
      compute: node 1 its 2nd step (pushes at t=4, base version 0), node 0 its 1st of round 2;
    - t=3: node 0's 2nd step (the run's 4th and last), pushes at t=4 (base version 1);
    - the end: the two pushes in flight are delivered in push order: node 1's (staleness 1),
      DN t=1 is a boundary: buffer 1/4 + 1/4 = 1/2, m = beta * 0 + 1/2 / 2 = 1/4, theta -=
      eta (beta m + g / 2) = 1/2 * 1/4 + 1/8 = 1/4 -> 5/8 (version 2); then node 0's
      (staleness 2 - 1 = 1), t=2, no boundary: theta -= 1/8 -> 1/2 (version 3).
    """
    s = make("async_local_sgd", H=2, outer="delayed_nesterov", outer_lr=1.0,
             outer_momentum=0.5, optim=sgd())
    r = async_run(s)
    assert r.model.w.item() == 0.5
    assert r.asynchronous["node_steps"] == [4, 2]
    assert r.asynchronous["updates"] == 3
    assert s.staleness == [0, 1, 1]
    assert [rec.op for rec in r.comm_log] == ["push", "pull", "push", "push", "pull", "pull"]
    assert [rec.src for rec in r.comm_log if rec.op == "push"] == [0, 1, 0]
    assert [rec.dst for rec in r.comm_log if rec.op == "pull"] == [0, 1, 0]
    # The rows per step: the fastest node's count, its updates and their staleness so far.
    assert [row["step"] for row in r.history if "train_loss" in row] == [1, 2, 3, 4]
    assert [row["updates"] for row in r.history if "updates" in row] == [0, 0, 1, 3]
    # DN's state after the run: m = 1/4, the buffer holds node 0's last 1/4, t = 3.
    assert s.m["w"].item() == 0.25 and s.buffer["w"].item() == 0.25 and s.t == 3


def test_plain_nesterov_applies_each_arrival_with_momentum() -> None:
    """The same trace with outer="nesterov" (torch SGD, Nesterov, on g / N): arrivals
    g = 1/4 each, so g / N = 1/8; beta = 1/2, eta = 1.
    1st: buf = 1/8, step g + beta buf = 1/8 + 1/16 = 3/16 -> 13/16;
    2nd: buf = 1/2 * 1/8 + 1/8 = 3/16, step 1/8 + 3/32 = 7/32 -> 19/32;
    3rd: buf = 3/32 + 1/8 = 7/32, step 1/8 + 7/64 = 15/64 -> 23/64."""
    s = make("async_local_sgd", H=2, outer="nesterov", outer_lr=1.0, outer_momentum=0.5,
             optim=sgd())
    r = async_run(s)
    assert r.model.w.item() == 23 / 64
    assert s.staleness == [0, 1, 1]


def test_fedbuff_trace_buffers_k_updates_weighted_by_staleness() -> None:
    """FedBuff, K = 2, eta_g = 1, a = 1/2, the same timelines. A node does not wait for the
    server step, so its staleness counts server steps:
    - node 0's push (t=2): tau 0, weight 1, buffer 1/4, no step (1 < K); node 0 restarts from
      the unchanged model (version 0);
    - the end: node 1's (base 0, tau 0): buffer 1/2, K reached: theta -= 1/2 / 2 -> 3/4,
      version 1; node 0's (base 0, tau 1): weight 1/sqrt(2), buffered, never applied (K = 2
      is not reached again: a partial buffer is not applied)."""
    s = make("fedbuff", H=2, K=2, eta_g=1.0, optim=sgd())
    r = async_run(s)
    assert r.model.w.item() == 0.75
    assert s.staleness == [0, 0, 1]
    assert s.buffered == 1
    assert s.buffer["w"].item() == pytest.approx(0.25 / math.sqrt(2), abs=1e-7)


def test_max_staleness_discards_old_updates_as_flsim() -> None:
    """FedBuff, K = 1, eta_g = 1, a = 0 (each arrival is a server step ``theta -= Delta``), the
    same timelines, and FLSim's cap ``max_staleness = 0``:
    - node 0's push (t=2): tau 0, applied: theta 1 - 1/4 = 3/4, version 1;
    - the end: node 1's (base 0, version 1: tau 1 > 0) is discarded, theta stays 3/4;
      node 0's (base 1, tau 0; its round moved it from 3/4 by 1/4) is applied: 1/2.
    Without the cap node 1's would apply too (1/2, version 2) and node 0's then be 1 old: 1/4."""
    capped = make("fedbuff", H=2, K=1, eta_g=1.0, a=0.0, max_staleness=0, optim=sgd())
    r = async_run(capped)
    assert r.model.w.item() == 0.5
    assert capped.staleness == [0, 0] and capped.discarded == [1]
    assert r.asynchronous["updates"] == 2 and r.asynchronous["discarded_stale"] == 1
    free = make("fedbuff", H=2, K=1, eta_g=1.0, a=0.0, optim=sgd())
    assert async_run(free).model.w.item() == 0.25 and free.discarded == []
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=f"max_staleness must be an integer >= 0.*{bad!r}"):
            make("fedbuff", max_staleness=bad)


def test_dylu_scales_local_steps_by_speed_and_equal_speeds_keep_h() -> None:
    s = make("async_local_sgd", H=10, dylu=True)
    async_run(s, nodes=4, steps=10, speeds="1:1:0.5:0.25", model=Slope())
    assert [s.local_steps(i) for i in range(4)] == [10, 10, 5, 2]  # floor(10 * 0.25) = 2
    plain = make("async_local_sgd", H=10, dylu=False, optim=sgd())
    dylu = make("async_local_sgd", H=10, dylu=True, optim=sgd())
    a = async_run(plain, nodes=2, steps=20, speeds="")
    b = async_run(dylu, nodes=2, steps=20, speeds="")
    assert a.model.w.item() == b.model.w.item()
    assert a.history == [dict(row, wall_s=r["wall_s"]) for row, r in zip(b.history, a.history,
                                                                           strict=True)]


def test_equal_speeds_are_lockstep_rounds() -> None:
    """Equal speeds: every node is due at the same instants, all push after their H-th step, and
    the server applies the N arrivals of a round in node order (their push order). Round 1 is
    computed from version 0: staleness 0, 1, .., N - 1; node i then restarts from version
    i + 1, and the N - 1 others' updates land before its next one: staleness N - 1 after."""
    s = make("async_local_sgd", H=2, optim=sgd())
    r = async_run(s, nodes=3, steps=6, speeds="")
    assert r.asynchronous["node_steps"] == [6, 6, 6]
    assert s.staleness == [0, 1, 2] + [2] * 6


def test_the_server_link_queues_pushes_first_come_first_served() -> None:
    """Two 1 MB pushes at t = 0 over 8 Mbit/s links (1 s each), latency 0.1 s: the second
    waits for the first to be through the server's downlink; replies likewise."""
    clock = SimClock(parse_network("bw=8Mbps,latency=0.1s,efficiency=1,hop_latency=0s"), 2, 1.0)
    clock.push(0, 1e6)
    clock.push(1, 1e6)
    (n0, a0), (n1, a1) = clock.serve_pushes(0.0)
    assert (n0, n1) == (0, 1) and (a0, a1) == pytest.approx((1.1, 2.1))
    clock.reply(0, 1e6, at=1.1)
    clock.reply(1, 1e6, at=2.1)
    assert clock.t == pytest.approx([2.2, 3.2])
    assert clock.node_comm == pytest.approx([2.2, 3.2])


def test_bytes_per_node_and_for_the_server() -> None:
    s = make("async_local_sgd", H=2, optim=sgd())
    r = async_run(s, nodes=2, steps=4, speeds="")
    # w is 4 bytes: each node pushed twice and pulled twice
    assert r.bytes_sent == [8.0, 8.0] and r.bytes_received == [8.0, 8.0]
    assert r.asynchronous["server_bytes_received"] == 16.0
    assert r.asynchronous["server_bytes_sent"] == 16.0


def test_asynchronous_runs_are_deterministic() -> None:
    runs = [async_run(make("fedbuff", H=3, K=2), nodes=3, steps=12, speeds="1:0.5:0.3",
                      model=Slope(0.3)) for _ in range(2)]
    a, b = ([{k: v for k, v in row.items() if k != "wall_s"} for row in r.history]
            for r in runs)
    assert a == b
    assert runs[0].model.w.item() == runs[1].model.w.item()


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"network": None}, "needs? a simulated network|give the run one"),
    ({"world": "speed=1:1,fail=1@2"}, "not failures"),
])
def test_asynchronous_needs_a_network_and_no_failures(kwargs, match) -> None:
    args = {"strategy": make("async_local_sgd", H=2), "num_nodes": 2, "max_steps": 4,
            "batch_size": 2, "network": FAST, "step_time": 1.0, "progress": False, **kwargs}
    with pytest.raises(ValueError, match=match):
        Trainer(Slope(), ones(), ones()).fit(**args)


def test_a_schedule_or_a_deadline_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="schedule"):
        make("async_local_sgd", **{"schedule.warmup": 10})
    with pytest.raises(ValueError, match="deadline"):
        make("fedbuff", deadline="2x")


class SlopeBN(Slope):
    """:class:`Slope` with a BatchNorm of one feature: 2 more parameters, 2 float buffers and an
    integer counter."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(1)

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, _ = batch
        return (self.w * self.bn(x).mean() + self.w * x.mean()).sum()


def test_a_push_carries_the_buffers_the_server_adopts() -> None:
    # each way, twice per node: w, bn.weight, bn.bias (12 bytes) + running_mean, running_var
    # (8 bytes); before, a push carried the parameters only (24 bytes sent, 40 received)
    r = async_run(make("async_local_sgd", H=2, optim=sgd()), nodes=2, steps=4, speeds="",
                  model=SlopeBN())
    assert r.bytes_sent == [40.0, 40.0] and r.bytes_received == [40.0, 40.0]


@pytest.mark.parametrize(("rounding", "expected"), [("floor", [8, 5, 3]), ("ceil", [8, 6, 4])])
def test_dylu_rounds_down_as_the_paper_or_up_as_halos(rounding: str, expected: list[int]) -> None:
    """Speeds 1 : 0.7 : 0.45, H = 8: H v_w / v_max = 8, 5.6, 3.6; the paper's floor gives
    [8, 5, 3] (the default), HALoS's ceil [8, 6, 4]."""
    kwargs = {} if rounding == "floor" else {"dylu_rounding": rounding}
    s = make("async_local_sgd", H=8, dylu=True, optim=sgd(), **kwargs)
    assert s.dylu_rounding == rounding
    async_run(s, nodes=3, steps=8, speeds="1:0.7:0.45")
    assert s.speeds == [1.0, 0.7, 0.45]
    assert [s.local_steps(i) for i in range(3)] == expected
    assert [dylu_steps(8, [0.5, 0.35, 0.225], i, rounding) for i in range(3)] == expected


def test_dylu_takes_at_least_one_step_and_integers_stay_integers() -> None:
    # H v_w / v_max = 10 * 0.05 = 0.5: floor 0, so 1 step (a node that never pushed would be
    # lost to the server); 100 * 0.29 = 28.999999999999996 in floats is 29, both ways
    assert dylu_steps(10, [1.0, 0.05], 1) == 1
    assert dylu_steps(10, [1.0, 0.05], 1, "ceil") == 1
    assert dylu_steps(100, [1.0, 0.29], 1) == 29
    assert dylu_steps(100, [1.0, 0.29], 1, "ceil") == 29


def test_the_default_outer_optimizer_is_delayed_nesterov_and_bad_options_are_named() -> None:
    s = make("async_local_sgd")
    assert (s.outer, s.dylu, s.dylu_rounding) == ("delayed_nesterov", False, "floor")
    with pytest.raises(ValueError, match=r"dylu_rounding must be one of \['floor', 'ceil'\], "
                                         r"got 'round'"):
        make("async_local_sgd", dylu_rounding="round")
    with pytest.raises(ValueError, match=r"outer must be one of \['delayed_nesterov', "
                                         r"'nesterov'\], got 'adam'"):
        make("async_local_sgd", outer="adam")


def test_fedbuff_s_buffer_follows_the_clients_in_flight() -> None:
    """K's default: max(2, round(C / 10)): 2 for a few nodes, 10 for 100 in flight (FLSim's
    ratio), so an update is about C / K = 10 server steps stale at any concurrency."""
    from support.runs import client_run

    few = make("fedbuff", H=2, optim=sgd())
    async_run(few)
    assert few.K is None and few.buffer_size == 2
    crowd = make("fedbuff", H=2)
    r = client_run(crowd, nodes=400, concurrency=100, clients_in_memory="round", steps=4)
    assert crowd.buffer_size == 10 and r.hyperparameters["K"] is None
    assert make("fedbuff", K=3).buffer_size == 3


def test_fedbuff_s_H_follows_the_setting() -> None:
    """H's default: 50 over N nodes; over a population one local epoch of the mean client: 120
    samples over 10 clients of batch 4 are 12 each, 3 steps (each of the 4 seats pushes twice
    in 6 steps: 8 updates); over 40 clients 3 each, under a batch: 1 step (24 updates). A given
    H is kept; a method whose H does not follow the run refuses H=None."""
    from support.runs import client_run

    from exogym.strategy.server import follow_run

    over_nodes = make("fedbuff")
    assert over_nodes.H is None and over_nodes.sync_period is None  # the run's to set
    follow_run(over_nodes, population=False, steps_per_epoch=234)
    assert over_nodes.sync_period == 50 and over_nodes.local_steps(0) == 50
    for clients, H, updates in ((10, 3, 8), (40, 1, 24)):
        r = client_run(make("fedbuff", optim=sgd()), nodes=clients, concurrency=4,
                       clients_in_memory="round", steps=6)
        assert r.hyperparameters["H"] is None  # recorded as given: a resume decides it again
        assert (r.asynchronous["H"], r.asynchronous["updates"]) == (H, updates)
        assert f"async       H = {H}, {updates} updates applied" in r.summary()
    given = make("fedbuff", H=2)
    follow_run(given, population=True, steps_per_epoch=3)
    assert given.sync_period == 2
    with pytest.raises(ValueError, match="H"):
        make("async_local_sgd", H=None)


def test_delayed_nesterov_over_equal_speed_rounds_is_diloco_s_outer_step() -> None:
    """Where a pseudo-gradient does not depend on the model it starts from (``Slope``: every
    node's round moves it by 2/8 = 1/4), DN with ``N_b = N`` at equal speeds is DiLoCo's outer
    Nesterov step round for round: N - 1 arrivals step ``eta g / N``, the N-th takes the buffer
    into the momentum and steps ``eta (beta m + g / N)``, so a round moves ``eta (mean g + beta
    m)`` with ``m <- beta m + mean g``: DiLoCo's. By hand (eta = beta = 1/2): m = 1/4, 3/8,
    7/16; steps 3/16, 7/32, 15/64; w = 1 - 41/64 = 23/64. What remains between them on a real
    model is the asynchronous restart: each node trains from the model as it stood after its
    own arrival (``test_equal_speeds_are_lockstep_rounds``' staleness), which is the method."""
    outer = {"outer_lr": 0.5, "outer_momentum": 0.5}
    dn = async_run(make("async_local_sgd", H=2, optim=sgd(), **outer), nodes=3, steps=6,
                   speeds="")
    diloco = async_run(make("diloco", H=2, optim=sgd(), **outer), nodes=3, steps=6, speeds="")
    # DN divides by N = 3 (1/12 is not a float32): equal to float32 rounding, 1e-6
    assert dn.model.w.item() == pytest.approx(23 / 64, abs=1e-6)
    assert diloco.model.w.item() == pytest.approx(23 / 64, abs=1e-6)
