"""How long a client's training takes, drawn per session as FLSim draws it.

FLSim, the simulator FedBuff was built with (Nguyen et al., AISTATS 2022, arXiv 2106.06639), does
not price a client's compute from its device: it draws how long each client's training lasts
from a distribution (``flsim/utils/timing/training_duration_distribution.py`` in
facebookresearch/FLSim at commit 7311f2d, read to understand, not copied), a fresh draw every
time a client trains. ``--world duration=...`` does the same for a population's clients: a
client's *session* (its ``H`` local steps of a round, or of an asynchronous server's round)
takes ``D`` seconds of compute, ``D`` drawn from (FLSim's class in brackets):

- ``halfnormal:SD[:MIN]``: ``D = MIN + |N(0, SD)|`` (``PerUserHalfNormalDurationDistribution``;
  FedBuff's Sent140 configuration is SD 1, MIN 0);
- ``gaussian:MEAN:SD[:MIN]``: ``D = max(N(MEAN, SD), MIN)`` (``PerUserGaussianDuration...``,
  ``MIN`` 0 unless given: a duration is never negative);
- ``uniform:MEAN[:MIN]``: ``D ~ U(MIN, 2 MEAN - MIN)`` (``PerUserUniformDuration...``);
- ``exponential:MEAN``: ``D ~ Exp`` of mean ``MEAN`` (``PerUserExponentialDuration...``);
- ``perexample:MEAN:SD[:MIN]``: ``D = n max(N(MEAN, SD), MIN)`` for the session's ``n``
  samples (``PerExampleGaussianDuration...``).

Each draw is seeded by ``(seed, session, client)`` (the session: the round's index, or the
asynchronous server's draw that seated the client), so it never depends on how the run is
executed or on who else trains, and a resumed run draws the same. The session's ``H`` steps
take ``D / H`` each (the seat's speed is set so), replacing the device's or the measured step
time; transfers stay the network's (FLSim has none: give a fast network to match it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["DURATION_KINDS", "Durations", "parse_durations"]

DurationKind = Literal["halfnormal", "gaussian", "uniform", "exponential", "perexample"]
DURATION_KINDS: tuple[DurationKind, ...] = ("halfnormal", "gaussian", "uniform", "exponential",
                                            "perexample")
_FORMS = {"halfnormal": "halfnormal:SD[:MIN]", "gaussian": "gaussian:MEAN:SD[:MIN]",
          "uniform": "uniform:MEAN[:MIN]", "exponential": "exponential:MEAN",
          "perexample": "perexample:MEAN:SD[:MIN]"}
_STREAM = 0xD0_5E55  # separates the duration draws from the world's other seed streams


LONGEST_S = 1e7
"""The largest MEAN, SD or MIN taken, in seconds (116 days a session, or a sample with
``perexample``): longer ones overflow the simulated clock's and the trace's times."""


@dataclass(frozen=True)
class Durations:
    """A distribution of client session durations in seconds (module docstring).

    Attributes:
        kind: one of :data:`DURATION_KINDS`.
        mean: ``MEAN`` (gaussian, uniform, exponential, perexample; seconds, per sample for
            perexample).
        sd: ``SD`` (halfnormal, gaussian, perexample).
        min: ``MIN``, the least duration (halfnormal, gaussian, uniform, perexample).
    """

    kind: DurationKind
    mean: float = 0.0
    sd: float = 0.0
    min: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in DURATION_KINDS:
            raise ValueError(f"duration must be one of {', '.join(_FORMS.values())}, got kind "
                             f"{self.kind!r}")
        for name in ("mean", "sd", "min"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool)
                    and math.isfinite(value) and 0 <= value <= LONGEST_S):
                raise ValueError(f"duration={self.spec()}: {name.upper()} must be a number in "
                                 f"[0, {LONGEST_S:g}] (seconds), got {value!r}")
        if self.kind == "halfnormal" and self.sd <= 0:
            raise ValueError(f"duration={self.spec()}: SD must be > 0")
        if self.kind in ("gaussian", "uniform", "exponential", "perexample") and self.mean <= 0:
            raise ValueError(f"duration={self.spec()}: MEAN must be > 0 (seconds)")
        if self.kind == "uniform" and self.min > self.mean:
            raise ValueError(f"duration={self.spec()}: MIN must be at most MEAN (U(MIN, "
                             "2 MEAN - MIN))")

    def draw(self, seed: int, session: int, client: int, samples: int) -> float:
        """Client ``client``'s duration in session ``session`` (seconds), its ``samples``
        samples (perexample's ``n``)."""
        rng = np.random.default_rng(np.random.SeedSequence([seed, _STREAM, session, client]))
        if self.kind == "halfnormal":
            return self.min + abs(self.sd * float(rng.standard_normal()))
        if self.kind == "gaussian":
            return max(self.mean + self.sd * float(rng.standard_normal()), self.min)
        if self.kind == "uniform":
            return float(rng.uniform(self.min, 2 * self.mean - self.min))
        if self.kind == "exponential":
            return float(rng.exponential(self.mean))
        return samples * max(self.mean + self.sd * float(rng.standard_normal()), self.min)

    def spec(self) -> str:
        """The ``duration=`` value :func:`parse_durations` reads back."""
        k = self.kind
        if k == "halfnormal":
            return f"halfnormal:{self.sd:g}:{self.min:g}"
        if k == "exponential":
            return f"exponential:{self.mean:g}"
        if k == "uniform":
            return f"uniform:{self.mean:g}:{self.min:g}"
        return f"{k}:{self.mean:g}:{self.sd:g}:{self.min:g}"

    def describe(self) -> str:
        """One line for a run's summary."""
        k = self.kind
        what = {"halfnormal": f"{self.min:g} + |N(0, {self.sd:g})| s",
                "gaussian": f"max(N({self.mean:g}, {self.sd:g}), {self.min:g}) s",
                "uniform": f"U({self.min:g}, {2 * self.mean - self.min:g}) s",
                "exponential": f"Exp(mean {self.mean:g} s)",
                "perexample": f"samples x max(N({self.mean:g}, {self.sd:g}), {self.min:g}) s"}[k]
        return f"client sessions of {what}, drawn per session"


def parse_durations(text: str) -> Durations:
    """``halfnormal:1:0``, ``gaussian:2:0.5``, ``uniform:2:1``, ``exponential:2``,
    ``perexample:0.01:0.002`` (module docstring)."""
    kind, *parts = [p.strip() for p in text.split(":")]
    if kind not in _FORMS:
        raise ValueError(f"takes one of {', '.join(_FORMS.values())} (seconds), got {text!r}")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"takes {_FORMS[kind]} with plain numbers (seconds), got "
                         f"{text!r}") from None
    counts = {"halfnormal": (1, 2), "gaussian": (2, 3), "uniform": (1, 2), "exponential": (1, 1),
              "perexample": (2, 3)}[kind]
    if not counts[0] <= len(values) <= counts[1]:
        raise ValueError(f"takes {_FORMS[kind]}, got {text!r}")
    if kind == "halfnormal":
        return Durations("halfnormal", sd=values[0], min=values[1] if len(values) > 1 else 0.0)
    if kind in ("uniform", "exponential"):
        return Durations(kind, mean=values[0],  # type: ignore[arg-type]
                         min=values[1] if len(values) > 1 else 0.0)
    return Durations(kind, mean=values[0], sd=values[1],  # type: ignore[arg-type]
                     min=values[2] if len(values) > 2 else 0.0)
