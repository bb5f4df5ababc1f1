"""FedAvg: local training, then the nodes' parameters are averaged every H steps.

Reference: H. B. McMahan, E. Moore, D. Ramage, S. Hampson, B. Agüera y Arcas, "Communication-
Efficient Learning of Deep Networks from Decentralized Data", AISTATS 2017, arXiv:1602.05629
(Algorithm 1, FederatedAveraging, with every client taking part in each round, C = 1).

Every node runs the inner optimizer on its own data; after each block of ``H`` local steps the
server model becomes the data-weighted mean of the models that arrived, Algorithm 1's
``w <- sum_{k in S} (n_k / m) w_k`` with ``m = sum_{k in S} n_k`` over the round's clients ``S``
(``weighting="examples"``, the default; ``n_k``: the node's shard size, a population's client's:
:attr:`exogym.sim.comm.Attendance.examples`), and every node restarts from it. IID shards are
equal, and a mean of equal weights is computed as the plain mean, bit for bit; a Dirichlet or
natural split gives unequal shards. ``weighting="uniform"``: the plain mean whatever the shards.
The paper's clients run plain SGD for E local epochs of batch size B, so a client's work grows
with ``n_k``; here the local work is ``H`` steps of the inner optimizer for every node (AdamW by
default, ``optim.name=sgd`` for the paper's client), and ``n_k / m`` still weights each model by
its share of the data in the objective ``f(w) = sum_k (n_k / n) F_k(w)`` that FedAvg minimises
(Flower's FedAvg weights by each client's examples likewise). Each node keeps its optimizer state
across rounds. Floating-point buffers (BatchNorm statistics) are averaged with the parameters.

Absent nodes (a world): the average is over the nodes whose parameters arrived (a ring among those
``M``), and only they adopt it; a node that is down, lost its message or was cut by a
``deadline`` keeps its own parameters, and a node back up receives the server model from a live
peer (:meth:`FedAvg.recover`).

Stragglers (``stragglers``, Li et al. 2020, arXiv 1812.06127, Section 5.2): in each round a
fraction of the nodes, drawn from a generator seeded by the run's seed (or ``straggler_seed``)
and the round, take
``e ~ U{1, ..., H}`` local steps and then stop (their parameters and inner optimizer state stay
as they are until the round ends); their partial work is averaged with the others'
(``drop_stragglers=False``, FedProx's way) or left out, as the paper's FedAvg does
(``drop_stragglers=True``: only the nodes that finished their ``H`` steps send, and every node
adopts their mean; the dropped ones' download of it is not counted).

Sent per round (every ``H`` steps) by each node: ``2 (N-1)/N * (P + B)`` bytes (ring all-reduce of
the parameters, ``P`` bytes, and float buffers, ``B`` bytes); nothing in between.

With a transport codec (``codec="int8"``, ``"fp16"``, ...; see :mod:`exogym.sim.codecs`) each node
sends its parameters and float buffers through it and every node restarts from the mean of the
reconstructions: ``P + B`` becomes the compressed payload (the sum over those tensors of
``codec.payload_bytes(numel)``, e.g. ``numel + 4`` per tensor for int8). Quantizing *parameters*
is lossy: the averaged model carries the quantization error of every round (int8 per tensor:
up to ``absmax / 254`` per entry), unlike quantizing an update that is then added to an exact
model. Sparsifying codecs (top-k, random-k) would set the unselected parameters to zero and are
rejected.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from exogym.strategy.base import StackedStrategy, in_range, positive_int, restart_rows

__all__ = ["WEIGHTINGS", "FedAvg"]

WEIGHTINGS = ("examples", "uniform")


@dataclass(kw_only=True)
class FedAvg(StackedStrategy):
    """Federated averaging of parameters every ``H`` local steps.

    Attributes:
        H: local steps between two averagings (the paper's local work per round).
        stragglers: the fraction of the nodes that straggle in each round (drawn per round,
            seeded by ``straggler_seed``): a straggler takes ``e ~ U{1, ..., H}`` local steps
            and then stops (FedProx's "systems heterogeneity", Li et al. 2020, Section 5.2).
        drop_stragglers: leave out of the average the stragglers that did not finish their
            ``H`` steps (the paper's FedAvg); False (FedProx's way): average their partial work.
        straggler_seed: seeds the draw of each round's stragglers and their steps; None (the
            default): the run's seed, so that the seeds of a study draw other stragglers.
        weighting: ``"examples"`` (the paper's ``n_k / m``) or ``"uniform"`` (the plain mean).
    """

    id = "fedavg"
    supports_participation: ClassVar[bool] = True
    H: int = 100
    stragglers: float = 0.0
    drop_stragglers: bool = False
    straggler_seed: int | None = None
    weighting: str = "examples"

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int("H", self.H)
        in_range("stragglers", self.stragglers, 0.0, 1.0)
        if not isinstance(self.drop_stragglers, bool):
            raise ValueError(f"drop_stragglers must be true or false, got "
                             f"{self.drop_stragglers!r}")
        seed = self.straggler_seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                                 or not 0 <= seed < 2**31):
            raise ValueError(f"straggler_seed must be an integer in [0, 2^31) or None (the "
                             f"run's seed), got {seed!r}")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {list(WEIGHTINGS)}, got "
                             f"{self.weighting!r}")
        codec = self._make_codec()
        if codec is not None and codec.sparsifying:
            raise ValueError(f"FedAvg averages parameters: codec={self.codec!r} would zero every "
                             "parameter it does not select; use fp16, bf16, int8, int4 or fp4")

    def init_state(self) -> None:
        # The server model: what the last round produced (the initial model before any round).
        self.server_state = {k: v.clone() for k, v in self.nodes.node_state(0).items()}

    def communicates(self, step: int) -> bool | None:
        """Only the last step of a round communicates (a subclass with another step: None)."""
        return self._communicates_every_H(step, FedAvg)

    @torch.no_grad()
    def step(self, step: int) -> None:
        self.inner_step(self._working(step))
        if (step + 1) % self.H == 0:
            self.average(step // self.H)

    def budgets(self, round_index: int) -> Tensor | None:
        """Local steps each node takes in round ``round_index`` (``[N]``, global order; None
        without stragglers): ``H``, or ``e ~ U{1, ..., H}`` for the ``round(stragglers * N)``
        stragglers, drawn from a generator seeded by ``straggler_seed`` and the round. A copy:
        the draw itself is cached for the round's steps, and a caller's change must not reach
        them."""
        budget = self._budgets(round_index)
        return None if budget is None else budget.clone()

    def _budgets(self, round_index: int) -> Tensor | None:
        """:meth:`budgets` without the copy: the round's cached draw, read only (every step
        reads it; a copy per step would be ``N`` integers copied for nothing)."""
        if self.stragglers == 0.0:
            return None
        seed = self.run_seed if self.straggler_seed is None else self.straggler_seed
        return _draw_budgets(seed, round_index, self.comm.num_nodes, self.H, self.stragglers)

    def _working(self, step: int) -> Tensor | None:
        """This process's rows that take step ``step`` (None: every active one)."""
        budget = self._budgets(step // self.H)
        if budget is None:
            return None
        rows = self.comm.local_rows((budget > step % self.H).tolist(), self.nodes.device)
        active = self.active
        return rows if active is None else rows & active

    @torch.no_grad()
    def average(self, round_index: int | None = None) -> None:
        """Round ``round_index``'s communication: every node's parameters and float buffers <-
        their mean (with a world: the mean over the nodes whose parameters arrived, which adopt
        it; the others keep their own, as DiLoCo's dropped nodes do). With ``drop_stragglers``
        the stragglers that did not finish send nothing and adopt the mean of the others (their
        download of it is not counted)."""
        tensors = list(self.nodes.params.values()) + list(self.nodes.float_buffers.values())
        names = list(self.nodes.params) + list(self.nodes.float_buffers)
        members = self.arrivals()
        adopt = members
        budget = self._budgets(round_index) if round_index is not None else None
        if self.drop_stragglers and budget is not None:
            # the stragglers that did not finish send nothing; alive, they adopt the mean
            adopt = members or [True] * self.comm.num_nodes
            members = [p and int(b) == self.H for p, b in zip(adopt, budget, strict=True)]
        weights = self.weights(members)
        if weights is not None:  # unequal shards: sum_k (n_k / m) w_k
            scaled = [t * weights.to(t.dtype).view(-1, *[1] * (t.dim() - 1)) for t in tensors]
            means = list(self.comm.all_reduce(scaled, "sum", tag="params",
                                              codec=self.transport_codec, members=members))
            rows = self.comm.local_rows(adopt or [True] * self.comm.num_nodes,
                                        self.nodes.device)
            self._adopt(tensors, names, means, rows)
        elif members is None:
            self.comm.all_reduce_(tensors, "mean", tag="params", codec=self.transport_codec)
            self._adopt(tensors, names, [t[0] for t in tensors], None)
        elif any(members):  # else nothing arrived: no round
            means = list(self.comm.all_reduce(tensors, "mean", tag="params",
                                              codec=self.transport_codec, members=members))
            assert adopt is not None
            self._adopt(tensors, names, means, self.comm.local_rows(adopt, self.nodes.device))

    def weights(self, members: list[bool] | None) -> Tensor | None:
        """Each local row's weight ``n_k / m`` among ``members`` (None: every node), 0 for the
        others; None when the members' ``n_k`` are equal or ``weighting="uniform"``: the plain
        mean, as it always was computed."""
        examples = self.comm.attendance.examples
        if self.weighting == "uniform" or examples is None:
            return None
        taking = [members is None or bool(members[i]) for i in range(self.comm.num_nodes)]
        counts = [examples[i] for i in range(self.comm.num_nodes) if taking[i]]
        if not counts or len(set(counts)) == 1:
            return None
        m = float(sum(counts))
        return torch.tensor([examples[i] / m if taking[i] else 0.0 for i in self.comm.node_ids],
                            dtype=torch.float64, device=self.nodes.device)

    def _adopt(self, tensors: list[Tensor], names: list[str], means: list[Tensor],
               rows: Tensor | None) -> None:
        """The means become the server model and the rows' (None: every row already holds
        them)."""
        if rows is not None:
            for t, mean in zip(tensors, means, strict=True):
                restart_rows(t, mean, rows)
        for name, mean in zip(names, means, strict=True):
            self.server_state[name].copy_(mean)
        self.copy_counters(self.server_state)

    def recover(self, node: int, donor: int) -> None:
        """A node back up gets the server model (and the donor's inner optimizer state with
        ``recovery="copy"``)."""
        params = {k: self.server_state[k] for k in self.nodes.params}
        self.recover_from_global(node, donor, params, self.server_state)

    def global_state(self) -> dict[str, Tensor]:
        return {k: v.clone() for k, v in self.server_state.items()}


@functools.lru_cache(maxsize=4)
def _draw_budgets(seed: int, round_index: int, n: int, H: int, stragglers: float) -> Tensor:
    """:meth:`FedAvg.budgets`' draw, once per round (every step of the round reads it; the
    tensor is shared: read only)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + round_index)
    chosen = torch.randperm(n, generator=g)[:round(stragglers * n)]
    budget = torch.full((n,), H, dtype=torch.long)
    budget[chosen] = torch.randint(1, H + 1, (len(chosen),), generator=g)
    return budget
