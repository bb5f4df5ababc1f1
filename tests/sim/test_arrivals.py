"""FLSim's client starts (exogym.sim.arrivals): constant gaps, Poisson's exponential gaps, the
spec and its errors."""

from __future__ import annotations

import numpy as np
import pytest

from exogym.sim.arrivals import Arrivals, parse_arrivals


def test_constant_arrivals_are_1_over_r_apart() -> None:
    a = parse_arrivals("constant:4")
    assert a == Arrivals("constant", 4.0) and a.spec() == "constant:4"
    assert [a.gap(j, 0) for j in (1, 2, 99)] == [0.25, 0.25, 0.25]


def test_poisson_gaps_are_exponential_of_mean_1_over_r_and_seeded() -> None:
    a = parse_arrivals("poisson:10")
    gaps = np.array([a.gap(j, 3) for j in range(1, 20_001)])
    # mean 1/R = 0.1, SD 0.1: 5 standard errors of 20,000 draws = 0.0035
    assert gaps.mean() == pytest.approx(0.1, abs=0.0035)
    assert np.mean(gaps > 0.1) == pytest.approx(np.exp(-1), abs=0.02)  # P(gap > 1/R) = 1/e
    assert a.gap(7, 3) == a.gap(7, 3) != a.gap(7, 4)


@pytest.mark.parametrize(("text", "match"), [
    ("uniform:3", r"arrivals must be constant:R or poisson:R .*got 'uniform:3'"),
    ("poisson", r"arrivals must be constant:R or poisson:R"),
    ("poisson:x", r"rate R must be a number in \[1e-06, 1e\+09\] .*got 'x'"),
    ("constant:0", r"rate R must be a number in \[1e-06, 1e\+09\] .*got 0.0"),
    # huge or tiny but finite: the simulated times overflowed when the trace was written
    ("constant:1e-300", r"rate R must be a number in \[1e-06, 1e\+09\] .*got 1e-300"),
    ("poisson:1e300", r"rate R must be a number in \[1e-06, 1e\+09\] .*got 1e\+300"),
])
def test_bad_arrivals_are_named(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_arrivals(text)
