"""Per-node data: every node draws its batches from its own disjoint shard.

Two ways to give data to N nodes (the original EXO Gym's contract):

- one ``Dataset`` shared by all nodes, split by a :class:`~exogym.sim.partition.Partition`:

  - ``"iid"`` (default): each epoch the dataset is permuted with a generator seeded by
    ``(seed, epoch)`` and node ``i`` takes every N-th index starting at ``i`` (like
    ``DistributedSampler(drop_last=True)``), so shards are disjoint, equal in size, and reshuffled
    every epoch; ``len(dataset) % N`` samples are left out of each epoch;
  - ``"dirichlet:ALPHA"`` (label skew), ``"contiguous"`` (consecutive blocks) or ``"natural"``
    (node ``i`` = the dataset's client ``i``, ``N`` = the number of clients): each node gets a
    fixed shard for the whole run (:mod:`exogym.sim.partition`), possibly of unequal sizes.
    Each node cycles through its own shard: a node-local pass permutes the shard with a
    generator seeded by ``(seed, node, pass)``, the node takes ``batch_size`` samples per step
    and starts its next pass when fewer than ``batch_size`` are left (that remainder is dropped
    from this pass; the next permutation puts other samples last). A small shard is therefore
    revisited more often than a large one. ``steps_per_epoch`` is
    ``sum(shard sizes) // (N * batch_size)``, the steps in which all nodes together draw about
    the whole dataset once, and ``epoch`` counts those;
- a ``dataset_factory(rank, num_nodes, train) -> Dataset``: node ``i`` gets its own dataset and
  permutes all of it each epoch with a generator seeded by ``(seed, epoch, i)`` (the factory
  decides each node's data, so only ``"iid"`` is accepted).

Every node gets exactly ``batch_size`` samples per step (the last incomplete batch of an epoch is
dropped), so the batches stack into one ``[N, batch_size, ...]`` pytree. A dataset may offer a fast
path ``get_batch(indices) -> batch`` (an already collated batch); otherwise samples are fetched
one by one and collated with ``torch.utils.data.default_collate``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor
from torch.utils._pytree import tree_map
from torch.utils.data import Dataset, TensorDataset, default_collate

from exogym.sim.partition import (
    Partition,
    contiguous_shards,
    dataset_labels,
    dirichlet_shards,
    label_histogram,
    natural_shards,
    parse_partition,
)

__all__ = [
    "PASS_KEY",
    "BatchDataset",
    "DatasetFactory",
    "FixedSubset",
    "NodeBatches",
    "fetch",
    "fixed_shards",
    "is_map_style",
    "iterate_batches",
    "node_examples",
    "node_pass_order",
    "seeded_generator",
]

DatasetFactory = Callable[[int, int, bool], Dataset]

PASS_KEY = 0x7061_7373  # "pass": separates node-pass seeds from the IID epoch seeds


@runtime_checkable
class BatchDataset(Protocol):
    """A dataset that returns a whole collated batch for a list of indices."""

    def get_batch(self, indices: Sequence[int]) -> Any: ...


def fetch(dataset: Dataset, indices: Tensor) -> Any:
    """The collated batch of ``dataset`` at ``indices`` (a 1-D int64 tensor)."""
    if isinstance(dataset, BatchDataset):
        return dataset.get_batch(indices)
    if type(dataset) is TensorDataset:  # default_collate's list, one gather per tensor
        return [t[indices] for t in dataset.tensors]
    return default_collate([dataset[int(i)] for i in indices])


def node_examples(batches: NodeBatches) -> list[int] | None:
    """Each node's training examples (its fixed shard's size, or its own dataset's length) when
    they differ; None when every node has as many (IID shards, equal datasets)."""
    if batches.shards is not None:
        sizes = [len(s) for s in batches.shards]
    elif batches.datasets:
        sizes = [_length(ds) for ds in batches.datasets]
    else:
        return None
    return None if len(set(sizes)) <= 1 else sizes


def seeded_generator(*key: int) -> torch.Generator:
    seed = int(np.random.SeedSequence(list(key)).generate_state(1, dtype=np.uint64)[0] >> 1)
    return torch.Generator().manual_seed(seed)


def _length(dataset: Dataset) -> int:
    try:
        return len(dataset)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"datasets must define __len__ (map-style), got {type(dataset).__name__}"
        ) from None


def fixed_shards(dataset: Dataset, num_nodes: int, batch_size: int, seed: int,
                 partition: Partition) -> list[Tensor]:
    """Each node's sample ids under a ``"dirichlet"``, ``"contiguous"`` or ``"natural"``
    partition (every node at least ``batch_size`` of them)."""
    if partition.kind == "contiguous":
        return contiguous_shards(_length(dataset), num_nodes)
    if partition.kind == "natural":
        return natural_shards(dataset, num_nodes, min_size=batch_size)
    labels = dataset_labels(dataset)
    if labels is None:
        raise ValueError(
            f"partition {partition.spec!r} splits by class label, but "
            f"{type(dataset).__name__} has no 'targets' (one integer label per sample); "
            "for a dataset without labels (text) use partition='contiguous'"
        )
    assert partition.alpha is not None  # Partition guarantees it for "dirichlet"
    return dirichlet_shards(labels, num_nodes, partition.alpha, seed=seed, min_size=batch_size)


def node_pass_order(shard: Tensor, seed: int, node: int, n_pass: int) -> Tensor:
    """A fixed ``shard`` of node ``node`` in the order of its pass ``n_pass`` (a permutation
    seeded by ``(seed, node, pass)``)."""
    gen = seeded_generator(seed, PASS_KEY, node, n_pass)
    return shard[torch.randperm(len(shard), generator=gen)]


def is_map_style(data: Any) -> bool:
    """A map-style dataset: torch's ``Dataset``, or any sized, indexable object that is not a
    ``dataset_factory`` (a Hugging Face ``datasets.Dataset``, a list)."""
    return isinstance(data, Dataset) or (hasattr(data, "__getitem__") and hasattr(data, "__len__")
                                         and not callable(data))


class NodeBatches:
    """An endless stream of node-stacked training batches, ``[N, batch_size, ...]`` per leaf.

    Args:
        data: one shared ``Dataset`` or a ``dataset_factory(rank, num_nodes, train)``.
        num_nodes: ``N``.
        batch_size: samples per node per step.
        seed: seeds the data order (and the partition); same seed, same batches.
        partition: how a shared dataset is split (:func:`~exogym.sim.partition.parse_partition`:
            ``"iid"``, ``"dirichlet:ALPHA"``, ``"contiguous"``, ``"natural"`` or a
            ``Partition``).

    Attributes:
        partition: the parsed :class:`~exogym.sim.partition.Partition`.
        steps_per_epoch: IID: steps after which every node has seen its whole shard once;
            fixed shards: ``sum(shard sizes) // (N * batch_size)``.
        epoch: the epoch of the last batch drawn (0 before the first).
        per_node: IID: samples per node per epoch; fixed shards: the smallest shard.
        shards: fixed shards (``"dirichlet"``, ``"contiguous"``, ``"natural"``): node ``i``'s
            sorted sample ids; None for IID, whose shards change every epoch.

    Raises:
        ValueError: a bad ``batch_size``, ``num_nodes`` or partition; a node with fewer than
            ``batch_size`` samples; a partition other than ``"iid"`` with a dataset_factory, or
            ``"dirichlet"`` with a dataset without integer ``targets``, ``"natural"`` with a
            dataset without ``clients`` or with ``N`` other than its number of clients.
        TypeError: ``data`` is neither a Dataset nor a callable.
    """

    def __init__(
        self,
        data: Dataset | DatasetFactory,
        num_nodes: int,
        batch_size: int,
        *,
        seed: int,
        partition: Partition | str = "iid",
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
        self.num_nodes, self.batch_size, self.seed = num_nodes, batch_size, seed
        self.partition = parse_partition(partition)
        self.shards: list[Tensor] | None = None
        if is_map_style(data):
            self.shared: Dataset | None = data
            self.datasets: list[Dataset] = []
            per_node = _length(data) // num_nodes
            where = f"the dataset ({_length(data)} samples) split over {num_nodes} nodes"
        elif callable(data):
            if self.partition.kind != "iid":
                raise ValueError(
                    f"partition {self.partition.spec!r} needs one shared Dataset; a "
                    "dataset_factory already decides each node's data: use partition='iid' "
                    "(or build the skew into the factory)"
                )
            self.shared = None
            self.datasets = [data(rank, num_nodes, True) for rank in range(num_nodes)]
            for rank, ds in enumerate(self.datasets):
                if not is_map_style(ds):
                    raise TypeError(
                        f"dataset_factory({rank}, {num_nodes}, True) returned "
                        f"{type(ds).__name__}, expected a torch.utils.data.Dataset"
                    )
            per_node = min(_length(ds) for ds in self.datasets)
            where = f"the smallest node dataset ({per_node} samples)"
        else:
            raise TypeError(
                "train data must be a map-style dataset (a torch.utils.data.Dataset, or anything "
                "with __len__ and __getitem__: a Hugging Face datasets.Dataset) or a "
                f"dataset_factory(rank, num_nodes, train), got {type(data).__name__}"
            )
        self.per_node = per_node
        self.steps_per_epoch = per_node // batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"batch_size {batch_size} is larger than {where}: "
                f"each node has {per_node} samples"
            )
        self.epoch = 0
        if self.shared is not None and self.partition.kind != "iid":
            self.shards = self._fixed_shards(self.shared)
            self.per_node = min(len(s) for s in self.shards)
            total = sum(len(s) for s in self.shards)
            self.steps_per_epoch = total // (num_nodes * batch_size)
            self._steps = 0  # batches drawn
            self._passes = [0] * num_nodes  # node-local passes started
            self._node_pos = [0] * num_nodes
            self._node_order = [self._node_pass(i, 0) for i in range(num_nodes)]
            return
        # IID: every node's own epoch and offset in it (equal unless a world made some node
        # skip steps); the orders of the epochs in use, rebuilt from the seed.
        self._epochs = [0] * num_nodes
        self._offsets = [0] * num_nodes
        self._orders: dict[int, Tensor] = {0: self._permute(0)}

    def _fixed_shards(self, dataset: Dataset) -> list[Tensor]:
        return fixed_shards(dataset, self.num_nodes, self.batch_size, self.seed, self.partition)

    def _node_pass(self, node: int, n_pass: int) -> Tensor:
        """Node ``node``'s fixed shard in the order of its pass ``n_pass``."""
        assert self.shards is not None
        return node_pass_order(self.shards[node], self.seed, node, n_pass)

    def _permute(self, epoch: int) -> Tensor:
        """Sample ids for this epoch: ``[N, per_node]``."""
        n, per = self.num_nodes, self.per_node
        if self.shared is not None:
            perm = torch.randperm(_length(self.shared),
                                  generator=seeded_generator(self.seed, epoch))
            return perm[: n * per].view(per, n).t().contiguous()  # node i: perm[i::n]
        return torch.stack([
            torch.randperm(_length(ds), generator=seeded_generator(self.seed, epoch, rank))[:per]
            for rank, ds in enumerate(self.datasets)
        ])

    def next_indices(self, active: Sequence[bool] | None = None) -> Tensor:
        """The ``[N, batch_size]`` sample ids of the next step. ``active`` (``N`` booleans;
        None: all): only those nodes consume their data; the others' rows are the ids they will
        take next (for shape only: a node that does not compute does not advance)."""
        if active is not None and all(active):
            active = None
        if self.shards is not None:
            return self._next_fixed(active)
        b, epochs, offsets = self.batch_size, self._epochs, self._offsets
        if active is None and len(set(epochs)) == 1 and len(set(offsets)) == 1:
            # every node at the same place: one slice of the shared order (and a new epoch for
            # all at once), exactly as without a world
            if offsets[0] + b > self.per_node:
                self._start_epoch(epochs[0] + 1)
                self._orders.pop(epochs[0], None)
                self._epochs = [epochs[0] + 1] * self.num_nodes
                self._offsets = [0] * self.num_nodes
            pos = self._offsets[0]
            idx = self._orders[self._epochs[0]][:, pos: pos + b]
            self._offsets = [pos + b] * self.num_nodes
            self.epoch = self._epochs[0]
            return idx
        rows = []
        for i in range(self.num_nodes):
            epoch, pos = self._epochs[i], self._offsets[i]
            if pos + b > self.per_node:
                epoch, pos = epoch + 1, 0
                self._start_epoch(epoch)
            rows.append(self._orders[epoch][i, pos: pos + b])
            if active is None or active[i]:
                self._epochs[i], self._offsets[i] = epoch, pos + b
        for e in [e for e in self._orders if e < min(self._epochs)]:
            del self._orders[e]  # no node reads that epoch any more
        self.epoch = max(self._epochs)
        return torch.stack(rows)

    def peek(self, node: int = 0) -> Any:
        """The batch ``node`` will take next, collated (``[B, ...]``), without taking it: for
        timing a step before training starts (nothing, no generator, moves)."""
        b = self.batch_size
        if self.shards is not None:
            order, pos = self._node_order[node], self._node_pos[node]
            if pos + b > len(order):
                order, pos = self._node_pass(node, self._passes[node] + 1), 0
            ids = order[pos: pos + b]
        else:
            epoch, pos = self._epochs[node], self._offsets[node]
            if pos + b > self.per_node:
                epoch, pos = epoch + 1, 0
            order = self._orders.get(epoch)
            ids = (order if order is not None else self._permute(epoch))[node, pos: pos + b]
        dataset = self.shared if self.shared is not None else self.datasets[node]
        return fetch(dataset, ids)

    def _start_epoch(self, epoch: int) -> None:
        if epoch not in self._orders:
            self._orders[epoch] = self._permute(epoch)

    def _next_fixed(self, active: Sequence[bool] | None) -> Tensor:
        """Fixed shards: each node's next ``batch_size`` ids of its current pass."""
        assert self.shards is not None
        b = self.batch_size
        rows = []
        for i, shard in enumerate(self.shards):
            consume = active is None or active[i]
            n_pass, pos, order = self._passes[i], self._node_pos[i], self._node_order[i]
            if pos + b > len(shard):
                n_pass, pos = n_pass + 1, 0
                order = self._node_pass(i, n_pass)
            rows.append(order[pos: pos + b])
            if consume:
                self._passes[i], self._node_pos[i], self._node_order[i] = n_pass, pos + b, order
        self.epoch = self._steps // self.steps_per_epoch
        self._steps += 1
        return torch.stack(rows)

    def state_dict(self) -> dict[str, Any]:
        """Where every node is in the data (the orders are rebuilt from the seed): each node's
        epoch and offset in the shared IID order, or its pass and offset in its fixed shard."""
        if self.shards is not None:
            return {"epoch": self.epoch, "steps": self._steps, "passes": list(self._passes),
                    "node_pos": list(self._node_pos)}
        return {"epoch": self.epoch, "epochs": list(self._epochs), "pos": list(self._offsets)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        if self.shards is not None:
            if "passes" not in state or len(state["passes"]) != self.num_nodes:
                raise ValueError("the saved data position is not of this partition and N")
            self._steps = int(state["steps"])
            self._passes = [int(p) for p in state["passes"]]
            self._node_pos = [int(p) for p in state["node_pos"]]
            self._node_order = [self._node_pass(i, p) for i, p in enumerate(self._passes)]
            return
        if "epochs" not in state or len(state["epochs"]) != self.num_nodes:
            raise ValueError("the saved data position is not of an IID partition of this N")
        self._epochs = [int(e) for e in state["epochs"]]
        self._offsets = [int(p) for p in state["pos"]]
        self._orders = {e: self._permute(e) for e in set(self._epochs)}

    def partition_stats(self) -> dict[str, Any]:
        """How the data is split, for a run's ``config.json``.

        Returns:
            ``{"partition": "dirichlet:0.5", "sizes": [samples of node i], "classes": [labels],
            "label_histogram": [[count of classes[k] in node i] per node]}``; ``classes`` and
            ``label_histogram`` only when the data has integer ``targets``. IID reshuffles its
            shards every epoch: ``sizes`` and the histogram are then those of epoch 0 (of each
            node's whole dataset for a dataset_factory).
        """
        if self.shared is None:
            sizes = [_length(ds) for ds in self.datasets]
            node_labels = [_labels_or_none(ds) for ds in self.datasets]
        else:
            shards = self.shards if self.shards is not None else list(self._permute(0))
            sizes = [len(s) for s in shards]
            labels = _labels_or_none(self.shared)
            node_labels = [labels[s] if labels is not None else None for s in shards]
        stats: dict[str, Any] = {"partition": self.partition.spec, "sizes": sizes}
        present = [t for t in node_labels if t is not None]
        if len(present) == len(node_labels):
            stats["classes"], stats["label_histogram"] = label_histogram(present)
        return stats

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return self.batch(None)

    def batch(self, active: Sequence[bool] | None = None) -> Any:
        """The next node-stacked batch (``active``: see :meth:`next_indices`)."""
        return self.rows(self.next_indices(active), 0, self.num_nodes)

    def rows(self, idx: Tensor, lo: int, hi: int) -> Any:
        """The batch of nodes ``lo`` to ``hi - 1`` (``[hi - lo, B, ...]`` per leaf) of the
        sample ids ``idx`` of :meth:`next_indices` (a paged run fetches a group's rows only)."""
        part = idx[lo:hi]
        n, b = part.shape
        if self.shared is not None:
            flat = fetch(self.shared, part.reshape(-1))
            return tree_map(
                lambda t: t.reshape(n, b, *t.shape[1:]) if isinstance(t, Tensor) else t, flat
            )
        per_node = [fetch(self.datasets[lo + i], part[i]) for i in range(n)]
        return tree_map(lambda *ts: torch.stack(ts), *per_node)


def _labels_or_none(dataset: Dataset) -> Tensor | None:
    """The dataset's integer labels, or None where it has none usable (statistics only)."""
    try:
        return dataset_labels(dataset)
    except ValueError:
        return None


class FixedSubset(Dataset):
    """A fixed random subset of ``k`` samples of ``dataset`` (evaluation during training).

    The samples are drawn once, without replacement, by a generator seeded with ``seed`` (0 by
    default: the same subset for every run, seed and strategy, so their curves are comparable),
    and kept in dataset order. ``get_batch`` is forwarded, so a fast dataset stays fast.

    Attributes:
        dataset: the full dataset; indices: the ``k`` sample ids, sorted.
        test_set: what it is, e.g. ``"2,000-sample fixed subset of test_batch.bin (10,000)"``.
    """

    def __init__(self, dataset: Dataset, k: int, seed: int = 0) -> None:
        n = _length(dataset)
        if not 1 <= k <= n:
            raise ValueError(f"a subset of {k} samples needs 1 <= k <= {n} (the dataset's size)")
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        self.dataset, self.indices = dataset, perm[:k].sort().values
        name = getattr(dataset, "test_set", None) or f"the evaluation set ({n:,})"
        self.test_set = f"{k:,}-sample fixed subset (seed {seed}) of {name}"

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[int(self.indices[index])]

    def get_batch(self, indices: Sequence[int] | Tensor) -> Any:
        return fetch(self.dataset, self.indices[torch.as_tensor(indices, dtype=torch.long)])


def iterate_batches(dataset: Dataset, batch_size: int) -> Iterator[tuple[Any, int]]:
    """``(batch, size)`` over the whole dataset in order (evaluation), last batch partial."""
    length = _length(dataset)
    for start in range(0, length, batch_size):
        idx = torch.arange(start, min(start + batch_size, length))
        yield fetch(dataset, idx), len(idx)
