"""Partial participation (exogym.sim.participation): K of the N nodes take part in each round,
drawn among the up nodes from a seeded generator; only they compute and are members of the
round's collectives; a client selected again receives the global model from a client of the
previous round; its inner optimizer state is fresh or kept (``client_state``)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from support.resume_cases import Net, data
from support.runs import client_run

from exogym import Trainer
from exogym.cli import main
from exogym.run.output.checkpoint import load_checkpoint
from exogym.sim.participation import Participation, parse_participation
from exogym.strategy import make
from exogym.strategy.optim import OptimSpec

WALL = {"wall_s"}


def members(bits: int, n: int) -> list[bool]:
    return [bool(bits >> i & 1) for i in range(n)]


def test_the_draw_is_k_of_the_up_nodes_seeded_by_round() -> None:
    p = Participation(count=3, seed=5)
    a, b = p.draw(0, [True] * 10), p.draw(0, [True] * 10)
    assert a == b and sum(a) == 3
    assert p.draw(1, [True] * 10) != a or p.draw(2, [True] * 10) != a  # rounds differ
    up = [i % 2 == 0 for i in range(10)]
    picked = p.draw(0, up)
    assert sum(picked) == 3 and all(up[i] for i in range(10) if picked[i])
    assert sum(p.draw(0, [True, False, False, False])) == 1  # fewer up than K: all of them
    assert Participation(fraction=0.25).per_round(10) == 3  # round(2.5) half up
    assert Participation(fraction=0.01).per_round(10) == 1  # at least one


@pytest.mark.parametrize(("value", "match"), [
    ("0", "a count >= 1 or a fraction"), ("1.5", "a fraction in"), ("ten", "got 'ten'"),
    (2.0, "a count is an integer"), (True, "a count or a fraction"),
])
def test_bad_participation_values_are_named(value: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_participation(value)
    assert parse_participation("10").count == 10 and parse_participation("0.1").fraction == 0.1


def test_only_the_round_s_participants_compute_and_join_with_the_global_model() -> None:
    # FedAvg, H = 2, 6 nodes, 2 per round, 6 rounds
    n, h = 6, 2
    r = client_run(make("fedavg", H=h), participation=2)
    draw = Participation(count=2, seed=0)
    rounds = [draw.draw(k, [True] * n) for k in range(6)]
    reduces = [rec for rec in r.comm_log if rec.op == "all_reduce"]
    assert [members(rec.members, n) for rec in reduces] == rounds  # each round's members
    assert [rec.step for rec in reduces] == [1, 3, 5, 7, 9, 11]
    # a client not in the previous round downloads the model from the server (a population's
    # topology) at the round's first step; no client sends it anything
    sends = [(rec.step, rec.src, rec.dst) for rec in r.comm_log if rec.op == "send"]
    expected = []
    for k in range(1, 6):
        joining = [i for i in range(n) if rounds[k][i] and not rounds[k - 1][i]]
        expected += [(k * h, -1, node) for node in joining]
    assert sends == expected
    # samples count the node-steps computed: 2 nodes x 12 steps x batch 4
    assert r.samples == 2 * 12 * 4 and r.history[-1]["samples"] == 96
    assert r.world["recoveries"] == len(expected)
    # among peers the model comes from a client of the previous round, in turn
    p = client_run(make("fedavg", H=h), participation=2, network="home-100mbps,topology=peer")
    sends = [(rec.step, rec.src, rec.dst) for rec in p.comm_log if rec.op == "send"]
    expected = []
    for k in range(1, 6):
        joining = [i for i in range(n) if rounds[k][i] and not rounds[k - 1][i]]
        donors = [i for i in range(n) if rounds[k - 1][i]]
        expected += [(k * h, donors[j % len(donors)], node) for j, node in enumerate(joining)]
    assert sends == expected


def test_every_node_participating_is_the_run_without_participation() -> None:
    # keeping their state (a fresh client restarts its inner optimizer every round), on peers'
    # network (a population's default topology is a server's)
    a = client_run(make("diloco", H=2))
    b = client_run(make("diloco", H=2), participation=6, client_state="keep",
                   network="home-100mbps,topology=peer")
    strip = [{k: v for k, v in row.items() if k not in WALL} for row in a.history]
    assert strip == [{k: v for k, v in row.items() if k not in WALL} for row in b.history]
    assert a.bytes_sent == b.bytes_sent and a.comm_log == b.comm_log
    assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(),
                                                 b.model.state_dict().values(), strict=True))


def test_client_state_matters_with_adam_and_not_with_stateless_sgd() -> None:
    adam = {s: client_run(make("fedavg", H=2), participation=2, client_state=s)
            for s in ("fresh", "keep")}
    assert adam["fresh"].final != adam["keep"].final
    sgd = {s: client_run(make("fedavg", H=2, optim=OptimSpec(name="sgd", lr=0.05)),
                         participation=2, client_state=s) for s in ("fresh", "keep")}
    assert sgd["fresh"].final == sgd["keep"].final


def test_a_run_with_participation_resumes_bit_for_bit(tmp_path: Path) -> None:
    full = client_run(make("diloco", H=2), steps=10, participation=0.5,
                      out_dir=tmp_path / "full", checkpoint_every=3, keep_checkpoints=4)
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cut = tmp_path / "cut"
        import shutil
        shutil.copytree(tmp_path / "full", cut)
        for step in (6, 9, 10):
            shutil.rmtree(cut / "checkpoints" / f"step-{step:08d}", ignore_errors=True)
        (cut / "summary.json").unlink()
        again = Trainer(Net(), data(), data()).fit(resume=cut, progress=False)
    assert again.resumed_from["step"] == 3  # mid-round (H = 2)
    strip = [{k: v for k, v in row.items() if k not in WALL} for row in full.history]
    assert strip == [{k: v for k, v in row.items() if k not in WALL} for row in again.history]
    assert again.comm_log == full.comm_log and again.clock == full.clock
    a, _ = load_checkpoint(tmp_path / "full")
    b, _ = load_checkpoint(cut)
    assert a["timelines"] == b["timelines"]


def test_methods_without_a_global_model_refuse_participation_by_name() -> None:
    for sid in ("ddp", "noloco", "diloco_eager", "async_local_sgd"):
        with pytest.raises(ValueError, match=rf"{sid} .*(does not take partial participation|"
                                             r"asynchronous)"):
            client_run(make(sid, **({"H": 2} if sid != "ddp" else {})), participation=2)
    with pytest.raises(ValueError, match="participation=7 is more than the 6 nodes"):
        client_run(make("fedavg", H=2), participation=7)


def test_the_command_line_takes_participation(tmp_path: Path, mnist_data: Path) -> None:
    assert main(["run", "--task", "mnist", "--strategy", "fedavg", "--set", "H=2", "--nodes",
                 "8", "--participation", "0.25", "--client-state", "keep", "--steps", "4",
                 "--batch-size", "8", "--eval-samples", "100", "--no-progress",
                 "--data-dir", str(mnist_data), "--out", str(tmp_path / "run")]) == 0
    import json

    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["participation"] == {"participation": "0.25", "client_state": "keep"}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["samples"] == 2 * 4 * 8  # 2 of 8 nodes, 4 steps, batch 8


def test_a_round_whose_participants_all_fail_goes_on_with_a_new_draw() -> None:
    # 2 nodes, 1 per round, H = 4: the round's participant fails at step 1 and the other node
    # takes its place for the rest of the round (the engine had no node to compute: a crash)
    first = Participation(count=1).draw(0, [True, True]).index(True)
    other = 1 - first
    r = client_run(make("fedavg", H=4), nodes=2, steps=4, participation=1,
                   world=f"fail={first}@1")
    (reduce,) = [rec for rec in r.comm_log if rec.op == "all_reduce"]
    assert members(reduce.members, 2) == [i == other for i in range(2)]
    assert r.samples == (1 + 3) * 4  # step 0 by the first, steps 1-3 by the other
