"""A volunteer population's day: a share of the clients online that follows the simulated clock.

Cross-device clients are online when their owners let them be (charging, idle, on Wi-Fi: the
Gboard deployment of Bonawitz et al. 2019, "Towards Federated Learning at Scale: System Design",
Figure 2, sees the eligible devices swing several-fold over a day); a volunteer network (the EXO
posts' SETI@home picture) has hobbyists' machines come and go. :class:`Diurnal` is a seeded,
synthetic model of that (``--world online=LOW:HIGH``):

- the share of clients online at simulated time ``t`` is ``p(t) = LOW + (HIGH - LOW) * (1 -
  cos(2 pi t / DAY)) / 2``: ``LOW`` when the run starts, ``HIGH`` half a day later;
- time is cut into sessions of ``SESSION`` seconds; in session ``s`` client ``i`` is online
  iff ``u(i, s) < p(s * SESSION)``, with ``u`` a uniform number hashed from ``(seed, i, s)``.
  So each client comes and goes from one session to the next, the share online at any time is
  about ``p(t)`` in expectation, and a client's availability needs nothing stored and no
  other client: a population of a million is asked for the few ids a draw needs
  (:meth:`Diurnal.up`, vectorized), never listed.

Independent sessions are a simplification (a real client's online periods are correlated from one
hour to the next); a FedScale trace (``--world trace:FILE``) gives real ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Diurnal"]

_KEY = np.uint64(0xD1E5_A110_5EED)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


@dataclass(frozen=True)
class Diurnal:
    """The share of clients online over the simulated day (module docstring).

    Attributes:
        low: the share online at the day's trough (the run's start), in ``[0, 1]``.
        high: the share online at its peak, ``low <= high <= 1``, ``high > 0``.
        day_s: the period, seconds.
        session_s: how long a client stays online or offline at least, seconds.
        seed: seeds who is online when.
    """

    low: float
    high: float
    day_s: float = 86400.0
    session_s: float = 3600.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("low", "high"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ValueError(f"online={self.low!r}:{self.high!r}: {name.upper()} must be a "
                                 f"share in [0, 1], got {v!r}")
        if self.low > self.high or self.high == 0:
            raise ValueError(f"online={self.low:g}:{self.high:g}: LOW:HIGH with LOW <= HIGH and "
                             "HIGH > 0 (the shares online at the trough and the peak)")
        for name in ("day_s", "session_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name.removesuffix('_s')} must be a duration > 0, got {v!r}")

    def share(self, t: float) -> float:
        """``p(t)``: the expected share of clients online at time ``t``."""
        return self.low + (self.high - self.low) * (1 - math.cos(2 * math.pi * t / self.day_s)) / 2

    def _uniform(self, ids: np.ndarray, session: int) -> np.ndarray:
        """``u(i, s)`` for every id of ``ids``: uniform in ``[0, 1)``, hashed."""
        key = _mix(_mix(np.array([self.seed], dtype=np.uint64) + _KEY)
                   ^ np.array([session], dtype=np.uint64))
        x = _mix((np.asarray(ids).astype(np.uint64) * _GOLDEN) ^ key)
        return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)

    def up(self, ids: np.ndarray, t: float) -> np.ndarray:
        """Which of the client ``ids`` are online at time ``t`` (booleans, vectorized): the
        session's draw against the share at the session's start (a client is online or not
        for a whole session)."""
        session = int(t // self.session_s)
        return self._uniform(np.asarray(ids), session) < self.share(session * self.session_s)

    def is_up(self, node: int, t: float) -> bool:
        return bool(self.up(np.array([node]), t)[0])

    def next_up(self, node: int, t: float) -> float | None:
        """The first time ``>= t`` at which ``node`` is online (the start of a session; None if
        it is not online within a year of sessions: ``HIGH`` tiny)."""
        if self.is_up(node, t):
            return t
        session = int(t // self.session_s)
        for s in range(session + 1, session + 1 + int(365 * 86400 / self.session_s)):
            start = s * self.session_s
            if self.is_up(node, start):
                return start
        return None

    def spec(self) -> str:
        return (f"online={self.low:g}:{self.high:g},day={self.day_s:g}s,"
                f"session={self.session_s:g}s")
