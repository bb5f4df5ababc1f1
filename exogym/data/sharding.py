"""Per-node data: every node draws its batches from its own disjoint shard.

Two ways to give data to N nodes (the original EXO Gym's contract):

- one ``Dataset`` shared by all nodes: each epoch it is permuted with a generator seeded by
  ``(seed, epoch)`` and node ``i`` takes every N-th index starting at ``i`` (like
  ``DistributedSampler(drop_last=True)``), so shards are disjoint, equal in size, and reshuffled
  every epoch; ``len(dataset) % N`` samples are left out of each epoch;
- a ``dataset_factory(rank, num_nodes, train) -> Dataset``: node ``i`` gets its own dataset and
  permutes all of it each epoch with a generator seeded by ``(seed, epoch, i)``.

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
from torch.utils.data import Dataset, default_collate

__all__ = ["BatchDataset", "DatasetFactory", "NodeBatches", "fetch", "iterate_batches"]

DatasetFactory = Callable[[int, int, bool], Dataset]


@runtime_checkable
class BatchDataset(Protocol):
    """A dataset that returns a whole collated batch for a list of indices."""

    def get_batch(self, indices: Sequence[int]) -> Any: ...


def fetch(dataset: Dataset, indices: Tensor) -> Any:
    """The collated batch of ``dataset`` at ``indices`` (a 1-D int64 tensor)."""
    if isinstance(dataset, BatchDataset):
        return dataset.get_batch(indices)
    return default_collate([dataset[int(i)] for i in indices])


def _generator(*key: int) -> torch.Generator:
    seed = int(np.random.SeedSequence(list(key)).generate_state(1, dtype=np.uint64)[0] >> 1)
    return torch.Generator().manual_seed(seed)


def _length(dataset: Dataset) -> int:
    try:
        return len(dataset)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"datasets must define __len__ (map-style), got {type(dataset).__name__}"
        ) from None


class NodeBatches:
    """An endless stream of node-stacked training batches, ``[N, batch_size, ...]`` per leaf.

    Attributes:
        steps_per_epoch: steps after which every node has seen its whole shard once.
        epoch: the epoch the next batch comes from.
    """

    def __init__(
        self, data: Dataset | DatasetFactory, num_nodes: int, batch_size: int, *, seed: int,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.num_nodes, self.batch_size, self.seed = num_nodes, batch_size, seed
        if isinstance(data, Dataset):
            self.shared: Dataset | None = data
            self.datasets: list[Dataset] = []
            per_node = _length(data) // num_nodes
            where = f"the dataset ({_length(data)} samples) split over {num_nodes} nodes"
        elif callable(data):
            self.shared = None
            self.datasets = [data(rank, num_nodes, True) for rank in range(num_nodes)]
            for rank, ds in enumerate(self.datasets):
                if not isinstance(ds, Dataset):
                    raise TypeError(
                        f"dataset_factory({rank}, {num_nodes}, True) returned "
                        f"{type(ds).__name__}, expected a torch.utils.data.Dataset"
                    )
            per_node = min(_length(ds) for ds in self.datasets)
            where = f"the smallest node dataset ({per_node} samples)"
        else:
            raise TypeError(
                "train data must be a torch.utils.data.Dataset or a "
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
        self._pos = 0
        self._order: Tensor = self._permute(0)

    def _permute(self, epoch: int) -> Tensor:
        """Sample ids for this epoch: ``[N, per_node]``."""
        n, per = self.num_nodes, self.per_node
        if self.shared is not None:
            perm = torch.randperm(_length(self.shared), generator=_generator(self.seed, epoch))
            return perm[: n * per].view(per, n).t().contiguous()  # node i: perm[i::n]
        return torch.stack([
            torch.randperm(_length(ds), generator=_generator(self.seed, epoch, rank))[:per]
            for rank, ds in enumerate(self.datasets)
        ])

    def next_indices(self) -> Tensor:
        """The ``[N, batch_size]`` sample ids of the next step."""
        if self._pos + self.batch_size > self.per_node:
            self.epoch += 1
            self._pos = 0
            self._order = self._permute(self.epoch)
        idx = self._order[:, self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        return idx

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        idx = self.next_indices()
        n, b = idx.shape
        if self.shared is not None:
            flat = fetch(self.shared, idx.reshape(-1))
            return tree_map(
                lambda t: t.reshape(n, b, *t.shape[1:]) if isinstance(t, Tensor) else t, flat
            )
        per_node = [fetch(ds, idx[i]) for i, ds in enumerate(self.datasets)]
        return tree_map(lambda *ts: torch.stack(ts), *per_node)


def iterate_batches(dataset: Dataset, batch_size: int) -> Iterator[tuple[Any, int]]:
    """``(batch, size)`` over the whole dataset in order (evaluation), last batch partial."""
    length = _length(dataset)
    for start in range(0, length, batch_size):
        idx = torch.arange(start, min(start + batch_size, length))
        yield fetch(dataset, idx), len(idx)
