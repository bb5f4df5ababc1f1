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
from collections.abc import Sequence
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
    """

    count: int | None = None
    fraction: float | None = None
    client_state: ClientState = "fresh"
    seed: int = 0

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
        """``k``, the participants of a round among ``num_nodes``."""
        if self.count is not None:
            if self.count > num_nodes:
                raise ValueError(f"participation={self.count} is more than the {num_nodes} "
                                 "nodes of the run")
            return self.count
        assert self.fraction is not None
        return max(math.floor(self.fraction * num_nodes + 0.5), 1)

    def draw(self, round_index: int, up: Sequence[bool], again: int = 0) -> list[bool]:
        """The participants of round ``round_index``: ``k`` of the ``up`` nodes, at random
        (``again``: a new draw within the round, after every participant failed)."""
        candidates = [i for i, u in enumerate(up) if u]
        k = min(self.per_round(len(up)), len(candidates))
        key = [self.seed, _STREAM, round_index] + ([again] if again else [])
        rng = np.random.default_rng(np.random.SeedSequence(key))
        chosen = set(rng.choice(len(candidates), size=k, replace=False).tolist())
        picked = {candidates[j] for j in chosen}
        return [i in picked for i in range(len(up))]

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
