"""A run's timeline: the clock's spans, the Chrome trace (trace.json), its picture (timeline.png),
``exogym trace`` rebuilding it from a finished run's folder, and a real process run's trace."""

from __future__ import annotations

import json
import math
import shutil
import sys
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from support.runs import WorldNet, fedscale_round_run, world_data, world_run
from support.toy_task import toy_task_source

from exogym import Trainer
from exogym.cli import main
from exogym.lab.compare import compare
from exogym.lab.sweep import sweep
from exogym.run.launch import fit_processes
from exogym.run.output.trace import MAX_BYTES, run_trace
from exogym.sim.clock import ClockTrace
from exogym.sim.comm import CommRecord
from exogym.sim.network import Network
from exogym.sim.spans import KINDS, SpanLog
from exogym.strategy import DDP, DiLoCo, make

pytestmark = pytest.mark.usefixtures("single_thread")

PH = {"X", "i", "M", "s", "f"}  # the event types exogym writes
WORLD = "speed=1:1:1:0.25,fail=1@4,rejoin=1@7"


def fit(out: Path | None, strategy: Any, world: str | None, **kw: Any) -> Any:
    """test_world.py's run (:func:`support.runs.world_run`) with batch 2 and the model drawn
    after seed 0, into ``out``."""
    return world_run(strategy, world, out_dir=out, **{"batch_size": 2, "model_seed": 0, **kw})


def net() -> WorldNet:
    return WorldNet(seed=0)


# -- checks of the format ------------------------------------------------------------------------
def validate(trace: dict[str, Any]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """Check ``trace`` as a Chrome trace (JSON object form) and return its X spans per track
    (process, thread) in order. Raises AssertionError naming what is wrong."""
    assert set(trace) >= {"traceEvents", "displayTimeUnit"}, sorted(trace)
    assert trace["displayTimeUnit"] in ("ms", "ns")
    assert json.loads(json.dumps(trace)) == trace  # plain JSON, no NaN
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    last: dict[tuple[int, int], float] = {}
    flows: dict[int, list[str]] = defaultdict(list)
    named = set()
    for e in trace["traceEvents"]:
        assert e["ph"] in PH, e
        assert {"name", "ph", "pid", "tid"} <= set(e), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name"), e
            named.add((e["name"], e["pid"]))
            continue
        assert isinstance(e["ts"], float | int) and math.isfinite(e["ts"]) and e["ts"] >= 0, e
        key = (e["pid"], e["tid"])
        assert e["ts"] >= last.get(key, 0.0), f"ts goes back on track {key}: {e}"
        last[key] = e["ts"]
        if e["ph"] == "X":
            assert {"cat", "dur"} <= set(e) and e["dur"] >= 0, e
            tracks[key].append(e)
        elif e["ph"] in "sf":
            flows[e["id"]].append(e["ph"])
        else:
            assert e["s"] in "gpt", e
    assert all(sorted(v) == ["f", "s"] for v in flows.values()), flows
    assert {pid for pid, _ in tracks} <= {pid for kind, pid in named if kind == "process_name"}
    return tracks


def top_level(spans: list[dict[str, Any]], gaps: bool = False) -> list[dict[str, Any]]:
    """The spans of one track that are not inside another, checked to nest properly and
    (unless ``gaps``) to follow each other without a gap (in nanoseconds, the trace's unit)."""
    out: list[dict[str, Any]] = []
    until = 0
    for s in spans:
        ts = round(s["ts"] * 1000)
        if out and ts < until:
            assert ts + round(s["dur"] * 1000) <= until, f"{s} overlaps the span before it"
            continue
        assert gaps or not out or ts == until, f"a gap before {s}"
        out.append(s)
        until = ts + round(s["dur"] * 1000)
    return out


def per_kind(spans: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds per kind of top-level spans (a merged span's from its args)."""
    out = dict.fromkeys(KINDS, 0.0)
    for s in spans:
        if s["cat"] == "steps":
            for k in KINDS:
                out[k] += s["args"].get(f"{k}_s", 0.0)
        else:
            out[s["cat"]] += s["dur"] / 1e6
    return out


def assert_spans_add_up(trace: dict[str, Any], clock: Any) -> None:
    """Every node's timeline starts at 0, has no gap, and its spans add up to its simulated
    time, per kind too (to the nanosecond per span: the trace's resolution)."""
    tracks = validate(trace)
    for i in range(len(clock.node_compute_s)):
        top = top_level(tracks[(i, 0)])
        assert top[0]["ts"] == 0.0
        total = sum(s["dur"] for s in top) / 1e6
        assert total == pytest.approx(clock.total_s, rel=1e-9, abs=1e-9)
        got = per_kind(top)
        want = dict(zip(KINDS, (clock.node_compute_s[i], clock.node_comm_s[i],
                                clock.node_idle_s[i], clock.node_down_s[i]), strict=True))
        for k in KINDS:
            assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-9 * len(top)), (i, k)


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


# -- a world run -------------------------------------------------------------------------------
def test_a_world_run_s_trace_is_a_chrome_trace_whose_spans_add_up(tmp_path: Path) -> None:
    r = fit(tmp_path / "run", DiLoCo(H=3, deadline="2x"), WORLD, trace=True)
    trace = load(tmp_path / "run" / "trace.json")
    assert_spans_add_up(trace, r.clock)
    events = trace["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {"node 0", "node 1", "node 2", "node 3, speed 0.25"}
    instants = sorted((e["name"], e["pid"]) for e in events if e["ph"] == "i")
    # node 1 fails at step 4 and rejoins at step 7 (recovered from node 0); node 3 is cut
    assert ("failure", 1) in instants and ("rejoin", 1) in instants
    assert ("deadline cut", 3) in instants and ("recovered", 1) in instants
    down = [e for e in events if e["ph"] == "X" and e["cat"] == "down"]
    assert [e["pid"] for e in down] == [1]
    assert down[0]["dur"] / 1e6 == pytest.approx(r.clock.node_down_s[1])
    recovery = [e for e in events if e["name"] == "recovery from node 0"]
    assert recovery and all(e["pid"] == 1 and e["args"]["tag"] == "recovery" for e in recovery)
    assert sum(e["ph"] == "s" for e in events) == len(recovery)  # a flow per send
    # the cut straggler: the others' all-reduces are among nodes 0-2, node 3 never waits
    ar = [e for e in events if e["name"] == "all_reduce pseudo_grads" and e["pid"] == 0]
    assert {e["args"]["members"] for e in ar} == {"0-2", "0,2"}
    wait = [e for e in events if e["name"] == "straggler wait"]
    assert wait and {e["args"]["waited_for"] for e in wait} <= {"0,2", "0-2", "0", "2"}
    assert trace["otherData"]["exogym"]["sim_time_s"] == pytest.approx(r.clock.total_s)
    png = (tmp_path / "run" / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_exogym_trace_rebuilds_the_live_trace_from_the_run_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fit(tmp_path / "run", DiLoCo(H=3, deadline="2x"), WORLD, trace=True)
    assert main(["trace", str(tmp_path / "run"), "-o", str(tmp_path / "again.json")]) == 0
    assert "open it in https://ui.perfetto.dev" in capsys.readouterr().out
    assert load(tmp_path / "again.json") == load(tmp_path / "run" / "trace.json")
    # a run that did not ask for it: the same trace, into its folder
    fit(tmp_path / "plain", DiLoCo(H=3, deadline="2x"), WORLD)
    assert not (tmp_path / "plain" / "trace.json").exists()
    assert (tmp_path / "plain" / "timeline.png").exists()  # a world: its picture anyway
    assert main(["trace", str(tmp_path / "plain")]) == 0
    assert load(tmp_path / "plain" / "trace.json") == load(tmp_path / "again.json")


def test_a_resumed_run_s_trace_is_the_uninterrupted_one(tmp_path: Path) -> None:
    whole = fit(tmp_path / "whole", DiLoCo(H=3), WORLD, trace=True)
    fit(tmp_path / "cut", DiLoCo(H=3), WORLD, steps=6, checkpoint_every=6, trace=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Trainer(net(), world_data(), world_data()).fit(resume=tmp_path / "cut", max_steps=12,
                                           progress=False, trace=True)
    assert_spans_add_up(load(tmp_path / "whole" / "trace.json"), whole.clock)
    assert load(tmp_path / "cut" / "trace.json") == load(tmp_path / "whole" / "trace.json")


def test_a_run_resumed_from_a_checkpoint_without_spans_is_traced_by_replay(
        tmp_path: Path) -> None:
    # identical nodes, no world: no picture, so its checkpoint holds no spans
    fit(tmp_path / "run", DDP(), None, n=2, steps=3, checkpoint_every=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = Trainer(net(), world_data(), world_data()).fit(resume=tmp_path / "run", max_steps=6,
                                               progress=False, trace=True)
    trace = load(tmp_path / "run" / "trace.json")
    assert_spans_add_up(trace, r.clock)
    first = next(e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 0)
    assert (first["ts"], first["args"]["count"], first["args"]["steps"]) == (0.0, 6, "0-5")
    assert main(["trace", str(tmp_path / "run"), "-o", str(tmp_path / "again.json")]) == 0
    assert load(tmp_path / "again.json") == trace


# -- an asynchronous run -----------------------------------------------------------------------
def test_an_asynchronous_run_s_trace_has_the_server_and_adds_up(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = fit(tmp_path / "run", make("async_local_sgd", H=3), "speed=1:1:0.5:0.25", trace=True)
    trace = load(tmp_path / "run" / "trace.json")
    assert_spans_add_up(trace, r.clock)
    tracks = validate(trace)
    pushes, replies = tracks[(4, 0)], tracks[(4, 1)]  # the server: process N
    assert len(pushes) == len(replies) == r.asynchronous["updates"]
    assert {e["name"] for e in pushes} == {f"push from node {i}" for i in range(4)}
    node_names = {e["name"] for i in range(4) for e in tracks[(i, 0)]}
    assert {"push (until it reached the server)", "pull"} <= node_names
    flows = [e for e in trace["traceEvents"] if e["ph"] == "s"]
    assert len(flows) == 2 * len(pushes)  # node -> server, server -> node
    assert (tmp_path / "run" / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    # exogym trace cannot replay it: it says so, or hands on the trace it recorded
    assert main(["trace", str(tmp_path / "run"), "-o", str(tmp_path / "copy.json")]) == 0
    assert load(tmp_path / "copy.json") == trace
    fit(tmp_path / "untraced", make("async_local_sgd", H=3), "speed=1:1:0.5:0.25")
    assert main(["trace", str(tmp_path / "untraced")]) == 2
    err = capsys.readouterr().err
    assert "asynchronous strategy" in err and "--trace" in err


@pytest.mark.parametrize("sid, settings", [
    ("streaming_diloco", {"H": 4}), ("diloco_eager", {"H": 3}), ("noloco", {"H": 2}),
    ("fedbuff", {"H": 2, "K": 2}), ("sparta", {}), ("demo", {})])
def test_every_kind_of_communication_adds_up(tmp_path: Path, sid: str,
                                             settings: dict[str, Any]) -> None:
    # overlapped collectives (their lanes), gossip sends (their flows), a server, every step
    r = fit(tmp_path / "run", make(sid, **settings), "speed=1:1:0.5:0.25", trace=True)
    trace = load(tmp_path / "run" / "trace.json")
    assert_spans_add_up(trace, r.clock)
    lanes = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == 1
             and e["pid"] < 4]
    overlapped = any(rec.overlap for rec in r.comm_log)
    assert bool(lanes) == overlapped
    for i in range(4):
        top_level([e for e in lanes if e["pid"] == i], gaps=True)  # one at a time per node


# -- size --------------------------------------------------------------------------------------
def test_merged_steps_keep_the_totals_and_say_so(tmp_path: Path) -> None:
    r = fit(tmp_path / "run", DDP(), "speed=1:0.5", n=2, steps=30, trace=True)
    trace = load(tmp_path / "run" / "trace.json")
    assert_spans_add_up(trace, r.clock)
    merged = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "steps"]
    # every step is the same: compute, (node 0) its wait for node 1, the all-reduce
    assert [(e["pid"], e["args"]["count"], e["args"]["steps"], e["args"]["same"])
            for e in merged] == [(0, 30, "0-29", True), (1, 30, "0-29", True)]
    assert "summed per kind" in trace["otherData"]["merged steps"]


def test_a_trace_too_large_for_its_budget_loses_detail_not_time(tmp_path: Path) -> None:
    r = fit(tmp_path / "run", DiLoCo(H=2, deadline="2x"), WORLD, steps=40)
    summary = load(tmp_path / "run" / "summary.json")
    log = SpanLog(4)
    ClockTrace.from_dict(summary["clock"]["trace"]).cost("home-100mbps", spans=log)
    names = [f"node {i}" for i in range(4)]
    full = run_trace(log, r.events, names, {})
    size = len(json.dumps(full, separators=(",", ":"))) + 1
    assert full["otherData"]["detail"] == "full"
    details = []
    for budget in (size - 1, size // 3):
        small = run_trace(log, r.events, names, {}, max_bytes=budget)
        assert len(json.dumps(small, separators=(",", ":"))) + 1 <= budget
        assert_spans_add_up(small, r.clock)
        details.append(small["otherData"]["detail"])
    assert details[0] == "merged steps without their detail; no flows, no overlap lanes"
    assert "consecutive stretches of a node's timeline" in details[-1]


def test_a_1000_node_run_s_trace_stays_under_20_mb(tmp_path: Path) -> None:
    # 1,000 nodes of every speed, failing and coming back, 20 steps of DiLoCo (H=5)
    r = fit(tmp_path / "run", DiLoCo(H=5), "speed_sigma=0.3,mtbf=2s,mttr=0.5s,seed=1", n=1000,
            steps=20, trace=True, engine="vmap")
    path = tmp_path / "run" / "trace.json"
    size = path.stat().st_size
    trace = load(path)
    assert trace["otherData"]["detail"] == "full"
    # In full detail, about 250 bytes per node-step here (5 MB: every node fails every few
    # seconds, which breaks its merged steps): the same run 60 steps long would fit in 20 MB
    # in full detail; longer runs keep under MAX_BYTES with less (the test above).
    assert size < 20e6 and size / (1000 * 20) < 20e6 / (1000 * 60)
    assert MAX_BYTES < 20e6
    tracks = validate(trace)
    for i in (0, 499, 999):
        assert sum(s["dur"] for s in top_level(tracks[(i, 0)])) / 1e6 == pytest.approx(
            r.clock.total_s, rel=1e-9)
    assert sum(e["name"] == "failure" for e in trace["traceEvents"]) == r.world["failures"]


# -- the clock's spans on their own ------------------------------------------------------------
def test_the_clock_s_spans_tile_each_node_s_time() -> None:
    # node 1 at half speed: every step node 0 computes 1 s, waits 1 s for node 1, then a 1 s
    # all-reduce (8 Mbit/s, 1 MB, N = 2); 5 identical steps are one block
    net = Network(up_bps=8e6, efficiency=1.0, hop_latency_s=0.0, node_speed=(1.0, 0.5))
    recs = tuple(CommRecord("all_reduce", 1_000_000, s, "g") for s in range(5))
    log = SpanLog(2)
    report = ClockTrace(2, 5, 1.0, "given", None, recs).cost(net, spans=log)
    assert log.totals(0) == [5.0, 5.0, 5.0, 0.0] and log.totals(1) == [10.0, 5.0, 0.0, 0.0]
    assert report.total_s == 15.0
    (b0,), (b1,) = log.blocks
    assert (b0.count, b0.steps, b0.same) == (5, (0, 4), True)
    assert [(s.kind, s.name, s.end - s.start) for s in b0.spans] == [
        ("compute", "compute", 1.0), ("idle", "straggler wait", 1.0),
        ("comm", "all_reduce g", 1.0)]
    assert dict(b0.spans[1].args) == {"waited_for": "1"}
    assert dict(b0.spans[2].args) == {"op": "all_reduce", "tag": "g", "bytes": 1_000_000,
                                      "members": "all"}
    assert [s.name for s in b1.spans] == ["compute", "all_reduce g"]


# -- options -----------------------------------------------------------------------------------
def test_trace_is_checked_like_every_option(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="trace must be True or False"):
        fit(tmp_path / "a", DDP(), None, trace="yes")
    with pytest.raises(ValueError, match="give out_dir"):
        fit(None, DDP(), None, trace=True)
    with pytest.raises(ValueError, match="give the run a network"):
        fit(tmp_path / "b", DDP(), None, trace=True, network=None)
    # a plain run (no world, identical nodes) draws no picture unless asked for its trace
    fit(tmp_path / "plain", DDP(), None, n=2, steps=2)
    assert not (tmp_path / "plain" / "timeline.png").exists()


# -- comparisons and sweeps link each run's timeline --------------------------------------------
@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "trace_toy_task.py").write_text(toy_task_source("trace-toy-v0"))
    yield f"{tmp_path}/trace_toy_task.py:make_task"
    sys.modules.pop("trace_toy_task", None)


def test_compare_and_sweep_link_each_run_s_timeline(toy: str, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = compare(toy, ["ddp"], num_nodes=2, max_steps=2, step_time="10ms",
                    world="speed=1:0.5", out_dir=tmp_path / "cmp", progress=False)
        s = sweep(toy, "ddp", {"network": ["home-100mbps", "home-100mbps,node_speed=1:0.5"]},
                  num_nodes=2, max_steps=2, step_time="10ms", out_dir=tmp_path / "sw",
                  progress=False)
    md = c.results_md.read_text()
    assert ("- `ddp`: [ddp-seed0](runs/ddp-seed0/) ([timeline](runs/ddp-seed0/timeline.png))"
            in md)
    assert (tmp_path / "cmp" / "runs" / "ddp-seed0" / "timeline.png").is_file()
    md = (tmp_path / "sw" / "results.md").read_text()
    # only the network whose nodes differ draws a picture
    assert "## Timelines" in md and "p000" not in md.split("## Timelines")[1]
    link = s.points[1].runs[0].out_dir.relative_to(tmp_path / "sw").as_posix()
    assert f"- p001 seed 0: [timeline]({link}/timeline.png)" in md


# -- a real run --------------------------------------------------------------------------------
def test_a_process_run_writes_its_real_trace_too(tmp_path: Path) -> None:
    fit_processes(net(), world_data(), None, strategy=make("ddp"), num_nodes=2, max_steps=4,
                  batch_size=2, log_interval=4, progress=False, network="home-100mbps",
                  out_dir=tmp_path / "run", trace=True, backend="gloo", timeout_s=60.0,
                  threads=1)
    real = load(tmp_path / "run" / "trace_real.json")
    tracks = validate(real)
    assert sorted(tracks) == [(0, 0), (1, 0)]
    for spans in tracks.values():
        top_level(spans, gaps=True)  # one after the other on each rank
        comm = [s for s in spans if s["cat"] == "comm"]
        assert [s["args"]["step"] for s in comm] == [0, 1, 2, 3]
        assert {s["name"] for s in comm} == {"all_reduce grads"}
        assert {s["name"] for s in spans} == {"compute", "all_reduce grads"}
    assert real["otherData"]["exogym"]["network"] == "real (torch.distributed)"
    assert (tmp_path / "run" / "trace.json").exists()  # and the simulated one
    shutil.rmtree(tmp_path / "run")


def test_compare_with_trace_writes_and_links_every_run_s_trace(toy: str, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = compare(toy, ["ddp"], num_nodes=2, max_steps=2, step_time="10ms",
                    network="home-100mbps", out_dir=tmp_path / "cmp", progress=False,
                    trace=True)
    run = tmp_path / "cmp" / "runs" / "ddp-seed0"
    events = json.loads((run / "trace.json").read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)
    assert "runs/ddp-seed0/trace.json" in c.results_md.read_text()


def test_a_span_log_cut_keeps_what_came_before_its_moment() -> None:
    """Four identical 1 s compute steps of node 0 (one block of 3 closed, the 4th open), cut at
    2.5 s: steps 0 and 1 whole, step 2 from 2 to 2.5 s, step 3 gone; node 1 untouched."""
    log = SpanLog(2)
    for k in range(4):
        log.add(0, "compute", k, k + 1.0, "compute")
    log.add(1, "compute", 0.0, 4.0, "compute")
    log.cut(0, 2.5)
    log.finish()
    blocks = log.blocks[0]
    assert [(b.count, b.start, b.end, b.steps) for b in blocks] == [(2, 0.0, 2.0, (0, 1)),
                                                                    (1, 2.0, 2.5, (2, 2))]
    assert log.totals(0) == [2.5, 0.0, 0.0, 0.0] and log.totals(1) == [4.0, 0.0, 0.0, 0.0]
    assert blocks[1].spans[0].step == 2 and blocks[1].spans[0].end == 2.5


def test_a_span_log_cut_inside_the_open_step_and_before_every_block() -> None:
    log = SpanLog(1)
    log.add(0, "compute", 0.0, 1.0, "compute")
    log.add(0, "idle", 1.0, 2.0, "straggler wait")
    log.add(0, "compute", 2.0, 3.0, "compute")  # closes step 0 (compute + idle)
    log.add(0, "comm", 3.0, 4.0, "all_reduce g")
    log.cut(0, 3.5)  # inside the open step's comm
    assert log.finish().totals(0) == [2.0, 0.5, 1.0, 0.0]
    log = SpanLog(1)
    log.add(0, "compute", 1.0, 2.0, "compute")
    log.add(0, "compute", 2.0, 3.0, "compute")
    log.cut(0, 0.5)  # before it all
    assert log.finish().blocks[0] == [] and log.totals(0) == [0.0] * 4


def test_a_client_let_go_mid_compute_ends_its_timeline_there(tmp_path: Path) -> None:
    """Over-selection lets a client go while it still computes (FedScale's hand case of
    tests/run/test_round_policy_runs.py: client 1 computes until 0.6 s, is let go at 0.452 s):
    its seat's timeline stops at the release, and every seat's spans still tile its time and
    add up to its clock's split."""
    r = fedscale_round_run(tmp_path, trace=True, out_dir=tmp_path / "run")
    assert [e["node"] for e in r.events if e["event"] == "discarded"] == [1, 0]
    trace = json.loads((tmp_path / "run" / "trace.json").read_text())
    assert_spans_add_up(trace, r.clock)
