"""Conformance over the whole strategy registry (Gymnasium's check_env, for strategies): the one
place that runs it for every registered strategy.

Every registered strategy passes every check of ``exogym check`` (exogym/lab/check.py: builds,
runs, communicates, deterministic, seeds differ, engines, exact resume, absent nodes,
hyperparameters, no host sync; tests/lab/test_check.py tests that machinery itself); and, beyond
those checks, runs on each engine it is asked for (no fallback to the loop) with every node
sending bytes, and is a dataclass of exogym's strategy modules citing its paper, whose unknown
keys are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
from support.runs import check_run

from exogym.lab.check import CHECKS, check_strategy
from exogym.strategy import get, make, registry
from exogym.strategy.server import ServerStrategy
from exogym.utils.config import ConfigError

IDS = registry()


def test_registry_holds_the_core_strategies() -> None:
    assert {"ddp", "fedavg", "diloco"} <= set(IDS)


@pytest.mark.parametrize("sid", IDS)
def test_passes_every_check_of_exogym_check(sid: str) -> None:
    results = check_strategy(sid, processes=False)
    assert [r.name for r in results] == list(CHECKS)
    failed = {r.name: r.detail for r in results if r.passed is False}
    assert not failed, failed
    asynchronous = issubclass(get(sid), ServerStrategy)
    skipped = [r.name for r in results if r.passed is None]
    assert skipped == (["processes", "absent nodes"] if asynchronous else ["processes"])


@pytest.mark.parametrize("sid", IDS)
def test_runs_on_every_engine_and_every_node_sends_bytes(sid: str) -> None:
    for engine in ("loop", "vmap", "threads"):
        result = check_run(sid, engine=engine)
        assert result.engine == engine  # no fallback to the loop
        assert result.strategy == sid and result.steps == 6
        assert all(x > 0 for x in result.bytes_sent), f"{sid} on {engine}: a node sent nothing"


@pytest.mark.parametrize("sid", IDS)
def test_is_a_dataclass_citing_its_paper_that_names_unknown_keys(sid: str) -> None:
    cls = type(make(sid))
    assert dataclasses.is_dataclass(cls)
    assert cls.__module__.startswith("exogym.strategy.")
    doc = (__import__(cls.__module__, fromlist=["x"]).__doc__ or "").lower()
    assert "arxiv" in doc or "openreview" in doc, f"{sid}: module docstring cites no paper"
    with pytest.raises(ConfigError, match=r"unknown key 'optim\.lrr'"):
        make(sid, **{"optim.lrr": "0.1"})
    with pytest.raises(TypeError):
        cls(not_a_field=1)  # type: ignore[call-arg]
