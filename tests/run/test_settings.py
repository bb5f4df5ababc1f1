"""One declaration per run setting (exogym/run/options.py): ``fit``'s signature, ``exogym run``'s
options, the keys of ``config.json``, the resume rules and docs/settings.md all agree with it.

Regenerate docs/settings.md's table (and review the diff) with ``EXOGYM_REGEN_DOCS=1 python -m
pytest tests/run/test_settings.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from support.resume_cases import Net, data
from support.scripts import ROOT

from exogym import Trainer
from exogym.cli import build_parser
from exogym.cli.app import _parse
from exogym.cli.run import _check_resume_options, _run_fit_args
from exogym.run.loop.config import RUN_CONFIG_KEYS
from exogym.run.options import (
    FitOptions,
    cli_default_of,
    default_of,
    recorded,
    settings,
    settings_table,
)
from exogym.run.trainer import Trainer as CoreTrainer
from exogym.strategy import make
from exogym.utils.config import ConfigError

DOCS = ROOT / "docs" / "settings.md"
BEGIN, END = "<!-- settings table: begin -->\n", "<!-- settings table: end -->\n"

# exogym run's options that are not settings of fit: the task and its data, the strategy and
# its hyperparameters, the sinks (fit's `sinks` are made from them)
RUN_OWN = {"-h", "--help", "--task", "--strategy", "--lr", "--set", "--data-dir",
           "--no-download", "--csv", "--tensorboard", "--wandb", "--ft", "--kill", "--min-replicas",
           "--commit-every", "--preset"}

# config.json's keys before settings were declared in one place: a run folder written then must
# still resume, so none of them may go
CONFIG_KEYS = {
    "strategy", "strategy_class", "hyperparameters", "num_nodes", "steps", "batch_size_per_node",
    "steps_per_epoch", "eval_interval", "eval_samples", "eval_at_start", "eval_batch_size",
    "log_interval", "partition", "partition_stats", "engine", "device", "seed",
    "micro_batch_size", "precision", "processes", "parameters", "eval_set", "network",
    "step_time_s", "compute_source", "allow_nonfinite", "allow_unsynced", "checkpointing",
    "world", "participation", "paging", "population",
}


def _run_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["run"]


def test_fit_takes_every_setting_by_the_same_name_and_default() -> None:
    params = [p for p in inspect.signature(CoreTrainer.fit).parameters.values()
              if p.name != "self"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)
    assert [(p.name, p.default) for p in params] == [
        (f.name, f.default) for f in dataclasses.fields(FitOptions)]
    hints = inspect.get_annotations(CoreTrainer.fit.__wrapped__)  # type: ignore[attr-defined]
    for f in dataclasses.fields(FitOptions):
        assert hints[f.name] == f.type, f.name  # the same annotation, as written


def test_the_run_command_has_a_flag_for_every_setting_that_declares_one() -> None:
    actions = {o: a for a in _run_parser()._actions for o in a.option_strings}
    flags = {s.flag: name for name, s in settings().items() if s.flag}
    assert set(actions) == set(flags) | RUN_OWN
    for flag, name in flags.items():
        s, action = settings()[name], actions[flag]
        assert action.help == s.help, flag
        if s.switch(default_of(name)):
            assert isinstance(action, argparse._StoreTrueAction), flag
            continue
        assert action.metavar == s.metavar and action.choices == s.choices, flag
        default = cli_default_of(name)
        assert action.default == default, flag
        assert (action.type is None) == (s.parse is None), flag


def test_every_setting_with_a_flag_reaches_fit() -> None:
    args = _run_parser().parse_args(["--out", "x"])
    task = SimpleNamespace(batch_size=8, eval_interval=5, run_info=lambda train: {"task": "t"})
    fit_args = _run_fit_args(args, task, Path("x"), [], [], None)  # type: ignore[arg-type]
    placed = {"num_nodes", "engine", "device", "resume"}  # _fit_run / --resume place these
    with_flag = {name for name, s in settings().items() if s.flag}
    assert set(fit_args) == (with_flag - placed - {"num_epochs"}) | {"sinks", "run_info"}
    assert set(fit_args) <= set(inspect.signature(CoreTrainer.fit).parameters)
    assert (fit_args["max_steps"], fit_args["batch_size"], fit_args["progress"],
            fit_args["async_checkpoint"]) == (500, 8, True, True)
    args = _run_parser().parse_args(["--epochs", "2", "--no-progress", "--sync-checkpoints"])
    fit_args = _run_fit_args(args, task, Path("x"), [], [], None)  # type: ignore[arg-type]
    assert "max_steps" not in fit_args and fit_args["num_epochs"] == 2
    assert fit_args["progress"] is False and fit_args["async_checkpoint"] is False


def test_resume_takes_the_flags_of_the_settings_that_may_change() -> None:
    parser = _run_parser()
    for ok in (["--steps", "9"], ["--offload", "disk"], ["--keep-checkpoints", "3"],
               ["--no-progress", "--trace", "--sync-checkpoints"], ["--data-dir", "d"]):
        _check_resume_options(parser.parse_args(["--resume", "r", *ok]))
    for bad in (["--nodes", "3"], ["--seed", "1"], ["--out", "o"], ["--epochs", "2"],
                ["--csv"], ["--set", "H=3"]):
        with pytest.raises(ConfigError, match=f"drop {bad[0]} "):
            _check_resume_options(parser.parse_args(["--resume", "r", *bad]))


def test_resume_refuses_a_typed_flag_whatever_its_value() -> None:
    # equal to the defaults, but typed: refused by name (was accepted, the run going on as
    # recorded with seed 1, 2 nodes and home-100mbps)
    with pytest.raises(ConfigError, match="drop --network, --nodes, --seed "):
        _check_resume_options(_parse(["run", "--resume", "r", "--seed", "0", "--nodes", "4",
                                      "--network", "datacenter"]))
    with pytest.raises(ConfigError, match="drop --strategy "):
        _check_resume_options(_parse(["run", "--resume", "r", "--strategy", "diloco"]))
    _check_resume_options(_parse(["run", "--resume", "r", "--steps", "500", "--data-dir", "d"]))


def test_config_records_every_recorded_setting_under_its_key(tmp_path: Path) -> None:
    assert set(RUN_CONFIG_KEYS) >= CONFIG_KEYS
    tops = {str(s.record).split(".")[0] for s in settings().values() if s.record}
    assert tops <= set(RUN_CONFIG_KEYS)
    given = {"num_nodes": 2, "max_steps": 4, "batch_size": 4, "eval_interval": 2,
             "eval_batch_size": 7, "eval_samples": 5, "eval_at_start": True, "log_interval": 2,
             "micro_batch_size": 2, "seed": 3, "allow_nonfinite": True, "allow_unsynced": True,
             "engine": "loop", "device": "cpu", "network": "home-100mbps", "partition": "iid",
             "checkpoint_every": 2, "keep_checkpoints": 3, "async_checkpoint": False,
             "resident": 1, "offload": "disk"}
    torch.manual_seed(0)
    Trainer(Net(), data(), data()).fit(strategy=make("fedavg", H=2), out_dir=tmp_path / "run",
                                       progress=False, step_time=0.1, **given)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert set(config) == set(RUN_CONFIG_KEYS)
    for name, value in given.items():
        assert recorded(config, name) == value, name
    assert recorded(config, "participation") is None  # a section the run does not have
    assert recorded(config, "client_store") == default_of("client_store")


def test_a_resumed_asynchronous_run_refuses_another_concurrency(tmp_path: Path) -> None:
    def fit(**extra: Any) -> Any:
        torch.manual_seed(1)
        return Trainer(Net(), data(), data()).fit(
            strategy=make("fedbuff", H=2, K=2), num_nodes=8, batch_size=4,
            network="home-100mbps", step_time=0.1, progress=False, **extra)

    fit(max_steps=4, concurrency=3, out_dir=tmp_path / "run", checkpoint_every=2)
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "run", cut)
    with pytest.raises(ValueError, match=r"population\.concurrency: checkpoint 3, now 2"):
        fit(resume=cut, concurrency=2)
    assert fit(resume=cut, concurrency=3, max_steps=6).steps == 6


def test_docs_settings_table_is_current() -> None:
    text = DOCS.read_text(encoding="utf-8")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    assert rest, f"{DOCS} has no {BEGIN.strip()} ... {END.strip()} block"
    current = f"{head}{BEGIN}{settings_table()}{END}{tail}"
    if os.environ.get("EXOGYM_REGEN_DOCS") == "1":
        DOCS.write_text(current, encoding="utf-8")
    assert text == current, ("docs/settings.md's table is not the declarations' "
                             "(regenerate: EXOGYM_REGEN_DOCS=1 python -m pytest "
                             "tests/run/test_settings.py)")
