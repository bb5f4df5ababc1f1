"""Where a run's nodes live: one interface for every node in memory, paged groups, and a
population's seats.

:class:`~exogym.run.loop.run.Run` asks a *holder* for the rows to compute and where their state is,
and never branches on which holder it has (docs/design/populations.md: the
nodes behind one interface):

- :class:`InMemory`: the ``N`` nodes (or a process's share of them) as node-stacked tensors;
- :class:`PagedNodes`: groups of ``K`` nodes paged in and out (:mod:`exogym.run.nodes.paging`),
  local-SGD rounds computed a group at a time ahead of the run, handed out step by step;
- :class:`Seats`: a population's ``K`` seats (:mod:`exogym.run.nodes.population`), whose clients
  change every round (or, for an asynchronous server, whenever it receives an update).

What a holder does for the run: one training step of the given nodes (:meth:`InMemory.step`),
a call on every copy of the strategy (recoveries), the global model, its bytes per node (per
client), its part of the checkpoint and of the result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from exogym.run.dist.communicator import DistributedCommunicator, gather_global_state, local_batch
from exogym.run.dist.ranks import RankContext
from exogym.run.nodes.client_store import ClientStore, parse_client_store
from exogym.run.nodes.paging import Paged
from exogym.run.nodes.population import Population
from exogym.run.output.checkpoint import Parts
from exogym.sim.client_data import ClientBatches
from exogym.sim.comm import Communicator, InProcessCommunicator
from exogym.sim.engine import NodeStack, auto_engine
from exogym.sim.sharding import NodeBatches
from exogym.strategy.base import StackedStrategy

if TYPE_CHECKING:
    from exogym.run.loop.clocking import ClockFeed
    from exogym.sim.clock import SimClock

__all__ = ["Holder", "InMemory", "PagedNodes", "Seats", "hold", "load_nodes", "nodes_state"]



class InMemory:
    """Every node this process computes, as node-stacked tensors (the module docstring).

    Args:
        nodes, comm: the replicas and their communicator.
        strategy: set up here over them.
        batches: the run's data.
        ranks: this process's place in a multi-process run, or None.
        total_steps: the run's length (the strategy's schedule).
    """

    def __init__(self, nodes: NodeStack, comm: Communicator, strategy: StackedStrategy,
                 batches: NodeBatches | ClientBatches, ranks: RankContext | None,
                 total_steps: int) -> None:
        self.nodes, self.comm, self.strategy, self.batches = nodes, comm, strategy, batches
        self.ranks = ranks
        strategy.setup(nodes, comm, total_steps)

    @property
    def strategies(self) -> list[StackedStrategy]:
        """Every copy of the run's strategy (one; a paged run: one per group)."""
        return [self.strategy]

    def call(self, fn: Callable[[StackedStrategy], None]) -> None:
        """``fn`` on every copy of the strategy, each with its nodes in memory."""
        fn(self.strategy)

    def step(self, step: int, active: list[bool] | None, feed: ClockFeed) -> Tensor:
        """The ``active`` nodes (None: all) compute ``step``: forward, backward, the strategy's
        update and communication; the clock is told; this process's rows' losses."""
        marks = feed.begin_step()
        self.comm.active = active
        local = None if active is None else [active[i] for i in self.comm.node_ids]
        batch = self.nodes.to_batch_device(self.next_batch(active))
        losses = self.nodes.forward_backward(batch, local)
        feed.computed(step, active)
        self.strategy.step(step)
        self.nodes.zero_grad()
        feed.end_step(marks, self.comm.n_local)
        return losses

    def next_batch(self, active: list[bool] | None) -> Any:
        """This process's rows of the next node-stacked batch (only ``active`` nodes consume
        data)."""
        assert isinstance(self.batches, NodeBatches)
        if self.ranks is None:
            return self.batches.batch(active)
        return local_batch(self.batches, self.ranks.node_ids, active)

    def view(self) -> tuple[float, int]:
        """The learning rate and epoch of the step just taken (a metrics row's)."""
        return self.strategy.lr, self.batches.epoch

    @property
    def between_rounds(self) -> bool:
        """Whether the held state is that of the run's step (a paged round computed ahead is
        not: no checkpoint or global model there)."""
        return True

    def global_state(self) -> dict[str, Tensor]:
        """The model to evaluate; across processes a collective (every rank calls it)."""
        if self.ranks is None:
            return self.strategy.global_state()
        assert isinstance(self.comm, DistributedCommunicator)
        return gather_global_state(self.strategy, self.comm)

    def bytes(self) -> tuple[list[float], list[float]]:
        """Every node's bytes sent and received so far."""
        return list(self.comm.bytes_sent), list(self.comm.bytes_received)

    def most_bytes(self) -> dict[str, float]:
        """The busiest node's bytes sent and received so far (a metrics row's)."""
        return {"bytes_sent": max(self.comm.bytes_sent),
                "bytes_received": max(self.comm.bytes_received)}

    def node_of(self, row: int, step: int) -> int:
        """The node (client) a global row id stood for at ``step``."""
        return row

    def state_dict(self) -> dict[str, Any]:
        """The replicas and the strategy's state (the run's checkpoint holds them)."""
        return {"nodes": nodes_state(self.nodes), "strategy": self.strategy.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any], folder: Path | None) -> None:
        load_nodes(self.nodes, state["nodes"])
        self.strategy.load_state_dict(state["strategy"])

    def parts(self) -> Parts | None:
        """Files a checkpoint holds besides the run's state (a paged run's groups)."""
        return None

    def result(self) -> dict[str, Any]:
        """The holder's fields of the :class:`~exogym.run.output.result.FitResult`."""
        sent, received = self.bytes()
        return {"bytes_sent": sent, "bytes_received": received}

    def resumed(self, clock: SimClock | None) -> None:
        """After a checkpoint is loaded and the clock restored (a population's seats take
        their clients' speeds again)."""

    def fill(self, clock: SimClock | None) -> None:
        """Before an asynchronous server's first step: its first clients in flight (a
        population's seats; nodes that are always there need none)."""

    def next_client(self, seat: int, clock: SimClock | None, step: int, at: float) -> None:
        """An asynchronous server received ``seat``'s update at ``at`` (a population's seat
        takes its next client; a node that is always there goes on)."""

    def close(self) -> None:
        pass


class Seats(InMemory):
    """A population's ``K`` seats (:mod:`exogym.run.nodes.population`): ``K`` rows (a process's
    share in a multi-process run) whose clients change every round; bytes per client.

    Args:
        population: the clients, their data, draws, store and accounting.
        others: as :class:`InMemory`.
    """

    def __init__(self, population: Population, nodes: NodeStack, comm: Communicator,
                 strategy: StackedStrategy, batches: ClientBatches, ranks: RankContext | None,
                 total_steps: int) -> None:
        super().__init__(nodes, comm, strategy, batches, ranks, total_steps)
        self.population = population
        comm.seats = True
        comm.on_record = population.on_record

    @classmethod
    def build(cls, model: torch.nn.Module, strategy: StackedStrategy, settings: Any,
              batches: ClientBatches, ranks: RankContext | None, device: torch.device,
              out_dir: Path | None) -> Seats:
        """The seats of a run's settings: ``K`` (a process's share), their communicator, the
        client store of clients that keep state (each process its own folder)."""
        s = settings
        assert s.participation is not None
        k = s.participation.per_round(s.num_nodes)
        nodes = NodeStack(model, k if ranks is None else ranks.nodes_per_process,
                          device=device, engine=s.engine, micro_batch_size=s.micro_batch_size,
                          precision=s.precision)
        comm = (InProcessCommunicator(k) if ranks is None
                else DistributedCommunicator(k, ranks.node_ids))
        store = None
        if s.participation.client_state == "keep":
            memory, folder = parse_client_store(s.client_store)
            if folder is None and out_dir is not None:
                folder = out_dir / "client-store"
            if folder is not None and ranks is not None and ranks.world_size > 1:
                folder = folder / f"rank-{ranks.rank}"  # each process stores its seats'
            store = ClientStore(memory, folder)
        population = Population(
            s.num_nodes, s.participation, strategy.sync_period or 1, batches, store=store,
            availability=s.world.availability, speeds=s.world.client_speeds(s.num_nodes),
            asynchronous=getattr(strategy, "asynchronous", False),
            next_change=s.world.next_availability_change)
        return cls(population, nodes, comm, strategy, batches, ranks, s.total_steps)

    # -- rounds (exogym.run.loop.schedule.Rounds) and an asynchronous server's clients -------------
    @property
    def active(self) -> list[bool] | None:
        """The seats that compute in this round (None: all)."""
        return self.population.active

    @property
    def seated(self) -> bool:
        return bool(self.population.seated)

    def start_round(self, step: int, clock: SimClock | None, feed: Callable[[], None],
                    event: Callable[[dict[str, Any]], None], counts: dict[str, Any]) -> None:
        """The round starting at ``step``: its clients drawn and seated; each join (the global
        model received) is an ``event`` and is counted in ``counts``, as a run with a row per
        client writes them (client ids, not seats)."""
        def joined(seat: int, client: int, donor: int, received: float, seconds: float) -> None:
            counts["recoveries"] += 1
            counts["recovery_bytes"] += received
            counts["recovery_time_s"] += seconds
            event({"step": step, "time_s": clock.t[seat] if clock is not None else 0.0,
                   "node": client, "event": "recovery", "donor": donor, "bytes": received,
                   "duration_s": seconds})

        self.population.start_round(step, self.strategy, self.nodes, self.comm, clock, joined,
                                    feed)

    def end_round(self) -> None:
        self.population.end_round(self.strategy, self.comm.node_ids)

    def fill(self, clock: SimClock | None) -> None:
        if not self.population.seated:
            self.population.fill(self.strategy, self.nodes, clock, self.comm.node_ids)
            self._speeds()

    def next_client(self, seat: int, clock: SimClock | None, step: int, at: float) -> None:
        self.population.replace(seat, self.strategy, self.nodes, clock, self.comm.node_ids,
                                step, at)
        self._speeds()

    def _speeds(self) -> None:
        """An asynchronous strategy's view of its seats' speeds (DyLU sizes rounds by them)."""
        pop = self.population
        if pop.speeds is not None:
            self.strategy.set_speeds(  # type: ignore[attr-defined]
                [float(pop.speeds[c]) for c in pop.seated_rows()])

    # -- the holder ----------------------------------------------------------------------------
    def next_batch(self, active: list[bool] | None) -> Any:
        return self.population.batch(active, self.comm.node_ids)

    def bytes(self) -> tuple[list[float], list[float]]:
        return self.population.sent.tolist(), self.population.received.tolist()

    def most_bytes(self) -> dict[str, float]:
        return {"bytes_sent": float(self.population.sent.max()),
                "bytes_received": float(self.population.received.max())}

    def node_of(self, row: int, step: int) -> int:
        return self.population.client_of(row, step)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "population": self.population.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any], folder: Path | None) -> None:
        super().load_state_dict(state, folder)
        self.population.load_state_dict(state["population"])
        self.nodes.row_ids = self.population.seated_rows(self.comm.node_ids)

    def resumed(self, clock: SimClock | None) -> None:
        self.population.apply_speeds(clock)

    def result(self) -> dict[str, Any]:
        pop = self.population
        return {**super().result(), "population": pop.report(), "rounds": pop.rounds,
                "draw_seats": pop.draw_seats}

    def close(self) -> None:
        if self.population.store is not None:
            self.population.store.close()


class PagedNodes(InMemory):
    """Groups of ``K`` nodes, one in memory at a time (:mod:`exogym.run.nodes.paging`). A step is
    computed now, with the steps up to the next synchronisation when the strategy says none of
    them communicates and no world can change who computes (each group then computes the round
    while it is in memory), or was computed earlier with its round: its losses, learning rate,
    epoch and price are kept until the run reaches it, and the round's collectives are counted
    at its last step.

    Args:
        paged: the groups (:class:`~exogym.run.nodes.paging.Paged`).
        hub: the run's communicator (the groups' counters and log).
        batches: the run's data.
        worldly: whether a world (or a deadline) may change who computes at any step (then
            step by step).
        until_evaluation: steps from a step to the next evaluation, that step included (a
            round ends there: an evaluation reads the groups' state of its step).
    """

    def __init__(self, paged: Paged, hub: Communicator, batches: NodeBatches, *,
                 worldly: bool, until_evaluation: Callable[[int], int],
                 total_steps: int) -> None:
        self.paged, self.nodes, self.comm, self.batches = paged, paged.groups[0].nodes, hub, \
            batches
        self.strategy, self.ranks = paged.groups[0].strategy, None
        self.worldly, self.until_evaluation, self.total_steps = (
            worldly, until_evaluation, total_steps)
        # A round computed ahead: per step (losses, (lr, epoch), price); the step's (lr, epoch)
        self._ahead: dict[int, tuple[Tensor, tuple[float, int], float | None]] = {}
        self._view: tuple[float, int] = (0.0, 0)

    @property
    def strategies(self) -> list[StackedStrategy]:
        return self.paged.strategies

    def call(self, fn: Callable[[StackedStrategy], None]) -> None:
        self.paged.call(lambda g: fn(g.strategy))

    def step(self, step: int, active: list[bool] | None, feed: ClockFeed) -> Tensor:
        self.comm.active = active
        paged = self.paged
        if step in self._ahead:
            losses, self._view, price = self._ahead.pop(step)
            feed.computed(step, active)
            feed.priced(price)
            if not self._ahead:
                paged.flush()
            return losses
        # partial participation changes who computes only at a round's first step, where a
        # round computed ahead starts anyway
        n = 1 if self.worldly else min(paged.round_length(step, self.total_steps),
                                       self.until_evaluation(step))
        marks, cpu = feed.begin_step(), paged.store.cpu_seconds
        assert isinstance(self.batches, NodeBatches)
        batches = self.batches
        ids, epochs = [], []
        for _ in range(n):
            ids.append(batches.next_indices(active))
            epochs.append(batches.epoch)
        # the clock learns of the step's compute before its collectives ask who arrives (a
        # deadline reads the clock), as in memory
        feed.computed(step, active)
        out = paged.compute(list(range(step, step + n)),
                            lambda k, lo, hi: batches.rows(ids[k], lo, hi), active)
        price = feed.end_step(marks, self.comm.n_local, steps=n,
                              exclude_cpu_s=paged.store.cpu_seconds - cpu)
        for k in range(1, n):
            self._ahead[step + k] = (out[k][0], (out[k][1], epochs[k]), price)
        self._view = (out[0][1], epochs[0])
        return out[0][0]

    def view(self) -> tuple[float, int]:
        return self._view

    @property
    def between_rounds(self) -> bool:
        return not self._ahead

    def global_state(self) -> dict[str, Tensor]:
        # evaluations end a round (until_evaluation), the run ends between rounds
        assert not self._ahead, "a paged run's global model read inside a round"
        return self.paged.global_state()

    def state_dict(self) -> dict[str, Any]:
        return {"groups": {"files": self.paged.group_files()}}  # the groups: the parts

    def load_state_dict(self, state: Mapping[str, Any], folder: Path | None) -> None:
        from exogym.run.output.checkpoint import read_part

        if folder is None or "groups" not in state:
            raise ValueError("a paged run resumes from a checkpoint folder of a paged run "
                             "(its groups are files beside the state)")
        device = self.nodes.device
        self.paged.load_groups(lambda name: read_part(folder, name, device), load_nodes)

    def parts(self) -> Parts | None:
        paged = self.paged
        return lambda folder, write: paged.write_groups(folder, write, nodes_state)

    def result(self) -> dict[str, Any]:
        return {**super().result(), "paging": self.paged.report()}

    def close(self) -> None:
        self.paged.close()


Holder = InMemory  # the interface: InMemory's methods, overridden by Seats and PagedNodes


def hold(model: torch.nn.Module, strategy: StackedStrategy, settings: Any,
         batches: NodeBatches | ClientBatches, ranks: RankContext | None, device: torch.device,
         out_dir: Path | None, until_evaluation: Callable[[int], int]) -> Holder:
    """Where a run's nodes live, by its settings (:class:`~exogym.run.loop.run.RunSettings`): a
    population's seats (``seats``), paged groups (``resident``, one process), or in memory;
    ``until_evaluation``: :class:`PagedNodes`' argument."""
    s = settings
    if s.seats:
        assert isinstance(batches, ClientBatches)
        return Seats.build(model, strategy, s, batches, ranks, device, out_dir)
    assert isinstance(batches, NodeBatches)
    if s.resident is not None and ranks is None:
        hub = InProcessCommunicator(s.num_nodes)
        engine = s.engine
        if engine == "auto":  # vmap (auto's choice on CUDA) batches what it holds: loop
            engine = auto_engine(device, s.num_nodes)
            engine = "loop" if engine == "vmap" else engine
        paged = Paged(model, strategy, hub, resident=s.resident, offload=s.offload,
                      device=device, engine=engine, micro_batch_size=s.micro_batch_size,
                      precision=s.precision, total_steps=s.total_steps)
        worldly = not s.world.perfect or getattr(strategy, "deadline", None) is not None
        return PagedNodes(paged, hub, batches, worldly=worldly,
                          until_evaluation=until_evaluation, total_steps=s.total_steps)
    n_here = s.num_nodes if ranks is None else ranks.nodes_per_process
    nodes = NodeStack(model, n_here, device=device, engine=s.engine,
                      micro_batch_size=s.micro_batch_size, precision=s.precision)
    comm = (InProcessCommunicator(s.num_nodes) if ranks is None
            else DistributedCommunicator(s.num_nodes, ranks.node_ids))
    return InMemory(nodes, comm, strategy, batches, ranks, s.total_steps)


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
