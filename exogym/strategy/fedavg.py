"""FedAvg: local training, then the nodes' parameters are averaged every H steps.

Reference: H. B. McMahan, E. Moore, D. Ramage, S. Hampson, B. Agüera y Arcas, "Communication-
Efficient Learning of Deep Networks from Decentralized Data", AISTATS 2017, arXiv:1602.05629
(Algorithm 1, FederatedAveraging, with every client taking part in each round, C = 1).

Every node runs the inner optimizer on its own data; after each block of ``H`` local steps the
server model becomes the data-weighted mean of the node models, ``w <- sum_k (n_k / n) w_k``;
exogym's shards are equal, so that is the plain mean, and every node restarts from it. The paper's
clients run plain SGD for E local epochs of batch size B; here the local work is ``H`` steps of the
inner optimizer (AdamW by default, ``optim.name=sgd`` for the paper's client), and each node keeps
its optimizer state across rounds. Floating-point buffers (BatchNorm statistics) are averaged with
the parameters.

Absent nodes (a world): the average is over the nodes whose parameters arrived (a ring among those
``M``), and only they adopt it; a node that is down, lost its message or was cut by a
``deadline`` keeps its own parameters, and a node back up receives the server model from a live
peer (:meth:`FedAvg.recover`).

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

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from exogym.strategy.base import StackedStrategy, positive_int, restart_rows

__all__ = ["FedAvg"]


@dataclass(kw_only=True)
class FedAvg(StackedStrategy):
    """Federated averaging of parameters every ``H`` local steps.

    Attributes:
        H: local steps between two averagings (the paper's local work per round).
    """

    id = "fedavg"
    supports_participation: ClassVar[bool] = True
    H: int = 100

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int("H", self.H)
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
        self.inner_step()
        if (step + 1) % self.H == 0:
            self.average()

    @torch.no_grad()
    def average(self) -> None:
        """One round's communication: every node's parameters and float buffers <- their mean
        (with a world: the mean over the nodes whose parameters arrived, which adopt it; the
        others keep their own, as DiLoCo's dropped nodes do)."""
        tensors = list(self.nodes.params.values()) + list(self.nodes.float_buffers.values())
        names = list(self.nodes.params) + list(self.nodes.float_buffers)
        members = self.arrivals()
        if members is None:
            self.comm.all_reduce_(tensors, "mean", tag="params", codec=self.transport_codec)
            means = [t[0] for t in tensors]
        elif any(members):
            means = list(self.comm.all_reduce(tensors, "mean", tag="params",
                                              codec=self.transport_codec, members=members))
            keep = self.comm.local_rows(members, self.nodes.device)
            for t, mean in zip(tensors, means, strict=True):
                restart_rows(t, mean, keep)
        else:
            return  # nothing arrived: no round
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
