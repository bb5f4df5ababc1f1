"""Conformance over the whole strategy registry (Gymnasium's check_env, for strategies).

Every registered strategy: builds from its defaults, runs a few steps through the Trainer, is
deterministic under a seed, reports bytes when it synchronises, rejects a misspelled
hyperparameter, and gives the same numbers with the loop, vmap and threads engines.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from exogym import Trainer
from exogym.lab.check import TinyNet, short_period, tiny_data
from exogym.strategy import describe, get, make, registry
from exogym.utils.config import ConfigError

IDS = registry()


def small(sid: str) -> dict[str, Any]:
    """Overrides that make a strategy synchronise within a 6-step run (``exogym check``'s)."""
    return short_period(get(sid))


Net, data = TinyNet, tiny_data  # exogym check's model and data


def fit(sid: str, *, seed: int = 0, engine: str = "loop", dtype: torch.dtype = torch.float32):
    torch.manual_seed(1)
    model = Net().to(dtype)
    return Trainer(model, data(dtype), data(dtype)).fit(
        strategy=make(sid, **small(sid)), num_nodes=3, max_steps=6, batch_size=8,
        eval_interval=3, log_interval=1, engine=engine, seed=seed,  # type: ignore[arg-type]
        progress=False,
    )


def test_registry_holds_the_core_strategies() -> None:
    assert {"ddp", "fedavg", "diloco"} <= set(IDS)


@pytest.mark.parametrize("sid", IDS)
def test_runs_reports_bytes_and_is_deterministic(sid: str) -> None:
    a, b = fit(sid), fit(sid)
    assert a.strategy == sid and a.steps == 6
    assert all(x > 0 for x in a.bytes_sent), f"{sid} sent nothing in 6 steps"
    assert len(a.comm_log) > 0
    measured = ("wall_s", "sim_time_s")  # this machine's timings, not the run's numbers
    strip = [{k: v for k, v in row.items() if k not in measured} for row in a.history]
    assert strip == [{k: v for k, v in row.items() if k not in measured} for row in b.history]
    for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert a.bytes_sent == b.bytes_sent
    c = fit(sid, seed=1)
    assert [r["train_loss"] for r in c.history] != [r["train_loss"] for r in a.history]


@pytest.mark.parametrize("sid", IDS)
def test_rejects_a_misspelled_hyperparameter(sid: str) -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'optim\.lrr'"):
        make(sid, **{"optim.lrr": "0.1"})
    cls = type(make(sid))
    with pytest.raises(TypeError):
        cls(not_a_field=1)  # type: ignore[call-arg]


@pytest.mark.parametrize("sid", IDS)
def test_every_hyperparameter_is_documented(sid: str) -> None:
    undocumented = [k for k, (_t, _d, doc) in describe(sid).items() if not doc]
    assert not undocumented, f"{sid}: fields without a docstring entry: {undocumented}"
    cls = type(make(sid))
    assert cls.__module__.startswith("exogym.strategy.")
    doc = (__import__(cls.__module__, fromlist=["x"]).__doc__ or "").lower()
    assert "arxiv" in doc or "openreview" in doc, f"{sid}: module docstring cites no paper"
    assert dataclasses.is_dataclass(cls)


@pytest.mark.parametrize("engine", ["vmap", "threads"])
@pytest.mark.parametrize("sid", IDS)
def test_loop_and_other_engines_agree(sid: str, engine: str) -> None:
    loop = fit(sid, engine="loop", dtype=torch.float64)
    other = fit(sid, engine=engine, dtype=torch.float64)
    assert other.engine == engine
    for p, q in zip(loop.model.parameters(), other.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0)
    assert loop.bytes_sent == other.bytes_sent
