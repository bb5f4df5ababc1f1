"""An asynchronous server's clients starting at a rate (``arrivals``, FLSim's): the j-th client
drawn starts no sooner than the j-th arrival, times worked by hand; resume bit for bit; errors
by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.runs import client_run, resume_cut

from exogym.strategy import make


def run(**extra: Any) -> Any:
    args: dict[str, Any] = dict(nodes=40, concurrency=4, clients_in_memory="round",
                                network="datacenter", world="duration=uniform:1:1", steps=4,
                                arrivals="constant:2")
    args.update(extra)
    return client_run(make("fedbuff", H=2, K=1), **args)


def test_clients_start_at_the_arrivals_by_hand() -> None:
    """4 seats, arrivals every 0.5 s, every session exactly 1 s (U(1, 1)), H = 2, a network
    whose transfers take ~0.2 ms. The first 4 clients arrive at 0.5, 1, 1.5, 2 s and push at
    1.5, 2, 2.5, 3 s; each push's replacement is the next arrival: 2.5, 3, 3.5, 4 s. Seat 0
    idles 0.5 s, then 1 s waiting for client 5, trains 2.5-3.5 s (its 4th step, the run's
    end once seat 3's client arrives at 4 s), then 0.5 s to the end: 2 s of idle."""
    r = run()
    assert r.clock is not None
    assert r.clock.node_compute_s == pytest.approx((2.0, 1.5, 1.0, 1.0), abs=1e-9)
    assert r.clock.node_idle_s == pytest.approx((2.0, 2.5, 3.0, 3.0), abs=2e-3)
    assert r.clock.total_s == pytest.approx(4.0, abs=2e-3)
    assert r.asynchronous is not None and r.asynchronous["node_steps"] == [4, 3, 2, 2]


def test_without_arrivals_a_client_starts_when_its_seat_is_free() -> None:
    r = run(arrivals=None)
    assert r.clock is not None and r.clock.node_idle_s[0] == pytest.approx(0.0, abs=2e-3)


def test_a_run_with_poisson_arrivals_resumes_bit_for_bit(tmp_path: Path) -> None:
    full = run(arrivals="poisson:3", steps=10, out_dir=tmp_path / "full", checkpoint_every=4,
               keep_checkpoints=4)
    again = resume_cut(tmp_path / "full", tmp_path / "cut", (8, 10))
    assert again.resumed_from["step"] == 4
    assert again.history == full.history or [
        {k: v for k, v in r.items() if k != "wall_s"} for r in again.history] == [
        {k: v for k, v in r.items() if k != "wall_s"} for r in full.history]
    assert again.rounds == full.rounds and again.clock.total_s == full.clock.total_s


def test_arrivals_need_an_asynchronous_server_s_concurrency() -> None:
    with pytest.raises(ValueError, match="start an asynchronous server's clients at a rate: "
                                         "give the run concurrency=C"):
        client_run(make("fedavg", H=2), nodes=40, participation=4, arrivals="poisson:3")
