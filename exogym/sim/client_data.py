"""A population's data: each client's samples and its place in them, computed per client.

A population (:mod:`exogym.run.nodes.population`) has ``N`` clients of which a few train in each
round, so nothing here holds or loops over all ``N`` clients per step: a client's shard is looked
up (disjoint partitions, built once, vectorized) or drawn (sampled partitions) when it is asked
for, and a client's position in its shard is kept only once it has trained.

Two kinds of shards, by the rule below (``L`` samples, batch size ``B``):

- **disjoint** (``N * B <= L``): the partitions of :mod:`exogym.sim.partition` exactly as a run
  with every node in memory splits them (:class:`~exogym.sim.sharding.NodeBatches`), so that a
  population that fits in memory the old way draws the very same batches: ``"iid"`` deals each
  epoch's permutation of the dataset (seeded by ``(seed, epoch)``) out as ``perm[i::N]``, each
  client with its own epoch and offset; ``"dirichlet:ALPHA"``, ``"contiguous"`` and ``"natural"``
  give fixed shards that a client cycles through in passes permuted from ``(seed, client,
  pass)``. The fixed shards are kept as one id array and ``N + 1`` offsets (``O(L + N)``).
- **sampled** (``N * B > L``: more clients than the data has disjoint batches): each client's
  shard is ``n = max(B, L // N)`` samples drawn when the client is first asked for, from a
  generator seeded by ``(seed, client)``: ``"iid"`` draws ``n`` distinct ids uniformly;
  ``"dirichlet:ALPHA"`` draws the client's class mix ``q ~ Dir(ALPHA * 1_C)`` over the ``C``
  classes, its class counts ``~ Multinomial(n, q)``, and each class's ids uniformly without
  replacement from that class's pool (with replacement only if a count exceeds the pool). Shards
  of different clients overlap (as clients of a large population share the world's data). The
  client then cycles through its shard in passes, as a fixed shard. ``"contiguous"`` and
  ``"natural"`` cannot be sampled: an error names the largest population they allow.

A client never has fewer than ``B`` samples: disjoint shards that would (Dirichlet draws) are
redrawn as :func:`exogym.sim.partition.dirichlet_shards` does, and sampled shards have ``n >= B``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils._pytree import tree_map

from exogym.sim.partition import Partition, dataset_labels, parse_partition
from exogym.sim.sharding import (
    fetch,
    fixed_shards,
    is_map_style,
    node_pass_order,
    seeded_generator,
)

__all__ = ["ClientBatches", "shard_mode"]

_SAMPLE_KEY = 0x636C_6E74  # "clnt": separates sampled shards from every other seed stream
_ORDERS_KEPT = 8  # IID epoch permutations kept (clients may be in different epochs)


def shard_mode(length: int, num_clients: int, batch_size: int) -> str:
    """``"disjoint"`` when every client can have a disjoint batch (``N * B <= L``), else
    ``"sampled"`` (the module docstring)."""
    return "disjoint" if num_clients * batch_size <= length else "sampled"


class ClientBatches:
    """The batches of a population's clients (module docstring): ``batch(clients)`` stacks the
    next ``B`` samples of each given client, ``[len(clients), B, ...]`` per leaf.

    Args:
        data: one shared ``Dataset`` (a dataset factory builds each node's data up front: it
            needs every node in memory).
        num_clients: ``N``.
        batch_size: ``B``.
        seed: the run's seed.
        partition: a :class:`~exogym.sim.partition.Partition` or its string.

    Attributes:
        mode: ``"disjoint"`` or ``"sampled"``.
        per_client: samples per client (sampled shards); None for disjoint ones (their sizes
            vary, :meth:`partition_stats`).
        steps_per_epoch: as :class:`~exogym.sim.sharding.NodeBatches` counts them.
        epoch: as :class:`~exogym.sim.sharding.NodeBatches` counts it.
    """

    def __init__(self, data: Any, num_clients: int, batch_size: int, *, seed: int,
                 partition: Partition | str = "iid") -> None:
        if not is_map_style(data):
            raise ValueError(
                "a population (clients_in_memory='round') needs one shared Dataset; a "
                "dataset_factory builds every node's data up front: use clients_in_memory="
                "'all' for it")
        self.dataset, self.num_clients, self.batch_size, self.seed = (
            data, num_clients, batch_size, seed)
        self.partition = parse_partition(partition)
        self.length = len(data)  # type: ignore[arg-type]
        self.mode = shard_mode(self.length, num_clients, batch_size)
        self.per_client: int | None = None
        self._labels: np.ndarray | None = None
        # Fixed shards as one id array and N + 1 offsets (disjoint, not IID).
        self._ids: Tensor | None = None
        self._offsets: np.ndarray | None = None
        self._pools: list[np.ndarray] = []  # sampled Dirichlet: each class's sample ids
        self._sampled: dict[int, Tensor] = {}  # sampled shards of the clients in use
        self._orders: OrderedDict[int, Tensor] = OrderedDict()  # IID epoch permutations
        # Each client's place once it has trained: (pass or epoch, offset); others at (0, 0).
        self.position: dict[int, tuple[int, int]] = {}
        self.epoch, self._steps, self._max_epoch = 0, 0, 0
        self._build()

    # -- the shards ------------------------------------------------------------------------
    def _build(self) -> None:
        kind, n, b, length = self.partition.kind, self.num_clients, self.batch_size, self.length
        if self.mode == "disjoint":
            if kind == "iid":
                self.steps_per_epoch = (length // n) // b
                return
            shards = fixed_shards(self.dataset, n, b, self.seed, self.partition)
            sizes = np.array([len(s) for s in shards], dtype=np.int64)
            self._offsets = np.concatenate([[0], np.cumsum(sizes)])
            self._ids = torch.cat(shards) if shards else torch.zeros(0, dtype=torch.long)
            self.steps_per_epoch = int(sizes.sum()) // (n * b)
            return
        if kind in ("contiguous", "natural"):
            raise ValueError(
                f"partition {self.partition.spec!r} gives each of the {n:,} clients a disjoint "
                f"part of the {length:,} samples, fewer than batch_size {b} each; it allows at "
                f"most {length // b:,} clients at this batch size (more clients are sampled: "
                "use 'iid' or 'dirichlet:ALPHA')")
        self.per_client = max(b, length // n)
        self.steps_per_epoch = max(self.per_client // b, 1)
        if kind == "dirichlet":
            labels = dataset_labels(self.dataset)
            if labels is None:
                raise ValueError(f"partition {self.partition.spec!r} splits by class label, but "
                                 f"{type(self.dataset).__name__} has no 'targets'")
            values = labels.numpy()
            self._pools = [np.flatnonzero(values == c) for c in np.unique(values)]

    def shard(self, client: int) -> Tensor:
        """The client's sample ids (sorted; a sampled shard is drawn on first use). IID
        disjoint shards change every epoch: this is the shard of the client's current epoch."""
        if self.mode == "sampled":
            return self._sampled_shard(client)
        if self._ids is None:  # IID: this epoch's deal
            epoch = self.position.get(client, (0, 0))[0]
            return self._iid_order(epoch)[client::self.num_clients][: self._iid_per()]
        assert self._offsets is not None
        lo, hi = int(self._offsets[client]), int(self._offsets[client + 1])
        return self._ids[lo:hi]

    def examples(self, clients: Sequence[int]) -> list[int] | None:
        """Each of ``clients``' training examples when the clients' shards differ in size (a
        disjoint Dirichlet or natural split); None when every client has as many (IID and
        sampled shards)."""
        if self._offsets is None or self.mode == "sampled":
            return None
        sizes = np.diff(self._offsets)
        if int(sizes.min()) == int(sizes.max()):
            return None
        return [int(sizes[c]) for c in clients]

    def _sampled_shard(self, client: int) -> Tensor:
        cached = self._sampled.get(client)
        if cached is not None:
            return cached
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, _SAMPLE_KEY, client]))
        n = self.per_client
        assert n is not None
        if not self._pools:
            ids = rng.choice(self.length, size=n, replace=False)
        else:
            q = rng.dirichlet(np.full(len(self._pools), float(self.partition.alpha or 1.0)))
            if not np.all(np.isfinite(q)):  # tiny alpha underflows: the limit, one class
                q = np.eye(len(self._pools))[rng.integers(len(self._pools))]
            counts = rng.multinomial(n, q / q.sum())
            ids = np.concatenate([
                rng.choice(pool, size=int(c), replace=int(c) > len(pool))
                for pool, c in zip(self._pools, counts, strict=True) if c])
        shard = torch.from_numpy(np.sort(ids)).to(torch.int64)
        self._sampled[client] = shard
        return shard

    def _iid_per(self) -> int:
        return self.length // self.num_clients

    def _iid_order(self, epoch: int) -> Tensor:
        order = self._orders.get(epoch)
        if order is None:
            order = torch.randperm(self.length, generator=seeded_generator(self.seed, epoch))
            self._orders[epoch] = order
            while len(self._orders) > _ORDERS_KEPT:
                self._orders.popitem(last=False)
        return order

    # -- batches ---------------------------------------------------------------------------
    def next_ids(self, client: int) -> Tensor:
        """The client's next ``B`` sample ids; its position moves on."""
        b = self.batch_size
        where, pos = self.position.get(client, (0, 0))
        if self.mode == "disjoint" and self._ids is None:  # IID: per-client epoch and offset
            if pos + b > self._iid_per():
                where, pos = where + 1, 0
            n = self.num_clients
            ids = self._iid_order(where)[client + n * pos: client + n * (pos + b): n]
            self._max_epoch = max(self._max_epoch, where)
        else:
            shard = self.shard(client)
            if pos + b > len(shard):
                where, pos = where + 1, 0
            ids = node_pass_order(shard, self.seed, client, where)[pos: pos + b]
        self.position[client] = (where, pos + b)
        return ids

    def take(self, clients: Sequence[int]) -> list[Tensor]:
        """The next ``B`` sample ids of each of ``clients`` (one step): every given client's
        position moves on, and the epoch counts as a run's does."""
        ids = [self.next_ids(c) for c in clients]
        if self._ids is None and self.mode == "disjoint":
            self.epoch = self._max_epoch
        else:
            self.epoch = self._steps // self.steps_per_epoch
        self._steps += 1
        return ids

    def fetch(self, ids: Sequence[Tensor]) -> Any:
        """The samples of ``ids`` (:meth:`take`'s), stacked ``[len(ids), B, ...]``."""
        stacked = torch.stack(list(ids))
        n, b = stacked.shape
        flat = fetch(self.dataset, stacked.reshape(-1))
        return tree_map(lambda t: t.reshape(n, b, *t.shape[1:]) if isinstance(t, Tensor) else t,
                        flat)

    def batch(self, clients: Sequence[int]) -> Any:
        """The next batch of each of ``clients`` (one step), stacked ``[len(clients), B, ...]``."""
        return self.fetch(self.take(clients))

    def peek(self, client: int = 0) -> Any:
        """``B`` samples of ``client``'s shard, collated, nothing moved (pricing a step before
        the run)."""
        return fetch(self.dataset, self.shard(client)[: self.batch_size])

    def forget(self, clients: Sequence[int]) -> None:
        """Drop the cached sampled shards of ``clients`` (redrawn from their seed if needed)."""
        for c in clients:
            self._sampled.pop(c, None)

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The positions of the clients that trained (``[client, pass or epoch, offset]``),
        the epoch and the step count; the shards are rebuilt from the seed."""
        rows = torch.tensor([[c, w, p] for c, (w, p) in sorted(self.position.items())],
                            dtype=torch.int64).reshape(-1, 3)
        return {"positions": rows, "epoch": self.epoch, "steps": self._steps,
                "max_epoch": self._max_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = {int(c): (int(w), int(p)) for c, w, p in state["positions"].tolist()}
        self.epoch, self._steps = int(state["epoch"]), int(state["steps"])
        self._max_epoch = int(state["max_epoch"])
        self._sampled.clear()

    def partition_stats(self) -> dict[str, Any]:
        """How the data is split, for ``config.json`` (no per-client list: ``N`` may be a
        million): the mode, and the shard sizes' range (disjoint) or the per-client size."""
        stats: dict[str, Any] = {"partition": self.partition.spec, "mode": self.mode,
                                 "clients": self.num_clients}
        if self.mode == "sampled":
            stats["samples_per_client"] = self.per_client
        elif self._offsets is not None:
            sizes = np.diff(self._offsets)
            stats["sizes"] = {"min": int(sizes.min()), "median": float(np.median(sizes)),
                              "max": int(sizes.max())}
        else:
            stats["sizes"] = {"min": self._iid_per(), "median": float(self._iid_per()),
                              "max": self._iid_per()}
        return stats

