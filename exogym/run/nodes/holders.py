"""Where a run's nodes live: the interface the run asks (:class:`Holder`) and the choice among
the holders (:func:`hold`).

The loop asks a *holder* for the rows to compute and where their state is, and never branches
on which holder it has (docs/design/populations.md, the nodes behind one interface):

- :class:`~exogym.run.nodes.memory.InMemory`: the ``N`` nodes (or a process's share of them)
  as node-stacked tensors;
- :class:`~exogym.run.nodes.paged.PagedNodes`: groups of ``K`` nodes paged in and out
  (:mod:`exogym.run.nodes.paging`), local-SGD rounds computed a group at a time ahead of the
  run, handed out step by step;
- :class:`~exogym.run.nodes.seats.Seats`: a population's ``K`` seats
  (:mod:`exogym.run.nodes.population`), whose clients change every round (or, for an
  asynchronous server, whenever it receives an update).

What a holder does for the run: one training step of the given nodes, a call on every copy of
the strategy (recoveries), the global model, its bytes per node (per client), its part of the
checkpoint and of the result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from exogym.run.dist.communicator import DistributedCommunicator, WallSpans
from exogym.run.dist.ranks import RankContext
from exogym.run.nodes.memory import InMemory
from exogym.run.nodes.paged import PagedNodes
from exogym.run.nodes.paging import Paged
from exogym.run.nodes.seats import Seats
from exogym.run.output.checkpoint import Parts
from exogym.run.settings import RunSettings, world_decides
from exogym.sim.client_data import ClientBatches
from exogym.sim.comm import Communicator, InProcessCommunicator
from exogym.sim.engine import NodeStack, auto_engine
from exogym.sim.sharding import NodeBatches, node_examples
from exogym.strategy.base import StackedStrategy

if TYPE_CHECKING:
    from exogym.sim.clock import SimClock

__all__ = ["Holder", "StepClock", "hold"]


class StepClock(Protocol):
    """What a holder tells the run's clock of a step (the loop's
    :class:`~exogym.run.loop.clocking.ClockFeed`)."""

    def begin_step(self) -> Any:
        """Before a step's compute: the marks its price is read from (None: not measured)."""

    def computed(self, step: int, active: list[bool] | None) -> None:
        """The step's compute (before its collectives ask who arrives)."""

    def end_step(self, marks: Any, nodes: int, *, steps: int = 1,
                 exclude_cpu_s: float = 0.0) -> float | None:
        """After a step (``steps`` computed at once): its measured price per node, or None."""

    def priced(self, price: float | None) -> None:
        """A step computed earlier (with its round) reaches the run: its price."""


class Holder(Protocol):
    """Where a run's nodes live, as the loop asks (module docstring)."""

    nodes: NodeStack
    comm: Communicator

    @property
    def strategies(self) -> list[StackedStrategy]:
        """Every copy of the run's strategy (one; a paged run: one per group)."""

    def call(self, fn: Callable[[StackedStrategy], None]) -> None:
        """``fn`` on every copy of the strategy, each with its nodes in memory."""

    def step(self, step: int, active: list[bool] | None, clock: StepClock) -> Tensor:
        """The ``active`` nodes (None: all) compute ``step``: forward, backward, the
        strategy's update and communication; the clock is told; this process's rows'
        losses."""

    def view(self) -> tuple[float, int]:
        """The learning rate and epoch of the step just taken (a metrics row's)."""

    @property
    def between_rounds(self) -> bool:
        """Whether the held state is that of the run's step (a paged round computed ahead is
        not: no checkpoint or global model there)."""

    def global_state(self) -> dict[str, Tensor]:
        """The model to evaluate; across processes a collective (every rank calls it)."""

    def most_bytes(self) -> dict[str, float]:
        """The busiest node's bytes sent and received so far (a metrics row's)."""

    def node_of(self, row: int, step: int) -> int:
        """The node (client) a global row id stood for at ``step``."""

    def state_dict(self) -> dict[str, Any]:
        """The replicas and the strategy's state (the run's checkpoint holds them)."""

    def load_state_dict(self, state: Mapping[str, Any], folder: Path | None) -> None:
        """Restore :meth:`state_dict` (``folder``: the checkpoint's, for its parts)."""

    def parts(self) -> Parts | None:
        """Files a checkpoint holds besides the run's state (a paged run's groups)."""

    def result(self) -> dict[str, Any]:
        """The holder's fields of the :class:`~exogym.run.output.result.FitResult`."""

    def resumed(self, clock: SimClock | None) -> None:
        """After a checkpoint is loaded and the clock restored."""

    def close(self) -> None: ...


def hold(model: torch.nn.Module, strategy: StackedStrategy, settings: RunSettings,
         batches: NodeBatches | ClientBatches, ranks: RankContext | None, device: torch.device,
         out_dir: Path | None, until_evaluation: Callable[[int], int]) -> Holder:
    """Where a run's nodes live, by its settings: a population's seats (``seats``), paged groups
    (``resident``, one process), or in memory; ``until_evaluation``: :class:`PagedNodes`'
    argument. In a multi-process run asked for its trace (``settings.trace``) the communicator
    records this rank's real collectives (:class:`WallSpans`)."""
    s = settings
    wall = WallSpans() if s.trace and ranks is not None else None
    if s.seats:
        assert isinstance(batches, ClientBatches)
        return Seats.build(model, strategy, s, batches, ranks, device, out_dir, wall)
    assert isinstance(batches, NodeBatches)
    if s.resident is not None and ranks is None:
        hub = InProcessCommunicator(
            s.num_nodes, server=s.network is not None and s.network.topology == "server")
        hub.attendance.examples = node_examples(batches)
        engine = s.engine
        if engine == "auto":  # vmap (auto's choice on CUDA) batches what it holds: loop
            engine = auto_engine(device, s.num_nodes)
            engine = "loop" if engine == "vmap" else engine
        paged = Paged(model, strategy, hub, resident=s.resident, offload=s.offload,
                      device=device, engine=engine, micro_batch_size=s.micro_batch_size,
                      precision=s.precision, total_steps=s.total_steps, seed=s.seed)
        return PagedNodes(paged, hub, batches, worldly=world_decides(s, strategy),
                          until_evaluation=until_evaluation, total_steps=s.total_steps)
    n_here = s.num_nodes if ranks is None else ranks.nodes_per_process
    nodes = NodeStack(model, n_here, device=device, engine=s.engine,
                      micro_batch_size=s.micro_batch_size, precision=s.precision)
    server = s.network is not None and s.network.topology == "server"
    comm = (InProcessCommunicator(s.num_nodes, server=server) if ranks is None
            else DistributedCommunicator(s.num_nodes, ranks.node_ids, wall=wall, server=server))
    comm.attendance.examples = node_examples(batches)
    return InMemory(nodes, comm, strategy, batches, ranks, s.total_steps, s.seed)
