"""Every node this process computes, in memory as node-stacked tensors: :class:`InMemory`, and
:class:`CommBytes`, what the holders whose bytes are their communicator's share."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from exogym.run.dist.communicator import DistributedCommunicator, gather_global_state, local_batch
from exogym.run.dist.ranks import RankContext
from exogym.run.output.checkpoint import Parts
from exogym.sim.client_data import ClientBatches
from exogym.sim.comm import Communicator
from exogym.sim.engine import NodeStack
from exogym.sim.sharding import NodeBatches
from exogym.strategy.base import StackedStrategy

if TYPE_CHECKING:
    from exogym.run.nodes.holders import StepClock
    from exogym.sim.clock import SimClock

__all__ = ["CommBytes", "InMemory", "load_nodes", "nodes_state"]


class CommBytes:
    """A holder whose nodes are the communicator's rows (not a population's clients): each
    node's bytes are the communicator's counters, a row is its node, nothing to resume or
    close.

    Args:
        nodes: the replicas (a paged run: its first group).
        comm: their communicator (a paged run: the run's, whose counters the groups share).
        strategy: the run's strategy.
        batches: the run's data.
    """

    def __init__(self, nodes: NodeStack, comm: Communicator, strategy: StackedStrategy,
                 batches: NodeBatches | ClientBatches) -> None:
        self.nodes, self.comm, self.strategy, self.batches = nodes, comm, strategy, batches

    @property
    def between_rounds(self) -> bool:
        return True

    def bytes(self) -> tuple[list[float], list[float]]:
        """Every node's bytes sent and received so far."""
        return list(self.comm.bytes_sent), list(self.comm.bytes_received)

    def most_bytes(self) -> dict[str, float]:
        return {"bytes_sent": max(self.comm.bytes_sent),
                "bytes_received": max(self.comm.bytes_received)}

    def node_of(self, row: int, step: int) -> int:
        return row

    def parts(self) -> Parts | None:
        return None

    def result(self) -> dict[str, Any]:
        sent, received = self.bytes()
        return {"bytes_sent": sent, "bytes_received": received}

    def resumed(self, clock: SimClock | None) -> None:
        pass

    def close(self) -> None:
        pass


class InMemory(CommBytes):
    """Every node this process computes, as node-stacked tensors.

    Args:
        nodes: the replicas.
        comm: their communicator.
        strategy: set up here over them.
        batches: the run's data.
        ranks: this process's place in a multi-process run, or None.
        total_steps: the run's length (the strategy's schedule).
    """

    def __init__(self, nodes: NodeStack, comm: Communicator, strategy: StackedStrategy,
                 batches: NodeBatches | ClientBatches, ranks: RankContext | None,
                 total_steps: int, seed: int = 0) -> None:
        super().__init__(nodes, comm, strategy, batches)
        self.ranks = ranks
        strategy.setup(nodes, comm, total_steps, seed=seed)

    @property
    def strategies(self) -> list[StackedStrategy]:
        return [self.strategy]

    def call(self, fn: Callable[[StackedStrategy], None]) -> None:
        fn(self.strategy)

    def step(self, step: int, active: list[bool] | None, clock: StepClock) -> Tensor:
        marks = clock.begin_step()
        local = None if active is None else [active[i] for i in self.comm.node_ids]
        batch = self.nodes.to_batch_device(self.next_batch(active))
        losses = self.nodes.forward_backward(batch, local)
        clock.computed(step, active)
        self.strategy.step(step)
        self.nodes.zero_grad()
        clock.end_step(marks, self.comm.n_local)
        return losses

    def next_batch(self, active: list[bool] | None) -> Any:
        """This process's rows of the next node-stacked batch (only ``active`` nodes consume
        data)."""
        assert isinstance(self.batches, NodeBatches)
        if self.ranks is None:
            return self.batches.batch(active)
        return local_batch(self.batches, self.ranks.node_ids, active)

    def view(self) -> tuple[float, int]:
        return self.strategy.lr, self.batches.epoch

    def global_state(self) -> dict[str, Tensor]:
        if self.ranks is None:
            return self.strategy.global_state()
        assert isinstance(self.comm, DistributedCommunicator)
        return gather_global_state(self.strategy, self.comm)

    def state_dict(self) -> dict[str, Any]:
        return {"nodes": nodes_state(self.nodes), "strategy": self.strategy.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any], folder: Path | None) -> None:
        load_nodes(self.nodes, state["nodes"])
        self.strategy.load_state_dict(state["strategy"])


def nodes_state(nodes: NodeStack) -> dict[str, Any]:
    """The replicas' parameters and buffers (by reference) and the engine they ran on."""
    return {"params": {k: p.detach() for k, p in nodes.params.items()},
            "buffers": dict(nodes.buffers), "engine": nodes.engine}


def load_nodes(nodes: NodeStack, saved: Mapping[str, Any]) -> None:
    """:func:`nodes_state` restored in place (names checked)."""
    with torch.no_grad():
        for kind in ("params", "buffers"):
            own = getattr(nodes, kind)
            if set(saved[kind]) != set(own):
                raise ValueError(f"the checkpoint's model has other {kind} "
                                 f"({sorted(set(saved[kind]) ^ set(own))}) than this model")
            for k, t in own.items():
                t.copy_(saved[kind][k])
    if saved["engine"] != nodes.engine:  # vmap fell back to the loop
        nodes.engine = saved["engine"]
    nodes._vmap_checked = True
