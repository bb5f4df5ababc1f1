"""When an asynchronous server's clients start training: at a rate, as FLSim starts them.

FLSim (facebookresearch/FLSim at commit 7311f2d,
``flsim/utils/async_trainer/training_event_generator.py``, read to understand, not copied)
does not fix how many clients train at once: clients *start* at a rate, and the concurrency
emerges from the rate times how long each trains. ``--arrivals`` does the same for a
population's asynchronous server (``--concurrency C`` then caps the clients in flight: the
seats):

- ``constant:R``: the ``j``-th client starts at ``j / R`` seconds (FLSim's
  ``ConstantAsyncTrainingStartTimeDistr``: a gap of ``1 / R``);
- ``poisson:R``: the gaps between starts are exponential of mean ``1 / R`` (FLSim's
  ``PoissonAsyncTrainingStartTimeDistr``), the ``j``-th gap drawn from a generator seeded by
  ``(seed, j)``.

The ``j``-th client drawn (the first ``C`` fill the seats, then one per arrival of an update at
the server) starts at ``max(its arrival, when a seat is free)``: with a cap ``C`` well above
``R`` times the mean duration no client waits for a seat, as in FLSim; a smaller cap queues
them, first come first served.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["ARRIVAL_KINDS", "Arrivals", "parse_arrivals"]

ArrivalKind = Literal["constant", "poisson"]
ARRIVAL_KINDS: tuple[ArrivalKind, ...] = ("constant", "poisson")
_STREAM = 0xA7_71BE  # separates the arrival draws from the run's other seed streams


@dataclass(frozen=True)
class Arrivals:
    """Clients starting at ``rate`` per second (module docstring).

    Attributes:
        kind: ``"constant"`` or ``"poisson"``.
        rate: ``R``, clients per simulated second.
    """

    kind: ArrivalKind
    rate: float

    def __post_init__(self) -> None:
        if self.kind not in ARRIVAL_KINDS:
            raise ValueError(f"arrivals must be constant:R or poisson:R, got kind {self.kind!r}")
        r = self.rate
        if not (isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r)
                and RATES[0] <= r <= RATES[1]):
            raise ValueError(f"arrivals rate R must be a number in [{RATES[0]:g}, "
                             f"{RATES[1]:g}] (clients per second), got {r!r}")

    def gap(self, j: int, seed: int) -> float:
        """Seconds between the ``(j - 1)``-th start and the ``j``-th (``j >= 1``; the 0-th is
        the run's start)."""
        if self.kind == "constant":
            return 1.0 / self.rate
        rng = np.random.default_rng(np.random.SeedSequence([seed, _STREAM, j]))
        return float(rng.exponential(1.0 / self.rate))

    def spec(self) -> str:
        return f"{self.kind}:{self.rate:g}"


RATES = (1e-6, 1e9)
"""The arrival rates taken (clients per simulated second): a client every 11.6 days to a
billion a second. Beyond them the simulated times overflow what the clock and the trace
represent (a rate of 1e-300 gave infinite times, found only when the trace was written)."""


def parse_arrivals(text: str | Arrivals | None) -> Arrivals | None:
    """``"constant:100"`` or ``"poisson:100"`` (clients per second), an :class:`Arrivals`, or
    None."""
    if text is None or isinstance(text, Arrivals):
        return text
    kind, sep, rate = (p.strip() for p in str(text).partition(":"))
    if not sep or kind not in ARRIVAL_KINDS:
        raise ValueError(f"arrivals must be constant:R or poisson:R (R clients per second), got "
                         f"{text!r}")
    try:
        value = float(rate)
    except ValueError:
        raise ValueError(f"arrivals rate R must be a number in [{RATES[0]:g}, {RATES[1]:g}] "
                         f"(clients per second), got {rate!r}") from None
    return Arrivals(kind, value)  # type: ignore[arg-type]
