"""``exogym run --preset NAME``: a published configuration's flags placed where the option
stands, a flag after it overriding, the run recording the settings as resolved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exogym.cli import main
from exogym.cli.app import _parse
from exogym.cli.presets import PRESETS, expand_preset
from exogym.strategy import make
from exogym.strategy.fedbuff import FedBuff


def test_the_preset_s_flags_stand_where_it_stands() -> None:
    flags = list(PRESETS["flsim-sent140"].flags)
    assert expand_preset(["run", "--nodes", "9", "--preset", "flsim-sent140", "--seed", "1"]) \
        == ["run", "--nodes", "9", *flags, "--seed", "1"]
    assert expand_preset(["run", "--preset=flsim-sent140"]) == ["run", *flags]
    # an unknown name stays, for the parser to refuse by name
    assert expand_preset(["run", "--preset", "flsim"]) == ["run", "--preset", "flsim"]


def test_a_flag_after_the_preset_overrides_it_and_one_before_is_overridden() -> None:
    args = _parse(["run", "--concurrency", "7", "--preset", "flsim-sent140", "--set", "K=5",
                   "--world", "duration=uniform:2:1"])
    assert args.concurrency == 128  # before: the preset's
    assert dict(args.overrides)["K"] == "5"  # after: the user's
    assert args.world.duration.spec() == "uniform:2:1"
    assert args.arrivals.spec() == "constant:100" and args.batch_size == 32


def test_an_unknown_preset_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(["run", "--preset", "flsim"])
    err = capsys.readouterr().err
    assert "invalid choice: 'flsim'" in err and "flsim-sent140" in err


def test_the_flsim_preset_s_strategy_is_fedbuff_s_flsim_sent140() -> None:
    args = _parse(["run", "--preset", "flsim-sent140"])
    overrides = {**dict(args.overrides), "optim.lr": str(args.lr)}
    made = make(args.strategy, **overrides)
    assert made == FedBuff.flsim_sent140(H=1)


def test_a_run_with_the_flsim_preset(tmp_path: Path, mnist_data: Path) -> None:
    """FLSim's timing end to end on a small population: clients start 10 ms apart and train
    ``|N(0, 1)|`` s each, so the run's simulated time is the arrivals' and sessions', not the
    network's; the config records the settings as typed."""
    out = tmp_path / "run"
    assert main(["run", "--data-dir", str(mnist_data), "--no-progress", "--no-download",
                 "--preset", "flsim-sent140", "--nodes", "400", "--steps", "3",
                 "--eval-interval", "3", "--eval-samples", "100", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert config["population"]["concurrency"] == 128
    assert config["population"]["arrivals"] == "constant:100"
    assert config["world"] == "duration=halfnormal:1:0"
    assert summary["hyperparameters"]["K"] == 10 and summary["hyperparameters"]["H"] == 1
    # 128 seats, 3 sessions each at most: the last client starts no sooner than its arrival
    assert summary["asynchronous"]["updates"] >= 128
    assert summary["sim_time_s"] >= summary["asynchronous"]["updates"] / 100
