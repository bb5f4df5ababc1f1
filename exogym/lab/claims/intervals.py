"""``claims-v1``'s statistics: a t-interval on a rule's per-seed paired statistic, equivalence
decided by the whole interval inside a margin, and the seeds a rule's smallest effect needs.

Per seed ``s`` a rule compares the two configurations trained with that seed (the same data
order and initial model): ``d_s = m_a(s) - m_b(s)`` or ``m_a(s) / m_b(s)``
(:func:`exogym.lab.claims.stats.per_seed`). Its interval is Student's ``t`` interval of the mean
of the ``d_s``: ``mean +- t(n-1) s / sqrt(n)`` (:func:`t_interval`), whose 95% covers the true mean
95% of the time on normal per-seed values whatever their spread, and 91.6% of the time on
lognormal ones of sigma 0.5 at 5 seeds (tests/lab/test_claims_v1.py checks both by simulation).
``claims-v0``'s percentile bootstrap of 3 to 5 seeds covered about 75 to 85%: with 3 seeds its
interval is the smallest and largest value.

``t``'s quantiles are exact for the integer degrees of freedom a suite has (:func:`t_quantile`:
the distribution function's closed form for an integer ``nu``, Abramowitz and Stegun 26.7.3 and
26.7.4, inverted by bisection), so no SciPy is needed.

A rule is one of three kinds (:class:`exogym.lab.claims.spec.Rule`):

- **superiority**: the claim says the mean is on one side of a threshold: ``reproduced`` when
  the whole interval is there, ``not reproduced`` when the whole interval is on the other side,
  else ``inconclusive`` (:func:`superiority`);
- **equivalence** ("matches"): ``reproduced`` when the whole interval lies inside the margin
  ``[low, high]`` (two one-sided tests at 2.5% each), ``not reproduced`` when the whole interval
  lies outside it, else ``inconclusive`` (:func:`equivalence`);
- **reported**: a quantity the configuration fixes (the bytes of a fixed schedule): its value
  is shown beside the verdict and never counts as evidence.

Seeds by power (:func:`seeds_for`): the pilot seeds (recorded, never part of a verdict) give the
spread ``sd`` of the per-seed statistic; a rule whose smallest effect of interest is ``delta``
needs the least ``n`` with ``(t_{0.975}(n-1) + t_{0.8}(n-1)) sd / sqrt(n) <= delta``: 80% power
to tell an effect of ``delta`` at the 95% level.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from exogym.lab.claims.stats import RuleOutcome, Verdict

__all__ = ["LEVEL", "POWER", "equivalence", "seeds_for", "superiority", "t_interval",
           "t_quantile"]

LEVEL = 0.95
"""Every rule's interval: 95%."""
POWER = 0.8
"""The power the test seeds are chosen for (:func:`seeds_for`)."""


def _two_sided(t: float, nu: int) -> float:
    """``P(|T| <= t)`` for Student's ``T`` with ``nu`` (an integer >= 1) degrees of freedom, in
    closed form (Abramowitz and Stegun 26.7.3, 26.7.4): with ``theta = atan(t / sqrt(nu))``, a
    finite sum of powers of ``cos(theta)``."""
    theta = math.atan(abs(t) / math.sqrt(nu))
    c, s = math.cos(theta), math.sin(theta)
    if nu == 1:
        return 2 * theta / math.pi
    term = total = 1.0
    if nu % 2:  # odd: 2/pi (theta + s c (1 + 2/3 c^2 + 2.4/(3.5) c^4 + ...)), nu - 3 in all
        for k in range(1, (nu - 1) // 2):
            term *= 2 * k / (2 * k + 1) * c * c
            total += term
        return 2 / math.pi * (theta + s * c * total)
    for k in range(1, nu // 2):  # even: s (1 + 1/2 c^2 + 1.3/(2.4) c^4 + ...), nu - 2 in all
        term *= (2 * k - 1) / (2 * k) * c * c
        total += term
    return s * total


@functools.lru_cache(maxsize=256)
def t_quantile(level: float, nu: int) -> float:
    """The ``q`` with ``P(|T| <= q) = level`` for Student's ``T`` with ``nu`` degrees of freedom
    (``level`` 0.95: the 97.5% quantile), by bisection to machine precision."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if isinstance(nu, bool) or not isinstance(nu, int) or nu < 1:
        raise ValueError(f"degrees of freedom must be an integer >= 1, got {nu!r}")
    lo, hi = 0.0, 1.0
    while _two_sided(hi, nu) < level:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if _two_sided(mid, nu) < level else (lo, mid)
    return (lo + hi) / 2


def t_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """Student's ``level`` interval of the mean of ``values`` (at least 2, finite)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        raise ValueError(f"a t-interval needs 2 values or more, got {x.size}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"a t-interval needs finite values, got {list(values)}")
    mean = float(x.mean())
    half = t_quantile(level, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean - half, mean + half


def _outcome(values: Sequence[float]) -> tuple[tuple[float, ...], RuleOutcome | None]:
    """The values as floats, and the outcome already decided (one seed, or a value that is not
    a number), else None."""
    vals = tuple(float(v) for v in values)
    if len(vals) < 2:
        return vals, RuleOutcome(vals, float(np.mean(vals)) if vals else math.nan,
                                 (math.nan, math.nan), "not decided")
    if not all(math.isfinite(v) for v in vals):
        return vals, RuleOutcome(vals, math.nan, (math.nan, math.nan), "inconclusive")
    return vals, None


def superiority(values: Sequence[float], side: str, threshold: float) -> RuleOutcome:
    """The claim: the mean of ``values`` is ``side`` (``"below"``/``"above"``) of
    ``threshold`` (the module docstring)."""
    if side not in ("below", "above"):
        raise ValueError(f"side must be 'below' or 'above', got {side!r}")
    vals, done = _outcome(values)
    if done is not None:
        return done
    lo, hi = t_interval(vals)
    claimed, other = ((hi < threshold, lo >= threshold) if side == "below"
                      else (lo > threshold, hi <= threshold))
    verdict: Verdict = "reproduced" if claimed else "not reproduced" if other else "inconclusive"
    return RuleOutcome(vals, float(np.mean(vals)), (lo, hi), verdict)


def equivalence(values: Sequence[float], low: float, high: float) -> RuleOutcome:
    """The claim: the mean of ``values`` lies within ``[low, high]`` (a "matches" claim's
    margin): the whole interval inside, reproduced; wholly outside, not reproduced."""
    if not low < high:
        raise ValueError(f"an equivalence margin needs low < high, got [{low}, {high}]")
    vals, done = _outcome(values)
    if done is not None:
        return done
    lo, hi = t_interval(vals)
    verdict: Verdict = ("reproduced" if low <= lo and hi <= high
                        else "not reproduced" if hi < low or lo > high else "inconclusive")
    return RuleOutcome(vals, float(np.mean(vals)), (lo, hi), verdict)


def seeds_for(sd: float, effect: float, *, least: int = 5, most: int = 12) -> tuple[int, bool]:
    """The test seeds that resolve an effect of ``effect`` when the per-seed statistic's spread
    is ``sd`` (module docstring), at least ``least`` and at most ``most``; and whether ``most``
    suffices (False: the rule is underpowered at the suite's budget)."""
    if not (math.isfinite(effect) and effect > 0):
        raise ValueError(f"the smallest effect of interest must be > 0, got {effect!r}")
    if not (math.isfinite(sd) and sd >= 0):
        raise ValueError(f"the pilot's spread must be a finite number >= 0, got {sd!r}")
    for n in range(max(least, 2), most + 1):
        needed = (t_quantile(LEVEL, n - 1) + t_quantile(2 * POWER - 1, n - 1)) * sd
        if needed / math.sqrt(n) <= effect:
            return n, True
    return most, False
