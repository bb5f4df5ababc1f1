"""Conformance over the whole strategy registry (Gymnasium's check_env, for strategies).

Every registered strategy: builds from its defaults, runs a few steps through the Trainer, is
deterministic under a seed, reports bytes when it synchronises, rejects a misspelled
hyperparameter, and gives the same numbers with the loop, vmap and threads engines.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support.runs import check_run

from exogym.strategy import describe, make, registry
from exogym.utils.config import ConfigError

IDS = registry()


def test_registry_holds_the_core_strategies() -> None:
    assert {"ddp", "fedavg", "diloco"} <= set(IDS)


@pytest.mark.parametrize("sid", IDS)
def test_runs_reports_bytes_and_is_deterministic(sid: str) -> None:
    a, b = check_run(sid), check_run(sid)
    assert a.strategy == sid and a.steps == 6
    assert all(x > 0 for x in a.bytes_sent), f"{sid} sent nothing in 6 steps"
    assert len(a.comm_log) > 0
    measured = ("wall_s", "sim_time_s")  # this machine's timings, not the run's numbers
    strip = [{k: v for k, v in row.items() if k not in measured} for row in a.history]
    assert strip == [{k: v for k, v in row.items() if k not in measured} for row in b.history]
    for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert a.bytes_sent == b.bytes_sent
    c = check_run(sid, seed=1)
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
    loop = check_run(sid, engine="loop", dtype=torch.float64)
    other = check_run(sid, engine=engine, dtype=torch.float64)
    assert other.engine == engine
    for p, q in zip(loop.model.parameters(), other.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0)
    assert loop.bytes_sent == other.bytes_sent
