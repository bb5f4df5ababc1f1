"""The torch.distributed engine: real gloo processes give the simulator's numbers and bytes.

Every registered strategy (and a few codec / dropped-node variants) is trained for a few steps on
a tiny model with BatchNorm (buffers: broadcast, averaged, integer counters) by

- the in-process simulator (:meth:`exogym.Trainer.fit`), with N = 2 and N = 4 nodes;
- 2 gloo processes x 1 node (N = 2) and 2 processes x 2 nodes per process (N = 4),

from the same seed; the global models and every node's parameters agree to 1e-5, and the bytes
and collective logs are identical. The two processes are spawned once and run every strategy with
1 and then 2 nodes per process.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from support.runs import TinyBN  # also --ft's model (test_ft.py)
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from exogym import Trainer
from exogym.run.dist.communicator import DistributedCommunicator, local_batch
from exogym.run.dist.ranks import local_node_ids
from exogym.run.launch import (
    RankContext,
    WorkerError,
    _fit_rank,
    fit_processes,
    fit_strategies,
    launch,
)
from exogym.sim.comm import InProcessCommunicator
from exogym.sim.compute import host_cores
from exogym.sim.engine import NodeStack
from exogym.sim.sharding import NodeBatches
from exogym.strategy import get, make, registry
from exogym.strategy.base import StackedStrategy
from exogym.strategy.server import ServerStrategy

pytestmark = pytest.mark.usefixtures("single_thread")

STEPS, H, BATCH, SEED = 6, 3, 4, 0
TOL = {"atol": 1e-5, "rtol": 0.0}


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(96, 6, generator=g), torch.randint(0, 3, (96,), generator=g))


def strategies() -> dict[str, StackedStrategy]:
    """Every registered strategy with a short sync period, plus codec and drop variants."""
    out: dict[str, StackedStrategy] = {}
    for sid in registry():
        if issubclass(get(sid), ServerStrategy):
            continue  # simulation only: refused by the process engine (test below)
        overrides: dict[str, Any] = {"optim.lr": 0.05}
        fields = make(sid).hyperparameters()
        if "H" in fields:
            overrides["H"] = H
        if "p" in fields:
            overrides["p"] = 0.2
        if sid == "streaming_diloco":
            overrides["H"] = 2 * H  # tau = 1 needs H // P >= 2; fragments sync at steps 3 and 6
        if sid == "demo":
            overrides.update(s=4, k=2)
        out[sid] = make(sid, **overrides)
    out["ddp+topk_ef"] = make("ddp", codec="topk:0.25", error_feedback=True)
    out["diloco+int8"] = make("diloco", H=H, codec="int8")
    # seed 5: with N = 2, outer step 0 keeps one node (an all-reduce among one member sends
    # nothing) and step 1 keeps both; with N = 4, one and then two nodes are dropped.
    out["diloco+drop"] = make("diloco", H=H, q=0.5, seed=5)
    out["fedavg+randk"] = make("fedavgm", H=H, codec="randk:0.5", codec_seed=5)
    return out


STRATEGIES = strategies()


def reference(strategy: StackedStrategy, num_nodes: int) -> tuple[Any, dict[str, Tensor]]:
    """The simulator's result, and every node's final parameters from the same loop by hand."""
    result = Trainer(TinyBN(), dataset()).fit(
        strategy=copy.deepcopy(strategy), num_nodes=num_nodes, max_steps=STEPS, batch_size=BATCH,
        engine="loop", device="cpu", seed=SEED, progress=False, network=None)
    s = copy.deepcopy(strategy)
    torch.manual_seed(SEED)
    batches = NodeBatches(dataset(), num_nodes, BATCH, seed=SEED)
    nodes = NodeStack(TinyBN(), num_nodes, engine="loop")
    comm = InProcessCommunicator(num_nodes)
    s.setup(nodes, comm, STEPS)
    for step in range(STEPS):
        comm.attendance.step = step
        nodes.forward_backward(next(batches))
        s.step(step)
        nodes.zero_grad()
    assert comm.bytes_sent == result.bytes_sent
    return result, {k: p.detach().clone() for k, p in nodes.params.items()}


def _job(ctx: RankContext, strategies: list[StackedStrategy]) -> dict[int, dict[str, Any]]:
    """Everything one process does, for 1 and then 2 nodes per process in the same 2-process
    group (spawning costs seconds, so it happens once)."""
    out = {}
    for per_process in (1, 2):
        c = dataclasses.replace(ctx, nodes_per_process=per_process)
        out[per_process] = {
            "strategies": fit_strategies(c, TinyBN(), dataset(), strategies, STEPS, BATCH, SEED),
            "collectives": _collectives(c), "rows": _local_rows(c)}
    # A whole logged and evaluated run (fit_processes' per-rank loop), 2 x 2 nodes.
    out[2]["fit"] = _fit_rank(
        ctx if ctx.nodes_per_process == 2 else dataclasses.replace(ctx, nodes_per_process=2),
        TinyBN(), dataset(), dataset(), make("diloco", H=H),
        {"max_steps": STEPS, "batch_size": BATCH, "eval_interval": 2, "eval_batch_size": 32,
         "log_interval": 2, "seed": SEED, "engine": "loop", "progress": False,
         "network": "home-100mbps", "step_time": 0.01})
    return out


@pytest.fixture(scope="module")
def runs() -> dict[int, list[dict[str, Any]]]:
    """``{nodes_per_process: [per-rank results]}`` of 2 gloo processes running every strategy."""
    ranks = launch(_job, 2, list(STRATEGIES.values()), backend="gloo", timeout_s=30.0, threads=1)
    return {per_process: [rank[per_process] for rank in ranks] for per_process in (1, 2)}


@pytest.mark.parametrize("per_process", [1, 2])
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_processes_match_the_simulator(
    runs: dict[int, list[dict[str, Any]]], name: str, per_process: int
) -> None:
    num_nodes = 2 * per_process
    ref, ref_nodes = reference(STRATEGIES[name], num_nodes)
    j = list(STRATEGIES).index(name)
    ranks = [rank_results["strategies"][j] for rank_results in runs[per_process]]
    expected_model = ref.model.state_dict()
    for r, res in enumerate(ranks):
        assert res.node_ids == local_node_ids(r, per_process)
        # Bytes and the collective log: identical, on every rank, for all N nodes.
        assert res.bytes_sent == ref.bytes_sent
        assert res.bytes_received == ref.bytes_received
        assert res.comm_log == ref.comm_log
        # The global model (the same on every rank) and this rank's nodes.
        assert set(res.global_state) == set(expected_model)
        for k, v in expected_model.items():
            torch.testing.assert_close(res.global_state[k], v, **TOL, msg=f"{name} {k}")
        for k, p in res.node_params.items():
            torch.testing.assert_close(p, ref_nodes[k][res.node_ids], **TOL, msg=f"{name} {k}")
    assert sum(ref.bytes_sent) > 0  # every strategy communicated something in 6 steps


def test_a_logged_run_ends_with_the_simulators_summary(
    runs: dict[int, list[dict[str, Any]]],
) -> None:
    ref = Trainer(TinyBN(), dataset(), dataset()).fit(
        strategy=make("diloco", H=H), num_nodes=4, max_steps=STEPS, batch_size=BATCH,
        eval_interval=2, eval_batch_size=32, log_interval=2, engine="loop", device="cpu",
        seed=SEED, progress=False, network="home-100mbps", step_time=0.01)
    got = runs[2][0]["fit"]
    assert runs[2][1]["fit"] is None  # only rank 0 reports
    assert [r["step"] for r in got.history] == [r["step"] for r in ref.history] == [2, 4, 6]
    for a, b in zip(got.history, ref.history, strict=True):
        for k in ("epoch", "samples", "bytes_sent", "bytes_received", "sim_time_s"):
            assert a[k] == b[k], k
        for k in ("train_loss", "lr", "eval_loss"):
            assert abs(a[k] - b[k]) <= 1e-5, k
    assert got.final.keys() == ref.final.keys() == {"eval_loss"}
    assert got.bytes_sent == ref.bytes_sent and got.comm_log == ref.comm_log
    assert (got.num_nodes, got.steps, got.samples, got.processes) == (4, STEPS, 96, 2)
    assert got.clock == ref.clock  # the simulated clock: the same trace, the same times
    for k, v in ref.model.state_dict().items():
        torch.testing.assert_close(got.model.state_dict()[k], v, **TOL)


# -- the communicator itself, by hand -----------------------------------------------------------
def _collectives(ctx: RankContext) -> dict[str, Any]:
    comm = DistributedCommunicator(ctx.num_nodes, ctx.node_ids)
    # Node g holds the row [g, 10 g] (fp32) and the integer g.
    ids = torch.tensor(ctx.node_ids, dtype=torch.float32)
    x = torch.stack([ids, 10 * ids], dim=1)  # [n_local, 2]
    ints = torch.tensor(ctx.node_ids, dtype=torch.int64)
    half = x.to(torch.bfloat16)
    mean, total, int_mean = comm.all_reduce([x, x, ints], "mean")[0], \
        comm.all_reduce(x, "sum"), comm.all_reduce(ints, "mean")
    gathered = comm.all_gather([x, ints])
    bcast = comm.broadcast([x, ints], src=ctx.num_nodes - 1)
    inplace = x.clone()
    comm.all_reduce_(inplace, "mean")
    return {"mean": mean, "sum": total, "int_mean": int_mean, "half": comm.all_reduce(half),
            "gathered": gathered, "bcast": bcast, "inplace": inplace,
            "sent": comm.bytes_sent, "received": comm.bytes_received}


def test_collectives_by_hand(runs: dict[int, list[dict[str, Any]]]) -> None:
    # 2 processes x 2 nodes: N = 4, nodes 0..3 hold [g, 10 g].
    for res in (rank["collectives"] for rank in runs[2]):
        # mean of g over 0..3 = 6/4 = 1.5; of 10 g = 15; sum = 6 and 60
        assert res["mean"].tolist() == [1.5, 15.0]
        assert res["sum"].tolist() == [6.0, 60.0]
        assert res["int_mean"].item() == 1  # int64 mean 6/4 = 1.5 truncates to 1
        assert res["half"].dtype == torch.bfloat16 and res["half"].tolist() == [1.5, 15.0]
        assert res["gathered"][0].tolist() == [[0, 0], [1, 10], [2, 20], [3, 30]]
        assert res["gathered"][1].tolist() == [0, 1, 2, 3]
        assert res["bcast"][0].tolist() == [3.0, 30.0] and res["bcast"][1].item() == 3
        assert res["inplace"].tolist() == [[1.5, 15.0], [1.5, 15.0]]
        # S = 2 fp32 = 8 bytes (x), 8 bytes (int64). Per node sent:
        #   all_reduce [x, x, ints]: 2 * 3/4 * 24 = 36; all_reduce x: 2*3/4*8 = 12; ints: 12;
        #   all_gather [x, ints]: 3 * 16 = 48; broadcast from node 3: node 3 sends 3 * 16 = 48;
        #   all_reduce_ x: 12; bf16 all_reduce (S = 4): 2*3/4*4 = 6.
        # nodes 0..2: 36 + 12 + 12 + 48 + 12 + 6 = 126; node 3: 126 + 48 = 174.
        assert res["sent"] == [126.0, 126.0, 126.0, 174.0]
        # received: the same but the broadcast: nodes 0..2 receive S = 16, node 3 nothing.
        assert res["received"] == [142.0, 142.0, 142.0, 126.0]


def _local_rows(ctx: RankContext) -> list[Tensor]:
    batches = NodeBatches(dataset(), ctx.num_nodes, BATCH, seed=SEED)
    return [local_batch(batches, ctx.node_ids)[1]
            for _ in range(15)]  # 15 steps > 12 per epoch: crosses an epoch


def test_local_batches_are_the_simulators_rows(runs: dict[int, list[dict[str, Any]]]) -> None:
    results = [rank["rows"] for rank in runs[2]]
    batches = NodeBatches(dataset(), 4, BATCH, seed=SEED)
    for step in range(15):
        full = next(batches)[1]  # [4, B] labels
        assert torch.equal(results[0][step], full[:2])
        assert torch.equal(results[1][step], full[2:])


def test_wrong_layout_is_rejected() -> None:
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedCommunicator(2, [0])
    with pytest.raises(ValueError, match="nprocs must be an integer >= 1, got 0"):
        launch(_collectives, 0)


# -- robustness ---------------------------------------------------------------------------------
class Explodes(nn.Module):
    """Raises in rank 1's forward at its third step."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        self.calls_seen = getattr(self, "calls_seen", 0) + 1
        if dist.get_rank() == 1 and self.calls_seen == 3:
            raise FloatingPointError("boom at step 2")
        x, y = batch
        return F.cross_entropy(self.fc(x), y)


class SlowRank1(nn.Module):
    """Rank 1's training forward takes 40 ms more CPU than rank 0's."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        if self.training and dist.get_rank() == 1:
            end = time.thread_time() + 0.04  # CPU work: a node's compute is its CPU time
            while time.thread_time() < end:
                pass
        x, y = batch
        return F.cross_entropy(self.fc(x), y)


def test_each_rank_s_measured_compute_makes_the_straggler_wait() -> None:
    # Measured compute is per rank in a process run: node 1 (rank 1) is >= 40 ms slower per
    # step, so node 0 idles at every all-reduce until node 1 arrives, exactly the difference.
    r = fit_processes(SlowRank1(), dataset(), None, strategy=make("ddp"), num_nodes=2,
                      max_steps=8, batch_size=BATCH, log_interval=8, progress=False,
                      network="bw=1Gbps,latency=0s", backend="gloo", timeout_s=60.0, threads=1,
                      compute="measured")
    clock, trace = r.clock, r.trace
    assert clock.compute_source == "measured" and trace.node_process == (0, 1)
    rows = trace.step_seconds
    # 40 ms of CPU per step priced over the cores the two ranks share (one thread each)
    assert sum(slow - fast for fast, slow in rows) >= 8 * 0.04 / host_cores(1, 2) * 0.9
    # at each step's all-reduce a node idles for what the other rank took more
    idle = tuple(sum(max(0.0, row[1 - i] - row[i]) for row in rows) for i in (0, 1))
    assert clock.node_idle_s == pytest.approx(idle, rel=1e-9, abs=1e-12)
    assert clock.node_idle_s[0] > clock.node_idle_s[1]
    assert clock.node_compute_s == pytest.approx(
        tuple(sum(row[i] for row in trace.step_seconds) for i in (0, 1)), rel=1e-12)
    assert r.recost("bw=1Gbps,latency=0s") == clock


@pytest.mark.parametrize("sid", [s for s in registry() if issubclass(get(s), ServerStrategy)])
def test_asynchronous_strategies_are_refused_before_spawning(sid: str) -> None:
    with pytest.raises(ValueError, match=rf"{sid} is asynchronous: .* one process"):
        fit_processes(TinyBN(), dataset(), None, strategy=make(sid), num_nodes=2,
                      max_steps=10, batch_size=BATCH, progress=False, backend="gloo")


def test_a_raising_worker_ends_the_run_promptly_naming_its_rank(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    with pytest.raises(WorkerError, match=r"(?s)rank 1 .*FloatingPointError: boom at step 2"):
        fit_processes(Explodes(), dataset(), None, strategy=make("ddp"), num_nodes=2,
                      max_steps=10, batch_size=BATCH, log_interval=1, out_dir=tmp_path,
                      progress=False, network=None, backend="gloo", timeout_s=300.0, threads=1)
    # Rank 0 waits in an all-reduce; the launcher ends it long before the 300 s collective
    # timeout (about 3 s on an idle 2-core machine: spawning two Python processes that import
    # torch; the bound leaves room for a loaded CI machine).
    assert time.perf_counter() - t0 < 90.0
    # The rows written before the failure (steps 1 and 2; step 3 raised) are kept.
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]


def test_the_cause_is_reported_before_a_peers_broken_connection(tmp_path: Path) -> None:
    """The parent may see rank 0's 'Connection reset by peer' first when rank 1 raised and closed
    its group: the report names rank 1 and its error (a flaky CI failure, 2026-11-25)."""
    import pickle
    from types import SimpleNamespace

    import torch.multiprocessing as mp

    from exogym.run.launch import _root_cause

    files = [tmp_path / "0", tmp_path / "1", tmp_path / "2"]
    files[0].write_bytes(pickle.dumps("RuntimeError: ... Read error: Connection reset by peer"))
    files[1].write_bytes(pickle.dumps("FloatingPointError: boom at step 2"))
    context = SimpleNamespace(error_files=[str(f) for f in files])  # rank 2 wrote nothing
    seen = mp.ProcessRaisedException("Read error: Connection reset by peer", 0, 1)
    rank, message = _root_cause(context, seen)
    assert rank == 1 and "boom at step 2" in message
    # the first failure seen is kept when it is a cause itself, or when no other rank's is
    cause = mp.ProcessRaisedException("ValueError: bad", 2, 1)
    assert _root_cause(context, cause) == (2, "ValueError: bad")
    files[1].write_bytes(pickle.dumps("Broken pipe"))
    assert _root_cause(context, seen)[0] == 0


# -- a signal while the workers are spawned or start --------------------------------------------
class _NeverUnpickled:
    """An argument whose unpickling in a worker never ends (an hour's sleep): the worker stays
    in its start, before ``_entry``, where SIGINT would kill it and no signal is kept."""

    def __reduce__(self) -> tuple[Any, tuple[float]]:
        return (time.sleep, (3600.0,))


def _never_runs(ctx: RankContext, blocker: Any) -> None:
    raise AssertionError("the worker's argument never unpickles")


@pytest.mark.parametrize("when", ["while spawning", "while the workers start"])
def test_a_signal_before_the_workers_keep_it_stops_the_run_and_every_worker(
        when: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGINT to the parent while the workers are spawned (after the first one started), or
    once they all exist but have not reached the point where they keep a signal for their first
    step: launch kills every worker it started (none has trained), joins them and raises
    Stopped, so that nothing waits for them (they are not daemons). The signal comes from the
    process itself at that point (signal.raise_signal), so no timing is assumed."""
    import multiprocessing
    import signal
    from multiprocessing.context import SpawnProcess

    import torch.multiprocessing as mp

    from exogym.utils.signals import Stopped

    started: list[Any] = []
    real_start, real_start_processes = SpawnProcess.start, mp.start_processes

    def start(self: Any) -> None:
        real_start(self)
        started.append(self)
        if when == "while spawning" and len(started) == 1:
            signal.raise_signal(signal.SIGINT)  # rank 1 is not spawned yet

    def start_processes(*args: Any, **kwargs: Any) -> Any:
        context = real_start_processes(*args, **kwargs)
        join = context.join

        def join_signalled(*a: Any, **k: Any) -> Any:
            signal.raise_signal(signal.SIGINT)
            return join(*a, **k)

        if when == "while the workers start":
            context.join = join_signalled
        return context

    monkeypatch.setattr(SpawnProcess, "start", start)
    monkeypatch.setattr(mp, "start_processes", start_processes)
    before = set(multiprocessing.active_children())
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(KeyboardInterrupt) as err:  # Stopped is one; so is a stray Ctrl-C
            launch(_never_runs, 2, _NeverUnpickled(), backend="gloo", timeout_s=30.0, threads=1)
        assert isinstance(err.value, Stopped) and err.value.signal == signal.SIGINT, err.value
        assert len(started) == 2  # a spawn is not cut half-way: then both are stopped
        assert [p.exitcode for p in started] == [-signal.SIGKILL] * 2  # killed and joined
        assert set(multiprocessing.active_children()) <= before
        assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    finally:
        for p in started:
            if p.is_alive():
                p.kill()
                p.join()


def test_workers_keep_freed_memory_on_linux() -> None:
    """glibc gives large freed blocks back to the system and faults them in again every step
    (3-4 ms of kernel time per MNIST node-step in a process per node): workers turn that off."""
    import sys

    from exogym.run.dist.ranks import keep_freed_memory

    assert keep_freed_memory() is (sys.platform == "linux")


def test_a_process_run_from_the_command_line_shows_workers_warnings_in_one_line(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], mnist_data: Path) -> None:
    """The workers print warnings as the command line does (they printed Python's FILE:LINE:
    UserWarning form with the source line)."""
    from exogym.cli import main

    assert main(["run", "--task", "mnist", "--strategy", "diloco", "--set", "H=50", "--nodes",
                 "2", "--steps", "2", "--engine", "process", "--allow-unsynced",
                 "--eval-samples", "100", "--no-progress", "--data-dir", str(mnist_data),
                 "--out", str(tmp_path / "run")]) == 0
    err = capfd.readouterr().err
    assert "exogym: warning: diloco: 2 steps is not a multiple of H=50" in err
    assert "UserWarning" not in err


def test_a_real_collective_counts_its_wall_and_cpu_time_as_transport() -> None:
    # DistributedCommunicator's all-reduce, gather and broadcast add their wall time and their
    # CPU time (the measured compute leaves both out: tests/sim/test_clock.py) in a one-rank group
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        comm = DistributedCommunicator(1, [0])
        x = torch.ones(1, 4_000_000)  # 16 MB: copies that take CPU time
        for call in (lambda: comm.all_reduce([x]), lambda: comm.all_gather([x]),
                     lambda: comm.broadcast([x], 0)):
            wall, cpu = comm.transport_s, comm.transport_cpu_s
            call()
            assert comm.transport_s > wall and comm.transport_cpu_s > cpu
    finally:
        dist.destroy_process_group()
