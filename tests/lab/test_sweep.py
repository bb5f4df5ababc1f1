"""``exogym sweep``: grid expansion, every point trained as ``exogym run`` would, the table and
the best point, resumption of an interrupted sweep, and its errors."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest
from support.toy_task import toy_task_source

from exogym.cli import main
from exogym.lab.report import Stat
from exogym.lab.sweep import SweepPoint, SweepResult, parse_grid, score_table, sweep
from exogym.utils.config import ConfigError

TASK = toy_task_source("sweep-toy-v0")


@pytest.fixture
def task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(sys, "path", list(sys.path))  # the file's folder goes first on it
    (tmp_path / "sweep_toy_task.py").write_text(TASK)
    yield f"{tmp_path}/sweep_toy_task.py:make_task"
    sys.modules.pop("sweep_toy_task", None)


def test_parse_grid_and_its_errors():
    assert parse_grid(["H=10, 50", "outer_lr=0.3,0.7"]) == {"H": ["10", "50"],
                                                           "outer_lr": ["0.3", "0.7"]}
    for bad, message in ((["H"], "give KEY=V1,V2"), (["H=1,,2"], "give KEY=V1,V2"),
                         (["H=1", "H=2"], "given twice"), (["H=1,1"], "repeats a value"),
                         ([], "at least one axis")):
        with pytest.raises(ConfigError, match=message):
            parse_grid(bad)


def test_every_point_and_seed_is_trained_and_the_best_has_the_lowest_mean(task, tmp_path):
    out = tmp_path / "sw"
    result = sweep(task, "diloco", {"H": ["1", "2"], "outer_lr": ["0.3", "0.7"]},
                   out_dir=out, num_nodes=2, max_steps=4, repeats=2, seed=5)
    assert [p.settings for p in result.points] == [
        {"H": "1", "outer_lr": "0.3"}, {"H": "1", "outer_lr": "0.7"},
        {"H": "2", "outer_lr": "0.3"}, {"H": "2", "outer_lr": "0.7"}]
    assert (result.trained, result.reused, result.seeds) == (8, 0, (5, 6))
    for p in result.points:
        config = json.loads((out / "runs" / f"p{p.index:03d}-seed6" / "config.json").read_text())
        assert config["hyperparameters"]["H"] == int(p.settings["H"])
        assert config["hyperparameters"]["outer_lr"] == float(p.settings["outer_lr"])
        assert config["seed"] == 6 and config["num_nodes"] == 2
        assert p.score == statistics.fmean(r.final["eval_loss"] for r in p.runs)
    assert len({p.score for p in result.points}) == 4  # the settings change the training
    assert result.best is min(result.points, key=lambda p: p.score)
    table = (out / "results.md").read_text()
    assert f"**p{result.best.index:03d}**" in table
    saved = json.loads((out / "results.json").read_text())
    assert saved["best"] == f"p{result.best.index:03d}"
    assert (out / "sweep.png").stat().st_size > 0


def test_an_interrupted_sweep_continues_without_retraining_finished_runs(task, tmp_path):
    out = tmp_path / "sw"
    grid = {"H": ["1", "2"]}
    first = sweep(task, "diloco", grid, out_dir=out, num_nodes=2, max_steps=4, repeats=2)
    (out / "runs" / "p001-seed1" / "summary.json").unlink()  # killed before it finished
    again = sweep(task, "diloco", grid, out_dir=out, num_nodes=2, max_steps=4, repeats=2)
    assert (again.trained, again.reused) == (1, 3)
    assert [p.score for p in again.points] == [p.score for p in first.points]
    with pytest.raises(ConfigError, match=r"holds another sweep \(different axes, points\)"):
        sweep(task, "diloco", {"H": ["1", "4"]}, out_dir=out, num_nodes=2, max_steps=4,
              repeats=2)


def test_nodes_and_network_are_axes_too(task, tmp_path):
    result = sweep(task, "ddp", {"nodes": ["1", "2"], "network": ["datacenter", "home-100mbps"]},
                   out_dir=tmp_path / "sw", max_steps=2)
    configs = [json.loads((r.out_dir / "config.json").read_text())
               for p in result.points for r in p.runs]
    assert [c["num_nodes"] for c in configs] == [1, 1, 2, 2]
    assert [p.runs[0].sim_time_s > 0 for p in result.points] == [True] * 4
    slow = {p.settings["network"]: p.metrics["sim_time_s"].mean for p in result.points
            if p.settings["nodes"] == "2"}
    assert slow["home-100mbps"] > slow["datacenter"]


def test_bad_sweeps_are_errors_before_training(task, tmp_path):
    with pytest.raises(ConfigError, match="grid axis 'Hh' is neither a key of diloco"):
        sweep(task, "diloco", {"Hh": ["1"]}, out_dir=tmp_path / "a")
    with pytest.raises(ConfigError, match=r"grid point p001 \(H=0\): .*H"):
        sweep(task, "diloco", {"H": ["1", "0"]}, out_dir=tmp_path / "b")
    with pytest.raises(ConfigError, match="H is both swept"):
        sweep(task, "diloco", {"H": ["1"]}, overrides={"H": "2"}, out_dir=tmp_path / "c")
    assert not any((tmp_path / d).exists() for d in "abc")


def test_score_table_averages_over_the_other_axes():
    def point(i: int, settings: dict[str, str], loss: float) -> SweepPoint:
        return SweepPoint(i, settings, (), {"eval_loss": Stat((loss,))})

    points = (point(0, {"a": "1", "b": "x"}, 1.0), point(1, {"a": "1", "b": "y"}, 3.0),
              point(2, {"a": "2", "b": "x"}, 5.0), point(3, {"a": "2", "b": "y"}, 9.0))
    result = SweepResult("t", "s", {"a": ["1", "2"], "b": ["x", "y"]}, (0,), points, points[0],
                         Path("."), 4, 0, None)
    assert score_table(result, "a", None) == {("1",): 2.0, ("2",): 7.0}
    assert score_table(result, "b", None) == {("x",): 3.0, ("y",): 6.0}
    assert score_table(result, "a", "b")[("2", "y")] == 9.0


def test_cli_sweep_prints_the_table(task, tmp_path, capsys):
    out = tmp_path / "cli"
    args = ["sweep", "--task", task, "--strategy", "fedavg", "--grid", "H=1,2", "--nodes", "2",
            "--steps", "2", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "# exogym sweep: fedavg on sweep-toy-v0" in printed
    assert "trained 2 run(s), read 0 finished one(s)" in printed
    assert main(args) == 0  # again: everything is read back
    assert "trained 0 run(s), read 2 finished one(s)" in capsys.readouterr().out


def test_a_misspelled_grid_axis_gets_the_closest_key(task, tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"grid axis 'outer_lrr' is neither a key of diloco nor "
                                          r"one of nodes, network \(did you mean 'outer_lr'\?\)"):
        sweep(task, "diloco", {"outer_lrr": ["0.3"]}, out_dir=tmp_path / "a")
    with pytest.raises(ConfigError, match=r"\(did you mean 'nodes'\?\)"):
        sweep(task, "diloco", {"ndoes": ["2"]}, out_dir=tmp_path / "b")
    assert main(["sweep", "--task", task, "--grid", "Hh=1,2", "--out", str(tmp_path / "c")]) == 2
    assert "grid axis 'Hh' is neither a key of diloco nor one of nodes, network (did you mean " \
           "'H'?)" in capsys.readouterr().err
    assert not any((tmp_path / d).exists() for d in "abc")


def test_the_table_shows_accuracy_as_a_percentage_as_compare_does():
    from exogym.lab.sweep import format_markdown

    point = SweepPoint(0, {"H": "10"}, (), {
        "eval_loss": Stat((0.5, 0.7)), "eval_accuracy": Stat((0.97, 0.99)),
        "bytes_sent_per_node": Stat((2e6, 2e6)), "sim_time_s": Stat((3.0, 3.0))})
    result = SweepResult("t", "diloco", {"H": ["10"]}, (0, 1), (point,), point, Path("."), 2, 0,
                         None)
    row = next(line for line in format_markdown(result).splitlines() if "| **p000**" in line)
    # accuracy: mean 98%, sample std sqrt(2 * 0.01^2 / 1) = 1.414%; loss: 0.6 ± 0.1414
    assert row == ("| **p000** | **10** | **0.6000 ± 0.1414** | **98.00% ± 1.41%** | **2.00 MB** "
                   "| **3.0 s** |")
