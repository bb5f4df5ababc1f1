"""``exogym run --preset NAME``: a published configuration's flags placed where the option
stands, a flag after it overriding, the run recording the settings as resolved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exogym.cli import main
from exogym.cli.app import _parse
from exogym.cli.presets import PRESETS, PresetError, expand_preset
from exogym.strategy import make
from exogym.strategy.fedbuff import FedBuff
from exogym.strategy.optim import OptimSpec


def test_the_preset_s_flags_stand_where_it_stands() -> None:
    flags = list(PRESETS["flsim-cifar10"].flags)
    assert expand_preset(["run", "--seed", "9", "--preset", "flsim-cifar10", "--lr", "1"]) \
        == ["run", "--seed", "9", *flags, "--lr", "1"]
    assert expand_preset(["run", "--preset=flsim-cifar10"]) == ["run", *flags]
    # an unknown name stays, for the parser to refuse by name
    assert expand_preset(["run", "--preset", "flsim"]) == ["run", "--preset", "flsim"]


def test_a_flag_after_the_preset_overrides_it_and_one_before_is_overridden() -> None:
    args = _parse(["run", "--participation", "7", "--preset", "flsim-cifar10", "--set", "H=5",
                   "--nodes", "50"])
    assert args.participation == "10"  # before: the preset's
    assert dict(args.overrides)["H"] == "5" and args.nodes == 50  # after: the user's
    assert args.task == "cifar10-cnn-v0" and args.batch_size == 32 and args.steps == 160


def test_a_preset_names_its_task_and_refuses_another(capsys: pytest.CaptureFixture[str]) -> None:
    for where in (["--task", "mnist", "--preset", "flsim-cifar10"],
                  ["--preset", "flsim-cifar10", "--task=mnist-cnn-v0"]):
        with pytest.raises(SystemExit) as e:
            _parse(["run", *where])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "--preset flsim-cifar10 was made for --task cifar10-cnn-v0; got --task mnist" in err
    # its own task, typed, is accepted
    assert _parse(["run", "--task", "cifar10-cnn-v0", "--preset", "flsim-cifar10"]).task \
        == "cifar10-cnn-v0"
    with pytest.raises(PresetError, match="made for --task cifar10-cnn-v0; got --task mnist"):
        expand_preset(["run", "--preset", "flsim-cifar10", "--task", "mnist"])


def test_a_preset_whose_task_exogym_lacks_is_refused_with_what_to_use() -> None:
    # FLSim's Sent140 FedBuff: LEAF's Sent140 is not an exogym task (on MNIST it trained to
    # chance, 11.35%, before this refusal)
    with pytest.raises(PresetError) as e:
        expand_preset(["run", "--preset", "flsim-sent140", "--nodes", "10000"])
    msg = str(e.value)
    assert "cannot run" in msg and "Sent140" in msg and "--arrivals constant:100" in msg
    assert "flsim-cifar10" in msg


def test_an_unknown_preset_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(["run", "--preset", "flsim"])
    err = capsys.readouterr().err
    assert "invalid choice: 'flsim'" in err and "flsim-cifar10" in err


def test_the_cifar10_preset_s_strategy_is_flsim_s_fedavgm() -> None:
    args = _parse(["run", "--preset", "flsim-cifar10"])
    overrides = {**dict(args.overrides), "optim.lr": str(args.lr)}
    made = make(args.strategy, **overrides)
    assert made == make("fedavgm", eta=2.13, beta=0.9, H=16,
                        optim=OptimSpec(name="sgd", lr=0.0138))
    assert args.nodes == 100 and args.participation == "10"
    assert args.partition.kind == "contiguous"


def test_the_sent140_strategy_is_flsim_s_fedbuff() -> None:
    s = FedBuff.flsim_sent140(H=1)
    assert (s.K, s.eta_g, s.server_momentum, s.a, s.H) == (10, 0.7, 0.9, 0.0, 1)
    assert s.optim == OptimSpec(name="sgd", lr=0.1)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n, p in PRESETS.items() if p.missing is None))
def test_every_preset_trains_its_task_to_its_target(name: str, tmp_path: Path,
                                                    data_dir: Path, cifar10_data: Path,
                                                    mnist_data: Path) -> None:
    """Each runnable preset, as typed (seed 0), reaches the target its docs state."""
    out = tmp_path / "run"
    assert main(["run", "--data-dir", str(data_dir), "--no-progress", "--no-download",
                 "--preset", name, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert config["task"] == PRESETS[name].task
    least = {"flsim-cifar10": 0.20}[name]  # the target in PRESETS[name].target
    assert f">= {least:.0%}" in PRESETS[name].target
    assert summary["final"]["eval_accuracy"] >= least
