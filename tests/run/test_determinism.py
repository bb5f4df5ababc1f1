"""Determinism of ``Trainer.fit``, data sharding, the FitResult's accounting and the run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset, TensorDataset

from exogym import Classifier, Trainer
from exogym.sim.sharding import NodeBatches
from exogym.strategy import make

pytestmark = pytest.mark.usefixtures("single_thread")

STEPS = 20
H = 5
BATCH = 16
NODES = 3
# Measurements of this machine: wall time, and the simulated time (its compute is measured from
# the run's steps when no step time is given).
WALL_CLOCK_KEYS = {"wall_s", "sim_time_s"}


class TinyCNN(nn.Module):
    """[B, 1, 8, 8] -> logits [B, 10]; no buffers."""

    def __init__(self, dropout: float = 0.0, batchnorm: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4) if batchnorm else nn.Identity()
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x: Tensor) -> Tensor:
        h = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(self.drop(h.flatten(1)))


def image_dataset(n: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 1, 8, 8, generator=gen),
                         torch.randint(0, 10, (n,), generator=gen))


TRAIN = image_dataset(512, 0)
VAL = image_dataset(128, 1)


def classifier(dropout: float = 0.0, batchnorm: bool = False) -> Classifier:
    torch.manual_seed(1234)
    return Classifier(TinyCNN(dropout, batchnorm))


def strategy(name: str):
    """A fresh strategy (they bind to one run); FedAvg and DiLoCo sync every H=5 steps."""
    return make(name) if name == "ddp" else make(name, H=H)


def fit(model: nn.Module, name: str, *, engine: str = "loop", seed: int = 0,
        num_nodes: int = NODES, max_steps: int = STEPS, **kwargs):
    return Trainer(model, TRAIN, VAL).fit(
        strategy=strategy(name), num_nodes=num_nodes, max_steps=max_steps, batch_size=BATCH,
        eval_interval=10, engine=engine, device="cpu", seed=seed, progress=False, **kwargs)


def comparable(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in WALL_CLOCK_KEYS} for row in history]


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def ring(num_nodes: int, payload: float) -> float:
    return 2 * (num_nodes - 1) / num_nodes * payload


# -- same seed, same numbers -------------------------------------------------------------------
SEED_CASES = [
    pytest.param(s, e, 0.0, id=f"{s}-{e}") for s in ("ddp", "fedavg", "diloco")
    for e in ("loop", "vmap")
] + [pytest.param("diloco", e, 0.3, id=f"diloco-{e}-dropout") for e in ("loop", "vmap")]


@pytest.mark.parametrize(("name", "engine", "dropout"), SEED_CASES)
def test_same_seed_gives_identical_runs(name: str, engine: str, dropout: float) -> None:
    model = classifier(dropout)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    a = fit(model, name, engine=engine, seed=7)
    b = fit(model, name, engine=engine, seed=7)  # the same model object: fit must not change it
    assert a.engine == b.engine == engine
    assert [row["step"] for row in a.history] == [10, 20]
    assert all("eval_loss" in row and "eval_accuracy" in row for row in a.history)
    assert comparable(a.history) == comparable(b.history)
    assert a.final == b.final == {k: v for k, v in a.history[-1].items() if k.startswith("eval_")}
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sorted(sa) == sorted(sb) == sorted(initial)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
        assert torch.equal(model.state_dict()[k], initial[k]), f"fit changed the user's {k}"
    assert any(not torch.equal(sa[k], initial[k]) for k in sa)  # it did train


@pytest.mark.parametrize("name", ["ddp", "fedavg", "diloco"])
def test_different_seeds_give_different_losses(name: str) -> None:
    model = classifier()
    a = fit(model, name, seed=0)
    b = fit(model, name, seed=1)
    losses_a = [row["train_loss"] for row in a.history]
    losses_b = [row["train_loss"] for row in b.history]
    assert len(losses_a) == len(losses_b) == 2
    assert all(la != lb for la, lb in zip(losses_a, losses_b, strict=True))


def test_dropout_seed_reaches_the_masks() -> None:
    """With a dataset of one repeated sample the data order cannot matter: only dropout differs."""
    x = torch.randn(1, 1, 8, 8).expand(64, 1, 8, 8)
    data = TensorDataset(x.contiguous(), torch.zeros(64, dtype=torch.long))
    model = classifier(dropout=0.5)
    runs = [Trainer(model, data).fit(strategy="ddp", num_nodes=2, max_steps=4, batch_size=8,
                                     log_interval=1, device="cpu", seed=s, progress=False)
            for s in (0, 0, 1)]
    losses = [[row["train_loss"] for row in r.history] for r in runs]
    assert losses[0] == losses[1]
    assert losses[0] != losses[2]


# -- sharding ------------------------------------------------------------------------------------
class IndexDataset(Dataset):
    """Sample ``i`` is ``offset + i`` itself."""

    def __init__(self, length: int, offset: int = 0) -> None:
        self.length, self.offset = length, offset

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Tensor:
        return torch.tensor(self.offset + i)


def epoch_of(batches: NodeBatches) -> Tensor:
    """The next ``steps_per_epoch`` batches, concatenated per node: ``[N, steps * B]``."""
    return torch.cat([next(batches) for _ in range(batches.steps_per_epoch)], dim=1)


def test_shards_are_disjoint_cover_the_epoch_and_reshuffle() -> None:
    length, n, b = 103, 4, 5  # 25 per node, 5 steps per epoch, 3 samples left out
    batches = NodeBatches(IndexDataset(length), n, b, seed=11)
    assert batches.steps_per_epoch == 5
    first = next(batches)
    assert first.shape == (n, b)
    assert first.dtype == torch.int64
    epochs = []
    rest = torch.cat([next(batches) for _ in range(batches.steps_per_epoch - 1)], dim=1)
    epochs.append(torch.cat([first, rest], dim=1))
    assert batches.epoch == 0
    epochs.append(epoch_of(batches))
    assert batches.epoch == 1
    for e in epochs:
        assert e.shape == (n, length // n)
        ids = e.flatten().tolist()
        assert len(set(ids)) == len(ids) == length // n * n  # disjoint, no repeats, all used
        assert set(ids) <= set(range(length))
        for i in range(n):
            for j in range(i):
                assert not set(e[i].tolist()) & set(e[j].tolist())
    assert not torch.equal(epochs[0], epochs[1])  # reshuffled
    assert set(epochs[0][0].tolist()) != set(epochs[1][0].tolist())  # new shards, not just order

    again = NodeBatches(IndexDataset(length), n, b, seed=11)
    assert torch.equal(epoch_of(again), epochs[0])
    assert torch.equal(epoch_of(again), epochs[1])
    other = NodeBatches(IndexDataset(length), n, b, seed=12)
    assert not torch.equal(epoch_of(other), epochs[0])


def test_dataset_factory_gives_each_node_its_own_data() -> None:
    calls = []

    def factory(rank: int, num_nodes: int, train: bool) -> Dataset:
        calls.append((rank, num_nodes, train))
        return IndexDataset(20 + 3 * rank, offset=1000 * rank)  # 20, 23, 26 samples

    batches = NodeBatches(factory, 3, 4, seed=0)
    assert calls == [(0, 3, True), (1, 3, True), (2, 3, True)]
    assert batches.steps_per_epoch == 5  # the smallest node dataset: 20 // 4
    for _ in range(2):
        e = epoch_of(batches)
        for rank in range(3):
            ids = e[rank].tolist()
            assert len(set(ids)) == len(ids) == 20
            assert set(ids) <= set(range(1000 * rank, 1000 * rank + 20 + 3 * rank))


SEEN: list[Tensor] = []  # module-level: NodeStack deep-copies the model, not this list


class Recorder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            SEEN.append(x.detach().clone())
        return ((self.w - x.float() / 1000) ** 2).mean()


def test_trainer_with_dataset_factory() -> None:
    calls = []

    def factory(rank: int, num_nodes: int, train: bool) -> Dataset:
        calls.append((rank, num_nodes, train))
        return IndexDataset(24 if train else 10, offset=1000 * rank + (0 if train else 500))

    SEEN.clear()
    result = Trainer(Recorder(), factory, factory).fit(
        strategy=make("fedavg", H=4), num_nodes=3, max_steps=8, batch_size=4, engine="loop",
        device="cpu", eval_interval=4, progress=False,
        compute="measured")  # no step counted on a copy of the model, which would record it
    assert calls == [(0, 1, False), (0, 3, True), (1, 3, True), (2, 3, True)]
    assert len(SEEN) == 8 * 3  # the loop engine: node 0, 1, 2 per step
    for k, x in enumerate(SEEN):
        rank = k % 3
        assert x.shape == (4,)
        assert set(x.tolist()) <= set(range(1000 * rank, 1000 * rank + 24)), (k, x)
    for rank in range(3):  # 6 steps per epoch: every sample of the node once, then a reshuffle
        node = torch.cat(SEEN[rank::3])
        assert sorted(node[:24].tolist()) == list(range(1000 * rank, 1000 * rank + 24))
    # eval on the val factory's dataset (samples 500..509): loss of w vs x / 1000
    w = float(result.model.w.detach())
    expected = sum((w - (500 + i) / 1000) ** 2 for i in range(10)) / 10
    assert result.final["eval_loss"] == pytest.approx(expected, rel=1e-5)


# -- FitResult accounting --------------------------------------------------------------------------
@pytest.mark.parametrize("num_nodes", [2, 4])
def test_samples_and_ddp_bytes(num_nodes: int) -> None:
    model = classifier()
    r = fit(model, "ddp", num_nodes=num_nodes)
    assert r.steps == STEPS
    assert r.samples == STEPS * num_nodes * BATCH
    assert [row["samples"] for row in r.history] == [10 * num_nodes * BATCH, r.samples]
    per_node = STEPS * ring(num_nodes, 4 * num_params(model))
    assert r.bytes_sent == pytest.approx([per_node] * num_nodes, rel=1e-12)
    assert r.bytes_received == pytest.approx([per_node] * num_nodes, rel=1e-12)
    assert r.history[-1]["bytes_sent"] == pytest.approx(per_node, rel=1e-12)
    assert r.history[0]["bytes_sent"] == pytest.approx(per_node / 2, rel=1e-12)
    assert len(r.comm_log) == STEPS


def test_ddp_bytes_with_buffers() -> None:
    """Node 0 also broadcasts its buffers, (N-1) * B bytes; every other node receives B."""
    model = classifier(batchnorm=True)
    r = fit(model, "ddp", num_nodes=NODES)
    ar = ring(NODES, 4 * num_params(model))
    buf = sum(b.numel() * b.element_size() for b in model.buffers())
    assert buf == 4 * 4 + 4 * 4 + 8  # running mean, var (fp32), num_batches_tracked (int64)
    assert r.bytes_sent[0] == pytest.approx(STEPS * (ar + (NODES - 1) * buf), rel=1e-12)
    assert r.bytes_sent[1:] == pytest.approx([STEPS * ar] * (NODES - 1), rel=1e-12)
    assert r.bytes_received[0] == pytest.approx(STEPS * ar, rel=1e-12)
    assert r.bytes_received[1:] == pytest.approx([STEPS * (ar + buf)] * (NODES - 1), rel=1e-12)


@pytest.mark.parametrize("name", ["diloco", "fedavg"])
@pytest.mark.parametrize("steps", [STEPS, 22])
def test_round_based_bytes(name: str, steps: int) -> None:
    model = classifier()
    if steps % H:
        with pytest.warns(UserWarning, match="not a multiple of H=5"):
            r = fit(model, name, max_steps=steps)
    else:
        r = fit(model, name, max_steps=steps)
    assert r.samples == steps * NODES * BATCH
    expected = (steps // H) * ring(NODES, 4 * num_params(model))
    assert r.bytes_sent == pytest.approx([expected] * NODES, rel=1e-12)
    assert r.bytes_received == pytest.approx([expected] * NODES, rel=1e-12)
    assert len(r.comm_log) == steps // H
    assert [rec.step for rec in r.comm_log] == [H * (k + 1) - 1 for k in range(steps // H)]


@pytest.mark.parametrize("name", ["diloco", "fedavg"])
def test_round_based_bytes_with_float_buffers(name: str) -> None:
    """2(N-1)/N * (P + B) per round, B = float buffer bytes (the int counter is not sent)."""
    model = classifier(batchnorm=True)
    r = fit(model, name)
    floats = sum(b.numel() * b.element_size() for b in model.buffers() if b.is_floating_point())
    expected = (STEPS // H) * ring(NODES, 4 * num_params(model) + floats)
    assert r.bytes_sent == pytest.approx([expected] * NODES, rel=1e-12)


# -- the run folder ------------------------------------------------------------------------------
def test_run_folder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    model = classifier()
    r = fit(model, "diloco", out_dir=out, log_interval=5)
    assert r.out_dir == out
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [5, 10, 15, 20]
    assert rows == r.history  # every value, wall_s included, exactly as returned
    assert ["eval_loss" in row for row in rows] == [False, True, False, True]
    summary = json.loads((out / "summary.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert summary["samples"] == r.samples == STEPS * NODES * BATCH
    assert summary["steps"] == STEPS
    assert summary["final"] == r.final
    assert summary["bytes_sent_per_node"] == r.bytes_sent
    assert config["strategy"] == "diloco"
    assert config["num_nodes"] == NODES
    assert config["seed"] == 0
    assert config["hyperparameters"]["H"] == H

    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(before) == {"metrics.jsonl", "summary.json", "config.json", "model.pt"}
    saved = torch.load(out / "model.pt", weights_only=True)  # the final global model
    assert saved.keys() == r.model.state_dict().keys()
    for k, v in r.model.state_dict().items():
        assert torch.equal(saved[k], v.cpu()), k
    with pytest.raises(FileExistsError, match=r"already exists and is not empty"):
        fit(model, "ddp", out_dir=out, seed=1)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing overwritten
