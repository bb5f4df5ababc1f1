"""Client session durations as FLSim draws them (exogym.sim.durations): the distributions'
laws, the per-session seeding, the spec round trip and the errors; in a run, a population's
client trains its round in its drawn seconds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from exogym.sim.durations import Durations, parse_durations
from exogym.sim.world import parse_world


def _many(d: Durations, n: int = 20_000, samples: int = 1) -> np.ndarray:
    return np.array([d.draw(0, s, 7, samples) for s in range(n)])


def test_the_laws_of_flsim_s_distributions() -> None:
    """20,000 seeded draws (fixed: the same numbers on every run); the tolerances are about 5
    standard errors of each mean (SD / sqrt(20,000) = 0.007 SD)."""
    half = _many(parse_durations("halfnormal:1:0.5"))
    assert half.min() >= 0.5  # MIN + |N(0, SD)|: mean MIN + SD sqrt(2 / pi) = 1.2979
    assert half.mean() == pytest.approx(0.5 + math.sqrt(2 / math.pi), abs=0.03)
    uni = _many(parse_durations("uniform:2:1"))  # U(MIN, 2 MEAN - MIN) = U(1, 3)
    assert uni.min() >= 1 and uni.max() <= 3 and uni.mean() == pytest.approx(2.0, abs=0.03)
    exp = _many(parse_durations("exponential:2"))
    assert exp.mean() == pytest.approx(2.0, abs=0.07)
    gauss = _many(parse_durations("gaussian:1:1"))  # max(N(1, 1), 0): P(0) = Phi(-1) = 0.1587
    assert gauss.min() == 0.0 and np.mean(gauss == 0.0) == pytest.approx(0.1587, abs=0.013)


def test_a_session_s_draw_is_its_own_and_per_example_scales_with_samples() -> None:
    d = parse_durations("halfnormal:1")
    assert d.draw(3, 5, 11, 1) == d.draw(3, 5, 11, 99)  # per user: samples do not matter
    assert len({d.draw(3, s, 11, 1) for s in range(10)}) == 10  # a fresh draw per session
    assert d.draw(3, 5, 11, 1) != d.draw(4, 5, 11, 1) != d.draw(3, 5, 12, 1)
    per = parse_durations("perexample:0.01:0.002")
    assert per.draw(0, 1, 2, 80) == pytest.approx(80 * per.draw(0, 1, 2, 1), rel=1e-12)
    assert parse_durations("uniform:2:2").draw(0, 0, 0, 1) == 2.0  # U(2, 2): exactly 2 s


@pytest.mark.parametrize("text", ["halfnormal:1:0", "gaussian:2:0.5:0.1", "uniform:2:1",
                                  "exponential:3", "perexample:0.01:0.002:0"])
def test_the_spec_reads_back(text: str) -> None:
    d = parse_durations(text)
    assert parse_durations(d.spec()) == d
    world = parse_world(f"duration={text},seed=4")
    assert world.duration == d and parse_world(world.spec()) == world
    assert "drawn per session" in world.describe()


@pytest.mark.parametrize(("text", "match"), [
    ("lognormal:1", r"takes one of halfnormal:SD\[:MIN\], .*got 'lognormal:1'"),
    ("halfnormal", r"takes halfnormal:SD\[:MIN\], got 'halfnormal'"),
    ("halfnormal:0", "SD must be > 0"),
    ("uniform:1:2", "MIN must be at most MEAN"),
    ("exponential:-1", r"MEAN must be a number in \[0, 1e\+07\] \(seconds\), got -1"),
    # huge but finite: the simulated times overflowed when the trace was written
    ("halfnormal:1e300:0", r"SD must be a number in \[0, 1e\+07\] \(seconds\), got 1e\+300"),
    ("perexample:1e8:1", r"MEAN must be a number in \[0, 1e\+07\]"),
    ("gaussian:a:1", r"takes gaussian:MEAN:SD\[:MIN\] with plain numbers"),
])
def test_bad_durations_are_named(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_durations(text)


def test_a_duration_replaces_speeds_and_is_a_population_s() -> None:
    with pytest.raises(ValueError, match="give duration= or a speed, not both"):
        parse_world("duration=halfnormal:1,speed_sigma=0.5")
    from support.runs import client_run

    from exogym.strategy import make

    with pytest.raises(ValueError, match="draws a population's client sessions: give the run "
                                         "participation=K"):
        client_run(make("fedavg", H=3), world="duration=halfnormal:1")
    with pytest.raises(ValueError, match="compute='measured' would rescale them"):
        client_run(make("fedavg", H=3), nodes=40, participation=4, clients_in_memory="round",
                   world="duration=halfnormal:1", step_time=None, compute="measured")


def test_a_client_trains_its_round_in_its_drawn_seconds() -> None:
    """FedAvg, H = 3, 4 clients a round over 2 rounds, every session exactly 2 s (U(2, 2)): each
    seat computes 2 x 2 = 4 s whatever the step time (0.1 s here), the rest is the network's."""
    from support.runs import client_run

    from exogym.strategy import make

    r = client_run(make("fedavg", H=3), nodes=40, participation=4, clients_in_memory="round",
                   network="datacenter", world="duration=uniform:2:2", steps=6)
    assert r.clock is not None
    assert r.clock.node_compute_s == pytest.approx((4.0,) * 4, rel=1e-12)
    assert r.clock.total_s == pytest.approx(4.0, abs=1e-2)
    assert r.world is not None and r.world["spec"] == "duration=uniform:2:2"
