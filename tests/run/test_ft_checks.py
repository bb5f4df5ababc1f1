"""--ft's parts that need no torchft (exogym/run/ft/manager.py, replay.py, exogym/cli/ft.py): the
communicator's arithmetic on small tensors by hand (a fake Manager), the refusals, the kill specs,
the command line's checks, and a real run's outages read as a world. These run everywhere;
test_ft.py runs real torchft replicas and is skipped where torchft is not installed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from exogym.run.ft.manager import (
    FTCommunicator,
    FTUnavailable,
    KillPoint,
    check_ft_strategy,
    require_torchft,
)
from exogym.sim.comm import all_reduce_bytes
from exogym.strategy import make

pytestmark = pytest.mark.usefixtures("single_thread")


class FakeManager:
    """A torchft Manager's face for the communicator: the quorum has ``participants``
    replicas; the others' contribution to every sum is ``other`` (flat, per call)."""

    def __init__(self, participants: int, rank: int, others: list[Tensor]) -> None:
        self.participants, self.rank, self.others = participants, rank, list(others)

    def num_participants(self) -> int:
        return self.participants

    def participating_rank(self) -> int:
        return self.rank

    def allreduce(self, t: Tensor, reduce_op: Any) -> Any:
        t.add_(self.others.pop(0))
        return type("Work", (), {"wait": lambda self: None})()


# -- the arithmetic, by hand -----------------------------------------------------------------
def test_mean_divides_by_the_quorum_nodes_and_bytes_are_a_ring_over_them() -> None:
    # replica 1 of a run of 3 replicas x 2 nodes; the quorum has 2 replicas (one is dead)
    comm = FTCommunicator(FakeManager(2, 1, [torch.tensor([10.0, 20.0])]), 6, [2, 3])
    rows = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    out = comm.all_reduce(rows, "mean")
    # local sum [4, 6]; + the other replica's [10, 20] = [14, 26]; / (2 replicas x 2 nodes)
    assert torch.equal(out, torch.tensor([3.5, 6.5]))
    each = all_reduce_bytes(8, 4)  # 8 bytes among 4 nodes: 2 * 3/4 * 8 = 12
    assert each == 12.0
    assert comm.bytes_sent == [0.0, 0.0, each, each, 0.0, 0.0]
    assert comm.bytes_received == comm.bytes_sent


def test_sum_and_integer_mean() -> None:
    comm = FTCommunicator(FakeManager(3, 0, [torch.tensor([5.0]), torch.tensor([7])]), 3, [0])
    assert torch.equal(comm.all_reduce(torch.tensor([[2.0]]), "sum"), torch.tensor([7.0]))
    # integer mean truncates toward zero, as in one process: (1 + 7) // 3 = 2
    assert torch.equal(comm.all_reduce(torch.tensor([[1]]), "mean"), torch.tensor([2]))


def test_broadcast_sends_the_quorums_first_replica() -> None:
    first = FTCommunicator(FakeManager(2, 0, [torch.zeros(2)]), 4, [0, 1])
    assert torch.equal(first.broadcast(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), 0),
                       torch.tensor([1.0, 2.0]))
    other = FTCommunicator(FakeManager(2, 1, [torch.tensor([1.0, 2.0])]), 4, [2, 3])
    # a replica that is not the first contributes zeros: it receives the first one's row
    assert torch.equal(other.broadcast(torch.tensor([[9.0, 9.0], [9.0, 9.0]]), 0),
                       torch.tensor([1.0, 2.0]))


def test_all_gather_is_refused() -> None:
    comm = FTCommunicator(FakeManager(1, 0, []), 1, [0])
    with pytest.raises(RuntimeError, match="all-gather under --ft"):
        comm.all_gather(torch.zeros(1, 2))


# -- refusals -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("sid", "why"), [
    ("sparta", "never hold one model"), ("demo", "all-gather"), ("noloco", "point-to-point"),
    ("diloco_eager", "one round late"), ("fedbuff", "asynchronous"),
])
def test_strategies_without_ft_are_refused_by_name(sid: str, why: str) -> None:
    with pytest.raises(ValueError, match=f"--ft does not take {sid}: .*{why}"):
        check_ft_strategy(make(sid))


def test_ft_strategies_are_taken() -> None:
    for sid in ("ddp", "fedavg", "diloco", "streaming_diloco", "fedadam"):
        check_ft_strategy(make(sid))


def test_missing_torchft_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchft", None)
    with pytest.raises(FTUnavailable, match=r"pip install 'exogym\[ft\]'.*Linux x86-64"):
        require_torchft()


def test_kill_points_are_checked() -> None:
    with pytest.raises(ValueError, match="one of step, collective, heal, serve, checkpoint"):
        KillPoint(3, "lunch")
    with pytest.raises(ValueError, match="integer >= 0"):
        KillPoint(-1)


# -- the command line --------------------------------------------------------------------------
def test_kill_specs_parse() -> None:
    from exogym.cli.ft import parse_kill
    from exogym.run.ft.launch import Kill

    assert parse_kill("1@40") == Kill(1, 40, "step", 0.0)
    assert parse_kill("2@90:collective+5") == Kill(2, 90, "collective", 5.0)
    assert parse_kill("0@30+never") == Kill(0, 30, "step", None)
    for bad in ("1@x", "1@40:lunch", "@3", "1@4+soon"):
        with pytest.raises(Exception, match=r"expected REPLICA@STEP|one of step"):
            parse_kill(bad)


@pytest.mark.parametrize(("argv", "message"), [
    (["--ft"], "needs --engine process (or a torchrun launch), got --engine auto"),
    (["--commit-every", "4"], "--commit-every sizes --ft's transactions: it needs --ft"),
    (["--ft", "--engine", "process", "--world", "fail=1@3"], "--ft does not take --world"),
    (["--ft", "--engine", "process", "--network", "home-1gbps"], "--ft does not take --network"),
    (["--kill", "1@3"], "--kill plans deaths of torchft replicas: it needs --ft"),
    (["--ft", "--engine", "process", "--strategy", "sparta"], "--ft does not take sparta"),
])
def test_cli_refuses_what_ft_does_not_take(argv: list[str], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from exogym.cli import main

    assert main(["run", "--task", "mnist-cnn-v0", *argv]) != 0
    assert message in capsys.readouterr().err

@pytest.mark.parametrize(("kill", "extra", "message"), [
    ("1@30", [], "--kill 1@30 can never fire: step 30 never comes (steps are 0..9); given "
                 "--nodes 3 --steps 10"),
    ("1@10", [], "--kill 1@10 can never fire: step 10 never comes (steps are 0..9)"),
    ("3@2+never", [], "--kill 3@2+never can never fire: replica 3 does not exist (replicas "
                      "are 0..2); given --nodes 3 --steps 10"),
    ("0@4:checkpoint", [], "--kill 0@4:checkpoint can never fire: no checkpoint is written "
                           "without checkpoint_every (--checkpoint-every)"),
    ("0@3:checkpoint+2", ["--checkpoint-every", "2"],
     "--kill 0@3:checkpoint+2 can never fire: checkpoints are written when steps 2, 4, ... are "
     "done (checkpoint_every=2), never at step 3"),
])
def test_a_kill_that_can_never_fire_is_refused_before_anything_starts(
        kill: str, extra: list[str], message: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from exogym.cli import main

    out = tmp_path / "run"
    assert main(["run", "--task", "mnist", "--ft", "--engine", "process", "--nodes", "3",
                 "--steps", "10", "--kill", kill, *extra, "--out", str(out),
                 "--data-dir", str(tmp_path / "no-data"), "--no-download"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"exogym: error: {message}"), err  # not the missing data's error
    assert not out.exists()


def test_kills_that_can_fire_are_taken_and_print_as_written() -> None:
    from exogym.cli.ft import parse_kill

    for text in ("0@0", "2@9:collective+5", "1@4:checkpoint+never", "1@8+0.5"):
        kill = parse_kill(text)
        assert str(kill) == text
        assert kill.never_fires(3, 10, checkpoint_every=4) is None
    # with several steps per commit a checkpoint may follow any step: not refused
    assert parse_kill("1@3:checkpoint").never_fires(3, 10, 4, commit_every=2) is None



# -- a real run's outages as a world ---------------------------------------------------------
def _write_events(folder: Path, events: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return folder


def test_a_real_runs_outages_become_a_world(tmp_path: Path) -> None:
    from exogym.run.ft.replay import outages, world_of

    events = [
        {"event": "fail", "node": 1, "step": 5}, {"event": "fail", "node": 2, "step": 7},
        {"event": "recovery", "node": 1, "step": 8, "donor": 0},
        # a death that cost no step: healed at the step it died in
        {"event": "fail", "node": 0, "step": 9},
        {"event": "recovery", "node": 0, "step": 9, "donor": 1},
        {"event": "quorum", "replica": 0, "step": 3},
    ]
    folder = _write_events(tmp_path / "real", events)
    assert outages(events) == {"fail": [(1, 5), (2, 7)], "recovery": [(1, 8, 0)]}
    assert world_of(folder) == "fail=1@5,rejoin=1@8,fail=2@7"
    assert world_of(_write_events(tmp_path / "none", [])) is None


# -- the quorum asked for while the step computes (exogym/run/ft/replica.py) ------------------
class QuorumManager:
    """A torchft Manager's face for one replica's loop (quorum of one). ``start_quorum`` returns
    only once the replica has started the step's forward (``computing``): a replica that waited
    for its quorum before computing would time out here. ``heal``: a peer's state handed to the
    replica in the quorum, as torchft's heal hands it to ``load_state_dict``."""

    _quorum_id = 1

    def __init__(self, computing: Any, heal: dict[str, Any] | None = None) -> None:
        self.computing, self.heal = computing, heal
        self.load: Any = None
        self.commits: list[bool] = []  # what should_commit answers, in turn (then True)

    def start_quorum(self) -> None:
        if not self.computing.wait(timeout=10):
            raise TimeoutError("the replica did not compute while its quorum was formed")
        if self.heal is not None:
            self.load(self.heal)

    def num_participants(self) -> int:
        return 1

    def participating_rank(self) -> int:
        return 0

    def errored(self) -> None:
        return None

    def should_commit(self) -> bool:
        return self.commits.pop(0) if self.commits else True

    def allreduce(self, t: Tensor, reduce_op: Any) -> Any:
        return type("Work", (), {"wait": lambda self: None})()


def _replica(tmp_path: Path, heal_from_step: int | None = None, strategy: Any = None) -> Any:
    import threading

    from torch.utils.data import TensorDataset

    from exogym.run.ft.manager import replica_state
    from exogym.run.ft.replica import ReplicaSpec, _Replica

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g))
    model = _Classifier()
    spec = ReplicaSpec(replica=0, replicas=1, nodes_per_replica=1, max_steps=20, batch_size=4,
                       seed=0, out_dir=str(tmp_path), lighthouse="http://unused", t0=0.0)
    computing = threading.Event()

    class Replica(_Replica):
        def _manager(self) -> Any:
            return QuorumManager(computing)

    replica = Replica(spec, model, data, strategy or make("ddp"))
    replica.manager.load = replica._load
    forward_backward = replica.nodes.forward_backward
    replica.calls = 0

    def counted(*a: Any, **k: Any) -> Tensor:
        replica.calls += 1
        computing.set()
        return forward_backward(*a, **k)

    replica.nodes.forward_backward = counted
    if heal_from_step is not None:  # a peer's state, ahead: another model, another step
        peer = replica_state(replica.strategy, replica.nodes, replica.batches, heal_from_step,
                             syncs=heal_from_step, replica=1)
        peer["params"] = {k: v + torch.randn(v.shape, generator=g)
                          for k, v in peer["params"].items()}
        replica.manager.heal = peer
    return replica


class _Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(6, 3)

    def forward(self, batch: Any) -> Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)


def test_the_step_computes_while_its_quorum_is_formed(tmp_path: Path) -> None:
    replica = _replica(tmp_path)
    replica._transaction(asked=False)
    assert (replica.step, replica.syncs, replica.calls, replica.heals) == (1, 1, 1, 0)
    replica.asking.shutdown()


def test_the_next_state_is_kept_while_the_commit_is_awaited(tmp_path: Path) -> None:
    replica = _replica(tmp_path)
    replica._transaction(asked=False)
    ahead = replica.kept_ahead  # the state after step 0, copied during its commit
    assert (ahead["step"], ahead["syncs"]) == (1, 1)
    after = {k: v.clone() for k, v in replica.nodes.params.items()}
    replica.manager.commits = [False]  # the next transaction is not committed: undone
    replica._transaction(asked=False)
    assert replica.kept is ahead and replica.kept_ahead is None
    assert (replica.step, replica.syncs) == (1, 1)
    for name, p in replica.nodes.params.items():
        torch.testing.assert_close(p, after[name], rtol=0, atol=0)
    replica._transaction(asked=False)  # committed this time
    assert (replica.step, replica.syncs, replica.kept_ahead["step"]) == (2, 2, 2)
    replica.asking.shutdown()


def test_a_heal_in_an_overlapped_quorum_lands_at_the_step_boundary(tmp_path: Path) -> None:
    replica = _replica(tmp_path, heal_from_step=7)
    replica._transaction(asked=False)
    # the forward computed on the stale state is dropped and the step computed again from the
    # peer's: the replica took the peer's step 7, and committed it
    assert (replica.step, replica.syncs, replica.calls, replica.heals) == (8, 8, 2, 1)
    replica.log.close()
    events = [json.loads(line) for line in
              (tmp_path / "replica0.events.jsonl").read_text().splitlines()]
    recovery = [e for e in events if e["event"] == "recovery"]
    assert len(recovery) == 1 and recovery[0]["step"] == 7 and recovery[0]["donor_replica"] == 1
    # the numbers of one step taken from the peer's state (the stale gradient dropped)
    from exogym.run.ft.manager import load_replica_state

    (tmp_path / "ref").mkdir()
    ref = _replica(tmp_path / "ref")
    load_replica_state(replica.manager.heal, ref.strategy, ref.nodes, ref.batches, own=False)
    ref.step = 7
    ref._compute()
    for name, p in replica.nodes.params.items():
        torch.testing.assert_close(p, ref.nodes.params[name], rtol=0, atol=0)
    replica.asking.shutdown()
    ref.asking.shutdown()


def test_no_state_is_copied_ahead_of_a_local_step(tmp_path: Path) -> None:
    replica = _replica(tmp_path, strategy=make("diloco", H=4))
    sync = next(t for t in range(8) if replica.strategy.communicates(t) is not False)
    while replica.step < sync:
        replica._local_step()
    replica._transaction(asked=False)
    assert replica.step == sync + 1 and replica.syncs == 1
    # the next step is an inner one: the state moves on, nothing kept ahead
    assert replica.strategy.communicates(replica.step) is False
    assert replica.kept_ahead is None
    replica.asking.shutdown()
