"""``exogym bench``: scores read from known curves, a suite run end to end into a leaderboard,
and its errors."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from support.toy_task import toy_task_source

from exogym.cli import main
from exogym.lab import bench as bench_module
from exogym.lab.bench import SUITES, Suite, Track, bench, score_at_budget, time_to_target
from exogym.lab.report import CurvePoint
from exogym.utils.config import ConfigError

TASK = toy_task_source("bench-toy-v0")

CURVE = [CurvePoint(0, 2.0, 0.0, 0.0), CurvePoint(10, 1.0, 5.0, 30.0),
         CurvePoint(20, 0.5, 10.0, 60.0), CurvePoint(30, 0.4, 15.0, 90.0)]


def test_the_score_is_the_loss_of_the_last_evaluation_within_the_budget():
    assert score_at_budget(CURVE, 60.0) == 0.5   # the evaluation at exactly 60 s counts
    assert score_at_budget(CURVE, 59.9) == 1.0
    assert score_at_budget(CURVE, None) == 0.4   # no budget: the last evaluation
    assert score_at_budget(CURVE, 0.0) == 2.0    # only the initial model
    assert math.isnan(score_at_budget(CURVE[1:], 10.0))


def test_time_to_target_is_the_first_evaluation_at_or_below_it():
    assert time_to_target(CURVE, 1.0) == 30.0
    assert time_to_target(CURVE, 0.45) == 90.0
    assert time_to_target(CURVE, 0.1) is None


@pytest.fixture
def toy_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "bench_toy_task.py").write_text(TASK)
    task = f"{tmp_path}/bench_toy_task.py:make_task"
    suite = Suite(id="toy-v0", description="two toy tracks", tracks=(
        Track(name="fast", task=task, num_nodes=2, network="datacenter", steps=4,
              step_time_s=0.01, eval_interval=2, budget_s=None, target_loss=0.69),
        Track(name="slow", task=task, num_nodes=2, network="home-100mbps", steps=4,
              step_time_s=0.01, eval_interval=1, budget_s=0.05, target_loss=0.69),
    ))
    monkeypatch.setitem(SUITES, "toy-v0", suite)
    yield "toy-v0"
    sys.modules.pop("bench_toy_task", None)


def test_a_suite_runs_into_a_leaderboard_scored_from_the_runs_own_metrics(toy_suite, tmp_path):
    out = tmp_path / "board"
    board = bench(toy_suite, ["ddp", "diloco-h2"], overrides={"diloco-h2.H": "2"},
                  out_dir=out)
    assert list(board["tracks"]) == ["fast", "slow"]
    for name, budget in (("fast", None), ("slow", 0.05)):
        entries = {e["label"]: e for e in board["tracks"][name]["entries"]}
        for label, entry in entries.items():
            rows = [json.loads(line) for line in
                    (out / name / "runs" / f"{label}-seed0" / "metrics.jsonl").read_text()
                    .splitlines()]
            evals = [r for r in rows if "eval_loss" in r]
            within = [r for r in evals if budget is None or r["sim_time_s"] <= budget]
            assert entry["score"] == within[-1]["eval_loss"], (name, label)
        ranked = sorted(entries.values(), key=lambda e: e["rank"])
        assert [e["rank"] for e in ranked] == [1, 2]
        assert ranked[0]["score"] <= ranked[1]["score"]
    # on the slow network DDP's all-reduce of every step costs time: it is scored earlier
    slow = {e["label"]: e for e in board["tracks"]["slow"]["entries"]}
    assert slow["ddp"]["bytes_sent_per_node"] > slow["diloco-h2"]["bytes_sent_per_node"]
    ranks = {label: [e["rank"] for t in board["tracks"].values() for e in t["entries"]
                     if e["label"] == label] for label in ("ddp", "diloco-h2")}
    assert {r["label"]: r["mean_rank"] for r in board["overall"]} == {
        k: sum(v) / 2 for k, v in ranks.items()}
    assert board["machine"]["torch"] and board["seeds"] == [0]
    text = (out / "leaderboard.md").read_text()
    assert text.startswith("# exogym bench: toy-v0") and "## slow" in text
    assert json.loads((out / "leaderboard.json").read_text())["suite"] == "toy-v0"


def test_unknown_suites_and_tracks_are_errors(toy_suite, tmp_path):
    with pytest.raises(ConfigError, match=r"unknown suite 'nope'; available: gym-v0, toy-v0"):
        bench("nope", ["ddp"], out_dir=tmp_path / "a")
    with pytest.raises(ConfigError, match=r"suite toy-v0 has no track 'medium'; its tracks: "
                                          r"fast, slow"):
        bench(toy_suite, ["ddp"], tracks=["medium"], out_dir=tmp_path / "b")


def test_gym_v0_fixes_the_clock_and_the_competition_track():
    tracks = {t.name: t for t in SUITES["gym-v0"].tracks}
    nanogpt = tracks["nanogpt-8-home"]
    assert (nanogpt.task, nanogpt.num_nodes, nanogpt.network) == (
        "shakespeare-char-gpt-v0", 8, "home-100mbps")
    assert nanogpt.budget_s is not None and all(t.step_time_s > 0 for t in tracks.values())


def test_cli_bench_prints_the_leaderboard(toy_suite, tmp_path, capsys):
    assert main(["bench", "--suite", toy_suite, "--strategies", "ddp,fedavg", "--set",
                 "fedavg.H=2", "--tracks", "fast", "--out", str(tmp_path / "o"),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "## fast" in out and "## slow" not in out and "leaderboard.md" in out
    assert bench_module.machine()["cpus"] >= 1
