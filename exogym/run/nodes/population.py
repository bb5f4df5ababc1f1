"""A population of clients: a round costs what its participants cost.

Cross-device federated learning trains ``N`` clients of which ``K`` take part in a round
(McMahan et al. 2017, Algorithm 1; pfl-research's and Flower's simulations). A run with partial
participation holds ``K`` *seats*, not ``N`` rows: the node-stacked replicas, the strategy's
per-node state, the communicator and the simulated clock are those of a ``K``-node run, and a
client is a seat's occupant for one round. At a round's first step (:meth:`Population.start_round`)

1. the round's clients are drawn among the available ones (:meth:`exogym.sim.participation.
   Participation.draw_ids`: seeded by the run's seed and the round, so the draw never depends on
   how the run is executed; ``O(K)`` work in a perfect world), sorted by id and seated in that
   order (seat ``j`` holds the ``j``-th smallest id, so reductions add the clients' rows in the
   order a run with every client in memory adds them);
2. each seat's own state starts afresh (``client_state="fresh"``: nothing is stored per client)
   or is read back from the client store (``"keep"``: :mod:`exogym.run.nodes.client_store`);
3. each client that did not take part in the previous round receives the global model, as in
   a run with every client in memory (:meth:`exogym.strategy.base.StackedStrategy.recover`, the
   ``recovery`` the client state implies), counted and timed: through a server (a population's
   default topology) it downloads the model from the server, and no client sends anything
   (:meth:`exogym.sim.comm.Communicator.download`); among peers (``topology=peer``) a client
   of the previous round sends it, in turn, point to point. In seats, that sender is the seat
   its donor held in the previous round (the seat's previous occupant may hand the model on to
   its next: a send from a seat to itself is two clients);

then the ``K`` seats compute the round's steps as any ``K`` nodes do, and at the round's end a
client that keeps state is written back. No step touches the other ``N - K`` clients: their
data positions, bytes and stored state exist only once they have trained.

Accounting. The communicator tells the population each record's bytes per seat as it counts
them (:attr:`exogym.sim.comm.Communicator.on_record`), and the population credits them to the
seats' clients (among peers, a join's sent bytes to the donor), into per-client totals
(``float64[N]``, allocated once: 16 MB for a million clients), in the order a run with a row
per client adds them. The communicator's log is in seats; :func:`client_records` gives it in
client ids (each record's seats mapped through the round it was made in), the form a run with
every client in memory logs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from exogym.sim.comm import CommRecord, Communicator
from exogym.sim.participation import Participation
from exogym.strategy.base import StackedStrategy

if TYPE_CHECKING:
    from exogym.run.nodes.client_store import ClientStore
    from exogym.sim.arrivals import Arrivals
    from exogym.sim.client_data import ClientBatches
    from exogym.sim.clock import SimClock
    from exogym.sim.durations import Durations
    from exogym.sim.engine import NodeStack

__all__ = ["InFlight", "Population", "client_records"]

Availability = Callable[[np.ndarray], np.ndarray]


class Population:
    """``N`` clients over ``K`` seats, seated round by round (the module docstring); an
    asynchronous server's clients in flight are :class:`InFlight`.

    Args:
        num_clients: ``N``.
        participation: how many clients per round (``K``) and ``client_state``.
        period: steps per round (the strategy's ``H``).
        batches: the clients' data (:class:`~exogym.sim.client_data.ClientBatches`).
        store: where clients that keep state keep it (``client_state="keep"``), else None.
        availability: which clients are up at a simulated time (a function of the time that
            returns a vectorized test of an id array, or None: every client), or None: every
            client always (:meth:`exogym.sim.world.World.availability`).
        speeds: every client's relative compute speed (its seat's speed in the clock for its
            rounds), or None: all 1.
        links: every client's link in bits/s, up and down (its seat's in the clock for its
            rounds: a FedScale-form device file's), or None: the network's.
        next_change: the next simulated time after a given one at which the world's
            availability may change (a round with no client up waits for it), or None.
    """

    asynchronous = False  # seats filled round by round (InFlight: as updates arrive)

    def __init__(self, num_clients: int, participation: Participation, period: int,
                 batches: ClientBatches, *, store: ClientStore | None = None,
                 availability: Callable[[float], Availability | None] | None = None,
                 speeds: np.ndarray | None = None, links: np.ndarray | None = None,
                 next_change: Callable[[float], float | None] | None = None,
                 durations: Durations | None = None, duration_seed: int = 0,
                 batch_size: int = 1) -> None:
        if participation.client_state == "keep" and store is None:
            raise ValueError("client_state='keep' needs a client store")
        self.num_clients, self.participation, self.period = num_clients, participation, period
        self.num_seats = participation.per_round(num_clients)
        self.batches, self.store, self.availability = batches, store, availability
        self.speeds, self.links, self.next_change = speeds, links, next_change
        # FLSim's session durations (exogym.sim.durations): a seat's speed per session
        self.durations, self.duration_seed = durations, duration_seed
        self.session_samples = period * batch_size
        self.seated: list[int] = []  # this round's clients, sorted (seat j: the j-th)
        self.previous: list[int] = []  # the previous round's
        self.rounds: list[list[int]] = []  # every round's clients (a round: K ints)
        # an asynchronous server's draws after the first (InFlight): the seat each new client
        # took, and the step it took it at
        self.draw_seats: list[int] = []
        self.draw_steps: list[int] = []
        self.sent = np.zeros(num_clients)  # per client (module docstring)
        self.received = np.zeros(num_clients)
        self._joining = False  # sends are joins: from the seat's previous occupant
        # the previous round's clients whose reports its round policy did not keep: drawn
        # again, they receive the global model as any new client (exogym.run.nodes.reports)
        self.unheard: set[int] = set()
        self.counts: dict[str, Any] = {"joins": 0, "join_bytes": 0.0, "join_time_s": 0.0}

    # -- the round -----------------------------------------------------------------------------
    @property
    def active(self) -> list[bool] | None:
        """The seats that compute (None: all; a round with fewer clients up than seats leaves
        the rest empty)."""
        if len(self.seated) == self.num_seats:
            return None
        return [j < len(self.seated) for j in range(self.num_seats)]

    def start_round(self, step: int, strategy: StackedStrategy, nodes: NodeStack,
                    comm: Communicator, clock: SimClock | None,
                    recovered: Callable[[int, int, int, float, float], None],
                    feed: Callable[[], None]) -> None:
        """Draw, seat and prepare the round starting at ``step`` (the module docstring);
        ``recovered(seat, client, donor, bytes, seconds)`` is told of each join once ``feed``
        has given the clock its transfer."""
        clients, up = self._draw(step, clock)
        self.previous, self.seated = self.seated, clients
        self.rounds.append(list(clients))
        self.batches.forget([c for c in self.previous if c not in set(clients)])
        nodes.row_ids = self.seated_rows(comm.node_ids)
        comm.attendance.examples = self.batches.examples(self.seated_rows())
        self.apply_speeds(clock)
        self._carry_staying(nodes, comm)
        for row, seat in enumerate(comm.node_ids):
            if seat < len(clients):
                self._own_state(strategy, row, clients[seat])
            else:
                strategy.restart_row(row)
        joins = self._joins(up)
        if joins:
            self._receive(joins, strategy, clock, recovered, feed)

    def _draw(self, step: int, clock: SimClock | None) -> tuple[list[int], Availability | None]:
        """The round's clients, drawn among those up when it starts; if none is, the seats
        wait for the next moment the world's availability changes (as the rows path waits for
        a quorum of one), then draw again."""
        now = clock.now if clock is not None else 0.0
        for _ in range(100_000):
            up = self.availability(now) if self.availability is not None else None
            clients = self.participation.draw_ids(step // self.period, self.num_clients, up)
            later = self.next_change(now) if not clients and self.next_change else None
            if clients or later is None:
                break
            if clock is not None:
                for seat in range(self.num_seats):
                    clock.wait(seat, later)
            now = later
        if not clients:
            raise RuntimeError(f"no client of the {self.num_clients:,} is available for the "
                               f"round at step {step} (simulated time {now:.1f} s), and the "
                               "world's availability never changes after it")
        return clients, up

    def _carry_staying(self, nodes: NodeStack, comm: Communicator) -> None:
        """A client staying from the previous round keeps its own model (parameters and
        buffers, as its row does in a run with a row per client): copied from the seat it held
        to the seat it takes (not traffic: it is the client's own). Only the seats whose
        client changes are touched."""
        before = {c: seat for seat, c in enumerate(self.previous)}
        moves = [(seat, before[c]) for seat, c in enumerate(self.seated)
                 if c in before and before[c] != seat]
        if not moves:
            return
        local = list(comm.node_ids)
        with torch.no_grad():
            for t in [*nodes.params.values(), *nodes.buffers.values()]:
                rows = [comm.fetch_row(t, src) for _, src in moves]  # all read before written
                for (seat, _), row in zip(moves, rows, strict=True):
                    if seat in local:
                        t[local.index(seat)].copy_(row)

    def _receive(self, joins: list[tuple[int, int]], strategy: StackedStrategy,
                 clock: SimClock | None, recovered: Callable[[int, int, int, float, float], None],
                 feed: Callable[[], None]) -> None:
        """The joining clients receive the global model, each from its donor."""
        clients = self.seated
        self._joining = True
        links = _SeatLinks(clock)
        done = []
        try:
            with _recovery_as(strategy):
                for seat, donor_seat in joins:
                    received = self.received[clients[seat]]  # its own total: the rows' float
                    busy = _comm(clock, seat)
                    links.send(donor_seat, seat, lambda s=seat, d=donor_seat: (
                        strategy.recover(s, d), feed()))
                    got = float(self.received[clients[seat]] - received)
                    done.append((seat, donor_seat, got, _comm(clock, seat) - busy))
        finally:
            self._joining = False
        for seat, donor_seat, got, seconds in done:
            self.counts["joins"] += 1
            self.counts["join_bytes"] += got
            self.counts["join_time_s"] += seconds
            # through a server the new client downloads the model from it (no client sends)
            donor = -1 if strategy.comm.server else self.previous[donor_seat]
            recovered(seat, clients[seat], donor, got, seconds)

    def apply_speeds(self, clock: SimClock | None) -> None:
        """Each seat computes at its client's speed and sends over its client's link (an empty
        seat at speed 1, on the network's link)."""
        if clock is None:
            return
        for seat, client in enumerate(self.seated_rows()):
            self._seat(clock, seat, client if seat < len(self.seated) else None)

    def _seat(self, clock: SimClock, seat: int, client: int | None) -> None:
        """The clock's seat ``seat`` takes ``client``'s speed and link (None: empty): with
        session durations, the speed at which the session's ``H`` steps take its drawn
        ``D`` seconds."""
        if self.durations is not None and client is not None:
            d = self.durations.draw(self.duration_seed, self.session(seat), client,
                                    self.session_samples)
            clock.set_speed(seat, clock.step_time_s * self.period / max(d, 1e-12))
        elif self.speeds is not None:
            clock.set_speed(seat, 1.0 if client is None else float(self.speeds[client]))
        if self.links is not None:
            clock.set_link(seat, None if client is None else float(self.links[client]))

    def session(self, seat: int) -> int:
        """The session of seat ``seat``'s client: the round's index (a draw per round)."""
        return len(self.rounds) - 1

    def seated_rows(self, local: Sequence[int] | None = None) -> list[int]:
        """Each of the ``local`` seats' client (None: every seat's; the threads engine seeds a
        seat's generator by it); an empty seat repeats the first client (it does not
        compute)."""
        every = (self.seated + [self.seated[0]] * (self.num_seats - len(self.seated))
                 if self.seated else list(range(self.num_seats)))
        return every if local is None else [every[j] for j in local]

    def _joins(self, up: Availability | None) -> list[tuple[int, int]]:
        """``(seat, donor's seat in the previous round)`` for each client not in the previous
        round: its donor is a client of the previous round that is up, in turn (the first of
        them if none is up)."""
        if not self.previous:
            return []
        before = set(self.previous) - self.unheard
        seats = [s for s, c in enumerate(self.previous) if c in before] or [0]
        if up is not None:
            flags = up(np.asarray(self.previous, dtype=np.int64))
            seats = [s for s in seats if flags[s]] or seats[:1]
        new = [seat for seat, c in enumerate(self.seated) if c not in before]
        self.unheard = set()
        return [(seat, seats[k % len(seats)]) for k, seat in enumerate(new)]

    def _own_state(self, strategy: StackedStrategy, row: int, client: int) -> None:
        """Seat ``row``'s own state for ``client``: its stored state, else a fresh one."""
        if self.store is not None and self.store.load(client, strategy, row):
            return
        strategy.restart_row(row)

    def end_round(self, strategy: StackedStrategy, local: Sequence[int]) -> None:
        """The round is over: clients that keep state write theirs back (each process its
        ``local`` seats')."""
        if self.store is not None:
            for row, seat in enumerate(local):
                if seat < len(self.seated):
                    self.store.save(self.seated[seat], strategy, row)

    def batch(self, active: Sequence[bool] | None = None,
              local: Sequence[int] | None = None) -> Any:
        """The next batch of the ``local`` seats (None: all; a process of a multi-process run
        holds its share), ``[len(local), B, ...]``: each computing seat's client's next samples
        (``active``: those seats; None: every seated client). Every computing client's data
        moves on, in every process (their positions stay the same everywhere); a seat that does
        not compute repeats the first computing seat's samples, and its client's does not."""
        seats = [j for j in range(len(self.seated)) if active is None or active[j]]
        ids = dict(zip(seats, self.take(seats), strict=True))
        rows = range(self.num_seats) if local is None else local
        return self.batches.fetch([ids.get(j, ids[seats[0]]) for j in rows])

    def take(self, seats: Sequence[int]) -> list[Any]:
        """The next sample ids of ``seats``' clients (each client's data position moves on;
        :meth:`batch` fetches them, the asynchronous engine later)."""
        return self.batches.take([self.seated[j] for j in seats])

    # -- accounting ----------------------------------------------------------------------------
    def on_record(self, op: str, sent: list[float], received: list[float], src: int,
                  dst: int) -> None:
        """A record's bytes per seat, credited to the seats' clients as they are counted (the
        order a run with a row per client adds them in: the same totals, bit for bit); a
        join's sender is the seat's previous occupant."""
        for seat, client in enumerate(self.seated):
            out = sent[seat]
            if out and self._joining and op == "send" and seat == src:
                self.sent[self.previous[src]] += out
                out = 0.0
            self.sent[client] += out
            self.received[client] += received[seat]

    def client_of(self, seat: int, step: int) -> int:
        """Who sat in ``seat`` at ``step``."""
        return self.rounds[min(step // self.period, len(self.rounds) - 1)][seat]

    def totals(self) -> tuple[np.ndarray, np.ndarray]:
        """Every client's bytes sent and received so far."""
        return self.sent, self.received

    def report(self) -> dict[str, Any]:
        """The population's part of ``summary.json``."""
        trained = self.batches.position
        over = self.participation.over_selection != 1.0
        return {"clients": self.num_clients, "per_round": self.num_seats,
                **({"reports_per_round": self.participation.reports(self.num_clients)}
                   if over else {}),
                "asynchronous": self.asynchronous,
                "client_state": self.participation.client_state, "rounds": len(self.rounds),
                "clients_trained": len(trained), **self.counts,
                **({} if self.store is None else {"store": self.store.report()})}

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The draws so far, the seating, the bytes of the clients that have any (no
        per-client array: ``N`` may be a million) and the data positions."""
        touched = np.flatnonzero((self.sent != 0) | (self.received != 0))
        return {"rounds": torch.tensor([c for r in self.rounds for c in r] or [],
                                       dtype=torch.int64),
                "round_sizes": [len(r) for r in self.rounds], "seated": list(self.seated),
                "previous": list(self.previous), "draw_seats": list(self.draw_seats),
                "draw_steps": list(self.draw_steps),
                "touched": torch.from_numpy(touched),
                "sent": torch.from_numpy(self.sent[touched]),
                "received": torch.from_numpy(self.received[touched]),
                "counts": dict(self.counts), "unheard": sorted(self.unheard),
                **({} if self.store is None else {"store": self.store.state_dict()})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        flat, self.rounds, at = state["rounds"].tolist(), [], 0
        for size in state["round_sizes"]:
            self.rounds.append(flat[at: at + size])
            at += size
        self.seated = [int(c) for c in state["seated"]]
        self.previous = [int(c) for c in state["previous"]]
        self.draw_seats = [int(s) for s in state["draw_seats"]]
        self.draw_steps = [int(s) for s in state["draw_steps"]]
        touched = state["touched"].numpy()
        self.sent[:], self.received[:] = 0.0, 0.0
        self.sent[touched] = state["sent"].numpy()
        self.received[touched] = state["received"].numpy()
        self.counts = dict(state["counts"])
        self.unheard = {int(c) for c in state.get("unheard", ())}
        if self.store is not None:
            self.store.load_state_dict(state["store"])


class InFlight(Population):
    """An asynchronous server's population: its seats are clients in flight (its concurrency),
    filled at the start (:meth:`fill`), a seat's next client drawn when the server receives its
    update (:meth:`replace`), instead of rounds. Arguments as :class:`Population`'s."""

    asynchronous = True

    def __init__(self, num_clients: int, participation: Participation, period: int,
                 batches: ClientBatches, *, store: ClientStore | None = None,
                 availability: Callable[[float], Availability | None] | None = None,
                 speeds: np.ndarray | None = None, links: np.ndarray | None = None,
                 next_change: Callable[[float], float | None] | None = None,
                 durations: Durations | None = None, duration_seed: int = 0,
                 batch_size: int = 1, arrivals: Arrivals | None = None) -> None:
        if (participation.count or 0) >= num_clients:
            raise ValueError(f"concurrency={participation.count} must be below the "
                             f"population's {num_clients} clients: a client whose update "
                             "arrives is replaced by one not in flight")
        super().__init__(num_clients, participation, period, batches, store=store,
                         availability=availability, speeds=speeds, links=links,
                         next_change=next_change, durations=durations,
                         duration_seed=duration_seed, batch_size=batch_size)
        # FLSim's arrivals (exogym.sim.arrivals): the j-th client drawn starts no sooner than
        # the j-th arrival; the arrivals so far and the last one's time
        self.arrivals, self.arrival_seed = arrivals, participation.seed
        self.arrived, self.last_arrival = 0, 0.0

    def fill(self, strategy: StackedStrategy, nodes: NodeStack, clock: SimClock | None,
             local: Sequence[int]) -> None:
        """An asynchronous server's first clients, one per seat (its concurrency): drawn among
        the available ones, each with its own state (fresh or stored)."""
        now = clock.now if clock is not None else 0.0
        up = self.availability(now) if self.availability is not None else None
        clients = self.participation.draw_ids(0, self.num_clients, up, k=self.num_seats)
        if len(clients) < self.num_seats:
            raise RuntimeError(self._too_few(len(clients), now))
        self.seated = clients
        self.rounds.append(list(clients))
        nodes.row_ids = self.seated_rows(local)
        for row, seat in enumerate(local):
            self._own_state(strategy, row, clients[seat])
        self.apply_speeds(clock)
        if self.arrivals is not None and clock is not None:
            for seat in range(self.num_seats):  # the first C clients arrive one by one
                _idle_until(clock, seat, self._next_arrival(), "waiting for its client")

    def replace(self, seat: int, strategy: StackedStrategy, nodes: NodeStack,
                clock: SimClock | None, local: Sequence[int], step: int, at: float) -> int:
        """An asynchronous server received seat ``seat``'s update: its client leaves (writing
        its state back if it keeps one) and the next client drawn among the available ones
        not in flight takes the seat, with its own state and speed; the new client. ``at``:
        when the update arrived (who is available then is drawn from); ``step``: the run's."""
        row = local.index(seat) if seat in local else None
        if self.store is not None and row is not None:
            self.store.save(self.seated[seat], strategy, row)
        now = at
        up = self.availability(now) if self.availability is not None else None
        flying = np.asarray(self.seated, dtype=np.int64)

        def free(ids: np.ndarray) -> np.ndarray:
            ok = ~np.isin(ids, flying)
            return ok if up is None else ok & up(ids)

        drawn = self.participation.draw_ids(len(self.rounds), self.num_clients, free, k=1)
        if not drawn:
            raise RuntimeError(self._too_few(0, now))
        client = drawn[0]
        self.seated[seat] = client
        self.rounds.append([client])
        self.draw_seats.append(seat)
        self.draw_steps.append(step)
        self.batches.forget([flying[seat]])
        nodes.row_ids = self.seated_rows(local)
        if row is not None:
            self._own_state(strategy, row, client)
        if clock is not None:
            self._seat(clock, seat, client)
            if self.arrivals is not None:
                self._await_arrival(clock, seat, at)
        return client

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "arrived": self.arrived,
                "last_arrival": self.last_arrival}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.arrived = int(state.get("arrived", 0))
        self.last_arrival = float(state.get("last_arrival", 0.0))

    def _next_arrival(self) -> float:
        """The next client's arrival (FLSim's start time, :mod:`exogym.sim.arrivals`)."""
        assert self.arrivals is not None
        self.arrived += 1
        self.last_arrival += self.arrivals.gap(self.arrived, self.arrival_seed)
        return self.last_arrival

    def _await_arrival(self, clock: SimClock, seat: int, at: float) -> None:
        """Seat ``seat``'s new client arrives at its arrival time: if that is after ``at`` (the
        previous client's update reached the server), the previous client's push is
        communication until ``at`` and the seat idles until the arrival, then the new client
        downloads the model (the reply starts no sooner)."""
        arrival = self._next_arrival()
        if arrival <= at:
            return  # it arrived before a seat was free: it starts now
        t = clock.t[seat]
        if at > t:
            if clock.spans is not None:
                clock.spans.add(seat, "comm", t, at, "push (until it reached the server)")
            clock.node_comm[seat] += at - t
            clock.t[seat] = at
        _idle_until(clock, seat, arrival, "waiting for the next client to arrive")

    def session(self, seat: int) -> int:
        """The draw that seated seat ``seat``'s client: 0 the first fill, ``k`` the server's
        ``k``-th replacement."""
        for k in range(len(self.draw_seats) - 1, -1, -1):
            if self.draw_seats[k] == seat:
                return k + 1
        return 0

    def _too_few(self, found: int, now: float) -> str:
        return (f"no client free to train at simulated time {now:.1f} s: {found} of the "
                f"{self.num_clients:,} clients are available and not in flight, the server keeps "
                f"{self.num_seats} in flight (--concurrency); lower it or make more clients "
                "available (--world online=LOW:HIGH)")

    def client_of(self, seat: int, step: int) -> int:
        client = self.rounds[0][seat]
        for (drawn,), s, when in zip(self.rounds[1:], self.draw_seats, self.draw_steps,
                                     strict=True):
            if s == seat and when <= step:
                client = drawn
        return client


def client_records(log: Sequence[CommRecord], rounds: Sequence[Sequence[int]], period: int,
                   ) -> list[CommRecord]:
    """A population run's log in client ids, as a run with every client in memory logs it:
    members as a bit mask of client ids, a send's ``src`` the donor (the seat's occupant in the
    previous round: a join among peers; ``-1``: a download from the server), ``dst`` the
    receiver."""
    out = []
    for rec in log:
        k = min(max(rec.step, 0) // period, len(rounds) - 1)
        seated = rounds[k]
        seats = ([s for s in range(len(seated)) if rec.members >> s & 1] if rec.members >= 0
                 else range(len(seated)))
        if rec.op == "send":
            dst = seated[rec.dst]
            if rec.src < 0:  # a download from the server
                out.append(replace(rec, members=1 << dst, dst=dst))
                continue
            src = rounds[k - 1][rec.src] if k > 0 else seated[rec.src]
            out.append(replace(rec, members=(1 << src) | (1 << dst), src=src, dst=dst))
            continue
        bits = sum(1 << seated[s] for s in seats)
        out.append(replace(rec, members=bits,
                           src=seated[rec.src] if rec.src >= 0 else -1,
                           dst=seated[rec.dst] if rec.dst >= 0 else -1))
    return out


class _SeatLinks:
    """The clock's side of the joins: a seat is two clients at a round's start, the previous
    one (a join's sender) and the new one (its receiver), each with its own time and link, as
    in a run with a row per client. Before each join's transfer the sender's seat shows the
    clock its previous client and the receiver's seat its new client (idle until the donor can
    send); after it, each seat shows its new client again."""

    def __init__(self, clock: SimClock | None) -> None:
        self.clock = clock
        self.donors = ({} if clock is None else
                       {s: (clock.t[s], clock.link_free[s]) for s in range(clock.num_nodes)})

    def send(self, src: int, dst: int, transfer: Callable[[], Any]) -> float:
        """Run ``transfer`` (the join's send, given to the clock) from seat ``src``'s previous
        client to seat ``dst``'s new one; when the donor could send (the recovery's start)."""
        c = self.clock
        if c is None:
            transfer()
            return 0.0
        here = (c.t[src], c.link_free[src])
        donor_t, donor_link = self.donors[src]
        c.t[src], c.link_free[src] = donor_t, donor_link
        # the new client exists from when it can receive: the donor's time, or through a
        # server the server's release (FedScale: a round starts when the last one ended)
        new = min(donor_t, c.last_release) if c.server else donor_t
        c.t[dst], c.link_free[dst] = min(c.t[dst], new), min(c.link_free[dst], new)
        transfer()
        self.donors[src] = (donor_t, c.link_free[dst])  # the donor's link was busy until then
        if src != dst:
            c.t[src], c.link_free[src] = here
        return donor_t


def _idle_until(clock: SimClock, seat: int, until: float, why: str) -> None:
    """Seat ``seat`` idles until ``until`` (its link too), a span ``why``."""
    clock.wait(seat, until, why)
    clock.link_free[seat] = max(clock.link_free[seat], until)


def _comm(clock: SimClock | None, seat: int) -> float:
    """Seat ``seat``'s time communicating on the clock so far (a join's transfer is its
    increase)."""
    return clock.node_comm[seat] if clock is not None else 0.0


@contextlib.contextmanager
def _recovery_as(strategy: StackedStrategy) -> Iterator[None]:
    """A joining client's recovery: its own state is already in its seat (``"keep"``: kept as
    it is), the global model comes from the donor."""
    before = strategy.recovery
    strategy.recovery = "keep"
    try:
        yield
    finally:
        strategy.recovery = before
