"""A rule's statistic over seeds, its bootstrap 95% confidence interval and the verdict.

Per seed ``s`` the rule compares the two configurations trained with that seed (paired: the
same data order, the same initial model): ``d_s = m_a(s) - m_b(s)`` or ``m_a(s) / m_b(s)``.
The statistic is the mean of the ``d_s``; its 95% CI is the percentile bootstrap (Efron and
Tibshirani 1993, ch. 13): 10,000 resamples of the seeds with replacement, drawn from a fixed
generator (the same CI for the same runs, always), the 2.5% and 97.5% quantiles of the resampled
means (no interpolation: with 3 to 5 seeds the resampled means take few values). One seed
(``--quick``: a check of the machinery) has no interval and no verdict: ``not decided``.

The verdict of a rule (:class:`~exogym.lab.claims.spec.Rule`): ``reproduced`` when the whole
CI is on the claimed side of the threshold, ``not reproduced`` when the whole CI is on the other
side, else ``inconclusive``; a per-seed value that is not a number (``inf - inf``: neither run
reached a target) makes the rule inconclusive. A claim's verdict: every rule reproduced,
``reproduced``; any not reproduced, ``not reproduced``; any not decided (one seed), ``not
decided``; else ``inconclusive``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["RESAMPLES", "RuleOutcome", "Verdict", "bootstrap_ci", "claim_verdict", "decide",
           "per_seed"]

Verdict = Literal["reproduced", "not reproduced", "inconclusive", "not decided", "reported"]
RESAMPLES = 10_000


def per_seed(a: Sequence[float], b: Sequence[float], form: str) -> list[float]:
    """``a[s] - b[s]`` or ``a[s] / b[s]`` for each seed ``s``."""
    if len(a) != len(b):
        raise ValueError(f"paired values: {len(a)} against {len(b)}")
    if form == "diff":
        return [x - y for x, y in zip(a, b, strict=True)]
    out = []
    for x, y in zip(a, b, strict=True):
        if y == 0:
            out.append(math.nan if x == 0 else math.copysign(math.inf, x))
        else:
            out.append(x / y)
    return out


def bootstrap_ci(values: Sequence[float], *, level: float = 0.95,
                 resamples: int = RESAMPLES, seed: int = 0,
                 statistic: Literal["mean", "median"] = "mean") -> tuple[float, float]:
    """The percentile bootstrap ``level`` interval of the mean (or the median: benchmarks'
    per-round ratios, ``bench/node_step.py``) of ``values`` (module docstring)."""
    if statistic not in ("mean", "median"):
        raise ValueError(f"statistic must be 'mean' or 'median', got {statistic!r}")
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no values to bootstrap")
    if x.size == 1 or np.all(x == x[0]):
        return float(x[0]), float(x[0])
    idx = np.random.default_rng(seed).integers(0, x.size, size=(resamples, x.size))
    with np.errstate(invalid="ignore"):
        stats = x[idx].mean(axis=1) if statistic == "mean" else np.median(x[idx], axis=1)
    tail = (1 - level) / 2
    lo, hi = np.quantile(stats, [tail, 1 - tail], method="inverted_cdf")
    return float(lo), float(hi)


@dataclass(frozen=True)
class RuleOutcome:
    """A rule decided: the per-seed values, their mean and CI, the verdict."""

    values: tuple[float, ...]
    mean: float
    ci: tuple[float, float]
    verdict: Verdict


def decide(values: Sequence[float], side: str, threshold: float) -> RuleOutcome:
    """The verdict of a rule whose per-seed values are ``values`` (module docstring)."""
    vals = tuple(float(v) for v in values)
    if len(vals) < 2:  # one seed: a value, no interval, no verdict
        return RuleOutcome(vals, float(np.mean(vals)) if vals else math.nan,
                           (math.nan, math.nan), "not decided")
    if any(math.isnan(v) for v in vals):
        return RuleOutcome(vals, math.nan, (math.nan, math.nan), "inconclusive")
    mean = float(np.mean(vals))
    lo, hi = bootstrap_ci(vals)
    claimed, other = (hi < threshold, lo >= threshold) if side == "below" else (
        lo > threshold, hi <= threshold)
    verdict: Verdict = ("reproduced" if claimed else "not reproduced" if other
                        else "inconclusive")
    return RuleOutcome(vals, mean, (lo, hi), verdict)


def claim_verdict(verdicts: Sequence[Verdict]) -> Verdict:
    """Every rule reproduced: reproduced; any not reproduced: not reproduced; else
    inconclusive; any not decided (one seed), not decided."""
    if any(v == "not decided" for v in verdicts):
        return "not decided"
    if all(v == "reproduced" for v in verdicts):
        return "reproduced"
    if any(v == "not reproduced" for v in verdicts):
        return "not reproduced"
    return "inconclusive"
