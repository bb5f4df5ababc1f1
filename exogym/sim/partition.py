"""How a shared dataset's samples are split among nodes: IID, Dirichlet label skew, contiguous,
natural (the dataset's own clients).

A :class:`Partition` is parsed from a short string (:func:`parse_partition`):

- ``"iid"`` (the default): every epoch the dataset is permuted from the seed and dealt out in
  equal disjoint shards (see :mod:`exogym.sim.sharding`); each node sees the label
  distribution of the whole dataset.
- ``"dirichlet:ALPHA"`` (``ALPHA > 0``): label skew, as in Hsu, Qi & Brown 2019, "Measuring the
  Effects of Non-Identical Data Distribution for Federated Visual Classification"
  (https://arxiv.org/abs/1909.06335), and the ``noniid-labeldir`` setting of NIID-Bench (Li, Diao,
  Chen & He 2021, "Federated Learning on Non-IID Data Silos: An Experimental Study",
  https://arxiv.org/abs/2102.02079). For each class ``c`` the class's samples are shuffled, node
  proportions ``q_c ~ Dir(ALPHA * 1_N)`` are drawn and the ``n_c`` samples are cut into ``N``
  consecutive pieces at the positions ``floor(cumsum(q_c)[:-1] * n_c)`` (node ``i`` gets piece
  ``i``, about ``q_ci * n_c`` samples). Small
  ``ALPHA`` (0.1) gives each node a few dominant classes; ``ALPHA -> inf`` tends to IID. Every
  sample goes to exactly one node, and the shards, fixed for the whole run, have unequal sizes.
  Needs integer class labels: ``dataset.targets``, one per sample.
- ``"contiguous"``: node ``i`` gets the ``i``-th block of ``len(dataset) // N`` consecutive sample
  indices (the last ``len(dataset) % N`` samples are left out). For the text datasets
  (:class:`exogym.tasks.data.shakespeare.ShakespeareChar`) sample ``j`` is the window starting at
  token ``j * stride``, so each node reads its own span of the text (neighbouring spans share at
  most the ``block_size`` tokens of the windows that straddle the border); for a classification set
  it is whatever order the file has.
- ``"natural"``: the dataset's own split into clients, as a federated benchmark defines it (LEAF's
  Shakespeare: one client per speaking role, :mod:`exogym.tasks.data.shakespeare_roles`). The
  dataset says which client each sample belongs to: ``dataset.clients``, one integer in
  ``0..R-1`` per sample, and optionally ``dataset.client_names`` (``R`` names; without them
  ``R = max(clients) + 1``). Node ``i`` gets the samples of client ``i``, fixed for the whole run;
  so the run needs exactly ``N = R`` nodes (a different ``N`` is a ``ValueError`` that names
  ``R``: train a subset of clients per round with partial participation instead), and every
  client must hold at least ``min_size`` samples (the per-node batch size). Nothing is drawn:
  no seed enters the split.

Draws and redraws (Dirichlet): a node's shard must hold at least ``min_size`` samples (the
per-node batch size). A draw that leaves some node short is redrawn from the next derived seed,
up to :data:`MAX_DRAWS` times; NIID-Bench redraws the same way (until every party has 10 samples,
without a bound). This conditions the draw on every node having a batch, which matters only where
short nodes are likely (small ``ALPHA`` with many nodes or large batches); if no draw succeeds, a
``ValueError`` names the node, its size, alpha and the batch size. Unlike NIID-Bench we do not
zero a class's proportion for nodes that already hold more than ``len / N`` samples: the split is
the plain one of Hsu et al., so shard sizes vary.

Randomness: draw ``d`` uses ``numpy.random.default_rng(SeedSequence([seed, KEY, d]))``, so the
same seed gives the same shards (for a given NumPy version: NumPy does not promise identical
streams of ``Generator.dirichlet`` across releases).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "MAX_DRAWS",
    "Partition",
    "PartitionKind",
    "contiguous_shards",
    "dataset_labels",
    "dirichlet_shards",
    "label_histogram",
    "natural_shards",
    "parse_partition",
]

PartitionKind = Literal["iid", "dirichlet", "contiguous", "natural"]
KINDS: tuple[str, ...] = get_args(PartitionKind)

MAX_DRAWS = 100
"""Dirichlet draws tried before giving up on a partition that leaves a node too few samples."""

_DIRICHLET_KEY = 0x6469_7269  # "diri": separates these seeds from the data-order seeds
_ALLOWED = (
    "'iid', 'dirichlet:ALPHA' (ALPHA > 0, e.g. 'dirichlet:0.5'; small ALPHA = strong label "
    "skew), 'contiguous' or 'natural' (the dataset's own clients, one node each)"
)


@dataclass(frozen=True, kw_only=True)
class Partition:
    """How a shared dataset is split among nodes (see the module docstring).

    Attributes:
        kind: ``"iid"``, ``"dirichlet"``, ``"contiguous"`` or ``"natural"``.
        alpha: the Dirichlet concentration ``alpha`` of Hsu et al. 2019 (``kind="dirichlet"``
            only; a finite float > 0): ``q_c ~ Dir(alpha * 1_N)``; None for the other kinds.
    """

    kind: PartitionKind = "iid"
    alpha: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"partition kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind != "dirichlet":
            if self.alpha is not None:
                raise ValueError(
                    f"alpha applies only to kind='dirichlet', got alpha={self.alpha!r} with "
                    f"kind={self.kind!r}"
                )
            return
        alpha = self.alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
            raise ValueError(
                f"dirichlet partition needs alpha, a float > 0, got {alpha!r}"
            )
        if not (math.isfinite(alpha) and alpha > 0):
            raise ValueError(
                f"dirichlet alpha must be a finite float > 0, got {alpha!r} (alpha -> infinity "
                "is the IID limit: use 'iid')"
            )
        object.__setattr__(self, "alpha", float(alpha))

    @property
    def spec(self) -> str:
        """The string form, which :func:`parse_partition` reads back: ``"dirichlet:0.5"``."""
        return self.kind if self.alpha is None else f"{self.kind}:{_number(self.alpha)}"

    def __str__(self) -> str:
        return self.spec


def _number(x: float) -> str:
    """``x`` short (``0.5``, ``10000``) where that is exact, else its full ``repr``."""
    short = f"{x:g}"
    return short if float(short) == x else repr(x)


def parse_partition(text: str | Partition) -> Partition:
    """The :class:`Partition` of ``"iid"``, ``"dirichlet:ALPHA"``, ``"contiguous"`` or
    ``"natural"``.

    Case and surrounding spaces are ignored; a :class:`Partition` is returned unchanged.

    Raises:
        ValueError: the text is none of the allowed forms, or ALPHA is not a finite float > 0.
        TypeError: ``text`` is neither a string nor a :class:`Partition`.
    """
    if isinstance(text, Partition):
        return text
    if not isinstance(text, str):
        raise TypeError(f"partition must be a str or a Partition, got {type(text).__name__}")
    name, sep, arg = (part.strip() for part in text.strip().lower().partition(":"))
    if name in ("iid", "contiguous", "natural") and not sep:
        return Partition(kind=name)  # type: ignore[arg-type]
    if name == "dirichlet" and sep:
        try:
            alpha = float(arg)
        except ValueError:
            raise ValueError(
                f"partition {text!r}: ALPHA {arg!r} is not a number; allowed: {_ALLOWED}"
            ) from None
        return Partition(kind="dirichlet", alpha=alpha)
    raise ValueError(f"partition {text!r} is not valid; allowed: {_ALLOWED}")


def dataset_labels(dataset: object) -> Tensor | None:
    """The class label of every sample, ``dataset.targets`` as int64 ``[len(dataset)]``.

    ``targets`` may be a tensor, a NumPy array or a sequence of ints (torchvision's CIFAR10 keeps
    a list). Returns None when the dataset has no ``targets`` attribute.

    Raises:
        ValueError: ``targets`` exists but is not one integer label per sample.
    """
    targets = getattr(dataset, "targets", None)
    if targets is None:
        return None
    name = type(dataset).__name__
    try:
        labels = torch.as_tensor(targets)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{name}.targets is not a sequence of integer labels: {e}") from None
    if labels.dim() != 1 or labels.dtype.is_floating_point or labels.dtype.is_complex or (
        labels.dtype == torch.bool
    ):
        raise ValueError(
            f"{name}.targets must be 1-D integer class labels, got {labels.dtype} "
            f"{tuple(labels.shape)}"
        )
    length = len(dataset)  # type: ignore[arg-type]
    if labels.numel() != length:
        raise ValueError(
            f"{name}.targets has {labels.numel()} labels for {length} samples; expected one "
            "label per sample"
        )
    return labels.to(torch.int64)


def contiguous_shards(length: int, num_nodes: int) -> list[Tensor]:
    """Node ``i``'s sample ids ``[i * per, (i + 1) * per)`` with ``per = length // num_nodes``."""
    per = length // num_nodes
    return [torch.arange(i * per, (i + 1) * per) for i in range(num_nodes)]


def natural_shards(dataset: object, num_nodes: int, *, min_size: int = 1) -> list[Tensor]:
    """Node ``i``'s sample ids under ``"natural"``: those with ``dataset.clients == i``.

    Args:
        dataset: has ``clients`` (one integer client id per sample: a tensor, NumPy array or
            sequence) and optionally ``client_names`` (one name per client, for messages).
        num_nodes: ``N``; must equal the number of clients ``R``.
        min_size: the fewest samples a client may have (the per-node batch size).

    Returns:
        ``R`` sorted int64 tensors of sample ids: disjoint, together every sample once.

    Raises:
        ValueError: the dataset has no ``clients`` (names its class and the partitions it
            allows); ``clients`` is not one id in ``0..R-1`` per sample; ``num_nodes != R``
            (names both); a client has fewer than ``min_size`` samples (names it).
    """
    name = type(dataset).__name__
    raw = getattr(dataset, "clients", None)
    if raw is None:
        allowed = ("'iid', 'dirichlet:ALPHA' or 'contiguous'"
                   if getattr(dataset, "targets", None) is not None else "'iid' or 'contiguous'")
        raise ValueError(
            f"partition 'natural' gives each node one of the dataset's own clients, but {name} "
            f"has no 'clients' attribute (one integer client id per sample); for {name} use "
            f"{allowed}"
        )
    clients = torch.as_tensor(raw)
    length = len(dataset)  # type: ignore[arg-type]
    if clients.dim() != 1 or clients.numel() != length or clients.dtype.is_floating_point or (
        clients.dtype.is_complex or clients.dtype == torch.bool
    ):
        raise ValueError(
            f"{name}.clients must be one integer client id per sample ({length}), got "
            f"{clients.dtype} {tuple(clients.shape)}"
        )
    clients = clients.to(torch.int64)
    names = getattr(dataset, "client_names", None)
    count = len(names) if names is not None else int(clients.max()) + 1 if length else 0
    if length and (int(clients.min()) < 0 or int(clients.max()) >= count):
        raise ValueError(
            f"{name}.clients must lie in 0..{count - 1} ({count} clients), got ids "
            f"{int(clients.min())}..{int(clients.max())}"
        )
    if num_nodes != count:
        raise ValueError(
            f"partition 'natural' gives each of the {count} clients of {name} its own node, but "
            f"the run has {num_nodes} nodes: run with {count} nodes (--nodes {count}; to train "
            "a few clients per round, add partial participation)"
        )
    sizes = torch.bincount(clients, minlength=count)
    small = int(torch.argmin(sizes)) if count else 0
    if count and int(sizes[small]) < min_size:
        who = f"client {small}" + (f" ({names[small]!r})" if names is not None else "")
        raise ValueError(
            f"partition 'natural': {who} of {name} has {int(sizes[small])} samples, fewer than "
            f"batch_size {min_size}; use a batch_size <= {int(sizes[small])} or build the "
            "dataset without its smallest clients"
        )
    order = torch.argsort(clients, stable=True)  # ascending ids within each client
    return list(torch.split(order, sizes.tolist()))


def dirichlet_shards(
    labels: Tensor,
    num_nodes: int,
    alpha: float,
    *,
    seed: int,
    min_size: int = 1,
    max_draws: int = MAX_DRAWS,
) -> list[Tensor]:
    """Split sample ids ``0..len(labels)-1`` among nodes with Dirichlet(alpha) label skew.

    Args:
        labels: int ``[L]``, the class of each sample.
        num_nodes: ``N``.
        alpha: concentration, > 0 (``Partition.alpha``).
        seed: the run's seed; draw ``d`` is seeded by ``(seed, d)`` (hashed).
        min_size: the fewest samples a node may get (the per-node batch size).
        max_draws: draws tried before giving up.

    Returns:
        ``N`` sorted int64 tensors of sample ids: disjoint, together every sample once.

    Raises:
        ValueError: every draw left some node with fewer than ``min_size`` samples (names the
            node and its size in the draw that came closest).
    """
    values = labels.cpu().numpy()
    by_class = [np.flatnonzero(values == c) for c in np.unique(values)]  # ascending ids
    concentration = np.full(num_nodes, float(alpha))
    best: tuple[int, int, int] = (-1, 0, 0)  # (smallest size, its node, draw) of the best draw
    for draw in range(max_draws):
        rng = np.random.default_rng(np.random.SeedSequence([seed, _DIRICHLET_KEY, draw]))
        pieces: list[list[np.ndarray]] = [[] for _ in range(num_nodes)]
        for ids in by_class:
            ids = rng.permutation(ids)
            q = rng.dirichlet(concentration)
            if not np.all(np.isfinite(q)):  # older NumPy can underflow for tiny alpha: the limit
                q = np.eye(num_nodes)[rng.integers(num_nodes)]  # alpha -> 0 is one node
            cuts = np.minimum((np.cumsum(q)[:-1] * len(ids)).astype(np.int64), len(ids))
            for node, piece in enumerate(np.split(ids, cuts)):
                pieces[node].append(piece)
        sizes = [sum(len(p) for p in node_pieces) for node_pieces in pieces]
        smallest = int(np.argmin(sizes))
        if sizes[smallest] >= min_size:
            return [torch.from_numpy(np.sort(np.concatenate(p))).to(torch.int64) for p in pieces]
        if sizes[smallest] > best[0]:
            best = (sizes[smallest], smallest, draw)
    size, node, draw = best
    raise ValueError(
        f"dirichlet:{_number(alpha)} over {num_nodes} nodes left some node with fewer samples than "
        f"batch_size {min_size} in all {max_draws} draws from seed {seed}; the closest (draw "
        f"{draw}) gave node {node} only {size} samples. Use a larger alpha, a smaller "
        "batch_size or fewer nodes"
    )


def label_histogram(node_labels: Sequence[Tensor]) -> tuple[list[int], list[list[int]]]:
    """``(classes, counts)``: the sorted classes present anywhere and, per node, its count of
    each class (``counts[i][k]`` samples of ``classes[k]`` in node ``i``'s labels)."""
    classes = torch.unique(torch.cat([t.reshape(-1) for t in node_labels]))
    counts = [
        torch.bincount(torch.searchsorted(classes, t.reshape(-1)), minlength=len(classes)).tolist()
        for t in node_labels
    ]
    return classes.tolist(), counts
