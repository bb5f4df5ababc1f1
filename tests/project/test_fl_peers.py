"""``bench/fl_peers.py``'s parts that need no peer installed: the workload file it exports from
exogym (shards, draws, per-client batch orders, initial weights, optimizer settings, as exogym's
own run has them), the peers' reading of it, the exogym command, the process-tree memory
sampler and the table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support.scripts import load_script

from exogym.cli import build_parser
from exogym.sim.participation import Participation
from exogym.sim.partition import dirichlet_shards
from exogym.sim.sharding import NodeBatches
from exogym.tasks import get_task
from exogym.tasks.data.mnist import load_mnist

driver = load_script("bench/fl_peers.py", "bench_fl_peers")
common = load_script("bench/fl_peers/peer_common.py", "bench_fl_peers_common")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, mnist_data: Path):
    """A 3-round workload file of the default spec (1,000 clients, 10 a round), read back as a
    peer reads it; with exogym's MNIST."""
    spec = driver.WorkloadSpec(rounds=3)
    path = driver.export(spec, str(mnist_data), tmp_path_factory.mktemp("wl") / "w.npz")
    train, test = load_mnist(mnist_data, download=False)
    with np.load(path) as f:
        raw = {k: f[k] for k in ("shard_ids", "shard_offsets")}
    return spec, common.load_workload(path), raw, train, test


def test_shards_are_exogyms_dirichlet_split(exported) -> None:
    spec, _, raw, train, _ = exported
    ids, offsets = raw["shard_ids"], raw["shard_offsets"]
    shards = [ids[offsets[i]:offsets[i + 1]] for i in range(spec.clients)]
    expected = dirichlet_shards(train.targets, spec.clients, 0.5, seed=spec.seed, min_size=8)
    assert all(np.array_equal(s, e.numpy()) for s, e in zip(shards, expected, strict=True))
    assert sorted(ids.tolist()) == list(range(len(train)))  # disjoint, every sample once
    assert min(len(s) for s in shards) >= spec.batch_size


def test_each_rounds_clients_are_exogyms_draw(exported) -> None:
    spec, wl, _, _, _ = exported
    draws = Participation(count=spec.per_round, seed=spec.seed)
    for r in range(spec.rounds):
        chosen = draws.draw(r, [True] * spec.clients)
        assert wl.clients[r].tolist() == [i for i, c in enumerate(chosen) if c]


def test_batches_follow_each_clients_own_pass_order(exported) -> None:
    """Client c's k-th participation trains batches 10k..10k+9 of its own stream: its shard in
    the order of exogym's pass 0, then pass 1, ... (8 a step, a pass's remainder dropped); the
    rounds it sits out do not advance it."""
    spec, wl, _, train, _ = exported
    reference = NodeBatches(train, spec.clients, spec.batch_size, seed=spec.seed,
                            partition=spec.partition)
    b, h = spec.batch_size, spec.local_steps

    def stream(client: int, steps: int) -> list[list[int]]:
        out, n_pass = [], 0
        while len(out) < steps:
            order = reference._node_pass(client, n_pass).tolist()
            out += [order[i:i + b] for i in range(0, len(order) - b + 1, b)]
            n_pass += 1
        return out

    seen: dict[int, int] = {}
    for r in range(spec.rounds):
        for slot, client in enumerate(wl.clients[r].tolist()):
            k = seen.get(client, 0)
            seen[client] = k + 1
            expected = stream(client, (k + 1) * h)[k * h:(k + 1) * h]
            assert wl.batches[r, slot].tolist() == expected, (r, client)
    assert wl.batches.shape == (spec.rounds, spec.per_round, h, b)
    assert max(seen.values()) == 2  # a client of two rounds: its stream goes on where it was


def test_initial_weights_optimizer_and_images_are_exogyms(exported) -> None:
    _, wl, _, train, test = exported
    torch.manual_seed(0)
    model = get_task("mnist").build_model()
    for k, v in model.state_dict().items():
        assert torch.equal(wl.init_state[k], v), k
    assert wl.meta["optim"] == {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                                "weight_decay": 0.0}
    assert torch.equal(wl.images, train.images) and torch.equal(wl.labels, train.targets)
    assert torch.equal(wl.test_images, test.images)
    peer_model = common.build_model(wl)  # exogym's classes, loaded from their file
    x = wl.images[:4]
    assert torch.equal(peer_model.net(x), model.net(x))


def test_exogym_command_is_the_workload_on_exogyms_command_line(tmp_path: Path) -> None:
    spec = driver.WorkloadSpec(rounds=100)
    cmd = driver.exogym_command(spec, tmp_path / "run", "/data")
    args = build_parser().parse_args(cmd[cmd.index("run"):])
    assert (args.nodes, args.participation, args.client_state, args.batch_size, args.steps,
            args.seed) == (1000, "10", "fresh", 8, 1000, 0)
    assert dict(args.overrides)["H"] == "10" and str(args.partition) == "dirichlet:0.5"


def test_tree_memory_counts_a_child_in_the_tools_session() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); "
                              "time.sleep(5)"], start_new_session=True, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "up\n"  # its interpreter is up, its memory with it
        assert child.pid in driver.tree(child.pid)
        assert child.pid in driver.tree(os.getpid())  # a descendant
        memory = driver.TreeMemory(child.pid)
        memory.sample()
        assert memory.peak_rss > 1e6 and memory.most_processes == 1
    finally:
        child.kill()
        child.wait()


def test_the_table_gives_medians_per_tool_in_first_seen_order() -> None:
    def run(tool: str, rate: float, gb: float, acc: float) -> dict:
        return {"tool": tool, "samples_per_s": rate, "peak_rss_bytes": gb * 1e9,
                "peak_pss_bytes": gb * 5e8, "other_s": 10.0, "accuracy": acc}

    records = [run("flower", 1000, 2.0, 0.95), run("exogym", 200, 4.0, 0.973),
               run("flower", 1300, 2.2, 0.95), run("exogym", 240, 5.0, 0.973),
               run("flower", 1200, 2.1, 0.95)]
    lines = driver.table(records).splitlines()
    assert lines[1] == "|---|---|---|---|---|---|---|---|"
    assert lines[2] == ("| flower | Ray: 2 actors + driver | 1,200 | 2.10 | 1.05 | 10.0 | 95.00% "
                        "| 3 |")
    assert lines[3] == "| exogym | 1 (threads engine) | 220 | 4.50 | 2.25 | 10.0 | 97.30% | 2 |"


def test_repeats_interleave_the_tools_in_rotated_order() -> None:
    order = driver.interleaved(["a", "b", "c"], 3)
    assert order == [(0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "c"), (1, "a"),
                     (2, "c"), (2, "a"), (2, "b")]
