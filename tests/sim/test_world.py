"""The world changes the training (docs/design/world.md): absent nodes, lost messages,
deadlines, failures and live recovery, the quorum, and the world model's own parsing.

Closed-form tests set the world's view by hand on a tiny float64 model (the communicator's
attendance: who computes, who is heard); the run-level tests inject failures as torchft's
``EventInjector.fail_at(rank, step)`` does (``fail=NODE@STEP``) and check the state the nodes end
with."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from support.by_hand import TOL, Heard, build, sgd, step_with, t
from support.runs import WorldNet, small, world_data, world_run

from exogym import Trainer
from exogym.cli import main
from exogym.sim.clock import SimClock, parse_deadline
from exogym.sim.world import World, parse_world
from exogym.strategy import DDP, DiLoCo, FedAvg, get, make, registry
from exogym.strategy.server import ServerStrategy


# -- closed form --------------------------------------------------------------------------------
def test_ddp_with_one_node_down_steps_with_the_mean_of_the_others() -> None:
    # Prepare: 3 nodes at w = [1, 2], SGD lr 0.1; node 1 is down this step
    ddp = DDP(optim=sgd(0.1))
    nodes, comm = build(ddp, (1.0, 2.0), n=3)
    comm.attendance.active = [True, False, True]

    # Execute: node 1 computed nothing (its gradient row is zero, as after zero_grad)
    step_with(ddp, nodes, [[1.0, 0.0], [0.0, 0.0], [3.0, 2.0]], 0)

    # Assert: mean of nodes 0 and 2 only: [2, 1]; they step to [1, 2] - 0.1 [2, 1] = [0.8, 1.9];
    # node 1 stays; a ring among M = 2: 2 (M-1)/M * 16 = 16 bytes for each, 0 for node 1
    assert torch.allclose(nodes.params["w"], t([[0.8, 1.9], [1.0, 2.0], [0.8, 1.9]]), **TOL)
    assert comm.bytes_sent == [16.0, 0.0, 16.0]
    assert comm.log[0].members == 0b101
    assert ddp.node_steps.tolist() == [1, 0, 1]  # node 1's count stays behind


def test_ddp_node_whose_gradient_is_lost_skips_the_step_and_heals() -> None:
    ddp = DDP(optim=sgd(0.1))
    nodes, comm = build(ddp, (1.0, 2.0), n=3)
    comm.attendance.heard = Heard([True, True, False])  # node 2 computed, its gradient was lost
    step_with(ddp, nodes, [[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]], 0)
    # mean of nodes 0, 1: [2, 1] -> [0.8, 1.9]; node 2 did not step and is out of sync
    assert torch.allclose(nodes.params["w"], t([[0.8, 1.9], [0.8, 1.9], [1.0, 2.0]]), **TOL)
    assert ddp.pending_recovery == [2]
    ddp.recover(2, donor=0)  # the trainer does this before the next step
    assert torch.equal(nodes.params["w"][2], nodes.params["w"][0])
    assert comm.log[-1].op == "send" and (comm.log[-1].src, comm.log[-1].dst) == (0, 2)
    # recovery bytes: w (16 bytes, SGD has no state without momentum)
    assert comm.bytes_received[2] == 16.0 + 0.0


def test_diloco_averages_the_pseudo_gradients_that_arrived() -> None:
    # Prepare: N = 3, H = 1, outer SGD lr 1 (no momentum): theta <- theta - mean(Delta_i)
    diloco = DiLoCo(H=1, outer_optimizer="sgd", outer_lr=1.0, outer_momentum=0.0,
                    optim=sgd(0.1))
    nodes, comm = build(diloco, (1.0, 2.0), n=3)
    comm.attendance.heard = Heard([True, False, True])  # node 1's message is lost

    # Execute: x_i = [1, 2] - 0.1 g_i = [[0.9, 2], [0.7, 1.8], [0.5, 1.5]]
    step_with(diloco, nodes, [[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]], 0)

    # Assert: Delta over M = 2: mean([0.1, 0], [0.5, 0.5]) = [0.3, 0.25] -> theta = [0.7, 1.75];
    # nodes 0, 2 restart from it, node 1 keeps its own (the q semantics)
    assert torch.allclose(diloco.global_state()["w"], t([0.7, 1.75]), **TOL)
    assert torch.allclose(nodes.params["w"], t([[0.7, 1.75], [0.7, 1.8], [0.7, 1.75]]), **TOL)
    # bytes: the M = 2 ring, 2 (M-1)/M * 16 = 16 for nodes 0 and 2; nothing for node 1
    assert comm.bytes_sent == [16.0, 0.0, 16.0]


def test_diloco_recovery_sends_the_global_model_and_the_outer_momentum() -> None:
    diloco = DiLoCo(H=1, optim=sgd(0.1, momentum=0.9))  # Nesterov outer: a momentum buffer
    nodes, comm = build(diloco, (1.0, 2.0), n=2)
    step_with(diloco, nodes, [[1.0, 0.0], [3.0, 2.0]], 0)
    with torch.no_grad():
        nodes.params["w"][1].fill_(7.0)  # node 1 drifted (it was down)
    before = comm.bytes_received[1]
    diloco.recover(1, donor=0)
    assert torch.equal(nodes.params["w"][1], diloco.global_state()["w"])
    # global w (16) + outer momentum (16) + the donor's inner SGD momentum row (16)
    assert comm.bytes_received[1] - before == 48.0
    assert torch.equal(diloco.optimizer.state[nodes.params["w"]]["momentum_buffer"][1],
                       diloco.optimizer.state[nodes.params["w"]]["momentum_buffer"][0])


def test_fedavg_members_adopt_the_mean_and_the_others_keep_theirs() -> None:
    fedavg = FedAvg(H=1, optim=sgd(0.1))
    nodes, comm = build(fedavg, (1.0, 2.0), n=3)
    comm.attendance.heard = Heard([False, True, True])
    step_with(fedavg, nodes, [[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]], 0)
    # x = [[0.9, 2], [0.7, 1.8], [0.5, 1.5]]; mean of nodes 1, 2: [0.6, 1.65]
    assert torch.allclose(nodes.params["w"], t([[0.9, 2.0], [0.6, 1.65], [0.6, 1.65]]), **TOL)
    assert torch.allclose(fedavg.global_state()["w"], t([0.6, 1.65]), **TOL)


# -- deadlines ------------------------------------------------------------------------------------
def test_a_deadline_cuts_exactly_the_nodes_later_than_its_rule() -> None:
    clock = SimClock("bw=1Gbps,latency=1ms", 4, 1.0)
    clock.t = [1.0, 2.0, 3.0, 10.0]  # arrivals; the last release was at 0
    # "2x": the (lower) median of [1, 2, 3, 10] is 2 -> limit 4: only node 3 is late
    assert clock.arrivals([True] * 4, "2x") == [True, True, True, False]
    # "2.5s" after the last release: nodes 2 (3 s) and 3 (10 s) are late
    assert clock.arrivals([True] * 4, "2.5s") == [True, True, False, False]
    # candidates only: node 0 absent, median of [2, 3, 10] = 3 -> limit 4.5
    assert clock.arrivals([False, True, True, True], "1.5x") == [False, True, True, False]
    assert parse_deadline("1.5x") == ("x", 1.5) and parse_deadline("30s") == ("s", 30.0)
    for bad in ("0.5x", "soon", "0s", "-1s"):
        with pytest.raises(ValueError, match="deadline"):
            parse_deadline(bad)


def test_a_slow_node_is_cut_by_the_deadline_and_the_others_wait_less() -> None:
    world = "speed=1:1:1:0.25"  # node 3 takes 4 times as long per step
    waited = world_run(DiLoCo(H=3), world, steps=12)
    cut = world_run(DiLoCo(H=3, deadline="2x"), world, steps=12)
    assert waited.world["stragglers_cut"] == 0
    # Without the deadline every sync waits for node 3: 12 steps x 0.2 s of its compute.
    assert waited.clock.node_compute_s[3] == pytest.approx(2.4)
    assert waited.clock.total_s > 2.4
    # With it (c: a ring of the 3 fast nodes): steps 0-2, the fast nodes at 0.15 s, node 3 at
    # 0.6 s > 2 x 0.15: cut at step 2, the others released at 0.15 + c. Node 3 sits out while
    # its clock (0.6 s) is ahead of theirs: steps 3-8 (the syncs at steps 5 and 8 are among
    # the 3 fast nodes); at step 9 they start at 0.45 + 3 c > 0.6 s and node 3 computes
    # again, steps 9-11, until 1.2 s: late again at the sync of step 11 (1.2 - 0.69 > 0.3 s).
    assert [(e["step"], e["node"]) for e in cut.events if e["event"] == "late"] == [(2, 3),
                                                                                    (11, 3)]
    assert cut.world["stragglers_cut"] == 2 and cut.world["late_steps"] == 6
    assert [(r.step, r.members) for r in cut.comm_log] == [(2, 7), (5, 7), (8, 7), (11, 7)]
    c = cut.clock.node_comm_s[0] / 4
    assert cut.clock.node_compute_s == pytest.approx((0.6, 0.6, 0.6, 1.2))
    assert cut.clock.node_comm_s[3] == 0.0
    # step 8 starts at 0.15 + 0.25 + 2 c (before 0.6 s), step 9 at 0.15 + 0.3 + 3 c (after)
    assert 0.4 + 2 * c < 0.6 < 0.45 + 3 * c
    assert cut.clock.total_s == pytest.approx(1.2)  # node 3's clock; the others end earlier
    assert 0.6 + 4 * c == pytest.approx(cut.clock.node_compute_s[0] + cut.clock.node_comm_s[0])


def test_ddp_heals_a_cut_straggler_when_it_has_caught_up() -> None:
    # Node 3 takes 0.2 s per step, the others 0.05 s plus a ring of ~0.06 s: cut at every step
    # it computes, it sits out the next one (the others are still before its clock), and heals
    # from node 0 when it computes again, from the state the others hold then.
    cut = world_run(DDP(deadline="2x"), "speed=1:1:1:0.25", steps=12)
    late = [e["step"] for e in cut.events if e["event"] == "late"]
    healed = [(e["step"], e["donor"]) for e in cut.events if e["event"] == "recovery"]
    assert late == [0, 2, 4, 6, 8, 10]
    assert healed == [(2, 0), (4, 0), (6, 0), (8, 0), (10, 0)]
    assert cut.world["late_steps"] == 6
    assert cut.clock.node_compute_s == pytest.approx((0.6, 0.6, 0.6, 1.2))
    assert {r.members for r in cut.comm_log if r.op == "all_reduce"} == {0b0111}


# -- failures, rejoins, live recovery ----------------------------------------------------------
def _recoveries(strategy: Any) -> list[tuple[int, int, dict[str, torch.Tensor], Any]]:
    """Record, right after each recovery, the node, its donor, both nodes' parameters and the
    strategy's global model."""
    seen: list[tuple[int, int, dict[str, torch.Tensor], Any]] = []
    recover = strategy.recover

    def spy(node: int, donor: int) -> None:
        recover(node, donor)
        params = {k: p.detach()[[node, donor]].clone() for k, p in strategy.nodes.params.items()}
        seen.append((node, donor, params, strategy.global_state()))

    strategy.recover = spy
    return seen


GLOBAL_MODEL = {"diloco", "fedavg", "fedprox", "fedadam", "fedyogi", "fedadagrad", "fedavgm",
                "streaming_diloco", "sparta_diloco", "muloco"}


# Asynchronous strategies refuse failures (tests/strategy/test_async.py).
SYNCHRONOUS = [sid for sid in registry() if not issubclass(get(sid), ServerStrategy)]


@pytest.mark.parametrize("sid", SYNCHRONOUS)
def test_a_node_that_fails_and_rejoins_is_recovered_to_the_run_state(sid: str) -> None:
    spec = small(sid)
    strategy = make(sid, **spec)
    seen = _recoveries(strategy)
    result = world_run(strategy, "fail=1@3,rejoin=1@6", steps=12)
    assert result.world["failures"] == 1 and result.world["rejoins"] == 1
    assert [e["event"] for e in result.events] == ["fail", "rejoin", "recovery"]
    assert result.events[0]["step"] == 3 and result.events[1]["step"] == 6
    ((node, donor, params, global_state),) = seen
    assert (node, donor) == (1, 0)
    for k, rows in params.items():
        if sid in GLOBAL_MODEL:  # the node holds the global model right after its recovery
            assert torch.equal(rows[0], global_state[k]), (sid, k)
        else:  # replicated methods: the donor's parameters
            assert torch.equal(rows[0], rows[1]), (sid, k)
    recovery = result.events[2]
    assert recovery["bytes"] > 0 and recovery["duration_s"] > 0
    # and at the end every node holds the same state as the others where the method keeps
    # them identical (a synchronisation at the last step: H divides 12 in small())
    final = strategy.nodes.params
    if sid in GLOBAL_MODEL - {"sparta_diloco", "streaming_diloco"} or sid in ("ddp", "demo"):
        for k, p in final.items():
            assert all(torch.equal(p[0], p[i]) for i in range(1, 4)), (sid, k)


def test_the_same_world_seed_gives_the_same_events_and_numbers() -> None:
    world = "mtbf=1s,mttr=0.5s,drop=0.1,seed=3"
    a = world_run(DiLoCo(H=2), world, steps=16)
    b = world_run(DiLoCo(H=2), world, steps=16)
    c = world_run(DiLoCo(H=2), world.replace("seed=3", "seed=4"), steps=16)
    assert a.events == b.events and a.final == b.final and a.bytes_sent == b.bytes_sent
    assert a.world["failures"] > 0
    assert a.events != c.events and a.final != c.final


def test_the_quorum_waits_for_nodes_to_return_or_says_why_it_cannot() -> None:
    # 4 nodes, every one down [1 s, 3 s) of its own clock; at least 3 must be up
    world = ("min_nodes=3,fail=0@1s,rejoin=0@3s,fail=1@1s,rejoin=1@3s,fail=2@1s,"
             "rejoin=2@3s")
    r = world_run(DDP(), world, steps=40)
    assert r.world["quorum_wait_s"] > 0
    assert any(e["event"] == "quorum_wait" for e in r.events)
    with pytest.raises(RuntimeError, match=r"quorum min_nodes=3 cannot be met at step 2"):
        world_run(DDP(), "min_nodes=3,fail=0@2,fail=1@2", steps=6)
    with pytest.raises(RuntimeError, match=r"not met within max_wait=10 s"):
        world_run(DDP(), "min_nodes=4,max_wait=10s,fail=0@1s,rejoin=0@1h", steps=40)


def test_a_perfect_world_is_no_world() -> None:
    plain = world_run(DiLoCo(H=3), None)
    perfect = world_run(DiLoCo(H=3), "perfect")
    assert plain.final == perfect.final and plain.clock.total_s == perfect.clock.total_s
    assert perfect.world is None and perfect.events == []


@pytest.mark.parametrize(("world", "deadline"), [
    ("fail=1@3,rejoin=1@9,drop=0.2,speed=1:1:0.5:1,seed=2", None),
    ("speed=1:1:1:0.25", "2x"),  # checkpointed at step 6 while node 3 sits out, late
])
def test_a_run_in_a_world_resumes_exactly(tmp_path: Path, world: str,
                                          deadline: str | None) -> None:
    full = world_run(DiLoCo(H=3, deadline=deadline), world, steps=12, out_dir=tmp_path / "full",
                     checkpoint_every=6)
    cut = tmp_path / "cut"
    import shutil
    shutil.copytree(tmp_path / "full", cut)
    shutil.rmtree(cut / "checkpoints" / "step-00000012")
    (cut / "summary.json").unlink()
    torch.manual_seed(1)
    resumed = Trainer(WorldNet(), world_data(), world_data()).fit(resume=cut, progress=False)
    assert resumed.final == full.final and resumed.events == full.events
    assert resumed.clock.total_s == full.clock.total_s and resumed.world == full.world
    lines = (cut / "events.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == full.events


def test_a_world_run_is_recosted_only_where_nothing_depended_on_its_time(tmp_path: Path) -> None:
    steps = world_run(DiLoCo(H=3), "fail=1@3,rejoin=1@6,drop=0.2")
    assert steps.recost("home-100mbps").total_s == pytest.approx(steps.clock.total_s, rel=1e-12)
    assert steps.recost("datacenter").total_s < steps.clock.total_s
    timed = world_run(DiLoCo(H=3), "mtbf=1s,mttr=0.5s")
    with pytest.raises(ValueError, match="decides who is up by simulated time"):
        timed.recost("datacenter")


# -- the world model -------------------------------------------------------------------------
def test_world_specs_parse_and_bad_ones_say_what_is_allowed(tmp_path: Path) -> None:
    w = parse_world("speed=1:1:0.5:0.25,mtbf=30min,mttr=5min,seed=3")
    assert w.speeds(4) == (1.0, 1.0, 0.5, 0.25) and (w.mtbf_s, w.mttr_s) == (1800.0, 300.0)
    assert parse_world(w.spec()) == w
    e = parse_world("fail=2@300,rejoin=2@700,drop=0.05")
    assert [e.is_up(2, 0.0, s) for s in (299, 300, 699, 700)] == [True, False, False, True]
    assert parse_world("fail=1@10min,rejoin=1@20min").next_up(1, 700.0, 0) == 1200.0
    for spec, message in [
        ("mtbf=-1min,mttr=1min", "a duration must be >= 0"),
        ("mtbf=0s,mttr=1s", r"world mtbf must be a finite number in \(0"),
        ("colour=red", "unknown world key 'colour'.*allowed: speed, speed_sigma, duration, mtbf"),
        ("mtbf=1min", "mtbf and mttr go together"),
        ("drop=1", r"world drop must be a finite number in \[0, 1\)"),
        ("fail=x", "expected NODE@STEP or NODE@TIME"),
        ("speed=1:0", "speed must list numbers > 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_world(spec)
    with pytest.raises(ValueError, match=r"names node 7, but the run.s nodes are 0\.\.3"):
        parse_world("fail=7@3").check_nodes(4)
    with pytest.raises(ValueError, match="speed lists 3 values but the run has 4 nodes"):
        parse_world("speed=1:1:1").check_nodes(4)
    overlap = tmp_path / "overlap.json"
    overlap.write_text(json.dumps({"format": "exogym-availability-v1",
                                   "nodes": [[[0, 100], [50, 200]]]}))
    with pytest.raises(ValueError, match=r"overlap.json.*node 0: intervals \[0.0, 100.0\] and "
                                         r"\[50, 200\] overlap"):
        parse_world(f"trace:{overlap}")


def test_mtbf_draws_are_seeded_per_node(tmp_path: Path) -> None:
    a, b = World(mtbf_s=100.0, mttr_s=10.0, seed=1), World(mtbf_s=100.0, mttr_s=10.0, seed=1)
    assert a.down_periods(2, 5000) == b.down_periods(2, 5000)
    assert a.down_periods(2, 5000) != World(mtbf_s=100.0, mttr_s=10.0, seed=2).down_periods(
        2, 5000)
    periods = a.down_periods(0, 20000)
    # the draws' means approach MTBF and MTTR (a few hundred periods)
    downs = [e - s for s, e in periods]
    assert 6 < sum(downs) / len(downs) < 14
    up, prev_end = [], 0.0
    for s, e in periods:
        up.append(s - prev_end)
        prev_end = e
    assert 70 < sum(up) / len(up) < 130
    assert not a.is_up(0, periods[0][0], 0) and a.is_up(0, periods[0][1], 0)


def test_traces_in_exogyms_and_fedscales_shapes(tmp_path: Path) -> None:
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"format": "exogym-availability-v1",
                                "nodes": [[[0, 10], [20, None]], [[5, None]]]}))
    w = parse_world(f"trace:{mine}")
    assert [w.is_up(0, x, 0) for x in (0, 10, 15, 20, 1e9)] == [True, True, False, True, True]
    assert w.next_up(0, 15.0, 0) == 20.0 and w.next_up(1, 0.0, 0) == 5.0
    fedscale = tmp_path / "fedscale.json"
    fedscale.write_text(json.dumps({
        "10": {"active": [0, 50], "inactive": [20, 60], "finish_time": 100, "model": "x"},
        "2": {"active": [5], "inactive": [95], "finish_time": 100, "duration": 90}}))
    w = parse_world(f"trace:{fedscale}")
    # clients in id order: "2" is node 0, "10" is node 1; periodic with finish_time 100
    assert [w.is_up(1, x, 0) for x in (10, 30, 55, 110, 130)] == [True, False, True, True, False]
    assert w.next_up(1, 130.0, 0) == 150.0 and w.is_up(0, 50.0, 0)
    # a run of more nodes than the trace: node i follows the trace's node i mod 2
    w.check_nodes(3)
    assert [w.is_up(3, x, 0) for x in (10, 30, 55)] == [w.is_up(1, x, 0) for x in (10, 30, 55)]


def test_the_command_line_runs_a_world_and_says_what_happened(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], mnist_data: Path) -> None:
    out = tmp_path / "run"
    assert main(["run", "--task", "mnist", "--strategy", "diloco", "--nodes", "4", "--steps",
                 "12", "--set", "H=4", "--batch-size", "16", "--network", "home-100mbps",
                 "--world", "fail=2@3,rejoin=2@7,drop=0.1,seed=1", "--step-time", "30ms",
                 "--eval-samples", "200", "--no-progress", "--out", str(out),
                 "--data-dir", str(mnist_data), "--no-download"]) == 0
    text = capsys.readouterr().out
    assert "world       fail=2@3,rejoin=2@7,drop=0.1,seed=1: 1 failure, 1 recovery (" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world"]["failures"] == 1 and summary["world"]["recoveries"] == 1
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if e["event"] != "lost"] == ["fail", "rejoin",
                                                                     "recovery"]
    assert main(["run", "--world", "speed=1:1", "--nodes", "4", "--steps", "100"]) == 2
    assert "world speed lists 2 values but the run has 4 nodes" in capsys.readouterr().err
    assert main(["run", "--world", "mtbf=1h,mttr=1min", "--network", "datacenter",
                 "--steps", "100", "--set", "H=10", "--set", "deadline=soon"]) == 2
    assert "deadline 'soon'" in capsys.readouterr().err
    assert math.isfinite(summary["final"]["eval_loss"])


def test_a_node_down_at_the_end_is_down_not_idle_and_replays_the_same() -> None:
    # Node 1 fails before step 2 and never comes back: from its failure to the end of the run it
    # is down (it was counted as idle: "waiting for the slowest"); a replay on the same network
    # (a step-based world may be re-costed) gives the same split.
    from support.resume_cases import Net, data

    torch.manual_seed(1)
    r = Trainer(Net(), data(), data()).fit(
        strategy=make("diloco", H=2), num_nodes=2, max_steps=6, batch_size=4, step_time=0.1,
        network="home-100mbps", world="fail=1@2", progress=False)
    c = r.clock
    assert c.node_compute_s[1] == pytest.approx(0.2, rel=1e-12)  # steps 0 and 1
    assert c.node_idle_s[1] == 0.0
    assert c.node_down_s[1] == pytest.approx(
        c.total_s - c.node_compute_s[1] - c.node_comm_s[1], rel=1e-12)
    assert c.node_down_s[0] == 0.0
    assert r.recost("home-100mbps") == c
