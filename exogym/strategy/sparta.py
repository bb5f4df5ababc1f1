"""SPARTA: after every local step, average a small random fraction ``p`` of the parameters.

Reference: M. Beton, M. Baioumy, T. van der Ouderaa, M. Reed, S. Howes, A. Cheema, G. Vrabie,
"Improving the Efficiency of Distributed Training using Sparse Parameter Averaging" (SPARTA,
Sparse Parameter Averaging), EXO Labs, ICLR 2025 workshop, OpenReview stFPf3gzq1 (no arXiv id).

Every node trains its own replica with the inner optimizer (AdamW). After each inner step the
nodes agree on a set ``S_t`` of ``k`` parameter entries and replace them, on every node, by their
mean over the nodes: ``theta_i[j] <- (1/N) sum_m theta_m[j]`` for ``j in S_t``; every other entry
stays local. The nodes never exchange ``S_t``: it is a function of the shared ``seed`` and the step
number, so every node computes the same set.

Index space: all parameters form ONE flat index space of ``M`` entries (parameters in registration
order, each flattened row-major), so ``k`` is exact and does not round to zero on small tensors.

- ``policy="random"`` (the paper's choice): ``S_t`` is a uniformly random ``k``-subset with
  ``k = max(1, round(p M))``, drawn from a ``torch.Generator`` seeded from ``(seed, t)``. Every
  entry is averaged with probability ``k/M ~ p`` per step, as with the reference implementation's
  per-entry Bernoulli(``p``) mask, but the payload has a fixed size.
- ``policy="partition"``: one random permutation of ``[0, M)`` drawn from ``seed`` is cut into
  ``P = min(M, ceil(1/p))`` contiguous parts of ``floor(M/P)`` or ``ceil(M/P)`` entries (the larger
  parts first); step ``t`` averages part ``t mod P``, so every entry is averaged exactly once every
  ``P`` steps.

Buffers (BatchNorm statistics) are not part of the sparse average (the paper trains transformers);
each node keeps its own.

The global model (what is deployed and evaluated) is the mean of the node replicas, parameters and
float buffers (the paper's suggestion: a full average at the end of training), with node 0's integer
buffers (``num_batches_tracked``). Computing it is an evaluation-side view and is not counted as
traffic; deploying it once costs one all-reduce of the model, ``2 (N-1)/N * P`` bytes per node.

Absent nodes (a world): the selected entries are averaged over the nodes whose values arrived (a
ring among those ``M``) and written into their rows only; a node that lost its message or was
cut by a ``deadline`` keeps its own values (SPARTA's replicas are never identical anyway, and the
next steps pull them together). A node back up copies a live peer's parameters and optimizer
state (:meth:`StackedStrategy.recover`).

Sent per step by each node: the ``k`` selected values, ``S = k * s`` bytes (``s`` = bytes per
element, 4 in fp32; indices are not sent), in a ring all-reduce: ``2 (N-1)/N * k * s`` bytes. MNIST
CNN (``M`` = 215,370, ``p`` = 0.005, ``N`` = 4): ``k`` = 1,077, ``S`` = 4,308 bytes, 6,462 bytes per
step (vs 1,292,220 for DDP), 3.23 MB over 500 steps.

No codec: SPARTA exchanges parameter values, not updates, so a lossy codec would write its
reconstruction error straight into the weights (a sparsifying one would zero them), and error
feedback cannot follow a payload whose entries change every step. The values travel in the
parameters' dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

import torch
from torch import Tensor

from exogym.sim.comm import Communicator
from exogym.strategy._exo_gym import exo_gym_name
from exogym.strategy.base import StackedStrategy, in_range

__all__ = ["POLICIES", "SPARTA", "SparseAverager", "check_sparta_config",
           "step_seed"]

Policy = Literal["random", "partition"]
POLICIES = ("random", "partition")

_MASK64 = (1 << 64) - 1
# The partition policy's permutation gets its own generator stream, apart from every step's.
_PERMUTATION_STREAM = 1 << 63


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def step_seed(seed: int, step: int) -> int:
    """A 32-bit generator seed derived from ``(seed, step)`` (splitmix64, folded to 32 bits).

    ``torch.Generator.manual_seed`` on a CPU generator keeps only the low 32 bits of its seed, so
    packing ``seed`` and ``step`` side by side would make every ``seed`` draw the same indices.
    """
    h = _splitmix64(_splitmix64(seed & _MASK64) ^ (step & _MASK64))
    return (h ^ (h >> 32)) & 0xFFFFFFFF


def sample_distinct(m: int, k: int, generator: torch.Generator) -> Tensor:
    """A uniformly random ``k``-subset of ``[0, m)``, sorted (int64, on the CPU).

    Cost ``O(k log k)`` when ``k << m``: the first ``k`` distinct values of a sequence of uniform
    draws are a uniform ``k``-subset (sequential sampling without replacement by rejection). If a
    batch of draws holds fewer than ``k`` distinct values, a fresh, longer batch is drawn; that
    event does not depend on the values' labels, so the subset stays uniform. Dense selections
    (``4k >= m``) take the first ``k`` entries of a random permutation.
    """
    if not 0 < k <= m:
        raise ValueError(f"k must be in [1, m={m}], got {k}")
    if 4 * k >= m:
        return torch.randperm(m, generator=generator)[:k].sort().values
    n = k + 2 * (k * k // m) + 16
    while True:
        draws = torch.randint(m, (n,), generator=generator)
        values, order = torch.sort(draws, stable=True)
        first = torch.ones(n, dtype=torch.bool)
        first[1:] = values[1:] != values[:-1]
        positions = order[first].sort().values  # where each value first occurs, in draw order
        if positions.numel() >= k:
            return draws[positions[:k]].sort().values
        n *= 2


def check_sparta_config(p: Any, policy: Any, seed: Any) -> None:
    """Validate SPARTA's hyperparameters (shared by :class:`SPARTA` and SPARTA + DiLoCo)."""
    in_range("p", p, 0.0, 1.0, lo_open=True)
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {list(POLICIES)}, got {policy!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise ValueError(f"seed must be an integer in [0, 2^31), got {seed!r}")


class SparseAverager:
    """SPARTA's index selection and sparse average over node-stacked parameters.

    Args:
        params: name -> node-stacked ``[N, *shape]`` parameter (``NodeStack.params``); changed in
            place by :meth:`average`.
        p: fraction of the ``M`` entries averaged per step.
        policy: ``"random"`` or ``"partition"`` (see the module docstring).
        seed: the shared seed every node derives the indices from.

    Attributes:
        num_elements: ``M``, entries of one replica over all parameters.
        k: entries averaged per step (``"partition"``: the size of the largest part).
        num_parts: ``P`` for ``"partition"``, None for ``"random"``.
    """

    def __init__(self, params: dict[str, Tensor], p: float, policy: str, seed: int) -> None:
        check_sparta_config(p, policy, seed)
        self.tensors = list(params.values())
        if not self.tensors:
            raise ValueError("SPARTA needs a model with at least one parameter")
        numels = [t[0].numel() for t in self.tensors]
        self.num_elements = m = sum(numels)
        if m == 0:
            raise ValueError("SPARTA needs a model with at least one parameter entry")
        # offsets[j] = first flat index of tensor j; offsets[-1] = M.
        self.offsets = torch.tensor([0, *numels]).cumsum(0)
        self._offsets = self.offsets.tolist()
        self.policy = policy
        self.seed = seed
        self.num_parts: int | None = None
        if policy == "random":
            self.k = min(m, max(1, math.floor(p * m + 0.5)))
        else:
            # 1/p rounded to 9 digits first, so that p = 0.1 gives 10 parts, not 11.
            num_parts = min(m, math.ceil(round(1.0 / p, 9)))
            gen = torch.Generator().manual_seed(step_seed(seed, _PERMUTATION_STREAM))
            self.permutation = torch.randperm(m, generator=gen)
            base, extra = divmod(m, num_parts)
            sizes = [base + 1] * extra + [base] * (num_parts - extra)
            self.part_bounds = [0, *torch.tensor(sizes).cumsum(0).tolist()]
            self.num_parts = num_parts
            self.k = sizes[0]

    def indices(self, step: int) -> Tensor:
        """The sorted flat indices averaged after ``step`` (int64, CPU); the same on every node."""
        if self.num_parts is None:
            gen = torch.Generator().manual_seed(step_seed(self.seed, step))
            return sample_distinct(self.num_elements, self.k, gen)
        part = step % self.num_parts
        lo, hi = self.part_bounds[part], self.part_bounds[part + 1]
        return self.permutation[lo:hi].sort().values

    @torch.no_grad()
    def average(self, flat_indices: Tensor, comm: Communicator, *, tag: str = "sparta",
                members: list[bool] | None = None) -> None:
        """Replace the entries ``flat_indices`` (sorted, CPU) of every node by their node mean.

        One all-reduce of the selected values (one ``[N, k_j]`` piece per tensor that has
        selected entries, ``k = sum_j k_j`` values per node); the indices are not sent. With
        ``members`` (``N`` booleans): the mean over them, written into their rows only.
        """
        if members is not None and not any(members):
            return
        # Index bookkeeping stays on the host (no device sync); only the k indices go to the device.
        cuts = torch.searchsorted(flat_indices, self.offsets).tolist()
        flats: list[Tensor] = []
        local: list[Tensor] = []
        for j, t in enumerate(self.tensors):
            lo, hi = cuts[j], cuts[j + 1]
            if lo == hi:
                continue
            flats.append(t.view(t.shape[0], -1))
            idx = flat_indices[lo:hi] - self._offsets[j]
            local.append(idx.to(t.device, non_blocking=True))
        values = [f.index_select(1, idx) for f, idx in zip(flats, local, strict=True)]
        means = cast(list[Tensor], comm.all_reduce(values, "mean", tag=tag, members=members))
        keep = None if members is None else comm.local_rows(members, flats[0].device
                                                            if flats else "cpu").view(-1, 1)
        for f, idx, mean, old in zip(flats, local, means, values, strict=True):
            new = mean.unsqueeze(0).expand(f.shape[0], -1)
            f.index_copy_(1, idx, new if keep is None else torch.where(keep, new, old))


@dataclass(kw_only=True)
class SPARTA(StackedStrategy):
    """Sparse parameter averaging: the inner step, then the node mean of a fraction p of entries.

    Attributes:
        p: fraction of all parameter entries averaged across the nodes after every step
            (0 < p <= 1; the paper's default 0.005).
        policy: which entries: "random" (a fresh uniform random subset each step, the paper's) or
            "partition" (a fixed random partition into ceil(1/p) parts, cycled in order).
        seed: shared seed the indices are derived from (with the step number); never sent.
    """

    id = "sparta"
    supports_codec: ClassVar[bool] = False
    p: float = 0.005
    policy: Policy = "random"
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_sparta_config(self.p, self.policy, self.seed)

    derived_state = ("averager",)  # its indices come from (seed, step) alone

    def init_state(self) -> None:
        self.averager = SparseAverager(self.nodes.params, self.p, self.policy, self.seed)

    @torch.no_grad()
    def step(self, step: int) -> None:
        self.inner_step()
        self.averager.average(self.averager.indices(step), self.comm, members=self.arrivals())

    @torch.no_grad()
    def global_state(self) -> dict[str, Tensor]:
        """The node mean of the parameters and float buffers; node 0's integer buffers."""
        return self.node_mean_state()


def __getattr__(name: str) -> Any:
    """EXO Gym's ``SPARTAStrategy`` under its path, this module, imported on first use
    (:mod:`exogym.strategy._exo_gym`)."""
    return exo_gym_name(__name__, name, ("SPARTAStrategy",))
