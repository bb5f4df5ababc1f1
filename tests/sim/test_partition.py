"""Non-IID partitions: parsing, Dirichlet label skew, contiguous shards, NodeBatches over them.

The real MNIST and Tiny Shakespeare files are read from the tests' data folder (the ``*_data``
fixtures of ``conftest.py``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

import exogym.run.trainer
from exogym.run.dist.communicator import local_batch
from exogym.sim.partition import (
    MAX_DRAWS,
    Partition,
    contiguous_shards,
    dataset_labels,
    dirichlet_shards,
    label_histogram,
    parse_partition,
)
from exogym.sim.sharding import NodeBatches
from exogym.strategy import make

CLASSES, PER_CLASS = 10, 600
LABELS = torch.arange(CLASSES * PER_CLASS) % CLASSES  # 6,000 samples, 600 of each class


class Labelled(Dataset):
    """Sample ``i`` is ``(i, targets[i])``; collated batches by tensor indexing."""

    def __init__(self, targets: Any) -> None:
        self.targets = targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return torch.tensor(i), torch.as_tensor(self.targets[i])

    def get_batch(self, indices: Sequence[int] | Tensor) -> tuple[Tensor, Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return idx, torch.as_tensor(self.targets)[idx]


class Plain(Dataset):
    """Sample ``i`` is ``i``; no labels."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Tensor:
        return torch.tensor(i)


def total_variation(labels: Tensor, shards: list[Tensor]) -> list[float]:
    """Per node: TV distance between its label distribution and the (uniform) global one."""
    out = []
    for shard in shards:
        p = torch.bincount(labels[shard], minlength=CLASSES).double() / len(shard)
        out.append(0.5 * float((p - 1 / CLASSES).abs().sum()))
    return out


def stream(batches: NodeBatches, steps: int) -> Tensor:
    """``[steps, N, B]`` sample ids of the next ``steps`` steps."""
    return torch.stack([batches.next_indices() for _ in range(steps)])


# -- parsing -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "kind", "alpha", "spec"), [
    ("iid", "iid", None, "iid"),
    ("  IID ", "iid", None, "iid"),
    ("contiguous", "contiguous", None, "contiguous"),
    ("dirichlet:0.5", "dirichlet", 0.5, "dirichlet:0.5"),
    ("Dirichlet: 1e4", "dirichlet", 10000.0, "dirichlet:10000"),
    ("dirichlet:1", "dirichlet", 1.0, "dirichlet:1"),
    ("dirichlet:0.1234567891", "dirichlet", 0.1234567891, "dirichlet:0.1234567891"),
])
def test_parse_partition(text: str, kind: str, alpha: float | None, spec: str) -> None:
    p = parse_partition(text)
    assert (p.kind, p.alpha, p.spec, str(p)) == (kind, alpha, spec, spec)
    assert parse_partition(p.spec) == p
    assert parse_partition(p) is p
    assert Partition() == parse_partition("iid")


@pytest.mark.parametrize("text", [
    "", "dirichlet", "dirichlet:", "iid:2", "contiguous:1", "label_skew", "dirichlet:abc",
])
def test_parse_partition_rejects_bad_forms(text: str) -> None:
    allowed = r"allowed: 'iid', 'dirichlet:ALPHA' \(ALPHA > 0.*'contiguous'"
    with pytest.raises(ValueError, match=allowed):
        parse_partition(text)


@pytest.mark.parametrize("text", ["dirichlet:0", "dirichlet:-1", "dirichlet:inf", "dirichlet:nan"])
def test_parse_partition_rejects_bad_alpha(text: str) -> None:
    with pytest.raises(ValueError, match=r"dirichlet alpha must be a finite float > 0, got"):
        parse_partition(text)


def test_partition_validates_its_fields() -> None:
    kinds = r"kind must be one of \('iid', 'dirichlet', 'contiguous', 'natural'\), got 'x'"
    with pytest.raises(ValueError, match=kinds):
        Partition(kind="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"alpha applies only to kind='dirichlet', got alpha=0.5"):
        Partition(kind="iid", alpha=0.5)
    with pytest.raises(ValueError, match=r"needs alpha, a float > 0, got None"):
        Partition(kind="dirichlet")
    with pytest.raises(ValueError, match=r"needs alpha, a float > 0, got True"):
        Partition(kind="dirichlet", alpha=True)
    assert Partition(kind="dirichlet", alpha=2).alpha == 2.0
    assert isinstance(Partition(kind="dirichlet", alpha=2).alpha, float)
    with pytest.raises(TypeError, match="partition must be a str or a Partition, got float"):
        parse_partition(0.5)  # type: ignore[arg-type]


# -- Dirichlet shards --------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.1, 1.0, 1e4])
def test_dirichlet_shards_are_disjoint_and_cover_every_sample(alpha: float) -> None:
    shards = dirichlet_shards(LABELS, 4, alpha, seed=0)
    assert len(shards) == 4
    for s in shards:
        assert s.dtype == torch.int64
        assert torch.equal(s, s.sort().values)
    assert torch.equal(torch.cat(shards).sort().values, torch.arange(len(LABELS)))


def test_dirichlet_shards_are_deterministic_per_seed() -> None:
    a = dirichlet_shards(LABELS, 4, 0.5, seed=3)
    b = dirichlet_shards(LABELS, 4, 0.5, seed=3)
    c = dirichlet_shards(LABELS, 4, 0.5, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert [len(x) for x in a] != [len(x) for x in c]


def test_small_alpha_is_far_from_iid_and_large_alpha_is_close() -> None:
    for seed in range(3):
        skewed = total_variation(LABELS, dirichlet_shards(LABELS, 4, 0.1, seed=seed))
        # IID would give TV ~ 0.01; Dir(0.1) puts most of a class on one or two nodes
        assert sum(skewed) / 4 > 0.4, (seed, skewed)
        near = dirichlet_shards(LABELS, 4, 1e4, seed=seed)
        # q_c ~ Dir(1e4 * 1_4): sd(q_ci) = sqrt(1/4 * 3/4 / 40001) = 0.0022, so node i gets
        # 600 * q_ci = 150 +- 1.3 samples of each class: within +-10 (7 sd)
        for shard in near:
            counts = torch.bincount(LABELS[shard], minlength=CLASSES)
            assert int((counts - 150).abs().max()) <= 10, counts
        assert max(total_variation(LABELS, near)) < 0.02


def test_dirichlet_one_node_gets_everything() -> None:
    (only,) = dirichlet_shards(LABELS, 1, 0.1, seed=0)
    assert torch.equal(only, torch.arange(len(LABELS)))


def test_dirichlet_redraws_until_every_node_has_min_size() -> None:
    first = dirichlet_shards(LABELS, 4, 0.1, seed=0)  # draw 0: sizes 3244, 482, 542, 1732
    assert min(len(s) for s in first) < 1000
    redrawn = dirichlet_shards(LABELS, 4, 0.1, seed=0, min_size=1000)
    assert min(len(s) for s in redrawn) >= 1000
    assert torch.equal(torch.cat(redrawn).sort().values, torch.arange(len(LABELS)))


def test_dirichlet_gives_up_after_max_draws() -> None:
    labels = torch.arange(40) % 4  # 4 nodes x batch 10 needs exactly 10 each: never at alpha 0.05
    with pytest.raises(ValueError, match=(
        rf"dirichlet:0.05 over 4 nodes left some node with fewer samples than batch_size 10 in "
        rf"all {MAX_DRAWS} draws from seed 0; the closest \(draw \d+\) gave node \d only \d "
        r"samples. Use a larger alpha, a smaller batch_size or fewer nodes")):
        dirichlet_shards(labels, 4, 0.05, seed=0, min_size=10)
    with pytest.raises(ValueError, match=r"dirichlet:0\.05 over 4 nodes"):
        NodeBatches(Labelled(labels), 4, 10, seed=0, partition="dirichlet:0.05")


def test_label_histogram() -> None:
    classes, counts = label_histogram([torch.tensor([3, 3, 7]), torch.tensor([7, 9]),
                                       torch.tensor([], dtype=torch.int64)])
    assert classes == [3, 7, 9]
    assert counts == [[2, 1, 0], [0, 1, 1], [0, 0, 0]]


def test_dataset_labels() -> None:
    assert torch.equal(dataset_labels(Labelled([2, 0, 1])), torch.tensor([2, 0, 1]))  # a list
    assert dataset_labels(Labelled(torch.tensor([1, 1], dtype=torch.uint8))).dtype == torch.int64
    assert dataset_labels(Plain(3)) is None
    with pytest.raises(ValueError, match=r"Labelled.targets must be 1-D integer class labels, "
                                         r"got torch.float32 \(2,\)"):
        dataset_labels(Labelled(torch.tensor([0.0, 1.0])))
    with pytest.raises(ValueError, match=r"got torch.int64 \(2, 2\)"):
        dataset_labels(Labelled(torch.zeros(2, 2, dtype=torch.int64)))

    class Short(Labelled):
        def __len__(self) -> int:
            return 3

    with pytest.raises(ValueError, match=r"Short\.targets has 4 labels for 3 samples; expected"):
        dataset_labels(Short(torch.tensor([0, 1, 2, 3])))


# -- contiguous shards -------------------------------------------------------------------------
def test_contiguous_shards_hand_computed() -> None:
    shards = contiguous_shards(11, 3)  # 3 per node, samples 9 and 10 left out
    assert [s.tolist() for s in shards] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_contiguous_shards_of_shakespeare_are_contiguous_spans_of_the_text(
    shakespeare_data: Path,
) -> None:
    from exogym.tasks.data.shakespeare import load_shakespeare

    t = 16
    train, _ = load_shakespeare(shakespeare_data, block_size=t, train_stride=t, download=False)
    n, b = 4, 8
    batches = NodeBatches(train, n, b, seed=0, partition="contiguous")
    per = len(train) // n
    assert batches.shards is not None
    for i, shard in enumerate(batches.shards):
        assert torch.equal(shard, torch.arange(i * per, (i + 1) * per))
    assert batches.steps_per_epoch == per // b
    assert batches.partition_stats() == {"partition": "contiguous", "sizes": [per] * n}
    for _ in range(5):
        idx = batches.next_indices()
        x, y = train.get_batch(idx.reshape(-1))
        x, y = x.view(n, b, t), y.view(n, b, t)
        for i in range(n):
            # stride = block: node i's inputs are tokens of its span [i*per*T, (i+1)*per*T)
            assert int(idx[i].min()) >= i * per and int(idx[i].max()) < (i + 1) * per
            starts = idx[i] * t
            assert torch.equal(x[i], train.tokens[starts[:, None] + torch.arange(t)])
            assert torch.equal(y[i], train.tokens[starts[:, None] + torch.arange(1, t + 1)])


# -- NodeBatches over fixed shards -------------------------------------------------------------
def test_node_batches_cycle_each_node_through_its_own_shard() -> None:
    n, b = 4, 32
    ds = Labelled(LABELS)
    batches = NodeBatches(ds, n, b, seed=1, partition="dirichlet:0.3")
    shards = dirichlet_shards(LABELS, n, 0.3, seed=1, min_size=b)
    assert batches.shards is not None
    assert all(torch.equal(x, y) for x, y in zip(batches.shards, shards, strict=True))
    sizes = [len(s) for s in shards]
    assert batches.steps_per_epoch == 6000 // (4 * 32) == 46
    assert batches.per_node == min(sizes)
    steps = 200  # 6,400 samples per node: the smaller shards are passed through several times
    assert 2 * min(sizes) < steps * b
    ids = stream(batches, steps)  # [steps, N, B]
    for i in range(n):
        node = ids[:, i].reshape(-1)
        assert set(node.tolist()) <= set(shards[i].tolist())
        per_pass = sizes[i] // b * b  # each pass: floor(size / B) batches, no repeats
        for start in range(0, len(node) - per_pass + 1, per_pass):
            one_pass = node[start : start + per_pass]
            assert len(set(one_pass.tolist())) == per_pass
        if len(node) >= 2 * per_pass:  # a new pass is a new order
            assert not torch.equal(node[:per_pass], node[per_pass : 2 * per_pass])


def test_node_batches_epoch_counts_dataset_equivalents() -> None:
    batches = NodeBatches(Labelled(LABELS), 4, 32, seed=1, partition="dirichlet:0.3")
    epochs = []
    for _ in range(2 * 46 + 1):
        batches.next_indices()
        epochs.append(batches.epoch)
    assert epochs == [0] * 46 + [1] * 46 + [2]


def test_node_batches_fixed_shards_are_deterministic() -> None:
    def make(seed: int, partition: str) -> Tensor:
        return stream(NodeBatches(Labelled(LABELS), 3, 16, seed=seed, partition=partition), 60)

    for partition in ("dirichlet:0.5", "contiguous"):
        assert torch.equal(make(5, partition), make(5, partition))
        assert not torch.equal(make(5, partition), make(6, partition))


def test_node_batches_collate_and_stats() -> None:
    n, b = 3, 8
    batches = NodeBatches(Labelled(LABELS), n, b, seed=2, partition="dirichlet:0.2")
    assert batches.shards is not None
    stats = batches.partition_stats()
    assert stats["partition"] == "dirichlet:0.2"
    assert stats["sizes"] == [len(s) for s in batches.shards]
    assert sum(stats["sizes"]) == 6000
    assert stats["classes"] == list(range(CLASSES))
    for i, row in enumerate(stats["label_histogram"]):
        assert row == torch.bincount(LABELS[batches.shards[i]], minlength=CLASSES).tolist()
    x, y = next(batches)
    assert x.shape == y.shape == (n, b)
    assert torch.equal(y, LABELS[x])
    for i in range(n):  # a node only ever sees the classes of its shard
        held = {c for c, k in enumerate(stats["label_histogram"][i]) if k}
        assert set(y[i].tolist()) <= held


def test_process_rows_equal_the_simulator_rows() -> None:
    """``exogym.run.dist.local_batch`` (the process engine) gives a process exactly its rows."""
    sim = NodeBatches(Labelled(LABELS), 4, 8, seed=9, partition="dirichlet:0.5")
    proc = NodeBatches(Labelled(LABELS), 4, 8, seed=9, partition="dirichlet:0.5")
    for _ in range(30):
        x, y = next(sim)
        px, py = local_batch(proc, [1, 3])
        assert torch.equal(px, x[[1, 3]]) and torch.equal(py, y[[1, 3]])
    assert proc.epoch == sim.epoch


def test_mnist_dirichlet_skew(mnist_data: Path) -> None:
    from exogym.tasks.data.mnist import MNIST

    train = MNIST(mnist_data, train=True, download=False)
    skewed = NodeBatches(train, 4, 64, seed=0, partition="dirichlet:0.1")
    iid = NodeBatches(train, 4, 64, seed=0)
    assert skewed.steps_per_epoch == iid.steps_per_epoch == 60000 // 256
    s, u = skewed.partition_stats(), iid.partition_stats()
    assert sum(s["sizes"]) == 60000 and u["sizes"] == [15000] * 4
    assert s["classes"] == u["classes"] == list(range(10))

    def dominant(stats: dict[str, Any]) -> list[float]:
        return [max(row) / sum(row) for row in stats["label_histogram"]]

    assert max(dominant(u)) < 0.12  # IID: the largest class, '1', is 11.2% of MNIST
    assert sum(dominant(s)) / 4 > 0.4  # Dir(0.1): a few classes dominate each node
    x, y = next(skewed)
    assert x.shape == (4, 64, 1, 28, 28) and y.shape == (4, 64)


# -- IID is unchanged --------------------------------------------------------------------------
def test_iid_indices_are_bit_identical_to_before() -> None:
    """Expected ids recorded from the implementation before partitions were added."""
    batches = NodeBatches(Plain(23), 3, 2, seed=7)
    assert batches.steps_per_epoch == 3
    assert stream(batches, 7).tolist() == [
        [[9, 6], [20, 13], [19, 5]], [[16, 4], [8, 12], [22, 11]], [[10, 21], [1, 18], [7, 0]],
        [[20, 15], [14, 6], [2, 5]], [[21, 3], [7, 16], [11, 17]], [[19, 1], [12, 4], [22, 8]],
        [[10, 18], [6, 19], [0, 1]],
    ]
    explicit = NodeBatches(Plain(23), 3, 2, seed=7, partition=Partition(kind="iid"))
    assert stream(explicit, 7).tolist() == stream(NodeBatches(Plain(23), 3, 2, seed=7), 7).tolist()

    def factory(rank: int, num_nodes: int, train: bool) -> Dataset:
        return Plain(5 + 2 * rank)

    batches = NodeBatches(factory, 2, 2, seed=5)
    assert batches.steps_per_epoch == 2
    assert stream(batches, 5).tolist() == [
        [[3, 0], [2, 1]], [[2, 4], [5, 0]], [[0, 1], [3, 4]], [[3, 2], [6, 5]], [[2, 1], [0, 4]],
    ]
    batches = NodeBatches(Plain(1003), 4, 8, seed=123)
    ids = stream(batches, 300)
    weights = torch.arange(ids.numel()).view(ids.shape) % 1009
    assert int((ids * weights).sum()) == 2356003890
    assert batches.epoch == 9


def test_iid_stats_describe_epoch_zero() -> None:
    ds = Labelled(torch.tensor([0, 1] * 10))  # 20 samples, labels alternate
    batches = NodeBatches(ds, 2, 5, seed=0)
    stats = batches.partition_stats()
    first_epoch = stream(NodeBatches(ds, 2, 5, seed=0), 2)  # 2 steps per epoch: [2, N, B]
    node0 = first_epoch[:, 0].reshape(-1)
    zeros = int((node0 % 2 == 0).sum())
    assert stats == {"partition": "iid", "sizes": [10, 10], "classes": [0, 1],
                     "label_histogram": [[zeros, 10 - zeros], [10 - zeros, zeros]]}
    assert NodeBatches(Plain(20), 2, 5, seed=0).partition_stats() == {
        "partition": "iid", "sizes": [10, 10]}

    def factory(rank: int, num_nodes: int, train: bool) -> Dataset:
        return Labelled(torch.tensor([rank] * (6 + rank)))

    assert NodeBatches(factory, 2, 2, seed=0).partition_stats() == {
        "partition": "iid", "sizes": [6, 7], "classes": [0, 1],
        "label_histogram": [[6, 0], [0, 7]]}


# -- errors ------------------------------------------------------------------------------------
def test_errors() -> None:
    def factory(rank: int, num_nodes: int, train: bool) -> Dataset:
        return Labelled(LABELS)

    with pytest.raises(ValueError, match=r"partition 'dirichlet:0.5' needs one shared Dataset; "
                                         r"a dataset_factory already decides each node's data"):
        NodeBatches(factory, 2, 4, seed=0, partition="dirichlet:0.5")
    with pytest.raises(ValueError, match=r"partition 'contiguous' needs one shared Dataset"):
        NodeBatches(factory, 2, 4, seed=0, partition="contiguous")
    with pytest.raises(ValueError, match=r"partition 'dirichlet:0.5' splits by class label, but "
                                         r"Plain has no 'targets'.*use partition='contiguous'"):
        NodeBatches(Plain(100), 2, 4, seed=0, partition="dirichlet:0.5")
    with pytest.raises(ValueError, match=r"Labelled.targets must be 1-D integer class labels"):
        NodeBatches(Labelled(torch.rand(100)), 2, 4, seed=0, partition="dirichlet:0.5")
    with pytest.raises(ValueError, match=r"batch_size 8 is larger than the dataset \(30 samples\) "
                                         r"split over 4 nodes: each node has 7 samples"):
        NodeBatches(Labelled(LABELS[:30]), 4, 8, seed=0, partition="dirichlet:1")
    with pytest.raises(ValueError, match=r"batch_size 8 is larger than the dataset"):
        NodeBatches(Plain(30), 4, 8, seed=0, partition="contiguous")
    with pytest.raises(ValueError, match=r"num_nodes must be >= 1, got 0"):
        NodeBatches(Plain(30), 0, 8, seed=0)
    with pytest.raises(ValueError, match=r"partition 'random' is not valid; allowed: 'iid'"):
        NodeBatches(Plain(30), 2, 8, seed=0, partition="random")


# -- end to end --------------------------------------------------------------------------------
SEEN: list[Tensor] = []  # module-level: NodeStack deep-copies the model, not this list


class Recorder(nn.Module):
    """Records the sample ids of each training forward (one node at a time, loop engine)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        ids, labels = batch
        if self.training:
            SEEN.append(ids.detach().clone())
        return ((self.w - labels.float()) ** 2).mean()


def test_trainer_trains_on_the_partition(tmp_path: Path) -> None:
    SEEN.clear()
    ds = Labelled(LABELS[:400])
    exogym.run.trainer.Trainer(Recorder(), ds).fit(
        strategy=make("fedavg", H=4), num_nodes=3, max_steps=12, batch_size=8, engine="loop",
        device="cpu", progress=False, network=None, partition="dirichlet:0.1", out_dir=tmp_path)
    shards = dirichlet_shards(LABELS[:400], 3, 0.1, seed=0, min_size=8)
    assert len(SEEN) == 12 * 3
    for k, ids in enumerate(SEEN):
        assert set(ids.tolist()) <= set(shards[k % 3].tolist())
    expected = stream(NodeBatches(ds, 3, 8, seed=0, partition="dirichlet:0.1"), 12)
    assert torch.equal(torch.stack(SEEN).view(12, 3, 8), expected)
    # The partition and its statistics are recorded with the run.
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["partition"] == "dirichlet:0.1"
    assert config["partition_stats"]["sizes"] == [len(sh) for sh in shards]
    assert sum(map(sum, config["partition_stats"]["label_histogram"])) == 400


def test_a_tensor_dataset_is_fetched_in_one_gather_as_collated() -> None:
    from torch.utils.data import TensorDataset, default_collate

    from exogym.sim.sharding import fetch

    ds = TensorDataset(torch.randn(10, 2, 3), torch.arange(10), torch.rand(10) > 0.5)
    idx = torch.tensor([7, 0, 3, 3])
    fast, slow = fetch(ds, idx), default_collate([ds[int(i)] for i in idx])
    assert type(fast) is type(slow) is list
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(fast, slow, strict=True))

    class Doubled(TensorDataset):  # a subclass may change items: it takes the general path
        def __getitem__(self, i: int) -> tuple[Tensor, ...]:
            return tuple(t * 2 for t in super().__getitem__(i))

    assert torch.equal(fetch(Doubled(torch.arange(10)), idx[:2])[0], torch.tensor([14, 0]))
