"""A world fuzzer: property-based runs (hypothesis) of drawn worlds x every registered strategy x
engines. Each run must finish or stop with a clear error raised by exogym (never an internal
exception), charge no bytes to a node while it is down, and resume bit for bit from a checkpoint
taken mid-run.

The budget is small by default (CI); ``EXOGYM_FUZZ_EXAMPLES=500`` runs a large one with a random
seed (docs/design/world.md, "The world fuzzer", records what it found). A failure prints the drawn
example, which reproduces it.
"""

from __future__ import annotations

import os
import re
import shutil
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.resume_cases import Net, data
from support.runs import small

from exogym import Trainer
from exogym.run.output.checkpoint import load_checkpoint
from exogym.sim.world import parse_world
from exogym.strategy import get, make, registry
from exogym.strategy.server import ServerStrategy

EXAMPLES = int(os.environ.get("EXOGYM_FUZZ_EXAMPLES", "12"))
BIG = EXAMPLES > 50
STEPS, CHECKPOINT_AT, STEP_TIME = 8, 4, 0.1
WALL = {"wall_s", "train_time_s", "wall_time_s", "samples_per_s", "out_dir"}
ALLOWED = (ValueError, RuntimeError)  # exogym's own errors for worlds it refuses or gives up on


@dataclass(frozen=True)
class Drawn:
    strategy: str
    engine: str
    nodes: int
    world: str
    deadline: str | None
    participation: int | float | None = None

    def describe(self) -> str:
        return (f"strategy={self.strategy} engine={self.engine} nodes={self.nodes} "
                f"world={self.world!r} deadline={self.deadline!r} "
                f"participation={self.participation!r}")


@st.composite
def worlds(draw: st.DrawFn) -> Drawn:
    n = draw(st.integers(2, 4))
    deadline = draw(st.sampled_from([None, None, "2x", "1.5x"]))
    return Drawn(strategy=draw(st.sampled_from(registry())),
                 engine=draw(st.sampled_from(["loop", "vmap", "threads"])), nodes=n,
                 world=_world(draw, n), deadline=deadline,
                 participation=draw(st.sampled_from([None, None, None, 1, 0.5])))


@st.composite
def paged_worlds(draw: st.DrawFn) -> Drawn:
    """Worlds of 16 nodes for synchronous strategies (paged in groups of 8); one draw in two a
    perfect world on the threads engine with no deadline, where local-SGD methods page once
    per round."""
    sync = [s for s in registry() if not issubclass(get(s), ServerStrategy)]
    strategy = draw(st.sampled_from(sync))
    participation = draw(st.sampled_from([None, None, 5]))
    if draw(st.booleans()):
        return Drawn(strategy=strategy, engine="threads", nodes=16,
                     world=f"seed={draw(st.integers(0, 3))}", deadline=None,
                     participation=participation)
    return Drawn(strategy=strategy, engine=draw(st.sampled_from(["loop", "threads"])), nodes=16,
                 world=_world(draw, 16), deadline=draw(st.sampled_from([None, "2x"])),
                 participation=participation)


def _world(draw: st.DrawFn, n: int) -> str:
    items: list[str] = []
    if draw(st.booleans()):
        speeds = draw(st.lists(st.sampled_from([1, 0.8, 0.5, 0.3]), min_size=n, max_size=n))
        items.append("speed=" + ":".join(str(v) for v in speeds))
    if draw(st.booleans()):  # failures and repairs of about a few steps (0.1 s each)
        items.append(f"mtbf={draw(st.sampled_from(['0.2s', '0.5s', '2s']))}")
        items.append(f"mttr={draw(st.sampled_from(['0.05s', '0.3s', '1s']))}")
    for _ in range(draw(st.integers(0, 2))):  # explicit failures, by step or by time
        node = draw(st.integers(0, n - 1))
        if draw(st.booleans()):
            fail = draw(st.integers(0, STEPS - 1))
            back = str(draw(st.integers(fail + 1, STEPS + 1)))
            when = str(fail)
        else:
            when = draw(st.sampled_from(["0.05s", "0.25s", "0.5s"]))
            back = draw(st.sampled_from(["0.6s", "1.2s"]))
        items.append(f"fail={node}@{when}")
        if draw(st.booleans()):
            items.append(f"rejoin={node}@{back}")
    if draw(st.booleans()):
        items.append(f"drop={draw(st.sampled_from([0.1, 0.5]))}")
    if draw(st.booleans()):
        items.append(f"min_nodes={draw(st.integers(1, n))}")
    items.append(f"seed={draw(st.integers(0, 3))}")
    return ",".join(items)


def _fit(d: Drawn, out_dir: Path | None, resume: Path | None = None, **more: Any) -> Any:
    torch.manual_seed(1)
    trainer = Trainer(Net(), data(), data())
    if resume is not None:
        return trainer.fit(resume=resume, progress=False)
    overrides = dict(small(d.strategy))
    if d.deadline is not None:
        overrides["deadline"] = d.deadline
    return trainer.fit(
        strategy=make(d.strategy, **overrides), num_nodes=d.nodes, max_steps=STEPS,
        batch_size=4, log_interval=1, eval_interval=4, eval_samples=20, engine=d.engine,
        network="home-100mbps", step_time=STEP_TIME, seed=3, world=d.world,
        participation=d.participation,
        out_dir=out_dir, checkpoint_every=CHECKPOINT_AT if out_dir else None,
        keep_checkpoints=3, allow_unsynced=True, allow_nonfinite=True, progress=False, **more)


def _clear(err: BaseException) -> bool:
    """An error exogym raised on purpose: an allowed type, raised in exogym's own code, with a
    message that says something."""
    if not isinstance(err, ALLOWED) or len(str(err)) < 20:
        return False
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and f"{os.sep}exogym{os.sep}" in frames[-1].filename


def _down_steps(events: list[dict[str, Any]], n: int) -> list[set[int]]:
    """The steps at which each node was down, from the run's fail / rejoin events."""
    down: list[set[int]] = [set() for _ in range(n)]
    since: dict[int, int] = {}
    for e in events:
        if e["event"] == "fail":
            since[e["node"]] = e["step"]
        elif e["event"] == "rejoin" and e["node"] in since:
            down[e["node"]].update(range(since.pop(e["node"]), e["step"]))
    for node, s in since.items():
        down[node].update(range(s, STEPS))
    return down


def _check_no_bytes_while_down(result: Any, n: int) -> None:
    down = _down_steps(result.events, n)
    for rec in result.comm_log:
        for node in range(n):
            if rec.step not in down[node]:
                continue
            member = rec.members == -1 or bool(rec.members >> node & 1)
            assert not member and node not in (rec.src, getattr(rec, "dst", -1)), (
                f"node {node} is down at step {rec.step} but takes part in {rec}")


def _strip(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in WALL} for r in rows]


def _check_resume(d: Drawn, full: Path, result: Any, tmp: Path) -> None:
    cut = tmp / "cut"
    shutil.copytree(full, cut)
    shutil.rmtree(cut / "checkpoints" / f"step-{STEPS:08d}")
    (cut / "summary.json").unlink()
    again = _fit(d, cut, resume=cut)
    assert _strip(again.history) == _strip(result.history)
    assert again.bytes_sent == result.bytes_sent and again.events == result.events
    assert again.clock == result.clock
    a, b = result.model.state_dict(), again.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    end_a, _ = load_checkpoint(full)
    end_b, _ = load_checkpoint(cut)
    assert end_a.keys() == end_b.keys()


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not BIG, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(d=worlds())
def test_drawn_worlds_finish_or_stop_clearly_charge_no_down_node_and_resume(
        d: Drawn, tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("fuzz")
    full = tmp / "full"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short runs, engine fallbacks: not what is tested
        try:
            result = _fit(d, full)
        except BaseException as err:
            if _clear(err):
                return
            raise AssertionError(f"{d.describe()}: unclear error {type(err).__name__}: "
                                 f"{err}") from err
        _check_no_bytes_while_down(result, d.nodes)
        _check_resume(d, full, result, tmp)


def test_every_node_down_at_once_waits_and_the_last_to_fail_goes_on_from_its_own_state() -> None:
    # 0.1 s a step: node 0 fails at 0.25 s (before its step at 0.3 s), node 1 at 0.35 s: nobody
    # is up, the run jumps to the next return (min_nodes=1). Node 0 is back at 1 s with no live
    # peer: it goes on from its own state (an event, no recovery); node 1, back at 1.2 s,
    # recovers from it (before: the recovery looked for a live donor that did not exist).
    torch.manual_seed(1)
    r = Trainer(Net(), data(), data()).fit(
        strategy=make("diloco", H=2), num_nodes=2, max_steps=20, batch_size=4,
        network="home-100mbps", step_time=0.1, world="fail=0@0.25s,fail=1@0.35s,"
        "rejoin=0@1s,rejoin=1@1.2s", progress=False)
    kinds = [(e["event"], e["node"]) for e in r.events]
    assert kinds == [("fail", 0), ("fail", 1), ("rejoin", 0), ("resume_own", 0),
                     ("rejoin", 1), ("recovery", 1)]
    assert [e["step"] for e in r.events][:2] == [3, 4]
    assert r.world["recoveries"] == 1
    assert [e["donor"] for e in r.events if e["event"] == "recovery"] == [0]


def test_a_rejoin_in_another_unit_than_its_failure_is_refused_by_name() -> None:
    # fail by step, rejoin by time: the failure would never end (each unit is its own source)
    with pytest.raises(ValueError, match=r"rejoin=0@1.0s ends no failure of node 0 given by "
                                         r"time \(its failure fail=0@2 is by step"):
        parse_world("fail=0@2,rejoin=0@1s")
    with pytest.raises(ValueError, match=r"rejoin=1@5 ends no failure of node 1 given by step"):
        parse_world("rejoin=1@5")
    assert parse_world("fail=0@2,rejoin=0@5,fail=1@1s,rejoin=1@2s").events


@settings(max_examples=max(EXAMPLES // 2, 4), deadline=None, derandomize=not BIG, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(d=paged_worlds())
def test_drawn_worlds_paged_give_the_in_memory_numbers(d: Drawn) -> None:
    """The same drawn world, every node in memory and paged in groups of 8
    (exogym.run.nodes.paging): the same rows, events, bytes, clock and model, or the same clear
    error."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:  # a row per client, as paging holds them (tests/run/test_population.py: seats)
            a = _fit(d, None, clients_in_memory="all")
        except BaseException as err:
            if not _clear(err):
                raise AssertionError(f"{d.describe()}: unclear error {err!r}") from err
            with pytest.raises(type(err), match=re.escape(str(err))):
                _fit(d, None, resident=8, offload="disk")
            return
        b = _fit(d, None, resident=8, offload="disk")
    assert _strip(b.history) == _strip(a.history), d.describe()
    assert b.paging is not None and a.paging is None
    assert b.events == a.events and b.bytes_sent == a.bytes_sent and b.clock == a.clock
    assert b.bytes_received == a.bytes_received and b.comm_log == a.comm_log
    ma, mb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(ma[k], mb[k]) for k in ma), d.describe()
