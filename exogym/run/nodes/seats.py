"""A population's seats as the run sees them: :class:`Seats`, the holder of the ``K`` rows whose
clients change every round (:mod:`exogym.run.nodes.population` draws, seats and accounts for
the clients; an asynchronous server's seats change at each reply)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from exogym.run.dist.communicator import DistributedCommunicator, WallSpans
from exogym.run.dist.ranks import RankContext
from exogym.run.nodes.client_store import ClientStore, parse_client_store
from exogym.run.nodes.memory import InMemory
from exogym.run.nodes.population import InFlight, Population
from exogym.run.settings import RunSettings, client_links, client_speeds
from exogym.sim.client_data import ClientBatches
from exogym.sim.comm import Communicator, InProcessCommunicator
from exogym.sim.engine import NodeStack
from exogym.sim.presence import recovery_source
from exogym.strategy.base import StackedStrategy
from exogym.strategy.server import ServerStrategy

if TYPE_CHECKING:
    from exogym.sim.clock import SimClock

__all__ = ["Seats"]


class Seats(InMemory):
    """A population's ``K`` seats (:mod:`exogym.run.nodes.population`): ``K`` rows (a process's
    share in a multi-process run) whose clients change every round; bytes per client.

    Args:
        population: the clients, their data, draws, store and accounting.
        comm: the seats' communicator, built for them (``seats=True``, its records' bytes
            credited to the clients: ``on_record=population.on_record``; :meth:`build`).
        others: as :class:`InMemory`.
    """

    def __init__(self, population: Population, nodes: NodeStack, comm: Communicator,
                 strategy: StackedStrategy, batches: ClientBatches, ranks: RankContext | None,
                 total_steps: int, seed: int = 0) -> None:
        super().__init__(nodes, comm, strategy, batches, ranks, total_steps, seed)
        self.population = population
        # an asynchronous server's view of its seats' speeds (DyLU sizes rounds by them)
        self.server = strategy if isinstance(strategy, ServerStrategy) else None

    @classmethod
    def build(cls, model: torch.nn.Module, strategy: StackedStrategy, settings: RunSettings,
              batches: ClientBatches, ranks: RankContext | None, device: torch.device,
              out_dir: Path | None, wall: WallSpans | None = None) -> Seats:
        """The seats of a run's settings: ``K`` (a process's share), their communicator, the
        client store of clients that keep state (each process its own folder); ``wall``: the
        distributed communicator's real trace."""
        s = settings
        assert s.participation is not None
        k = s.participation.per_round(s.num_nodes)
        nodes = NodeStack(model, k if ranks is None else ranks.nodes_per_process,
                          device=device, engine=s.engine, micro_batch_size=s.micro_batch_size,
                          precision=s.precision)
        store = None
        if s.participation.client_state == "keep":
            memory, folder = parse_client_store(s.client_store)
            if folder is None and out_dir is not None:
                folder = out_dir / "client-store"
            if folder is not None and ranks is not None and ranks.world_size > 1:
                folder = folder / f"rank-{ranks.rank}"  # each process stores its seats'
            store = ClientStore(memory, folder)
        # an asynchronous server's seats are clients in flight, replaced as updates arrive
        kind = InFlight if isinstance(strategy, ServerStrategy) else Population
        population = kind(
            s.num_nodes, s.participation, strategy.sync_period or 1, batches, store=store,
            availability=s.world.availability, speeds=client_speeds(s), links=client_links(s),
            next_change=s.world.next_availability_change, durations=s.world.duration,
            duration_seed=s.world.seed, batch_size=s.batch_size,
            **({"arrivals": s.arrivals} if kind is InFlight else {}))
        # a seat's previous client may send to its next one; the bytes are the clients'
        server = s.network is not None and s.network.topology == "server"
        comm = (InProcessCommunicator(k, seats=True, on_record=population.on_record,
                                      server=server)
                if ranks is None else
                DistributedCommunicator(k, ranks.node_ids, seats=True, server=server,
                                        on_record=population.on_record, wall=wall))
        return cls(population, nodes, comm, strategy, batches, ranks, s.total_steps, s.seed)

    # -- rounds (exogym.run.loop.rounds) and an asynchronous server's clients ---------------------
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
                   "node": client, "event": "recovery", **recovery_source(donor),
                   "bytes": received, "duration_s": seconds})

        self.population.start_round(step, self.strategy, self.nodes, self.comm, clock, joined,
                                    feed)

    def end_round(self) -> None:
        self.population.end_round(self.strategy, self.comm.node_ids)

    def fill(self, clock: SimClock | None) -> None:
        """Before an asynchronous server's first step: its first clients in flight (once)."""
        assert isinstance(self.population, InFlight), "an asynchronous server's seats"
        if not self.population.seated:
            self.population.fill(self.strategy, self.nodes, clock, self.comm.node_ids)
            self._speeds()

    def next_client(self, seat: int, clock: SimClock | None, step: int, at: float) -> None:
        """The server received ``seat``'s update at ``at``: the seat takes its next client."""
        assert isinstance(self.population, InFlight), "an asynchronous server's seats"
        self.population.replace(seat, self.strategy, self.nodes, clock, self.comm.node_ids,
                                step, at)
        self._speeds()

    def _speeds(self) -> None:
        """An asynchronous strategy's view of its seats' speeds (DyLU sizes rounds by them)."""
        pop = self.population
        if pop.speeds is not None and self.server is not None:
            self.server.set_speeds([float(pop.speeds[c]) for c in pop.seated_rows()])

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
        pop, comm = self.population, self.comm
        server = ({"server_bytes_sent": comm.server_bytes_sent,
                   "server_bytes_received": comm.server_bytes_received} if comm.server else {})
        return {**super().result(), "population": {**pop.report(), **server},
                "rounds": pop.rounds, "draw_seats": pop.draw_seats}

    def close(self) -> None:
        if self.population.store is not None:
            self.population.store.close()
