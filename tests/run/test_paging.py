"""Virtual nodes (exogym.run.nodes.paging): a run with ``resident=K`` computes its nodes a group of
K at a time, the other groups paged out to host memory or disk, and gives the numbers of the run
with every node in memory, bit for bit (one machine).

Groups of 8: the fused CPU optimizers compute an element in a SIMD vector or in a loop's scalar
tail, which round differently; with groups of a multiple of 8 nodes every element is computed by
the same code in both runs (measured on this machine's DEFAULT, AVX2 and AVX512 kernels).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from support.runs import check_run

from exogym import Trainer
from exogym.lab.check import TinyNet, tiny_data
from exogym.run.nodes.paging import Paged, PageStore, PagingError, parse_offload
from exogym.run.output.checkpoint import CheckpointError, checkpoint_steps
from exogym.sim.comm import InProcessCommunicator
from exogym.sim.sharding import NodeBatches
from exogym.strategy import StackedStrategy, get, make, registry
from exogym.strategy.optim import LRSchedule
from exogym.strategy.server import ServerStrategy

SYNCHRONOUS = [s for s in registry() if not issubclass(get(s), ServerStrategy)]


def fit(strategy: StackedStrategy | str, **kw: Any) -> Any:
    """exogym check's run (:func:`support.runs.check_run`) on 20 nodes, batch 4, 1 ms a step."""
    return check_run(strategy, **{"num_nodes": 20, "batch_size": 4, "step_time": "1ms", **kw})


def rows(result: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in result.history]


def assert_same(a: Any, b: Any) -> None:
    """``b``, paged, gave ``a``'s numbers (in memory) bit for bit."""
    assert a.paging is None and b.paging is not None and b.paging["bytes_read"] > 0
    assert rows(a) == rows(b)
    ma, mb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    assert a.bytes_sent == b.bytes_sent and a.bytes_received == b.bytes_received
    assert a.comm_log == b.comm_log and a.clock == b.clock


@pytest.mark.parametrize("sid", SYNCHRONOUS)
def test_a_paged_run_gives_the_in_memory_numbers_bit_for_bit(sid: str) -> None:
    assert_same(fit(sid), fit(sid, resident=8))  # groups of 8, 8 and 4 nodes, host memory


def test_engine_auto_pages_with_the_loop_engine_where_it_would_pick_vmap(monkeypatch) -> None:
    # on CUDA engine="auto" picks vmap, which a paged run cannot use: it pages with the loop
    monkeypatch.setattr("exogym.run.nodes.holders.auto_engine", lambda device, n: "vmap")
    b = fit("diloco", engine="auto", resident=8)
    assert rows(b) == rows(fit("diloco", engine="loop", resident=8))


@pytest.mark.parametrize("engine", ["loop", "threads"])
@pytest.mark.parametrize("sid", ["ddp", "diloco"])
def test_dropout_and_batch_norm_page_like_in_memory(sid: str, engine: str) -> None:
    # dropout draws from each node's generator, whose state a paged round keeps per step
    # (threads: a group computes the round's steps in a row), and BatchNorm's running
    # statistics are buffers paged with the group
    from support.resume_cases import Net, data

    def run(**kw: Any) -> Any:
        torch.manual_seed(1)
        return Trainer(Net(norm=True, drop=True), data(), data()).fit(
            strategy=make(sid, **({"H": 4} if sid == "diloco" else {})), num_nodes=16,
            max_steps=8, batch_size=4, eval_interval=4, log_interval=1, engine=engine, seed=0,
            progress=False, step_time="1ms", **kw)

    assert_same(run(), run(resident=8))


@pytest.mark.parametrize("sid", ["ddp", "diloco", "sparta", "streaming_diloco", "demo"])
def test_threads_engine_paged_to_disk(sid: str, tmp_path: Path) -> None:
    a = fit(sid, engine="threads")
    b = fit(sid, engine="threads", resident=8, offload=f"disk:{tmp_path / 'pages'}")
    assert_same(a, b)
    assert list((tmp_path / "pages").iterdir()) == []  # the run's pages are removed at its end


@pytest.mark.parametrize("sid", ["diloco", "fedavg", "fedadam", "muloco", "diloco_eager"])
def test_rounds_computed_group_by_group_give_the_same_rows(sid: str) -> None:
    # threads engine: each group computes a round's H = 4 steps while in memory; the rows of
    # the steps inside a round (loss, lr under warm-up and cosine, bytes, an evaluation of the
    # global model at step 2, mid-round: the round stops there, as eager DiLoCo's global model,
    # the nodes' mean, changes every step) are the in-memory run's
    schedule = LRSchedule(warmup_steps=3, cosine=True)
    kw: dict[str, Any] = dict(engine="threads", max_steps=10, eval_interval=2)
    a = fit(make(sid, H=4, schedule=schedule), **kw)
    b = fit(make(sid, H=4, schedule=schedule), resident=8, offload="disk", **kw)
    assert_same(a, b)
    assert len({r["lr"] for r in b.history}) > 5
    # rounds: the groups are read less often than step by step (the loop engine's paging)
    stepwise = fit(make(sid, H=4, schedule=schedule), resident=8, offload="disk",
                   **{**kw, "engine": "loop"})
    assert b.paging is not None and stepwise.paging is not None
    assert b.paging["bytes_read"] < stepwise.paging["bytes_read"]
    if sid == "diloco_eager":
        return  # takes no partial participation
    a = fit(make(sid, H=4), participation=6, clients_in_memory="all", **kw)
    b = fit(make(sid, H=4), participation=6, resident=8, **kw)
    assert_same(a, b)


def test_a_checkpoint_due_inside_a_round_is_written_at_its_end(tmp_path: Path) -> None:
    # evaluations at rounds' ends (an evaluation inside a round would end the round there)
    kw: dict[str, Any] = dict(engine="threads", max_steps=12, network=None, eval_interval=4)
    whole = fit(make("diloco", H=4), resident=8, **kw)
    fit(make("diloco", H=4), resident=8, out_dir=tmp_path / "run", checkpoint_every=2,
        keep_checkpoints=10, **{**kw, "max_steps": 6})
    assert checkpoint_steps(tmp_path / "run") == [6, 4]  # the one due at 2 waits for 4
    resumed = Trainer(TinyNet(), tiny_data(), tiny_data()).fit(
        resume=tmp_path / "run", max_steps=12, progress=False)
    # every row after the checkpoint (step 6 of the first run also has its final evaluation)
    assert rows(resumed)[6:] == rows(whole)[6:] and len(rows(whole)) == 12
    mr, mw = resumed.model.state_dict(), whole.model.state_dict()
    assert all(torch.equal(mr[k], mw[k]) for k in mw)


def test_worlds_and_participation_page_like_in_memory() -> None:
    world = "fail=3@2,rejoin=3@4,fail=17@1,rejoin=17@5"
    for sid in ("ddp", "diloco", "sparseloco"):
        a, b = fit(sid, world=world, max_steps=8), fit(sid, world=world, max_steps=8, resident=8)
        assert_same(a, b)
        assert [e["event"] for e in b.events] == [e["event"] for e in a.events]
    speeds = ":".join(["1"] * 16 + ["0.5"] * 2 + ["0.25"] * 2)  # a deadline cuts the slowest
    for sid in ("ddp", "diloco"):
        strategy = {"ddp": make("ddp", deadline="2x"), "diloco": make("diloco", H=2,
                                                                       deadline="2x")}[sid]
        again = {"ddp": make("ddp", deadline="2x"), "diloco": make("diloco", H=2,
                                                                    deadline="2x")}[sid]
        a = fit(strategy, world=f"speed={speeds}", max_steps=8)
        b = fit(again, world=f"speed={speeds}", max_steps=8, resident=8, engine="threads")
        assert_same(a, b)
        assert b.world["stragglers_cut"] > 0 and b.world == a.world
    a = fit(make("fedavg", H=2), participation=5, max_steps=8, clients_in_memory="all")
    b = fit(make("fedavg", H=2), participation=5, max_steps=8, resident=8, offload="disk")
    assert_same(a, b)


def test_resume_of_a_paged_run_is_bit_for_bit(tmp_path: Path) -> None:
    whole = fit("diloco", max_steps=8, resident=8)
    fit("diloco", max_steps=4, resident=8, out_dir=tmp_path / "run", checkpoint_every=4,
        network=None)
    assert checkpoint_steps(tmp_path / "run") == [4]
    step_dir = tmp_path / "run" / "checkpoints" / "step-00000004"
    manifest = json.loads((step_dir / "manifest.json").read_text())
    groups = [f"group-{g:06d}.pt" for g in range(3)]  # one file per group, in the manifest
    assert sorted(manifest["sha256"]) == [*groups, "rank-0.pt"]
    assert all((step_dir / name).is_file() for name in groups)
    resumed = Trainer(TinyNet(), tiny_data(), tiny_data()).fit(  # pages on disk now
        resume=tmp_path / "run", max_steps=8, progress=False, offload="disk")
    assert resumed.paging is not None and resumed.paging["offload"] == "disk"
    assert resumed.model.state_dict().keys() == whole.model.state_dict().keys()
    assert all(torch.equal(resumed.model.state_dict()[k], v)
               for k, v in whole.model.state_dict().items())
    with pytest.raises(ValueError, match=r"paging\.resident: checkpoint 8, now 4"):
        Trainer(TinyNet(), tiny_data(), tiny_data()).fit(
            resume=tmp_path / "run", max_steps=8, resident=4, progress=False)
    last = tmp_path / "run" / "checkpoints" / "step-00000008" / "group-000001.pt"
    last.write_bytes(last.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"group-000001\.pt is corrupted or truncated"):
        Trainer(TinyNet(), tiny_data(), tiny_data()).fit(
            resume=tmp_path / "run", max_steps=10, progress=False)


@pytest.mark.parametrize(("engine", "reads"), [("loop", 9), ("threads", 6)])
def test_only_the_group_computing_is_in_memory(engine: str, reads: int) -> None:
    hub = InProcessCommunicator(20)
    paged = Paged(TinyNet(), make("diloco", H=2), hub, resident=8, offload="disk",
                  device=torch.device("cpu"), engine=engine, micro_batch_size=None,
                  precision="fp32", total_steps=2)
    in_memory: list[list[int]] = []
    for g in paged.groups:  # record who is in memory when a group's step ends
        def zero_grad(own: Any = g.nodes.zero_grad) -> None:
            in_memory.append([h.index for h in paged.groups
                              if any(s.nbytes() for s in h.storages)])
            own()
        g.nodes.zero_grad = zero_grad  # type: ignore[method-assign]
    batches = NodeBatches(tiny_data(), 20, 4, seed=0)
    assert paged.round_length(0, 2) == (2 if engine == "threads" else 1)
    t = 0
    while t < 2:  # the loop engine step by step; threads: the round of H = 2 steps at once
        n = paged.round_length(t, 2)
        ids = [batches.next_indices() for _ in range(n)]
        out = paged.compute(list(range(t, t + n)),
                            lambda k, lo, hi, ids=ids: batches.rows(ids[k], lo, hi), None)
        assert [tuple(loss.shape) for loss, _ in out] == [(20,)] * n
        t += n
    assert in_memory == [[0], [1], [2]] * 2  # one group at a time, each step to its end
    assert not any(s.nbytes() for g in paged.groups for s in g.storages)
    # per group, the loop engine: a step, then the outer step's two passes; threads: the round
    # (step 0 and step 1 to its all-reduce), then the outer step's second pass
    assert paged.store.reads == reads
    paged.flush()
    assert [r.op for r in hub.log] == ["all_reduce"]
    paged.close()
    assert paged.store.folder is not None and not paged.store.folder.exists()


def test_groups_that_make_other_collectives_are_an_error() -> None:
    @dataclass(kw_only=True)
    class Uneven(StackedStrategy):
        id = "uneven_paging"

        def step(self, step: int) -> None:
            self.inner_step()
            if self.comm.node_ids[0] == 0:  # only the group holding node 0 communicates
                self.comm.all_reduce(self.nodes.params["body.0.bias"])

    with pytest.raises(PagingError, match=r"group 1 \(nodes 8-15\).* same collectives"):
        fit(Uneven(), resident=8, network=None)
    fit(Uneven(), network=None)  # in memory every node is in the one group


def test_a_step_that_says_it_is_silent_and_communicates_is_an_error() -> None:
    @dataclass(kw_only=True)
    class Liar(StackedStrategy):
        id = "liar_paging"

        def communicates(self, step: int) -> bool | None:
            return False

        def step(self, step: int) -> None:
            self.inner_step()
            self.comm.all_reduce(self.nodes.params["body.0.bias"])

    with pytest.raises(PagingError, match="Liar made a collective at step 0, where its "
                                          "communicates"):
        fit(Liar(), resident=8, network=None)
    assert [make("diloco", H=4).communicates(t) for t in range(4)] == [False] * 3 + [None]
    assert [make("fedavg", H=3).communicates(t) for t in range(3)] == [False, False, None]


@pytest.mark.parametrize(("kw", "message"), [
    ({"resident": 0}, "resident must be an integer >= 1"),
    ({"resident": 8, "offload": "ram"}, "offload takes 'host', 'disk' or 'disk:DIR', got 'ram'"),
    ({"resident": 8, "offload": "disk:"}, "needs a folder"),
    ({"resident": 8, "engine": "vmap"}, "loop or threads engine"),
    ({"resident": 8, "strategy": "fedbuff"}, "fedbuff is asynchronous"),
])
def test_bad_paging_settings_are_refused_by_name(kw: dict[str, Any], message: str) -> None:
    kw = dict(kw)  # the parametrize case is shared: not changed here
    strategy = kw.pop("strategy", "diloco")
    with pytest.raises(ValueError, match=message):
        fit(strategy, network="datacenter", **kw)


def test_resident_of_every_node_is_the_in_memory_run(tmp_path: Path) -> None:
    fit("ddp", resident=20, out_dir=tmp_path / "run")
    assert json.loads((tmp_path / "run" / "config.json").read_text())["paging"] is None
    fit("ddp", resident=8, offload="disk", out_dir=tmp_path / "paged")
    config = json.loads((tmp_path / "paged" / "config.json").read_text())
    assert config["paging"] == {"resident": 8, "offload": "disk"}
    paging = json.loads((tmp_path / "paged" / "summary.json").read_text())["paging"]
    # every step reads each group at least once: 6 steps x 20 nodes x 83 fp32 parameters
    assert paging["groups"] == 3 and paging["bytes_read"] >= 6 * 20 * 83 * 4


@pytest.mark.parametrize("kind", ["host", "disk"])
def test_page_store_round_trip(kind: str, tmp_path: Path) -> None:
    kind_, folder = parse_offload(kind if kind == "host" else f"disk:{tmp_path}")
    store = PageStore(kind_, folder, device=torch.device("cpu"))
    a, b = torch.arange(10, dtype=torch.float32), torch.arange(3, dtype=torch.int64) - 7
    storages = [a.untyped_storage(), b.untyped_storage()]
    store.save(4, storages)
    before = (a.clone(), b.clone())
    for s in storages:
        s.resize_(0)
    store.load(4, storages, [40, 24])
    assert torch.equal(a, before[0]) and torch.equal(b, before[1])
    assert store.bytes_written == store.bytes_read == 64
    if kind == "disk":
        assert (tmp_path / "group-000004.bin").stat().st_size == 64
    store.close()
    assert tmp_path.exists() and list(tmp_path.iterdir()) == []  # the pages go, the folder stays
