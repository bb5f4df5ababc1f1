"""A population's rounds under a round policy (exogym.run.nodes.reports): over-selection keeps
the first K reports, a deadline and too few reports abandon a round, clients drop out when
their availability ends; every client not kept is an event and a count; resume bit for bit;
errors by name. The rule's arithmetic is tests/sim/test_round_policy.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.resume_cases import Net
from support.runs import client_run, fedscale_round_run, resume_cut

from exogym.sim.world import parse_world
from exogym.strategy import make


def run(**extra: Any) -> Any:
    """FedAvg (H = 3) over 40 clients, 4 reports a round, sessions of |N(0, 1)| s, 12 steps."""
    args: dict[str, Any] = dict(nodes=40, participation=4, clients_in_memory="round", steps=12,
                                world="duration=halfnormal:1:0")
    args.update(extra)
    return client_run(make("fedavg", H=3), **args)


def rows(result: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in result.history]


def test_a_policy_that_keeps_every_report_changes_nothing() -> None:
    plain, ruled = run(), run(round_policy="over_selection=1,dropouts=on")
    assert rows(plain) == rows(ruled) and plain.clock.total_s == ruled.clock.total_s
    assert plain.comm_log == ruled.comm_log and plain.events == ruled.events


def test_over_selection_aggregates_the_first_k_of_ceil_r_k() -> None:
    r = run(round_policy="over_selection=1.5")  # 6 drawn, the first 4 reports kept
    assert r.population["per_round"] == 6 and r.population["reports_per_round"] == 4
    assert r.population["discarded"] == 4 * 2  # 4 rounds, 2 discarded each
    rounds = [rec for rec in r.comm_log if rec.op == "all_reduce"]
    assert len(rounds) == 4 and all(bin(rec.members).count("1") == 4 for rec in rounds)
    cut = [e for e in r.events if e["event"] == "discarded"]
    assert len(cut) == 8 and all(e["time_s"] <= e["report_s"] for e in cut)
    assert r.clock.total_s < run(round_policy="over_selection=1.5,min_reports=4",
                                 participation=6).clock.total_s  # waiting for all 6: longer


def test_a_round_without_enough_reports_is_abandoned() -> None:
    r = run(round_policy="deadline=1ms,min_reports=2")  # every report is later than 1 ms
    assert r.population["abandoned_rounds"] == 4 and r.population["late"] == 4 * 4
    assert not [rec for rec in r.comm_log if rec.op == "all_reduce"]  # nothing aggregated
    torch.manual_seed(1)
    untouched = Net()  # client_run seeds the model with 1: the global model never moved
    for x, y in zip(untouched.state_dict().values(), r.model.state_dict().values(), strict=True):
        assert torch.equal(x, y)


def test_clients_drop_out_when_their_availability_ends_before_they_report() -> None:
    world = "duration=halfnormal:2:0,online=0.5:0.5,session=1s,seed=2"
    r = run(world=world, round_policy="over_selection=2", steps=15)
    drops = [e for e in r.events if e["event"] == "dropout"]
    assert drops and r.population["dropouts"] == len(drops)
    up = parse_world(world).availability
    for e in drops:  # each was offline at the moment its report would have arrived
        assert not up(e["report_s"])(np.asarray([e["node"]]))[0]
    off = run(world=world, round_policy="over_selection=2,dropouts=off", steps=15)
    assert off.population["dropouts"] == 0


def test_a_run_with_a_policy_resumes_bit_for_bit(tmp_path: Path) -> None:
    full = run(round_policy="over_selection=1.5,deadline=2s", out_dir=tmp_path / "full",
               checkpoint_every=4, keep_checkpoints=4)
    again = resume_cut(tmp_path / "full", tmp_path / "cut", (8, 12))
    assert again.resumed_from["step"] == 4  # mid-round (H = 3)
    assert rows(again) == rows(full) and again.comm_log == full.comm_log
    assert again.events == full.events and again.population == full.population
    assert again.clock.total_s == full.clock.total_s


@pytest.mark.parametrize(("extra", "match"), [
    (dict(participation=None, world=None), "rules a synchronous population's rounds: give the "
                                            "run participation=K"),
    (dict(clients_in_memory="all", world=None), "rules a population's rounds in seats"),
    (dict(round_policy="min_reports=5"), "min_reports=5 is more than the 4 reports"),
])
def test_a_policy_outside_a_population_s_seats_is_refused(extra: dict[str, Any],
                                                          match: str) -> None:
    with pytest.raises(ValueError, match=match):
        run(**{"round_policy": "over_selection=1.3", **extra})


def test_an_asynchronous_server_takes_no_round_policy() -> None:
    with pytest.raises(ValueError, match="rules a synchronous population's rounds"):
        client_run(make("fedbuff", H=2), nodes=40, concurrency=4, clients_in_memory="round",
                   round_policy="over_selection=1.3")


def test_failures_inside_a_round_are_dropouts_on_seats_with_a_policy() -> None:
    """mtbf failures in a population: with a round policy the seats hold the round and a client
    down when its report would arrive drops out; without one, a row per client as before."""
    world = "duration=uniform:2:1,mtbf=6s,mttr=3s,seed=5"
    r = run(world=world, round_policy="over_selection=1.5", steps=15)
    assert r.population is not None and r.population["dropouts"] > 0
    w = parse_world(world)
    for e in r.events:
        if e["event"] == "dropout":
            assert not w.is_up(e["node"], e["report_s"], 0)
    with pytest.raises(ValueError, match="with --round-policy, mtbf failures are seats' dropouts"):
        run(world="mtbf=6s,mttr=3s,seed=5", round_policy=None)


def test_a_round_lasts_until_its_kth_report_as_fedscale_prices_it(tmp_path: Path) -> None:
    """FedScale's rule (aggregator.py, tictak_client_tasks): a client's completion is its
    download, compute and upload over its own link; the first K of the over-selected clients
    are kept and the round lasts as long as the K-th. 3 clients, K = 2, over_selection 1.5 (all
    3 drawn each round), a FedScale-form device file, the model's 332 bytes (2,656 bits), no
    latency, H = 3 steps of batch 4 (12 samples a round):

    | client | ms/sample | compute | kbit/s | upload = download |
    | 0 | 10 | 0.12 s | 8     | 0.332 s  |
    | 1 | 50 | 0.6 s  | 80    | 0.0332 s |
    | 2 | 20 | 0.24 s | 26.56 | 0.1 s    |

    Round 1 (exogym's clients start from the initial model: no download): completions 0.452,
    0.6332, 0.34: clients 2 and 0 kept, released at 0.452; client 1 discarded. Round 2 (each
    downloads from 0.452, then computes and uploads): 0.452 + 0.784 = 1.236, 0.452 + 0.6664 =
    1.1184, 0.452 + 0.44 = 0.892: clients 2 and 1 kept, released at 1.1184 (FedScale's round
    time 0.6664, the 2nd of 0.784, 0.6664, 0.44); client 0 discarded. The run ends when client
    2 has downloaded the result: 1.1184 + 0.1 = 1.2184."""
    r = fedscale_round_run(tmp_path)
    assert r.comm_log[0].payload_bytes == 332
    cut = [(e["node"], e["time_s"], e["report_s"]) for e in r.events
           if e["event"] == "discarded"]  # who, when let go, when its report would arrive
    assert [n for n, _, _ in cut] == [1, 0]
    assert [t for _, t, _ in cut] == pytest.approx([0.452, 1.1184], rel=1e-9)
    assert [s for _, _, s in cut] == pytest.approx([0.6332, 1.236], rel=1e-9)
    assert r.clock is not None and r.clock.total_s == pytest.approx(1.2184, rel=1e-9)


def test_a_population_in_seats_is_not_re_costed_from_its_log() -> None:
    """The log in seats does not carry the seats' changing clients (their speeds, links,
    joins): re-costing it would give another number than the run's own clock, so it refuses."""
    with pytest.raises(ValueError, match="seats change clients every round"):
        run().recost("home-100mbps")
