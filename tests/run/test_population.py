"""Populations (exogym.run.nodes.population): a run with partial participation holds the round's K
clients in seats, and gives the numbers of the run with a row per client: the same draws,
bytes, collectives (in client ids), events, losses and model, bit for bit; a million clients
start and train; the data of a population (exogym.sim.client_data); the client store
(exogym.run.nodes.client_store) and exact resume."""

from __future__ import annotations

import json
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.resume_cases import Labelled, Net, data
from support.runs import client_run

from exogym import Trainer
from exogym.run.nodes.client_store import ClientStore, parse_client_store
from exogym.run.nodes.population import client_records
from exogym.run.output.result import NonFiniteLossError
from exogym.sim.client_data import ClientBatches, shard_mode
from exogym.sim.participation import Participation
from exogym.sim.sharding import NodeBatches
from exogym.strategy import make
from exogym.strategy.optim import OptimSpec

WALL = {"wall_s"}


def fit(strategy: Any, mode: str, *, k: int = 2, **extra: Any):
    """test_participation.py's run (:func:`support.runs.client_run`): ``k`` clients a round,
    held as ``mode`` says (``clients_in_memory``)."""
    return client_run(strategy, participation=k, clients_in_memory=mode, **extra)


def rows(result: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k not in WALL} for row in result.history]


def assert_same_run(a: Any, b: Any, period: int) -> None:
    """``b`` (seats) gives ``a``'s numbers (a row per client) exactly."""
    assert b.population is not None and a.population is None
    assert rows(a) == rows(b)
    assert a.bytes_sent == list(b.bytes_sent) and a.bytes_received == list(b.bytes_received)
    assert a.events == b.events and a.world == b.world
    assert client_records(b.comm_log, b.rounds, period) == a.comm_log
    assert a.clock.total_s == b.clock.total_s
    for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values(), strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("sid", ["fedavg", "diloco", "fedadam", "fedprox"])
@pytest.mark.parametrize("state", ["fresh", "keep"])
def test_seats_give_the_numbers_of_a_row_per_client(sid: str, state: str) -> None:
    h = 2
    a = fit(make(sid, H=h), "all", client_state=state)
    b = fit(make(sid, H=h), "round", client_state=state)
    assert_same_run(a, b, h)
    assert b.population["rounds"] == 6 and b.population["per_round"] == 2
    assert len(b.rounds) == 6 and all(r == sorted(r) and len(r) == 2 for r in b.rounds)
    assert b.population["joins"] == b.world["recoveries"] > 0


@pytest.mark.parametrize("mode", ["all", "round"])
def test_a_client_s_bytes_through_a_server_are_its_own_worked_by_hand(mode: str) -> None:
    # FedAvg, H = 2, 6 clients, 2 a round (seed 0): the rounds' clients, in order
    r = fit(make("fedavg", H=2), mode)
    rounds = [[0, 4], [1, 5], [4, 5], [2, 3], [2, 3], [0, 4]]
    assert [sorted(c) for c in (r.rounds or [[i for i in range(6) if rec.members >> i & 1]
                                              for rec in r.comm_log if rec.op == "all_reduce"])
            ] == rounds
    s = 332.0  # the model's bytes: Net(6 -> 16 -> 3) in float32 is 83 numbers
    # each round, each client uploads its model and downloads the average: one S each way; a
    # client not in the previous round first downloads the global model from the server (a
    # join: rounds 1: 1 and 5; 2: 4; 3: 2 and 3; 5: 0 and 4). No client uploads for another.
    rounds_in = [2, 1, 2, 2, 3, 2]
    joins = [1, 1, 1, 1, 2, 1]
    assert list(r.bytes_sent) == [s * k for k in rounds_in]
    assert list(r.bytes_received) == [s * (k + j) for k, j in zip(rounds_in, joins, strict=True)]
    assert r.world["recoveries"] == 7 and r.world["recovery_bytes"] == 7 * s
    recoveries = [e for e in r.events if e["event"] == "recovery"]
    assert all(e["from"] == "server" and "donor" not in e for e in recoveries)
    # a join lasts its download: 8 S / (efficiency * 100 Mbit/s) plus one latency
    net = r.network
    assert net is not None
    took = 8 * s / (net.efficiency * 100e6) + net.message_latency_s
    assert all(e["duration_s"] == pytest.approx(took, rel=1e-9) for e in recoveries)
    if mode == "round":
        # the server sent 12 averages and 7 models, and received 12 uploads
        p = r.population
        assert p["server_bytes_sent"] == 19 * s and p["server_bytes_received"] == 12 * s
        assert p["join_time_s"] == pytest.approx(7 * took, rel=1e-9)
        traffic = next(x for x in r.summary().splitlines() if x.startswith("traffic"))
        assert traffic == ("traffic     per client sent 664 B, received 1.05 KB (mean over the 6 "
                           "that took part; max 996 B, 1.66 KB; 13 collectives)")


@pytest.mark.parametrize("engine", ["loop", "threads"])
def test_seats_on_both_engines_with_dropout_and_a_dirichlet_split(engine: str) -> None:
    def run(mode: str) -> Any:
        torch.manual_seed(3)
        return Trainer(Net(drop=True), data(), data()).fit(
            strategy=make("fedavg", H=3), num_nodes=8, max_steps=9, batch_size=4,
            network="home-100mbps", step_time=0.1, progress=False, log_interval=1,
            eval_interval=9, participation=3, clients_in_memory=mode, engine=engine,
            partition="dirichlet:1.0")

    assert_same_run(run("all"), run("round"), 3)


def test_a_fresh_client_restarts_its_state_every_round_and_a_kept_one_does_not() -> None:
    # stateless SGD: the client state cannot matter; Adam: it does
    sgd = [fit(make("fedavg", H=2, optim=OptimSpec(name="sgd", lr=0.05)), "round",
               client_state=s) for s in ("fresh", "keep")]
    assert rows(sgd[0]) == rows(sgd[1])
    adam = [fit(make("fedavg", H=2), "round", client_state=s) for s in ("fresh", "keep")]
    assert rows(adam[0]) != rows(adam[1])
    store = adam[1].population["store"]
    # every client that trained wrote its state after each of its rounds: 6 rounds x 2
    assert store["writes"] == 12 and store["clients"] == adam[1].population["clients_trained"]
    assert store["reads"] == 12 - store["clients"]  # a client's first round reads nothing


def test_a_million_clients_start_in_seconds_and_train_the_round_s_few() -> None:
    n = 1_000_000
    t0 = time.perf_counter()
    torch.manual_seed(0)
    big = Labelled(torch.randn(400, 6), torch.randint(0, 3, (400,)))
    r = Trainer(Net(), big, data()).fit(
        strategy=make("fedavg", H=2), num_nodes=n, max_steps=6, batch_size=4,
        network="home-100mbps", step_time=0.1, progress=False, log_interval=2,
        participation=5, partition="dirichlet:0.5", eval_samples=None)
    assert time.perf_counter() - t0 < 60  # a generous bound: seconds here
    assert r.population["clients"] == n and r.population["clients_trained"] == 15
    assert r.samples == 5 * 6 * 4
    assert len(r.bytes_sent) == n and np.count_nonzero(np.asarray(r.bytes_sent)) == 15
    summary = r.to_dict()
    assert summary["bytes_sent_per_node"]["nodes_with_traffic"] == 15
    drawn = [c for rnd in r.rounds for c in rnd]
    assert drawn == [c for k in range(3) for c in Participation(count=5).draw_ids(k, n)]
    # the clients drawn after the first round receive the global model: joins, not recoveries
    world = next(line for line in r.summary().splitlines() if line.startswith("world"))
    assert " 0 failures, 10 joins (" in world and "recover" not in world


def test_the_draw_is_o_k_uniform_among_the_available_and_the_rows_path_s_draw() -> None:
    p = Participation(count=10, seed=2)
    t0 = time.perf_counter()
    ids = p.draw_ids(7, 10**9)
    assert time.perf_counter() - t0 < 0.5 and ids == sorted(set(ids)) and len(ids) == 10
    # the rows path's boolean form is the same draw
    flags = p.draw(3, [True] * 50)
    assert [i for i, f in enumerate(flags) if f] == p.draw_ids(3, 50)
    up = np.arange(50) % 5 == 0  # 10 of 50 up
    assert p.draw(3, up.tolist()) == [bool(u) for u in up]  # as many up as K: all of them
    few = np.arange(1000) % 100 == 0  # 10 up of 1,000: found by listing them
    assert p.draw_ids(1, 1000, few.__getitem__) == list(range(0, 1000, 100))
    # uniform among the available: each of 40 available clients drawn 1/4 of the time
    half = np.arange(80) % 2 == 0
    counts = np.zeros(80)
    for r in range(2000):
        counts[Participation(count=10, seed=r).draw_ids(0, 80, half.__getitem__)] += 1
    assert counts[~half].sum() == 0
    assert np.all(np.abs(counts[half] / 2000 - 0.25) < 0.05)  # 5 sigma: sqrt(.25*.75/2000)=.01


def test_client_batches_deal_the_rows_path_s_batches() -> None:
    ds = data()
    for partition in ("iid", "dirichlet:0.7", "contiguous"):
        rows_path = NodeBatches(ds, 6, 4, seed=5, partition=partition)
        seats = ClientBatches(ds, 6, 4, seed=5, partition=partition)
        assert seats.mode == "disjoint"
        assert seats.steps_per_epoch == rows_path.steps_per_epoch
        for step in range(20):  # clients 1 and 4 train, the others wait
            active = [i in (1, 4) for i in range(6)]
            ids = rows_path.next_indices(active)
            mine = torch.stack([seats.next_ids(c) for c in (1, 4)])
            assert torch.equal(ids[[1, 4]], mine), (partition, step)


def test_sampled_shards_are_drawn_per_client_from_the_seed() -> None:
    ds = Labelled(torch.randn(200, 6), torch.arange(200) % 4)
    assert shard_mode(200, 100, 4) == "sampled" and shard_mode(200, 50, 4) == "disjoint"
    a = ClientBatches(ds, 10**6, 4, seed=1, partition="dirichlet:0.1")
    b = ClientBatches(ds, 10**6, 4, seed=1, partition="dirichlet:0.1")
    assert a.per_client == 4  # max(B, L // N)
    assert torch.equal(a.shard(123_456), b.shard(123_456))
    assert not torch.equal(a.shard(1), a.shard(2))
    # alpha = 0.1: a client's samples come from few classes
    classes = [len(set(ds.targets[a.shard(c)].tolist())) for c in range(200)]
    assert np.mean(classes) < 2.0
    iid = ClientBatches(ds, 1000, 8, seed=1, partition="iid")
    assert iid.per_client == 8 and len(set(iid.shard(3).tolist())) == 8
    assert a.partition_stats() == {"partition": "dirichlet:0.1", "mode": "sampled",
                                   "clients": 10**6, "samples_per_client": 4}
    with pytest.raises(ValueError, match=r"contiguous.*at most 50 clients"):
        ClientBatches(ds, 1000, 4, seed=1, partition="contiguous")


def test_client_store_keeps_records_in_memory_then_on_disk(tmp_path: Path) -> None:
    class Fake:  # the store's view of a strategy: its client rows and step counts
        def __init__(self) -> None:
            self.m = torch.zeros(3, 5)
            self.v = torch.zeros(3, 2, dtype=torch.float64)
            self.node_steps = torch.zeros(3, dtype=torch.long)

        def client_state(self) -> list[torch.Tensor]:
            return [self.m, self.v]

        def restart_row(self, row: int) -> None:
            self.m[row], self.v[row], self.node_steps[row] = 0, 0, 0

    s = Fake()
    record = 5 * 4 + 2 * 8 + 8  # bytes of one client's rows and its count
    store = ClientStore(2 * record, tmp_path / "store")
    for client in range(4):
        s.m[0], s.v[0], s.node_steps[0] = client, -client, 10 + client
        store.save(client, s, 0)  # type: ignore[arg-type]
    assert store.host_bytes == 2 * record and sorted(store.host) == [2, 3]
    assert sorted(store.index) == [0, 1] and store.stats["disk_bytes"] == 2 * record
    for client in (0, 3):
        assert store.load(client, s, 1)  # type: ignore[arg-type]
        assert torch.equal(s.m[1], torch.full((5,), float(client)))
        assert torch.equal(s.v[1], torch.full((2,), -float(client), dtype=torch.float64))
        assert int(s.node_steps[1]) == 10 + client
    assert not store.load(9, s, 1)  # type: ignore[arg-type]
    state = store.state_dict()  # host records appended: the index names every client
    assert state["index"][:, 0].tolist() == [0, 1, 2, 3]
    again = ClientStore(0, tmp_path / "store")
    again.load_state_dict(state)
    assert again.load(2, s, 2) and int(s.node_steps[2]) == 12  # type: ignore[arg-type]
    for segment in (tmp_path / "store").glob("segment-*.bin"):
        segment.write_bytes(b"")
    with pytest.raises(ValueError, match=r"not in .* any more"):
        ClientStore(0, tmp_path / "store").load_state_dict(state)
    assert parse_client_store("2GB:/x") == (2 * 10**9, Path("/x"))
    with pytest.raises(ValueError, match="SIZE must be a number of bytes"):
        parse_client_store("lots")


def test_a_population_that_keeps_state_resumes_bit_for_bit(tmp_path: Path) -> None:
    def run(out: Path, **extra: Any) -> Any:
        return fit(make("fedavg", H=2), "round", nodes=40, steps=10, k=3, out_dir=out,
                   client_state="keep", client_store="0B", **extra)

    full = run(tmp_path / "full", checkpoint_every=3, keep_checkpoints=4)
    assert (tmp_path / "full" / "client-store").is_dir()  # 0 B of memory: records on disk
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "full", cut)
    for step in (6, 9, 10):
        shutil.rmtree(cut / "checkpoints" / f"step-{step:08d}", ignore_errors=True)
    (cut / "summary.json").unlink()
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = Trainer(Net(), data(), data()).fit(resume=cut, progress=False)
    assert again.resumed_from["step"] == 3  # mid-round (H = 2)
    assert rows(again) == rows(full) and again.comm_log == full.comm_log
    assert again.rounds == full.rounds and again.events == full.events
    assert list(again.bytes_sent) == list(full.bytes_sent)
    for x, y in zip(full.model.state_dict().values(), again.model.state_dict().values(),
                    strict=True):
        assert torch.equal(x, y)


def test_what_prevents_seats_is_named() -> None:
    with pytest.raises(ValueError, match=r"world 'fail=0@2'.*use clients_in_memory='all'"):
        fit(make("fedavg", H=2), "round", world="fail=0@2")
    with pytest.raises(ValueError, match="clients_in_memory must be 'auto', 'round' or 'all'"):
        fit(make("fedavg", H=2), "some")
    with pytest.raises(ValueError, match="client_store 'x'"):
        fit(make("fedavg", H=2), "round", client_store="x")
    # auto: a world whose participants fail inside a round holds a row per client
    r = fit(make("fedavg", H=2), "auto", world="fail=0@2")
    assert r.population is None


def test_seats_take_their_clients_speeds_as_the_rows_do() -> None:
    world = "speed_sigma=0.5,seed=2"
    a = fit(make("fedavg", H=2), "all", nodes=12, k=3, world=world)
    b = fit(make("fedavg", H=2), "round", nodes=12, k=3, world=world)
    assert_same_run(a, b, 2)  # the joins' transfers timed as each client's own (two per seat)


def test_clients_are_drawn_among_those_the_trace_says_are_up(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    # 4 trace nodes: 1 and 3 never up; node i of the population follows trace node i mod 4
    trace.write_text('{"format": "exogym-availability-v1", "nodes": '
                     '[[[0, null]], [[1e12, null]], [[0, null]], [[1e12, null]]]}')
    r = fit(make("fedavg", H=2), "round", nodes=40, k=5, world=f"trace:{trace}")
    drawn = {c for rnd in r.rounds for c in rnd}
    assert drawn and all(c % 2 == 0 for c in drawn) and len(drawn) > 10


def test_the_diurnal_share_online_follows_the_day() -> None:
    from exogym.sim.availability import Diurnal
    from exogym.sim.world import parse_world

    day = Diurnal(0.1, 0.5, day_s=100.0, session_s=10.0, seed=4)
    assert day.share(0) == pytest.approx(0.1) and day.share(50) == pytest.approx(0.5)
    assert day.share(25) == pytest.approx(0.3)  # 0.1 + 0.4 * (1 - cos(pi / 2)) / 2
    ids = np.arange(200_000)
    for t, share in ((0.0, 0.1), (50.0, 0.5), (25.0, day.share(20.0))):  # a session's start
        assert abs(day.up(ids, t).mean() - share) < 0.005  # 4 sigma of 200,000 draws
    assert np.array_equal(day.up(ids[:50], 51.0), day.up(ids[:50], 59.0))  # one session
    assert not np.array_equal(day.up(ids[:50], 51.0), day.up(ids[:50], 61.0))
    node = int(np.flatnonzero(~day.up(ids[:100], 0.0))[0])
    back = day.next_up(node, 0.0)
    assert back is not None and back % 10.0 == 0 and day.is_up(node, back)
    w = parse_world("online=0.1:0.5,day=100s,session=10s,seed=4")
    assert w.online == day and parse_world(w.spec()) == w and w.availability_varies
    with pytest.raises(ValueError, match="LOW:HIGH with LOW <= HIGH"):
        parse_world("online=0.5:0.1")
    with pytest.raises(ValueError, match="day= and session= shape online"):
        parse_world("day=1h")


def fit_async(sid: str = "fedbuff", *, nodes: int = 1000, c: int = 5, steps: int = 20,
              **extra: Any) -> Any:
    torch.manual_seed(1)
    overrides = {"H": 2, "K": 2} if sid == "fedbuff" else {"H": 2}
    return Trainer(Net(), data(), data()).fit(
        strategy=make(sid, **overrides), num_nodes=nodes, max_steps=steps, batch_size=4,
        network="home-100mbps", step_time=0.1, progress=False, log_interval=5,
        eval_interval=10, concurrency=c, **extra)


@pytest.mark.parametrize("sid", ["fedbuff", "async_local_sgd"])
def test_an_asynchronous_server_keeps_c_clients_of_a_population_in_flight(sid: str) -> None:
    r = fit_async(sid, world="speed=halfnormal:1:0.1,seed=3")
    p = r.population
    assert p["asynchronous"] and p["per_round"] == 5
    updates = r.asynchronous["updates"]
    # a new client per update received, but for the last ones, delivered as the run ends
    assert len(r.rounds[0]) == 5 and updates - 5 <= len(r.rounds) - 1 < updates
    # a client drawn is never one in flight: the seats always hold 5 different clients
    seats = list(r.rounds[0])
    for (client,), seat in zip(r.rounds[1:], r.draw_seats, strict=True):
        assert client not in seats
        seats[seat] = client
    # bytes: each push is its client's (one per update), a model sent to the next client
    pushes = [rec for rec in r.comm_log if rec.op == "push"]
    assert len(pushes) == updates
    sent, received = np.asarray(r.bytes_sent), np.asarray(r.bytes_received)
    drawn = {c for rnd in r.rounds for c in rnd}
    assert set(np.flatnonzero(sent).tolist()) <= drawn
    assert set(np.flatnonzero(received).tolist()) <= drawn
    assert 0 < np.count_nonzero(sent) <= updates


def test_a_small_population_draws_the_one_client_not_in_flight() -> None:
    r = fit_async(nodes=6, c=5)
    seats = list(r.rounds[0])
    for (client,), seat in zip(r.rounds[1:], r.draw_seats, strict=True):
        assert {client} == set(range(6)) - set(seats)  # the only free one: the one that left
        seats[seat] = client


def test_an_asynchronous_population_resumes_bit_for_bit(tmp_path: Path) -> None:
    full = fit_async(steps=12, out_dir=tmp_path / "full", checkpoint_every=5,
                     keep_checkpoints=4, client_state="keep",
                     world="speed=halfnormal:1:0.1,seed=3")
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "full", cut)
    for step in (10, 12):
        shutil.rmtree(cut / "checkpoints" / f"step-{step:08d}", ignore_errors=True)
    (cut / "summary.json").unlink()
    torch.manual_seed(1)
    again = Trainer(Net(), data(), data()).fit(resume=cut, progress=False)
    assert again.resumed_from["step"] == 5
    assert rows(again) == rows(full) and again.rounds == full.rounds
    assert again.comm_log == full.comm_log and list(again.bytes_sent) == list(full.bytes_sent)


def test_concurrency_is_an_asynchronous_server_s() -> None:
    with pytest.raises(ValueError, match="fedavg is synchronous: it takes participation=K"):
        fit(make("fedavg", H=2), "auto", concurrency=3)
    with pytest.raises(RuntimeError, match="no client free to train"):
        fit_async(nodes=1000, c=5, world="online=0:0.001,seed=1")


def test_two_processes_hold_the_seats_and_give_the_one_process_run() -> None:
    from exogym.run.launch import fit_processes

    kw: dict[str, Any] = dict(max_steps=8, batch_size=4, network="home-100mbps", step_time=0.1,
                              progress=False, log_interval=2, eval_interval=4, participation=4,
                              engine="loop", client_state="keep")
    torch.manual_seed(1)
    one = Trainer(Net(), data(), data()).fit(strategy=make("fedadam", H=2), num_nodes=40, **kw)
    torch.manual_seed(1)
    two = fit_processes(Net(), data(), data(), strategy=make("fedadam", H=2), num_nodes=40,
                        nodes_per_process=2, backend="gloo", threads=1, **kw)
    assert two.processes == 2 and two.population["per_round"] == 4  # 2 seats in each
    assert two.rounds == one.rounds and two.comm_log == one.comm_log
    assert two.bytes_sent == one.bytes_sent and two.events == one.events
    # the ranks' reduction adds the seats' rows in another order: float32 round-off
    for a, b in zip(one.history, two.history, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
        assert a.get("eval_loss", 0.0) == pytest.approx(b.get("eval_loss", 0.0), rel=1e-5)


def test_a_staying_client_keeps_its_own_model_when_its_seat_changes(tmp_path: Path) -> None:
    # only clients 4 and 5 are up at first: round 0 seats 2 of its 3 seats; a client staying
    # into round 1 may take the seat that was empty (its parameters: nobody's), and must bring
    # its own model there, as its row does (found by review: it trained from stale values)
    trace = tmp_path / "trace.json"
    trace.write_text('{"format": "exogym-availability-v1", "nodes": ' + json.dumps(
        [[[0.15, None]]] * 4 + [[[0, None]]] * 2) + "}")
    for seed in (0, 2):
        a = fit(make("fedavg", H=2), "all", nodes=6, k=3, steps=6, seed=seed,
                world=f"trace:{trace}")
        b = fit(make("fedavg", H=2), "round", nodes=6, k=3, steps=6, seed=seed,
                world=f"trace:{trace}")
        assert b.rounds[0] == [4, 5] and len(b.rounds[1]) == 3
        assert rows(a) == rows(b) and a.bytes_sent == b.bytes_sent  # (the rows path's trace
        for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values(),  # also
                        strict=True):                              # logs its clients' failures)
            assert torch.equal(x, y)


def test_a_round_with_no_client_up_waits_for_the_world(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"  # nobody until 0.5 s, then everyone
    trace.write_text('{"format": "exogym-availability-v1", "nodes": [[[0.5, null]]]}')
    r = fit(make("fedavg", H=2), "round", nodes=20, k=3, steps=4, world=f"trace:{trace}")
    assert r.samples == 3 * 4 * 4 and len(r.rounds) == 2
    assert r.history[0]["sim_time_s"] >= 0.5 + 0.1  # waited, then computed a step
    never = tmp_path / "never.json"
    never.write_text('{"format": "exogym-availability-v1", "nodes": [[[0, 0.05]]]}')
    with pytest.raises(RuntimeError, match="no client of the 20 is available"):
        fit(make("fedavg", H=2), "round", nodes=20, k=3, steps=4, world=f"trace:{never}")


def test_error_feedback_residuals_come_back_with_a_client_that_keeps_its_state() -> None:
    def run(mode: str) -> Any:
        return fit(make("fedavg", H=2, codec="int8", error_feedback=True), mode,
                   client_state="keep")

    assert_same_run(run("all"), run("round"), 2)  # both paths keep them on a join


def test_an_asynchronous_population_names_the_client_of_a_non_finite_loss() -> None:
    x, y = data().tensors
    x = x.clone()
    x[7] = float("nan")
    torch.manual_seed(1)
    with pytest.raises(NonFiniteLossError, match=r"non-finite training loss at step \d+ on "
                                                 r"node\(s\) \d+ of 100"):
        Trainer(Net(), Labelled(x, y), data()).fit(
            strategy=make("fedbuff", H=2), num_nodes=100, max_steps=60, batch_size=4,
            network="home-100mbps", step_time=0.1, progress=False, log_interval=1,
            eval_interval=60, concurrency=4)


def test_the_run_s_last_updates_draw_no_client_and_concurrency_stays_below_n() -> None:
    r = fit_async(nodes=1000, c=5, steps=10)
    drawn = {c for rnd in r.rounds for c in rnd}
    assert len(drawn) == r.population["clients_trained"]  # nobody drawn only to download
    with pytest.raises(ValueError, match="concurrency=6 must be below the population's 6"):
        fit_async(nodes=6, c=6)


def test_halfnormal_speeds_apply_to_every_run_not_only_seats() -> None:
    def sim(world: str | None) -> float:
        torch.manual_seed(1)
        r = Trainer(Net(), data(), data()).fit(
            strategy=make("diloco", H=2), num_nodes=4, max_steps=4, batch_size=4,
            network="home-100mbps", step_time=0.1, progress=False, world=world)
        return r.clock.total_s

    assert sim("speed=halfnormal:5:0.1,seed=2") > 2 * sim(None)  # ignored before (review)


def test_two_stores_in_one_folder_never_read_each_other_s_records(tmp_path: Path) -> None:
    class Rows:
        def __init__(self, value: float) -> None:
            self.m = torch.full((1, 2), value)
            self.node_steps = torch.zeros(1, dtype=torch.long)

        def client_state(self) -> list[torch.Tensor]:
            return [self.m]

    a, b = ClientStore(0, tmp_path), ClientStore(0, tmp_path)
    for client in range(3):
        a.save(client, Rows(100.0 + client), 0)  # type: ignore[arg-type]
        b.save(client, Rows(-1.0 - client), 0)  # type: ignore[arg-type]
    for client in range(3):
        got = Rows(0.0)
        assert a.load(client, got, 0)  # type: ignore[arg-type]
        assert got.m.tolist() == [[100.0 + client] * 2]
    assert len(list(tmp_path.glob("segment-*.bin"))) == 2  # one file each


def test_two_processes_resume_a_population_with_the_recorded_processes(tmp_path: Path) -> None:
    from exogym.run.launch import fit_processes

    kw: dict[str, Any] = dict(max_steps=8, batch_size=4, network="home-100mbps",
                              step_time=0.1, progress=False, log_interval=2, eval_interval=4,
                              engine="loop")
    torch.manual_seed(1)
    full = fit_processes(Net(), data(), data(), strategy=make("fedavg", H=2), num_nodes=12,
                         nodes_per_process=2, backend="gloo", threads=1, participation=4,
                         out_dir=tmp_path / "full", checkpoint_every=3, keep_checkpoints=4,
                         **kw)
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "full", cut)
    for step in (6, 8):
        shutil.rmtree(cut / "checkpoints" / f"step-{step:08d}", ignore_errors=True)
    (cut / "summary.json").unlink()
    again = fit_processes(Net(), data(), data(), strategy=None, num_nodes=12, backend="gloo",
                          threads=1, resume=cut, progress=False)
    assert again.resumed_from["step"] == 3 and again.processes == 2
    assert again.rounds == full.rounds and again.comm_log == full.comm_log
    assert rows(again) == rows(full)


def test_options_that_name_each_other_are_refused_by_name(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    # more clients in flight than clients: the message named participation, never given
    with pytest.raises(ValueError, match=r"concurrency=8 is more than the 6 clients of the run"):
        fit(make("fedbuff", H=2), "round", k=None, concurrency=8)
    # a client store for clients that keep no state was accepted and never used
    with pytest.raises(ValueError, match=r"client_store='1GB' .* needs client_state='keep' "
                                         r"\(got 'fresh'"):
        fit(make("fedavg", H=2), "round", client_store="1GB")
    from exogym.cli import main

    code = main(["run", "--task", "mnist", "--strategy", "fedavg", "--nodes", "10",
                 "--participation", "2", "--client-store", "512MB", "--steps", "2",
                 "--out", str(tmp_path / "r")])
    assert code == 2 and "--client-store 512MB keeps the state of clients that keep it: give " \
        "--client-state keep (got fresh)" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
