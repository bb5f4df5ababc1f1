"""The simulated clock: hand-computed schedules, and the clock of short real runs."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from support.runs import noise_data
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from exogym import Classifier, Trainer
from exogym.cli import main
from exogym.sim.clock import (
    ClockTrace,
    SimClock,
    decode_comm_log,
    encode_comm_log,
    measure_step_time,
    parse_deadline,
    resolve_step_time,
)
from exogym.sim.comm import CommRecord
from exogym.sim.compute import host_cores
from exogym.sim.network import Network, parse_network
from exogym.strategy.base import StackedStrategy
from exogym.strategy.ddp import DDP
from exogym.strategy.diloco import DiLoCo
from exogym.strategy.optim import OptimSpec
from exogym.tasks.registry import Task

pytestmark = pytest.mark.usefixtures("single_thread")

# 8 Mbit/s = 1 MB/s, no latency: with N = 2 a ring all-reduce of S bytes takes
# 2 (N-1)/N * S / 1e6 = S / 1e6 seconds. The schedule tests use the bare formulas (every bit is
# payload, no software latency per hop) for round numbers; the runs below use the calibration.
NET2 = Network(up_bps=8e6, efficiency=1.0, hop_latency_s=0.0)
# The calibration of every network's defaults (exogym.sim.network): payload share of a link
# 1448 / 1547 = 0.936005, software latency 150 us per hop.
EFF = 1448 / 1547
HOP = 150e-6


def ar(step: int, payload: int = 1_000_000, tag: str = "g", overlap: bool = False) -> CommRecord:
    return CommRecord("all_reduce", payload, step, tag, overlap)


def run_clock(net: Network, n: int, c: float, steps: int, records: list[CommRecord],
              overlap_steps: int | None = None):
    return ClockTrace(n, steps, c, "given", overlap_steps, tuple(records)).cost(net)


# -- hand-computed schedules -----------------------------------------------------------------------
def test_synchronous_steps_wait_for_the_straggler() -> None:
    # node 1 computes at half speed: c = (1 s, 2 s); every step ends with a 1 s all-reduce.
    # Step: max(1, 2) + 1 = 3 s; 3 steps = 9 s. Node 0: compute 3, comm 3, idle 3 (1 s per
    # step waiting for node 1); node 1: compute 6, comm 3, idle 0.
    net = parse_network("bw=8Mbps,latency=0s,efficiency=1,hop_latency=0s,node_speed=1:0.5")
    r = run_clock(net, 2, 1.0, 3, [ar(0), ar(1), ar(2)])
    assert r.total_s == pytest.approx(9.0)
    assert r.node_compute_s == pytest.approx((3.0, 6.0))
    assert r.node_comm_s == pytest.approx((3.0, 3.0))
    assert r.node_idle_s == pytest.approx((3.0, 0.0))
    assert (r.compute_s, r.comm_s, r.idle_s) == pytest.approx((4.5, 3.0, 1.5))
    assert r.utilization == pytest.approx(0.5)
    # the same run with equal nodes: 3 * (1 + 1) = 6 s, no idle time, utilization 1/2
    even = run_clock(NET2, 2, 1.0, 3, [ar(0), ar(1), ar(2)])
    assert (even.total_s, even.idle_s, even.utilization) == pytest.approx((6.0, 0.0, 0.5))


def test_local_steps_only_wait_at_the_sync() -> None:
    # H = 3 with the same straggler: nodes drift apart for 3 steps (3 s vs 6 s), meet at the
    # sync: 6 + 1 = 7 s; then 3 more steps without a sync: node 1 ends at 13, node 0 at 10 and
    # idles 3 s more at the end. Node 0: compute 6, comm 1, idle 6; node 1: 12, 1, 0.
    net = parse_network("bw=8Mbps,latency=0s,efficiency=1,hop_latency=0s,node_speed=1:0.5")
    r = run_clock(net, 2, 1.0, 6, [ar(2)])
    assert r.total_s == pytest.approx(13.0)
    assert r.node_idle_s == pytest.approx((6.0, 0.0))
    assert r.node_comm_s == pytest.approx((1.0, 1.0))
    for i in range(2):
        assert r.node_compute_s[i] + r.node_comm_s[i] + r.node_idle_s[i] == pytest.approx(13.0)


def test_overlapped_collective_adds_only_what_compute_does_not_hide() -> None:
    # c = 1 s; a 2.5 s collective (S = 2.5 MB) issued after step 0 at t = 1 ends at 3.5.
    rec = [ar(0, 2_500_000, overlap=True)]
    # W = 2: needed after the compute of step 2 (t = 3): a 0.5 s stall, then step 3: 4.5 s.
    r = run_clock(NET2, 2, 1.0, 4, rec, overlap_steps=2)
    assert r.total_s == pytest.approx(4.5)
    assert r.comm_s == pytest.approx(0.5) and r.compute_s == pytest.approx(4.0)
    # W = 3: needed at t = 4 > 3.5, fully hidden: 4 s, comm 0
    r = run_clock(NET2, 2, 1.0, 4, rec, overlap_steps=3)
    assert (r.total_s, r.comm_s) == pytest.approx((4.0, 0.0))
    # no W: needed at the end of the run (t = 4): hidden too
    assert run_clock(NET2, 2, 1.0, 4, rec).total_s == pytest.approx(4.0)
    # blocking: 1 + 2.5 + 3 = 6.5 s
    assert run_clock(NET2, 2, 1.0, 4, [ar(0, 2_500_000)]).total_s == pytest.approx(6.5)
    # W = 0: due right after the step that sent it: as blocking
    assert run_clock(NET2, 2, 1.0, 4, rec, overlap_steps=0).total_s == pytest.approx(6.5)


def test_overlapped_collective_is_awaited_before_the_next_with_its_tag() -> None:
    # two 2.5 s overlapped syncs with the same tag after steps 0 and 1 (no W): the second is
    # sent at t = 2 but needs the first's result (t = 3.5): stall 1.5; it then runs 3.5 -> 6.0;
    # steps 2, 3 compute 3.5 -> 5.5; the end waits for it: 6.0 s, comm 1.5 + 0.5 = 2.0
    recs = [ar(0, 2_500_000, overlap=True), ar(1, 2_500_000, overlap=True)]
    r = run_clock(NET2, 2, 1.0, 4, recs)
    assert (r.total_s, r.comm_s, r.compute_s) == pytest.approx((6.0, 2.0, 4.0))
    # different tags need no wait, but share the network (one collective at a time):
    # first 1 -> 3.5, second 3.5 -> 6.0; compute ends at 4; the end waits until 6.0
    recs[1] = ar(1, 2_500_000, tag="h", overlap=True)
    assert run_clock(NET2, 2, 1.0, 4, recs).total_s == pytest.approx(6.0)


def test_blocking_collective_queues_behind_an_overlapped_one() -> None:
    # overlapped 2.5 s after step 0 (t = 1 -> 3.5), a blocking 1 s after step 1 (t = 2) must
    # wait for the network: 3.5 -> 4.5; then step 2: 5.5 s. Comm of each node: 2.5 s.
    recs = [ar(0, 2_500_000, tag="a", overlap=True), ar(1, 1_000_000, tag="b")]
    r = run_clock(NET2, 2, 1.0, 3, recs)
    assert (r.total_s, r.comm_s) == pytest.approx((5.5, 2.5))


def test_setup_collectives_come_before_the_first_step() -> None:
    clock = SimClock(NET2, 2, 1.0)
    clock.collective(ar(-1))  # e.g. a broadcast of the initial model: 1 s
    clock.compute(0)
    assert clock.now == pytest.approx(2.0)
    assert run_clock(NET2, 2, 1.0, 1, [ar(-1)]).total_s == pytest.approx(2.0)


def test_comm_log_encoding_round_trips() -> None:
    ddp = [ar(s) for s in range(500)]
    assert len(encode_comm_log(ddp)) == 1  # one block for a whole DDP run
    diloco = [ar(s) for s in range(99, 500, 100)]
    fields = {k: v for k, v in asdict(ar(99)).items() if k != "step"}
    assert fields["payload_bytes"] == 1_000_000 and fields["tag"] == "g"
    assert encode_comm_log(diloco) == [
        {"first_step": 99, "every": 100, "count": 5, "records": [fields]}]
    irregular = ([CommRecord("broadcast", 7, -1, "init")] + [ar(0), ar(0, 5, "b")]
                 + [ar(s, 3, f"fragment{s % 2}", True) for s in range(3, 30, 5)] + [ar(40)])
    for log in (ddp, diloco, irregular, []):
        blocks = encode_comm_log(log)
        assert decode_comm_log(json.loads(json.dumps(blocks))) == log


def test_resolve_step_time() -> None:
    assert resolve_step_time() == (None, "measured")
    assert resolve_step_time("1.5s") == (1.5, "given")
    assert resolve_step_time(0.25) == (0.25, "given")
    with pytest.raises(ValueError, match="step_time must be > 0 seconds"):
        resolve_step_time(0.0)
    with pytest.raises(ValueError, match="unknown duration unit 'parsecs'"):
        resolve_step_time("2 parsecs")


def test_parse_deadline_says_what_is_allowed() -> None:
    assert parse_deadline("1.5x") == ("x", 1.5) and parse_deadline("30s") == ("s", 30.0)
    assert parse_deadline("20ms") == ("s", 0.02)
    for zero in ("0s", "0ms", " 0.0s "):
        with pytest.raises(ValueError) as err:
            parse_deadline(zero)
        assert str(err.value) == (f"deadline {zero!r}: a duration must be above zero (e.g. 30s); "
                                  "or give a multiple of the median arrival, >= 1 (e.g. 2x)")
    for bad in ("soon", "-1s", "1e400s", "0"):
        with pytest.raises(ValueError) as err:
            parse_deadline(bad)
        assert str(err.value) == (
            f"deadline {bad!r}: give a multiple of the median arrival, a number >= 1 followed by "
            "x (e.g. 2x), or a finite duration above zero after the last synchronisation (e.g. "
            "30s)")
    with pytest.raises(ValueError, match=r"deadline '0.5x': .* a number >= 1 followed by x"):
        parse_deadline("0.5x")


# -- real runs -------------------------------------------------------------------------------------
class Tiny(nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.drop(F.relu(self.fc1(x))))


TRAIN, VAL = noise_data(256, 0), noise_data(64, 1)
P_BYTES = 4 * (8 * 16 + 16 + 16 * 4 + 4)  # fp32 parameters of Tiny: 4 x 212 = 848 bytes


def model(dropout: float = 0.0) -> Classifier:
    torch.manual_seed(0)
    return Classifier(Tiny(dropout))


def fit(strategy: StackedStrategy, **kwargs):
    kwargs = {"num_nodes": 3, "max_steps": 6, "batch_size": 8, "log_interval": 1,
              "device": "cpu", "progress": False, **kwargs}
    train = kwargs.pop("trainer_data", TRAIN)
    return Trainer(kwargs.pop("model", None) or model(), train, VAL).fit(strategy=strategy,
                                                                         **kwargs)


def test_ddp_run_clock_is_compute_plus_collectives(tmp_path: Path) -> None:
    net = parse_network("bw=1Mbps,latency=3ms")
    r = fit(DDP(), network=net, step_time=0.25, out_dir=tmp_path / "run")
    # one ring all-reduce of 848 bytes per step over 3 nodes:
    # 2 * 2 * (8 * 848 / 3 / (1e6 EFF) + 0.003 + HOP) = 4 * (0.0024159 + 0.00315) = 0.0222638 s
    t = 4 * (8 * P_BYTES / 3 / (1e6 * EFF) + 0.003 + HOP)
    assert t == pytest.approx(0.0222638, abs=1e-7)
    assert [rec.payload_bytes for rec in r.comm_log] == [P_BYTES] * 6
    assert r.clock.total_s == pytest.approx(6 * (0.25 + t), rel=1e-12)
    assert r.clock.compute_s == pytest.approx(1.5, rel=1e-12)
    assert r.clock.comm_s == pytest.approx(6 * t, rel=1e-12)
    assert r.clock.idle_s == 0.0 and r.clock.compute_source == "given"
    assert [row["sim_time_s"] for row in r.history] == pytest.approx(
        [k * (0.25 + t) for k in range(1, 7)], rel=1e-12)
    assert r.clock.total_s == pytest.approx(
        6 * 0.25 + sum(net.collective_time(c.op, c.payload_bytes, 3) for c in r.comm_log))
    assert r.recost(net) == r.clock  # replaying the log gives the live clock exactly
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["sim_time_s"] == r.clock.total_s
    assert summary["network"]["spec"] == net.spec()
    assert summary["utilization"] == pytest.approx(0.25 / (0.25 + t))
    trace = ClockTrace.from_dict(summary["clock"]["trace"])
    assert trace.cost(net) == r.clock
    assert "sim clock" in r.summary() and "utilization" in r.summary()


def test_diloco_run_and_recost_on_another_network() -> None:
    r = fit(DiLoCo(H=3), network="datacenter", step_time=0.5)
    assert [rec.step for rec in r.comm_log] == [2, 5]
    home = r.recost("home-100mbps")
    # 2 syncs of 848 bytes on 3 nodes at 100 Mbit/s, 20 ms: 4 * (8 * 848 / 3 / (1e8 EFF) + 0.02
    # + HOP) = 4 * (2.41594e-5 + 0.02015) = 0.0806966 s each
    t = 4 * (8 * P_BYTES / 3 / (1e8 * EFF) + 0.02 + HOP)
    assert t == pytest.approx(0.0806966, abs=1e-7)
    assert home.total_s == pytest.approx(6 * 0.5 + 2 * t, rel=1e-12)
    assert home.network == "home-100mbps" and home.compute_source == "given"
    assert r.recost("home-100mbps", step_time_s=1.0).total_s == pytest.approx(6.0 + 2 * t)
    assert r.clock.total_s < home.total_s


def test_stragglers_lengthen_synchronous_steps() -> None:
    net = parse_network("bw=1Mbps,latency=3ms,node_speed=1:1:0.25")  # node 2: 4x slower
    r = fit(DDP(), network=net, step_time=0.25)
    t = 4 * (8 * P_BYTES / 3 / (1e6 * EFF) + 0.003 + HOP)  # 0.0222638 s, as above
    assert r.clock.total_s == pytest.approx(6 * (1.0 + t), rel=1e-12)  # max(0.25, 1.0) + t
    assert r.clock.node_idle_s == pytest.approx((4.5, 4.5, 0.0))  # 6 x 0.75 s
    assert r.clock.idle_s == pytest.approx(3.0)


@dataclass(kw_only=True)
class OverlapAverage(StackedStrategy):
    """Test strategy: broadcasts the model at set-up, then every 2 steps an overlapped
    all-reduce of the parameters whose result is due ``tau`` steps later.

    Attributes:
        tau: steps the all-reduce overlaps.
    """

    tau: int = 1

    @property
    def overlap_steps(self) -> int:
        return self.tau

    def init_state(self) -> None:
        self.comm.broadcast(list(self.nodes.params.values()), 0, tag="init")

    def step(self, step: int) -> None:
        self.inner_step()
        if step % 2 == 1:
            self.comm.all_reduce(list(self.nodes.params.values()), tag="params", overlap=True)


def test_overlapped_run_uses_the_strategy_tau() -> None:
    # 0.1 Mbit/s, no latency but the hops' 150 us; star broadcast at set-up: 2 x 848 B = 13,568
    # bits / (1e5 EFF) + HOP = 0.1449565 + 0.00015 = 0.1451065 s; each all-reduce: 2 * 2/3 *
    # 6,784 bits / (1e5 EFF) + 4 HOP = 0.0966376 + 0.0006 = 0.0972376 s, after steps 1, 3, 5.
    net = parse_network("bw=0.1Mbps,latency=0s")
    b = 2 * 8 * P_BYTES / (1e5 * EFF) + HOP
    a = 4 / 3 * 8 * P_BYTES / (1e5 * EFF) + 4 * HOP
    assert (b, a) == pytest.approx((0.1451065, 0.0972376), abs=1e-7)
    # c = 0.05 s, tau = 1: the result is due after the next step's 0.05 s of compute, so each
    # sync but the last stalls a - 0.05; the last one (after step 5) is awaited at the end.
    r = fit(OverlapAverage(tau=1), network=net, step_time=0.05)
    assert [rec.step for rec in r.comm_log] == [-1, 1, 3, 5]
    assert r.clock.total_s == pytest.approx(b + 6 * 0.05 + 2 * (a - 0.05) + a, rel=1e-12)
    # tau = 3 hides 0.15 s > a: only the last sync, awaited at the end, shows
    r3 = fit(OverlapAverage(tau=3), network=net, step_time=0.05)
    assert r3.clock.total_s == pytest.approx(b + 6 * 0.05 + a, rel=1e-12)
    assert r.recost(net) == r.clock and r3.recost(net) == r3.clock


def test_the_clock_changes_no_training_number() -> None:
    """Priced on a device, measured, given or absent, on any network: the same seed gives the
    same losses (counting a step runs a copy of the model and restores the RNG; measuring times
    the run's own steps and draws no random number)."""
    runs = [fit(DiLoCo(H=2), model=model(0.3), network=net, seed=5, **how)
            for net, how in ((None, {}), ("home-100mbps", {"compute": "measured"}),
                             ("mobile", {"step_time": 2.0}), ("datacenter", {}),
                             ("home-100mbps", {"hardware": "m2"}))]
    losses = [[row["train_loss"] for row in r.history] for r in runs]
    assert losses[0] == losses[1] == losses[2] == losses[3] == losses[4]
    assert runs[0].clock is None and "sim_time_s" not in runs[0].history[0]
    assert runs[1].clock.compute_source == "measured" and runs[1].clock.step_time_s > 0
    assert runs[3].clock.compute_source == runs[4].clock.compute_source == "profile"
    for a, b in zip(runs[0].model.state_dict().values(), runs[1].model.state_dict().values(),
                    strict=True):
        assert torch.equal(a, b)


def burn(cpu_s: float) -> None:
    """Keep this thread's CPU busy for ``cpu_s`` seconds of its own CPU time."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


class SlowTraining(nn.Module):
    """Tiny, plus ``cpu_s`` of CPU work in every training forward (not in evaluation mode)."""

    def __init__(self, cpu_s: float) -> None:
        super().__init__()
        self.tiny, self.cpu_s = Tiny(), cpu_s

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            burn(self.cpu_s)
        return self.tiny(x)


class SlowLoading(TensorDataset):
    """A dataset that takes ``cpu_s`` of CPU work per sample read."""

    def __init__(self, base: TensorDataset, cpu_s: float) -> None:
        super().__init__(*base.tensors)
        self.cpu_s = cpu_s

    def __getitem__(self, i: int) -> tuple[Tensor, ...]:
        burn(self.cpu_s)
        return super().__getitem__(i)


def test_measured_compute_is_each_training_step_as_it_took() -> None:
    # Each node-step spends 30 ms of CPU in its training forward (evaluation mode does not: a
    # probe on an eval-mode copy would miss it) and 8 x 2 ms reading its batch: every step
    # measures at least 46 ms of CPU per node, priced over the C cores the run has. The clock
    # charges each step what it took: its compute is the sum of the measured steps, c their
    # mean, and a replay of the trace gives the same clock.
    torch.manual_seed(0)
    r = fit(DiLoCo(H=4), model=Classifier(SlowTraining(0.03)), network="bw=1Gbps,latency=0s",
            max_steps=8, log_interval=8, trainer_data=SlowLoading(TRAIN, 0.002),
            compute="measured")
    seconds = [row[0] for row in r.trace.step_seconds]
    cores = host_cores(torch.get_num_threads())
    assert r.trace.node_process == (0, 0, 0)  # one process
    assert len(seconds) == 8 and min(seconds) >= 0.046 / cores and max(seconds) < 1.0
    assert r.trace.compute_method.startswith(f"CPU time of the step's training work per node "
                                             f"/ {cores:g} core")
    assert r.clock.compute_source == "measured"
    assert r.clock.step_time_s == pytest.approx(sum(seconds) / 8, rel=1e-12)
    assert r.clock.node_compute_s == pytest.approx((sum(seconds),) * 3, rel=1e-12)
    comm = 2 * (2 * 2 * (8 * P_BYTES / 3 / (1e9 * EFF) + HOP))  # 2 syncs, 4 ring hops each
    assert r.clock.total_s == pytest.approx(sum(seconds) + comm, rel=1e-9)
    net = parse_network("bw=1Gbps,latency=0s")
    assert r.recost(net) == r.clock
    # a given step time replaces the measured ones
    assert r.recost(net, step_time_s=0.5).total_s == pytest.approx(8 * 0.5 + comm, rel=1e-9)


def test_measured_compute_reaches_the_clock_by_every_row() -> None:
    # The clock lags behind the steps and catches up at log steps: every row's simulated time
    # is the measured compute of the steps so far plus their all-reduces.
    r = fit(DDP(), network="bw=1Gbps,latency=0s", max_steps=6, log_interval=2, eval_interval=6,
            model=model(0.25), compute="measured")
    seconds = [row[0] for row in r.trace.step_seconds]
    rows = [row for row in r.history if "train_loss" in row]
    assert [row["step"] for row in rows] == [2, 4, 6]
    per_step = (r.clock.total_s - sum(seconds)) / 6  # the all-reduce of each step
    for row in rows:
        k = row["step"]
        assert row["sim_time_s"] == pytest.approx(sum(seconds[:k]) + k * per_step, rel=1e-9)


def test_measure_step_time_leaves_the_rng_and_the_model_alone() -> None:
    m = Tiny(dropout=0.5)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    state = torch.get_rng_state()
    x = (torch.randn(5, 8), torch.zeros(5, dtype=torch.long))
    torch.set_rng_state(state)
    c = measure_step_time(Classifier(m), x, OptimSpec(), "cpu", repeats=3, budget_s=0.01)
    assert c > 0
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())
    assert measure_step_time(Classifier(m), x, OptimSpec(), "cpu") == c  # cached
    with pytest.raises(ValueError, match="repeats must be an integer >= 3"):
        measure_step_time(Classifier(Tiny(0.1)), x, OptimSpec(), "cpu", repeats=2)


def test_a_custom_device_prices_the_counted_step() -> None:
    # a device of 1 GFLOP/s and 1 GB/s, no overhead: every kernel is compute- or memory-bound
    hardware = "flops=1G,mem_bw=1GB/s,overhead=0s,eta_c=1,eta_m=1"
    r = fit(DDP(), num_nodes=1, network="home-100mbps", hardware=hardware)
    assert r.clock.compute_source == "profile"
    assert r.compute is not None
    step = r.compute["step"]
    # at least the matrix products' FLOPs at 1 GFLOP/s, at most every FLOP and byte in turn
    assert step["matmul_flops"] / 1e9 <= r.clock.step_time_s
    assert r.clock.step_time_s <= step["flops"] / 1e9 + step["bytes"] / 1e9
    assert r.clock.total_s == pytest.approx(6 * r.clock.step_time_s, rel=1e-12)
    assert r.clock.utilization == pytest.approx(1.0)


def test_bad_clock_arguments() -> None:
    with pytest.raises(ValueError, match="unknown network profile 'dialup'"):
        fit(DDP(), network="dialup")
    with pytest.raises(ValueError, match="give one of them"):
        fit(DDP(), step_time=1.0, hardware="h100")
    with pytest.raises(ValueError, match=r"node_speed lists 2 values .* but the run has 3 nodes"):
        fit(DDP(), network="datacenter,node_speed=1:2", step_time=1.0)
    r = fit(DDP(), network=None)
    with pytest.raises(ValueError, match="no simulated clock"):
        r.recost("datacenter")


# -- the command line ------------------------------------------------------------------------------
def test_recost_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    r = fit(DDP(), network="datacenter", step_time=0.25, out_dir=out)
    assert main(["recost", str(out), "--network", "home-100mbps", "--network",
                 "bw=1Mbps,latency=3ms"]) == 0
    text = capsys.readouterr().out
    home = r.recost("home-100mbps")
    lines = {line.split()[0]: line for line in text.splitlines()[3:]}
    assert set(lines) == {"datacenter", "home-100mbps", "custom"}
    assert "(the run)" in lines["datacenter"]
    assert f"{home.total_s / r.clock.total_s:.3g}x" in lines["home-100mbps"]
    assert "6 collectives" in text and "0.25 s per step per node (given)" in text
    assert main(["recost", str(out), "--step-time", "1s", "--network", "home-100mbps"]) == 0
    text = capsys.readouterr().out
    assert "1 s per step per node (given)" in text
    # the run's own network is re-costed with the new step time too: 6 x (1 s + 4 x (8 x 848 /
    # 3 / (2e11 EFF) + 1e-5 + HOP)) = 6.00384 s; home: 6 x (1 + 4 x (2.41594e-5 + 0.02 + HOP))
    # = 6.48418 s
    run_row, home_row = text.splitlines()[3:5]
    assert run_row.split()[:4] == ["datacenter", "(the", "run)", "6"]
    assert home_row.split()[:2] == ["home-100mbps", "6.48"]
    assert main(["recost", str(out)]) == 0  # every profile but the run's own, after it
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()[3:]]
    assert names == ["datacenter", "cloud-10g", "home-1gbps", "home-100mbps", "mobile"]
    assert main(["recost", str(tmp_path / "nowhere")]) == 2
    assert "nowhere/summary.json does not exist" in capsys.readouterr().err
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "summary.json").write_text((out / "summary.json").read_text()[:200])
    assert main(["recost", str(tmp_path / "cut")]) == 2  # truncated: one line naming the file
    err = capsys.readouterr().err
    assert "cut/summary.json is not valid JSON (truncated or corrupted?)" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_run_command_reports_the_simulated_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny = Task(id="tiny", description="test", build_model=lambda: Classifier(Tiny()),
                load_data=lambda data_dir, download: (TRAIN, VAL), batch_size=8)
    monkeypatch.setattr("exogym.cli.run.get_task", lambda task_id: tiny)
    out = tmp_path / "run"
    assert main(["run", "--no-progress", "--strategy", "ddp", "--nodes", "4", "--steps", "2",
                 "--network", "home-100mbps", "--step-time", "1s", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "sim clock   home-100mbps (100 Mbit/s, 20 ms, ring all-reduce)" in printed
    # 2 steps x (1 s + ring all-reduce of 848 bytes over 4 nodes at 100 Mbit/s, 20 ms:
    # 6 x (8 x 848 / 4 / (1e8 EFF) + 0.02 + HOP) = 6 x (1.81196e-5 + 0.02015) = 0.1210087 s)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sim_time_s"] == pytest.approx(2.2420174, abs=1e-7)
    assert summary["sim_time_s"] == pytest.approx(2 * (1 + 6 * (8 * P_BYTES / 4 / (1e8 * EFF)
                                                               + 0.02 + HOP)),
                                                  rel=1e-12)
    assert summary["network"]["name"] == "home-100mbps"
    assert json.loads((out / "config.json").read_text())["network"] == "home-100mbps"
    with pytest.raises(SystemExit) as exit_:  # argparse: a bad unit is a usage error
        main(["run", "--network", "bw=1Gbit"])
    assert exit_.value.code == 2
    assert "unknown bandwidth unit 'Gbit'" in capsys.readouterr().err


# -- a run that cannot be re-costed says so, in the API, the command and its summary -------------
def test_a_run_that_cannot_be_recosted_refuses_another_step_time(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A world decided by simulated time: another compute time per step moves every failure and
    recovery in time, and so who took part, as another network does. FitResult.recost refuses
    both (the recorded network and compute replay as before), with exogym recost's words, and the
    summary says why instead of suggesting exogym recost."""
    out = tmp_path / "world"
    r = fit(DDP(), network="home-100mbps", world="mtbf=1s,mttr=0.5s", step_time=0.01,
            out_dir=out)
    why = ("its world (mtbf=1s,mttr=0.5s) decides who is up by simulated time, which another "
           "network would change")
    assert r.trace is not None and r.trace.not_recostable == why
    assert r.recost("home-100mbps") == r.clock  # its own network and compute: the recorded
    refusal = (f"this run cannot be re-costed with another compute time per step: {why}; train "
               "it again with --step-time 1s")
    for network in ("home-100mbps", "datacenter"):
        with pytest.raises(ValueError) as err:
            r.recost(network, step_time_s=1.0)
        assert str(err.value) == refusal
    with pytest.raises(ValueError, match=r"^this run cannot be re-costed on another network: "):
        r.recost("datacenter")
    capsys.readouterr()
    assert main(["recost", str(out), "--network", "home-100mbps", "--step-time", "1s"]) == 2
    assert capsys.readouterr().err == f"exogym: error: {refusal}\n"  # the command says the same
    summary = r.summary()
    assert f"            cannot be re-costed by exogym recost: {why}" in summary.splitlines()
    assert "on another network" not in summary
    plain = fit(DDP(), network="home-100mbps", step_time=0.01)
    assert plain.trace is not None and plain.trace.not_recostable is None
    # no folder written: the result re-costs itself; with one, the command names it
    assert ('            on another network: result.recost("NAME")'
            in plain.summary().splitlines())
    assert (f"            on another network: exogym recost {out} --network NAME"
            in replace(plain, out_dir=out).summary().splitlines())
    assert "cannot be re-costed" not in plain.summary()


def test_a_helper_thread_ending_during_a_step_is_not_priced_as_the_nodes_work() -> None:
    # a checkpoint writer's CPU, ended before the step's second reading, was priced as compute
    # (found in review); a thread that says so when it ends is subtracted
    import threading

    from exogym.sim.compute import StepMeter, thread_done

    meter = StepMeter(torch.device("cpu"), 1)

    def helper() -> None:
        burn(0.2)
        thread_done()

    worker = threading.Thread(target=helper, name="exogym-checkpoint-test")
    worker.start()
    mark = meter.start()
    worker.join()
    assert meter.stop(mark, 1) < 0.1


def test_the_cores_a_run_is_given_can_be_set_by_exogym_cores(monkeypatch) -> None:
    # Four ranks that stand for machines of their own on two cores: each has half a core, and
    # a node's step is priced at twice its CPU time (bench/clock_fidelity.py's N = 4 runs)
    from exogym.sim.compute import StepMeter

    monkeypatch.setenv("EXOGYM_CORES", "0.5")
    assert host_cores(1) == host_cores(8, 4) == 0.5
    meter = StepMeter(torch.device("cpu"), host_cores(1))
    mark = meter.start()
    burn(0.05)
    assert 0.1 <= meter.stop(mark, 1) < 0.13
    torch.manual_seed(0)
    r = fit(DiLoCo(H=4), model=Classifier(SlowTraining(0.03)), network="bw=1Gbps,latency=0s",
            max_steps=4, log_interval=4, compute="measured")
    assert min(row[0] for row in r.trace.step_seconds) >= 0.03 / 0.5
    assert r.trace.compute_method.startswith(
        "CPU time of the step's training work per node / 0.5 cores (the run's share of this "
        "machine, EXOGYM_CORES)")
    monkeypatch.setenv("EXOGYM_CORES", "3")
    assert host_cores(1) == 3.0


@pytest.mark.parametrize("bad", ["abc", "0", "-1", "nan", "inf", ""])
def test_a_bad_exogym_cores_is_refused_by_name(monkeypatch, bad: str) -> None:
    monkeypatch.setenv("EXOGYM_CORES", bad)
    with pytest.raises(ValueError, match=f"EXOGYM_CORES={bad!r}: .* must be a number > 0"):
        host_cores(1)


@pytest.mark.parametrize("cores", [0, -1.0, float("nan"), True])
def test_a_step_meter_refuses_cores_that_are_not_a_positive_number(cores: object) -> None:
    from exogym.sim.compute import StepMeter

    with pytest.raises(ValueError, match=rf"cores must be a number > 0, got {cores!r}"):
        StepMeter(torch.device("cpu"), cores)  # type: ignore[arg-type]


def test_a_collectives_cpu_time_is_transport_not_compute(monkeypatch) -> None:
    # gloo reduces and copies on the calling thread and moves bytes on its own: 8 to 12 ms of a
    # 20 ms MNIST step over a shaped 100 Mbit/s link, priced as compute before (a DDP run's
    # total was 9% over). A process run's collectives count their CPU time as transport
    # (exogym.run.dist._transport) and the step's price leaves it out; here a collective that
    # burns 40 ms of CPU stands for one, counted (wrapped) or not.
    import threading

    from exogym.run.dist.communicator import _transport
    from exogym.sim.comm import InProcessCommunicator
    from exogym.sim.compute import thread_done, work_cpu_mark, work_cpu_since

    go = threading.Event()
    helper = threading.Thread(target=lambda: (go.wait(), burn(0.1), thread_done()),
                              name="exogym-metrics-test")  # ends before the second reading
    helper.start()
    mark = work_cpu_mark()
    go.set()
    burn(0.03)
    helper.join()
    assert 0.03 <= work_cpu_since(mark) < 0.06  # the helper thread's 0.1 s is not transport

    original = InProcessCommunicator._all_reduce_inplace

    def burning(self, tensors, op):
        burn(0.04)
        return original(self, tensors, op)

    def median_price(method) -> float:
        monkeypatch.setattr(InProcessCommunicator, "_all_reduce_inplace", method)
        torch.manual_seed(0)
        r = fit(DDP(), model=Classifier(SlowTraining(0.01)), network="bw=1Gbps,latency=0s",
                max_steps=6, log_interval=6, num_nodes=2, compute="measured")
        return sorted(row[0] for row in r.trace.step_seconds)[3]

    monkeypatch.setattr(InProcessCommunicator, "wall", None, raising=False)
    cores = host_cores(torch.get_num_threads())
    counted, uncounted = median_price(_transport(burning)), median_price(burning)
    # 2 nodes in one process: the burn is 0.02 s per node over C cores
    assert uncounted - counted >= 0.8 * 0.04 / 2 / cores
    assert counted < (0.01 + 0.01) / cores
