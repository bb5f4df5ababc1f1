"""Partial participation: K of the N nodes (clients) take part in each round.

Cross-device federated learning trains a population of clients of which a few take part in each
round: McMahan et al. (2017, "Communication-Efficient Learning of Deep Networks from
Decentralized Data", Algorithm 1) select ``m = max(C K, 1)`` of the ``K`` clients at random each
round (their ``C``, the fraction; Flower's ``fraction_fit``); FedScale samples among the clients
its availability traces say are online. Here:

- a round is the strategy's synchronisation period ``H`` (FedAvg's local epochs, DiLoCo's inner
  steps); at the start of each round ``k`` of the nodes the world says are up are drawn without
  replacement, from a generator seeded by ``(seed, round)`` (the same draw in every process and
  on resume), ``k = K`` given as a count, or ``max(round(C N), 1)`` given as a fraction ``C``;
  fewer up nodes than ``k``: all of them;
- only the participants compute, send and are charged (the others are absent from the round,
  as a down node is: no forward, no data drawn, no optimizer step, not a member of the round's
  collectives); a participant that fails during the round is down as any node; if every
  participant is down at a step, the round goes on with a new draw among the up nodes (seeded
  by the round and the step), which join it as any newly selected client;
- a client selected again starts its round from the current global model, received from the
  server (a point-to-point transfer, charged to it: the run's live recovery); whether it keeps
  its own inner optimizer state between its rounds is a setting, ``client_state``: ``"fresh"``
  (Flower's default: a client builds its optimizer each round) or ``"keep"``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = ["CLIENT_STATES", "Participation", "parse_participation"]

_STREAM = 0x9A27  # separates the participation draws from the world's seed streams

ClientState = Literal["fresh", "keep"]
CLIENT_STATES: tuple[ClientState, ...] = ("fresh", "keep")


@dataclass(frozen=True)
class Participation:
    """How many nodes take part in each round.

    Attributes:
        count: ``K``, the participants per round; or
        fraction: ``C`` in (0, 1]: ``max(round(C N), 1)`` participants.
        client_state: ``"fresh"`` (a participant's inner optimizer state starts fresh each
            round) or ``"keep"`` (kept from its previous round).
        seed: seeds the draws (with the round's index).
        over_selection: ``r``: a round draws ``ceil(r k)`` clients of which the first ``k``
            reports count (:mod:`exogym.sim.round_policy`); 1: the ``k`` drawn.
    """

    count: int | None = None
    fraction: float | None = None
    client_state: ClientState = "fresh"
    seed: int = 0
    over_selection: float = 1.0

    def __post_init__(self) -> None:
        if (self.count is None) == (self.fraction is None):
            raise ValueError("participation takes a count K or a fraction C, one of them")
        if self.count is not None and (isinstance(self.count, bool) or not isinstance(
                self.count, int) or self.count < 1):
            raise ValueError(f"participation must be a count >= 1 or a fraction in (0, 1], got "
                             f"{self.count!r}")
        if self.fraction is not None and not (isinstance(self.fraction, (int, float))
                                              and 0.0 < self.fraction <= 1.0):
            raise ValueError(f"participation must be a count >= 1 or a fraction in (0, 1], got "
                             f"{self.fraction!r}")
        if self.client_state not in CLIENT_STATES:
            raise ValueError(f"client_state must be one of {list(CLIENT_STATES)}, got "
                             f"{self.client_state!r}")

    def per_round(self, num_nodes: int) -> int:
        """The clients a round draws among ``num_nodes``: ``k``, or ``ceil(r k)`` with
        over-selection (at most ``num_nodes``)."""
        k = self.reports(num_nodes)
        if self.over_selection == 1.0:
            return k
        return min(math.ceil(self.over_selection * k - 1e-9), num_nodes)

    def reports(self, num_nodes: int) -> int:
        """``k``, the participants of a round among ``num_nodes`` (the reports it
        aggregates)."""
        if self.count is not None:
            if self.count > num_nodes:
                raise ValueError(f"participation={self.count} is more than the {num_nodes} "
                                 "nodes of the run")
            return self.count
        assert self.fraction is not None
        return max(math.floor(self.fraction * num_nodes + 0.5), 1)

    def draw(self, round_index: int, up: Sequence[bool], again: int = 0) -> list[bool]:
        """The participants of round ``round_index``: ``k`` of the ``up`` nodes, at random
        (``again``: a new draw within the round, after every participant failed), as ``N``
        booleans; the same draw as :meth:`draw_ids` with ``up`` as the availability."""
        flags = np.asarray(up, dtype=bool)
        available = None if flags.all() else flags.__getitem__
        picked = set(self.draw_ids(round_index, len(flags), available, again))
        return [i in picked for i in range(len(flags))]

    def draw_ids(self, round_index: int, num_clients: int,
                 available: Callable[[np.ndarray], np.ndarray] | None = None,
                 again: int = 0, k: int | None = None) -> list[int]:
        """The participants of round ``round_index`` among ``num_clients``, sorted ids; ``k``
        of the clients ``available`` says are up (a vectorized test of an id array; None: all
        are), all of them if fewer are up. Expected work ``O(k / p)`` for a share ``p`` of the
        clients up, never a pass over every client unless fewer than ``k`` turn up in
        ``64 k`` random tries (then the up clients are listed once, vectorized).

        The draw: a uniform ``k``-subset of the ids (``Generator.choice`` without
        replacement, ``O(k)`` for a large population), the ones up kept; while fewer than
        ``k``, uniform ids with replacement, each new one up kept. Given how many of the first
        subset are up, that is a uniform ``k``-subset of the up clients; with every client up
        it is the first subset alone, so a perfect world draws without testing anyone.
        ``k``: draw that many instead of the round's count (an asynchronous server replacing
        one client).
        """
        k = min(self.per_round(num_clients) if k is None else k, num_clients)
        key = [self.seed, _STREAM, round_index] + ([again] if again else [])
        rng = np.random.default_rng(np.random.SeedSequence(key))
        first = rng.choice(num_clients, size=k, replace=False)
        if available is None:
            return sorted(int(i) for i in first)
        chosen = [int(i) for i in first[available(first)]]
        seen = set(chosen)
        tries = 0
        while len(chosen) < k and tries < 64 * k:
            candidates = rng.integers(0, num_clients, size=2 * (k - len(chosen)) + 8)
            tries += len(candidates)
            for c in candidates[available(candidates)].tolist():
                if c not in seen:
                    seen.add(c)
                    chosen.append(c)
                    if len(chosen) == k:
                        break
        if len(chosen) < k:  # few clients up: list them (once, vectorized) and draw the rest
            every = np.arange(num_clients)
            rest = np.setdiff1d(every[available(every)], np.asarray(chosen, dtype=np.int64))
            need = k - len(chosen)
            chosen += (rest if len(rest) <= need else
                       rng.choice(rest, size=need, replace=False)).tolist()
        return sorted(chosen)

    def spec(self) -> str:
        """``"K"`` or ``"C"`` (a fraction), as the command line takes it."""
        return str(self.count) if self.count is not None else f"{self.fraction:g}"

    def to_dict(self) -> dict[str, Any]:
        return {"participation": self.spec(), "client_state": self.client_state}


def parse_participation(value: int | float | str | None, *, client_state: str = "fresh",
                        seed: int = 0) -> Participation | None:
    """``10`` or ``"10"`` (a count), ``0.1`` or ``"0.1"`` (a fraction), None (every node)."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"participation must be a count K (e.g. 10) or a fraction C "
                                 f"in (0, 1] (e.g. 0.1), got {text!r}") from None
    if isinstance(value, bool):
        raise ValueError(f"participation must be a count or a fraction, got {value!r}")
    if isinstance(value, int):
        return Participation(count=value, client_state=client_state, seed=seed)  # type: ignore[arg-type]
    if isinstance(value, float) and value.is_integer() and value > 1:
        raise ValueError(f"participation={value!r}: a count is an integer (10), a fraction is "
                         "in (0, 1] (0.1)")
    return Participation(fraction=float(value), client_state=client_state,  # type: ignore[arg-type]
                         seed=seed)
