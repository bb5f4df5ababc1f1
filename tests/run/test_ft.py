"""--ft with real torchft replicas on this machine (exogym/run/ft/launch.py, replica.py): without
a failure they give the simulator's numbers; with replicas SIGKILLed at chosen points they end
normally, every live replica with the same global model, every synchronisation applied once; a
real run replayed as a simulated world; torchrun groups with a Lighthouse. Skipped where torchft
is not installed (``pip install 'exogym[ft]'``); what needs no torchft is test_ft_checks.py."""

from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from support.runs import TinyBN  # the same model as the process engine's tests
from torch.utils.data import TensorDataset

from exogym import Trainer
from exogym.run.ft.launch import FTResult, Kill, fit_ft  # imports torchft only when it runs
from exogym.strategy import make

torchft = pytest.importorskip("torchft", reason="--ft needs torchft (pip install 'exogym[ft]')")

pytestmark = pytest.mark.usefixtures("single_thread")


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(192, 6, generator=g),
                         torch.randint(0, 3, (192,), generator=g))


STEPS, BATCH, REPLICAS = 12, 4, 3


def ft_run(strategy: Any, out: Path, **kw: Any) -> FTResult:
    # a warm spare only where a replica is restarted (it is one more process on the cores)
    args = {"replicas": REPLICAS, "max_steps": STEPS, "batch_size": BATCH, "seed": 0,
            "deadline_s": 120.0, "spares": 1 if kw.get("kills") else 0, **kw}
    return fit_ft(TinyBN(), dataset(), copy.deepcopy(strategy), out_dir=out, **args)


def assert_survived(result: FTResult, syncs: int, first: int = 0) -> None:
    """The run ended with every live replica holding the same global model, every
    synchronisation applied once, one metrics row per step."""
    states = list(result.global_states.values())
    assert states, "no replica finished"
    for s in states[1:]:
        for k in states[0]:
            assert torch.equal(states[0][k], s[k]), k
    assert set(result.syncs.values()) == {syncs}
    assert [r["step"] for r in result.rows] == list(range(first, STEPS))
    for r in range(REPLICAS):
        path = result.out_dir / f"replica{r}.rows.jsonl"
        steps = [json.loads(line)["step"] for line in path.read_text().splitlines()]
        assert len(steps) == len(set(steps)), f"replica {r} wrote a step twice"


@pytest.mark.parametrize("sid", ["ddp", "diloco"])
def test_without_failures_ft_gives_the_simulators_numbers(sid: str, tmp_path: Path) -> None:
    strategy = make(sid, **({"H": 4} if sid == "diloco" else {}), **{"optim.lr": 0.05})
    result = ft_run(strategy, tmp_path)
    assert_survived(result, STEPS if sid == "ddp" else STEPS // 4)
    sim = Trainer(TinyBN(), dataset()).fit(
        strategy=copy.deepcopy(strategy), num_nodes=REPLICAS, max_steps=STEPS,
        batch_size=BATCH, engine="loop", device="cpu", seed=0, progress=False, network=None)
    want = sim.model.state_dict()
    got = result.global_states[0]
    for k, v in want.items():  # the sums' order differs: float round-off only
        assert torch.allclose(got[k].to(v.dtype), v, atol=1e-5, rtol=0), k
    assert result.trained == {r: STEPS for r in range(REPLICAS)}


def test_ddp_survives_a_kill_inside_a_collective(tmp_path: Path,
                                                capfd: pytest.CaptureFixture[str]) -> None:
    # min_replicas=3: the survivors' steps do not commit until the restarted replica is back,
    # so it heals however slowly it starts (a loaded machine)
    result = ft_run(make("ddp", **{"optim.lr": 0.05}), tmp_path, min_replicas=3,
                    kills=[Kill(1, 5, at="collective", restart_after_s=0.0)])
    assert_survived(result, STEPS)
    assert sorted(result.global_states) == [0, 1, 2]
    fails = [e for e in result.events if e["event"] == "fail"]
    assert [(e["node"], e["step"]) for e in fails] == [(1, 5)]
    heals = [e for e in result.events if e["event"] == "recovery"]
    assert len(heals) == 1 and heals[0]["node"] == 1 and heals[0]["donor"] in (0, 2)
    assert heals[0]["bytes"] > 0 and heals[0]["step"] == 5  # no step committed without it
    assert result.restarts[0]["back_s"] is not None
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["trained"] == {"0": STEPS, "1": STEPS, "2": STEPS}
    # the survivors' step 5 failed in the collective and was done again: discarded, not lost
    assert any(e["event"] == "discarded" and e["step"] == 5 for e in result.events)
    # the donor's checkpoint server served the heal without writing its access log line
    # (`"GET /checkpoint/5/full HTTP/1.1" 200 -`) into the run's output
    assert "GET /checkpoint/" not in capfd.readouterr().err


@pytest.mark.slow  # keeps the default suite under 10 min on 2 cores; CI's slow step runs it
def test_transactions_of_several_steps(tmp_path: Path) -> None:
    # commit_every=4: one quorum and one commit per 4 DDP steps; without a failure the model
    # is the one-step transactions' exactly; a kill inside step 6's collective discards the
    # transaction of steps 4-7 on the survivors, which redo it
    strategy = make("ddp", **{"optim.lr": 0.05})
    one = ft_run(strategy, tmp_path / "one")
    four = ft_run(strategy, tmp_path / "four", commit_every=4)
    for k, v in one.global_states[0].items():
        assert torch.equal(four.global_states[0][k], v), k
    killed = ft_run(strategy, tmp_path / "killed", commit_every=4, min_replicas=3,
                    kills=[Kill(1, 6, at="collective", restart_after_s=0.0)])
    assert_survived(killed, STEPS)
    assert any(e["event"] == "discarded" and e["step"] == 4 and e["steps"] >= 1
               for e in killed.events)
    heals = [e for e in killed.events if e["event"] == "recovery"]
    assert [(e["node"], e["step"]) for e in heals] == [(1, 4)]  # a transaction's first step
    for k, v in one.global_states[0].items():  # min_replicas=3: no step without replica 1
        assert torch.equal(killed.global_states[0][k], v), k


def test_a_donor_that_dies_while_serving_a_heal(tmp_path: Path) -> None:
    # replica 1 dies at step 3; replica 0, if it is the one chosen to serve its heal, dies
    # while serving it: the heal fails, replica 1 asks again and heals from replica 2
    kills = [Kill(1, 3), Kill(0, 3, at="serve")]
    result = ft_run(make("ddp", **{"optim.lr": 0.05}), tmp_path, min_replicas=2, kills=kills)
    assert_survived(result, STEPS)
    assert 1 in result.global_states
    heals = [e for e in result.events if e["event"] == "recovery" and e["node"] == 1]
    assert heals and heals[-1]["donor"] in (0, 2)


def test_diloco_survives_a_death_during_a_heal_and_a_restart_that_never_comes(
        tmp_path: Path) -> None:
    # replica 1 dies at step 2; its second process dies while loading a peer's state (at its
    # own step 0, before the load); its third heals. Replica 2 dies at step 6 for good.
    kills = [Kill(1, 2), Kill(1, 0, at="heal"), Kill(2, 6, restart_after_s=None)]
    result = ft_run(make("diloco", H=4, **{"optim.lr": 0.05}), tmp_path, kills=kills)
    assert_survived(result, STEPS // 4)
    assert 0 in result.global_states and 2 not in result.global_states
    fails = sorted((e["node"], e["step"]) for e in result.events if e["event"] == "fail")
    assert fails[0] == (1, 2) and (2, 6) in fails


def test_a_checkpoint_resumes_exactly(tmp_path: Path) -> None:
    strategy = make("diloco", H=4, **{"optim.lr": 0.05})
    whole = ft_run(strategy, tmp_path / "whole", checkpoint_every=8)
    ckpt = tmp_path / "whole" / "ckpt"
    assert sorted(p.name for p in ckpt.glob("*.pt")) == [f"replica{r}.pt" for r in range(3)]
    # a run that resumes from the step-8 checkpoints ends where the whole run ended
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(ckpt, resumed_dir / "ckpt")
    resumed = ft_run(strategy, resumed_dir, resume=True)
    assert_survived(resumed, STEPS // 4, first=8)
    for k, v in whole.global_states[0].items():
        assert torch.equal(resumed.global_states[0][k], v), k


def test_a_kill_while_writing_a_checkpoint_leaves_the_others_whole(tmp_path: Path) -> None:
    result = ft_run(make("ddp", **{"optim.lr": 0.05}), tmp_path, checkpoint_every=4,
                    kills=[Kill(2, 8, at="checkpoint", restart_after_s=0.0)])
    assert_survived(result, STEPS)
    # replica 2 died with its step-8 file written and not renamed: its step-4 one is whole
    states = {p.name: torch.load(p, weights_only=False)["step"]
              for p in (tmp_path / "ckpt").glob("*.pt")}
    assert states["replica0.pt"] == states["replica1.pt"] == STEPS
    assert states["replica2.pt"] in (4, STEPS)  # STEPS if it healed before step 12



# -- the same world, real and simulated ------------------------------------------------------
def test_a_replayed_run_has_the_real_runs_outages_and_its_losses(tmp_path: Path) -> None:
    from exogym.run.ft.replay import compare, world_of

    strategy = make("diloco", H=4, **{"optim.lr": 0.05})
    ft_run(strategy, tmp_path / "real", kills=[Kill(2, 5, restart_after_s=None)])
    world = world_of(tmp_path / "real")
    assert world == "fail=2@5"
    Trainer(TinyBN(), dataset()).fit(
        strategy=copy.deepcopy(strategy), num_nodes=REPLICAS, max_steps=STEPS,
        batch_size=BATCH, engine="loop", device="cpu", seed=0, progress=False, network=None,
        world=world, out_dir=tmp_path / "sim", log_interval=1)
    result = compare(tmp_path / "real", tmp_path / "sim")
    assert result["fail_equal"] and result["rejoin_equal"] and result["donor_equal"]
    assert result["steps"] == STEPS
    # the live nodes draw the same batches in both: the losses agree to float round-off
    assert result["loss_max_abs"] < 1e-5


# -- under torchrun: two groups standing for two machines, with a Lighthouse ------------------
def _torchrun_groups(tmp_path: Path, options: list[list[str]],
                     delays: tuple[float, ...] = (0.0, 0.0)) -> list[str]:
    """Two torchrun groups of one process each (``REPLICA_GROUP_ID`` 0 and 1) with a Lighthouse
    of this process, running ``exogym run --ft`` with each group's ``options``, the second
    started ``delays[1]`` seconds after the first; their standard outputs."""
    import os
    import subprocess
    import time

    from support.toy_task import toy_task_source
    from torchft.coordination import LighthouseServer

    from exogym.run.launch import free_port

    (tmp_path / "toy.py").write_text(toy_task_source("toy-ft"))
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=10000,
                                  heartbeat_timeout_ms=1000)
    port = lighthouse.address().rsplit(":", 1)[1]
    procs: list[Any] = []
    try:
        for group, (extra, delay) in enumerate(zip(options, delays, strict=True)):
            time.sleep(delay)
            env = {k: v for k, v in os.environ.items() if k not in (
                "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
            env.update(REPLICA_GROUP_ID=str(group), OMP_NUM_THREADS="1", RUST_LOG="warn",
                       TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{port}")
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "1", "--max-restarts", "2", "--rdzv-endpoint",
                   f"localhost:{free_port()}", "-m", "exogym", "run", "--task",
                   "toy.py:make_task", "--strategy", "ddp", "--nodes", "2", "--ft",
                   "--out", "run", "--no-download", *extra]
            procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        lighthouse.shutdown()
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-2000:] + err[-4000:]
    return [out for out, _ in outs]


@pytest.mark.slow  # keeps the default suite under 10 min on 2 cores; CI's slow step runs it
def test_two_torchrun_groups_survive_a_killed_worker(tmp_path: Path) -> None:
    both = ["--steps", "40", "--min-replicas", "2", "--kill", "1@20"]
    outs = [(out, "") for out in _torchrun_groups(tmp_path, [both, both])]
    assert "replica 1 died at step 20, restarted: back in" in outs[0][0]
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["trained"] == {"0": 40, "1": 40} and summary["syncs"] == {"0": 40, "1": 40}
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [(e["node"], e["step"]) for e in events if e["event"] == "fail"] == [(1, 20)]
    assert [(e["node"], e["step"], e["donor"]) for e in events
            if e["event"] == "recovery"] == [(1, 20, 0)]
    states = [torch.load(run / f"replica{r}.result.pt", weights_only=False)["global_state"]
              for r in (0, 1)]
    for k in states[0]:
        assert torch.equal(states[0][k], states[1][k]), k


def test_a_torchrun_group_started_late_heals_and_joins(tmp_path: Path) -> None:
    # group 1 starts 3 s after group 0, which trains alone meanwhile; its first quorum heals it
    # (a first process, not a restart) and it takes part in every step after
    steps = ["--steps", "3000"]
    _torchrun_groups(tmp_path, [steps, steps], delays=(0.0, 3.0))
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["trained"]["0"] == 3000 and 0 < summary["trained"]["1"] < 3000
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    heals = [e for e in events if e["event"] == "recovery"]
    assert [(e["node"], e["donor"], e["generation"]) for e in heals] == [(1, 0, 0)]
    assert heals[0]["step"] == 3000 - summary["trained"]["1"]
    assert summary["syncs"]["0"] == summary["syncs"]["1"] == 3000
    states = [torch.load(run / f"replica{r}.result.pt", weights_only=False)["global_state"]
              for r in (0, 1)]
    for k in states[0]:
        assert torch.equal(states[0][k], states[1][k]), k


def test_ft_evaluates_during_training_and_reports_what_a_simulated_run_does(
        tmp_path: Path) -> None:
    """Evaluation during --ft (every 4 steps, by the quorum's first replica) gives the
    simulator's evaluations of the same run, and summary.json has a simulated run's fields
    with the same values: samples, bytes per node, the final evaluation on the whole set."""
    strategy = make("diloco", H=4, **{"optim.lr": 0.05})
    test = dataset()
    result = ft_run(strategy, tmp_path / "ft", eval_dataset=test, eval_interval=4)
    evals = {r["step"] + 1: r["eval_loss"] for r in result.rows if "eval_loss" in r}
    sim_dir = tmp_path / "sim"
    Trainer(TinyBN(), dataset(), test).fit(
        strategy=copy.deepcopy(strategy), num_nodes=REPLICAS, max_steps=STEPS,
        batch_size=BATCH, engine="loop", device="cpu", seed=0, progress=False, network=None,
        eval_interval=4, out_dir=sim_dir)
    rows = [json.loads(line) for line in (sim_dir / "metrics.jsonl").read_text().splitlines()]
    want = {r["step"]: r["eval_loss"] for r in rows if "eval_loss" in r}
    assert sorted(evals) == sorted(want) == [4, 8, 12]
    for step, loss in want.items():
        assert evals[step] == pytest.approx(loss, rel=1e-5), step
    ft = json.loads((tmp_path / "ft" / "summary.json").read_text())
    sim = json.loads((sim_dir / "summary.json").read_text())
    assert ft["samples"] == sim["samples"] == STEPS * REPLICAS * BATCH
    assert ft["bytes_sent_per_node"] == sim["bytes_sent_per_node"]
    assert ft["final"]["eval_loss"] == pytest.approx(sim["final"]["eval_loss"], rel=1e-5)
    assert ft["eval_during_training"] and ft["samples_per_s"] > 0 and ft["quorums"] >= 1
    # the evaluation after the last step follows its row: kept out of the training time
    parts = ft["seconds"].values()
    assert sum(p["eval_last"] > 0 for p in parts) == 1 and sum(p["eval"] > 0 for p in parts) >= 1
    assert (tmp_path / "ft" / "model.pt").is_file()
