"""The asynchronous engine (exogym/run/loop/timelines.py): the steps the per-node timelines find
due are counted then and computed later, batched (:class:`BatchedSteps`); the run's numbers are
those of computing each group of nodes as it is due (:class:`ImmediateSteps`, the engine before
2026-11-28), bit for bit: every metrics row, ``summary.json``'s numbers, the communicator's log,
the clients drawn, the simulated clock and the final model.

Why they can be: a node's row of a masked step depends on its own parameters, optimizer state
and data only (checked here for each engine), and every step is computed before the server reads
or writes a node and at the end of each run step, its loss accounted in the order the groups
were due."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from support.async_runs import FAST
from support.resume_cases import Net, data
from support.runs import resume_cut

from exogym import Trainer
from exogym.run.loop.timelines import BatchedSteps, ImmediateSteps, PerNodeTimelines
from exogym.sim.engine import NodeStack
from exogym.strategy import make
from exogym.strategy.fedbuff import FedBuff

WALL = {"wall_s", "train_time_s", "wall_time_s", "samples_per_s", "out_dir", "folder"}

# name -> (strategy id, its settings, fit's settings, the model's options)
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any], dict[str, bool]]] = {
    "fedbuff, 4 nodes at 1:0.5:0.25:0.125": (
        "fedbuff", {"H": 3, "K": 2}, {"num_nodes": 4, "world": "speed=1:0.5:0.25:0.125"}, {}),
    "async_local_sgd DN + DyLU, 4 nodes, BatchNorm": (
        "async_local_sgd", {"H": 4, "dylu": True},
        {"num_nodes": 4, "world": "speed=1:0.7:0.45:0.3"}, {"norm": True}),
    "async_local_sgd Nesterov, equal speeds": (
        "async_local_sgd", {"H": 2, "outer": "nesterov"}, {"num_nodes": 3}, {}),
    "fedbuff, dropout": (
        "fedbuff", {"H": 3, "K": 2}, {"num_nodes": 3, "world": "speed=1:0.6:0.35"},
        {"drop": True}),
    "fedbuff, vmap engine": (
        "fedbuff", {"H": 3, "K": 2},
        {"num_nodes": 3, "world": "speed=1:0.6:0.35", "engine": "vmap"}, {}),
    "fedbuff, 300 clients, 12 in flight, half-normal speeds": (
        "fedbuff", {"H": 4, "K": 3},
        {"num_nodes": 300, "concurrency": 12, "world": "speed=halfnormal:1:0,seed=2"}, {}),
    "async_local_sgd, 200 clients, 6 in flight, kept state, loop engine": (
        "async_local_sgd", {"H": 3},
        {"num_nodes": 200, "concurrency": 6, "world": "speed=halfnormal:1:0.1,seed=5",
         "client_state": "keep", "engine": "loop"}, {}),
    "fedbuff, 60 clients, 10 in flight, the server's link shared (server=2Mbps)": (
        "fedbuff", {"H": 2, "K": 3},
        {"num_nodes": 60, "concurrency": 10, "world": "speed=halfnormal:1:0,seed=4",
         "network": "home-100mbps,server=2Mbps"}, {}),
    "fedbuff, staleness cap, datacenter network, threads engine": (
        "fedbuff", {"H": 2, "K": 2, "max_staleness": 1},
        {"num_nodes": 100, "concurrency": 8, "world": "speed=halfnormal:1:0,seed=1",
         "network": "datacenter", "engine": "threads"}, {}),
}


def run(case: str, batched: bool, monkeypatch: pytest.MonkeyPatch,
        **extra: Any) -> tuple[Any, int]:
    """``case`` on the batched engine, or with each group computed as it is due: its result
    and the number of the engine's steps (masked or not) it computed."""
    sid, overrides, settings, model = CASES[case]
    calls = [0]
    forward_backward = NodeStack.forward_backward

    def counted(self: NodeStack, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return forward_backward(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(NodeStack, "forward_backward", counted)
        if not batched:
            m.setattr(BatchedSteps, "of", classmethod(lambda cls, *args: None))
        torch.manual_seed(1)
        fit = {"network": "home-100mbps", "max_steps": 24, "batch_size": 4, "step_time": 0.01,
               "log_interval": 1, "eval_interval": 8, "progress": False, **settings, **extra}
        result = Trainer(Net(**model), data(), data()).fit(
            strategy=make(sid, **overrides), **fit)
    return result, calls[0]


def numbers(r: Any) -> dict[str, Any]:
    """Everything a run reports but its wall times."""
    def clean(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if k not in WALL}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    return {"summary": clean(r.to_dict()), "rows": clean(r.history), "log": r.comm_log,
            "events": r.events, "sent": list(r.bytes_sent), "received": list(r.bytes_received),
            "rounds": getattr(r, "rounds", None), "draw_seats": getattr(r, "draw_seats", None),
            "clock": r.clock, "trace": r.trace}


def assert_same_model(a: Any, b: Any) -> None:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("case", list(CASES))
def test_batched_steps_give_the_numbers_of_each_group_computed_as_it_is_due(
        case: str, monkeypatch: pytest.MonkeyPatch, single_thread: None) -> None:
    # Execute: the same run on both engines
    due, due_steps = run(case, batched=False, monkeypatch=monkeypatch)
    batched, batched_steps = run(case, batched=True, monkeypatch=monkeypatch)
    # Assert: every number the same, bit for bit, in no more engine steps
    assert numbers(batched) == numbers(due)
    assert_same_model(batched, due)
    assert batched.asynchronous["updates"] > 0
    assert batched_steps <= due_steps
    if "dropout" in case:  # random numbers: every group computed at once, as before
        assert batched_steps == due_steps


def test_a_population_in_flight_computes_far_fewer_engine_steps(
        monkeypatch: pytest.MonkeyPatch, single_thread: None) -> None:
    case = "fedbuff, 300 clients, 12 in flight, half-normal speeds"
    due, due_steps = run(case, batched=False, monkeypatch=monkeypatch)
    batched, batched_steps = run(case, batched=True, monkeypatch=monkeypatch)
    # 12 clients of distinct speeds: groups of one node, computed a batched step for several
    node_steps = due.samples // 4
    assert batched.samples == due.samples
    assert due_steps >= 0.8 * node_steps  # nearly one engine step per node-step
    assert batched_steps * 2 <= due_steps


def test_a_batched_population_resumes_bit_for_bit(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  single_thread: None) -> None:
    case = "async_local_sgd, 200 clients, 6 in flight, kept state, loop engine"
    full, _ = run(case, batched=True, monkeypatch=monkeypatch, out_dir=tmp_path / "full",
                  checkpoint_every=7, keep_checkpoints=4)
    again = resume_cut(tmp_path / "full", tmp_path / "cut", (14, 21, 24))
    assert again.resumed_from["step"] == 7
    got, want = numbers(again), numbers(full)
    for key in ("rows", "log", "sent", "received", "rounds", "draw_seats", "clock"):
        assert got[key] == want[key], key
    assert again.asynchronous == full.asynchronous
    assert_same_model(again, full)


@pytest.mark.parametrize("engine", ["loop", "threads", "vmap"])
def test_a_node_s_row_is_the_same_in_any_mask(engine: str, single_thread: None) -> None:
    # Prepare: 5 nodes apart (their own parameters, data and AdamW state after a few steps)
    def stack() -> tuple[NodeStack, FedBuff]:
        torch.manual_seed(3)
        nodes = NodeStack(Net(norm=True), 5, engine=engine)
        from exogym.sim.comm import InProcessCommunicator
        comm = InProcessCommunicator(5)
        s = make("fedbuff", H=1000)
        assert isinstance(s, FedBuff)
        s.setup(nodes, comm, 100)
        for k in range(3):
            active = [i <= k + 2 for i in range(5)]
            step(nodes, s, active, k)
        return nodes, s

    def step(nodes: NodeStack, s: FedBuff, active: list[bool], k: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(10 + k)
        batch = (torch.randn(5, 4, 6, generator=g), torch.randint(0, 3, (5, 4), generator=g))
        s.comm.attendance.active = active
        losses = nodes.forward_backward(batch, active)
        s.inner_step()
        nodes.zero_grad()
        return losses

    # Execute: node 1's and 3's next step with node 4, and with nodes 0 and 2
    a_nodes, a = stack()
    b_nodes, b = stack()
    la = step(a_nodes, a, [False, True, False, True, True], 7)
    lb = step(b_nodes, b, [True, True, True, True, False], 7)
    # Assert: their rows the same, bit for bit (losses, parameters, buffers, optimizer state)
    for i in (1, 3):
        assert torch.equal(la[i], lb[i])
        for name, p in a_nodes.params.items():
            assert torch.equal(p[i], b_nodes.params[name][i]), name
        for name, buf in a_nodes.buffers.items():
            assert torch.equal(buf[i], b_nodes.buffers[name][i]), name
        for p, q in zip(a.optimizer.param_groups[0]["params"],
                        b.optimizer.param_groups[0]["params"], strict=True):
            for key, value in a.optimizer.state[p].items():
                other = b.optimizer.state[q][key]
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    assert torch.equal(value[i], other[i]), key


def test_a_bare_compute_or_a_strategy_with_its_own_step_is_computed_as_due(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Clocks:
        clock = None

    bare = PerNodeTimelines(lambda step, active: None, object(),  # type: ignore[arg-type]
                            Clocks(), num_rows=2, total_steps=2)  # type: ignore[arg-type]
    assert isinstance(bare.due, ImmediateSteps)

    class OwnStep(FedBuff):
        def step(self, step: int) -> None:
            super().step(step)

    taken: list[list[bool] | None] = []
    take = ImmediateSteps.take
    monkeypatch.setattr(ImmediateSteps, "take", lambda self, step, rows, active: (
        taken.append(active), take(self, step, rows, active)))
    r = Trainer(Net(), data(), data()).fit(
        strategy=OwnStep(H=2, K=2), num_nodes=2, max_steps=4, batch_size=4,
        network=FAST, step_time=1.0, world="speed=1:0.5", progress=False)
    assert r.asynchronous["node_steps"] == [4, 2]  # at 0 s and 2 s both nodes, else the first
    assert taken == [None, [True, False], None, [True, False]]
