"""Strategies and tasks from the researcher's own code: ``file.py:Name``, ``module:Name``,
:func:`exogym.strategy.register` and entry points; wherever an id is accepted, and resumable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from support.toy_task import toy_task_source

from exogym import strategy as strategies
from exogym.cli import main
from exogym.lab.compare import compare, resolve_strategies
from exogym.tasks import get_task
from exogym.utils.config import ConfigError
from exogym.utils.plugins import load_object, source_of

METHOD = textwrap.dedent('''
    from dataclasses import dataclass

    from exogym.strategy.diloco import DiLoCo


    @dataclass(kw_only=True)
    class HalfOuter(DiLoCo):
        """DiLoCo whose outer learning rate is halved (a stand-in for a researcher's idea)."""

        scale: float = 0.5

        def __post_init__(self) -> None:
            super().__post_init__()
            if not 0 < self.scale <= 1:
                raise ValueError(f"scale must be in (0, 1], got {self.scale!r}")

        def init_state(self) -> None:
            super().init_state()
            for group in self.outer_opt.param_groups:
                group["lr"] = self.outer_lr * self.scale


    class NotAStrategy:
        pass


    def a_function():
        return 1
''')

TASK = toy_task_source("tiny-linear-v0", "a linear classifier on 8 features", features=8,
                       samples=256, train=192) + textwrap.dedent('''
    TINY = make_task()

    def not_a_task():
        return 42
''')


@pytest.fixture
def user_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with ``halfouter_method.py`` and ``tiny_task.py``; every module, path and id they
    add is removed afterwards (the next test's files have the same module names)."""
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "halfouter_method.py").write_text(METHOD)
    (folder / "tiny_task.py").write_text(TASK)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield folder
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def test_a_strategy_from_a_file_is_built_registered_and_recorded_with_its_path(user_code):
    spec = f"{user_code}/halfouter_method.py:HalfOuter"
    s = strategies.make(spec, H=3, scale="0.25")
    assert type(s).__name__ == "HalfOuter" and s.id == "HalfOuter"
    assert (s.H, s.scale, s.outer_lr) == (3, 0.25, 0.7)
    assert "HalfOuter" in strategies.registry()
    assert strategies.get("HalfOuter") is type(s)  # found again by its id
    assert source_of(type(s)) == f"{user_code.resolve()}/halfouter_method.py:HalfOuter"
    with pytest.raises(ConfigError, match="scale must be in"):
        strategies.make(spec, scale="2")
    with pytest.raises(ConfigError, match=r"unknown.*'sclae'"):
        strategies.make(spec, sclae="0.5")


def test_a_relative_path_and_a_module_name_name_the_same_class(user_code, monkeypatch):
    monkeypatch.chdir(user_code.parent)
    by_path = strategies.get("code/halfouter_method.py:HalfOuter")
    assert strategies.get("halfouter_method:HalfOuter") is by_path  # the module it was imported as


@pytest.mark.parametrize(("spec", "message"), [
    ("{d}/missing.py:HalfOuter", r"strategy file '.*missing.py' does not exist"),
    ("{d}/halfouter_method.py:Nope", r"has no 'Nope'; it defines: HalfOuter, NotAStrategy"),
    ("{d}/halfouter_method.py:NotAStrategy",
     r"is a class NotAStrategy, not a subclass of exogym.strategy.StackedStrategy"),
    ("{d}/halfouter_method.py:a_function", r"is a function, not a subclass"),
    ("{d}/halfouter_method.py:", r"bad strategy .*give path/to/file.py:Name"),
    ("no_such_package_xyz.methods:Cls", r"no module named 'no_such_package_xyz'"),
    ("exogym.strategy.base:StackedStrategy", r"is abstract: it does not define"),
])
def test_bad_strategy_specs_are_errors_naming_what_is_wrong(user_code, spec, message):
    with pytest.raises(ConfigError, match=message):
        strategies.get(spec.format(d=user_code))


def test_file_names_that_cannot_be_their_own_module_are_refused(user_code):
    (user_code / "my-method.py").write_text(METHOD)
    with pytest.raises(ConfigError, match=r"must be a Python identifier.*my_method.py"):
        strategies.get(f"{user_code}/my-method.py:HalfOuter")
    (user_code / "json.py").write_text(METHOD)  # would be, or be shadowed by, the standard json
    with pytest.raises(ConfigError, match=r"imported as module 'json'.*rename the file"):
        strategies.get(f"{user_code}/json.py:HalfOuter")
    other = user_code / "elsewhere"
    other.mkdir()
    (other / "halfouter_method.py").write_text(METHOD)
    strategies.get(f"{user_code}/halfouter_method.py:HalfOuter")
    with pytest.raises(ConfigError, match=r"already loaded from .*code/halfouter_method.py"):
        strategies.get(f"{other}/halfouter_method.py:HalfOuter")


def test_a_class_whose_id_is_taken_is_refused(user_code):
    (user_code / "clash.py").write_text(
        "from exogym.strategy.diloco import DiLoCo\n\nclass Mine(DiLoCo):\n    id = 'diloco'\n")
    with pytest.raises(ConfigError, match=r"has id 'diloco', which is already "
                                          r"exogym.strategy.diloco:DiLoCo's"):
        strategies.get(f"{user_code}/clash.py:Mine")


def test_register_names_a_class_of_a_file_or_module(user_code):
    import exogym

    exogym.register("half_outer", f"{user_code}/halfouter_method.py:HalfOuter")  # the same
    assert exogym.register is strategies.register
    assert strategies.make("half_outer", scale="0.5").scale == 0.5
    with pytest.raises(ValueError, match=r"already registered to exogym\.strategy\.ddp:DDP"):
        strategies.register("ddp", f"{user_code}/halfouter_method.py:HalfOuter")
    with pytest.raises(ValueError, match="entry_point must look like"):
        strategies.register("x", "halfouter_method.HalfOuter")
    with pytest.raises(ValueError, match="strategy_id must be an identifier"):
        strategies.register("half-outer", "m:C")


def test_installed_packages_add_strategies_through_entry_points(user_code, monkeypatch):
    dist = user_code / "halfpkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: halfpkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[exogym.strategies]\nhalf_outer_ep = halfouter_method:HalfOuter\n"
        "diloco = halfouter_method:HalfOuter\n")
    monkeypatch.syspath_prepend(str(user_code))
    monkeypatch.setattr(strategies, "_plugins_read", False)
    with pytest.warns(RuntimeWarning, match=r"halfpkg's entry point exogym.strategies diloco = "
                                            r"halfouter_method:HalfOuter is not used"):
        ids = strategies.registry()
    assert "half_outer_ep" in ids
    assert strategies.get("half_outer_ep").__name__ == "HalfOuter"
    assert strategies.get("diloco").__name__ == "DiLoCo"  # the built-in keeps its id


def test_installed_packages_add_tasks_through_entry_points(user_code, monkeypatch, capsys):
    dist = user_code / "tinytask-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tinytask\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[exogym.tasks]\ntiny-linear-v0 = tiny_task:make_task\nmnist = tiny_task:TINY\n")
    monkeypatch.syspath_prepend(str(user_code))
    task = get_task("tiny-linear-v0")
    assert (task.id, task.source) == ("tiny-linear-v0", "tiny_task:make_task")
    assert get_task("mnist").id == "mnist-cnn-v0"  # an installed task never replaces exogym's
    assert main(["tasks"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[-1] == ("tiny-linear-v0: a linear classifier on 8 features (batch 8/node, "
                          "lr 0.05; installed, tiny_task:make_task)")
    with pytest.raises(ConfigError, match=r"unknown task 'tiny-linear-v1' \(did you mean "
                                          r"'tiny-linear-v0'\?\)"):
        get_task("tiny-linear-v1")


def test_a_task_from_a_file_is_a_task_or_a_function_returning_one(user_code):
    task = get_task(f"{user_code}/tiny_task.py:make_task")
    assert task.id == "tiny-linear-v0"
    assert task.source == f"{user_code.resolve()}/tiny_task.py:make_task"
    assert get_task(f"{user_code}/tiny_task.py:TINY").id == "tiny-linear-v0"
    train, _ = task.load_data(None, False)
    assert task.run_info(train) == {"task": "tiny-linear-v0", "task_source": task.source}
    with pytest.raises(ConfigError, match=r"must be an exogym.tasks.Task or a function returning "
                                          r"one; got int \(from calling it\)"):
        get_task(f"{user_code}/tiny_task.py:not_a_task")
    with pytest.raises(ConfigError, match="task file"):
        get_task(f"{user_code}/nope.py:make_task")


def test_cli_run_of_user_code_resumes_from_another_folder_in_a_fresh_process(user_code, tmp_path):
    out = tmp_path / "run"
    args = ["run", "--task", f"{user_code}/tiny_task.py:make_task", "--strategy",
            f"{user_code}/halfouter_method.py:HalfOuter", "--set", "H=2", "--set", "scale=0.5",
            "--nodes", "2", "--no-progress", "--seed", "3"]
    assert main([*args, "--steps", "4", "--out", str(out), "--checkpoint-every", "2"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["strategy"] == "HalfOuter" and config["task"] == "tiny-linear-v0"
    assert config["strategy_class"] == f"{user_code.resolve()}/halfouter_method.py:HalfOuter"
    assert config["task_source"] == f"{user_code.resolve()}/tiny_task.py:make_task"
    assert config["hyperparameters"]["scale"] == 0.5
    full = tmp_path / "full"
    assert main([*args, "--steps", "6", "--out", str(full)]) == 0
    env = {**os.environ, "PYTHONPATH": ""}
    done = subprocess.run([sys.executable, "-m", "exogym", "run", "--resume", str(out),
                           "--steps", "6", "--no-progress"], cwd="/", env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    want = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    def same(r: dict) -> dict:  # the wall clock, and the simulated one from a measured step
        return {k: v for k, v in r.items() if k not in ("wall_s", "sim_time_s")}

    assert [same(r) for r in rows] == [same(r) for r in want]
    assert [r["step"] for r in rows] == [2, 4, 6]
    a = torch.load(out / "model.pt", weights_only=True)
    b = torch.load(full / "model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_compare_labels_user_strategies_by_their_id_and_sets_their_fields(user_code, tmp_path):
    spec = f"{user_code}/halfouter_method.py:HalfOuter"
    built = resolve_strategies(["diloco", spec, f"{spec}-quarter"],
                               {"HalfOuter.H": "2", "HalfOuter-quarter.scale": "0.25", "H": "4"})
    assert list(built) == ["diloco", "HalfOuter", "HalfOuter-quarter"]
    assert (built["HalfOuter"].H, built["HalfOuter"].scale) == (2, 0.5)
    assert (built["HalfOuter-quarter"].H, built["HalfOuter-quarter"].scale) == (4, 0.25)
    with pytest.raises(ConfigError, match=r"diloco \(diloco\) has no key 'scale'"):
        resolve_strategies(["diloco", spec], {"scale": "0.25"})
    result = compare(task=f"{user_code}/tiny_task.py:make_task", strategies=["diloco", spec],
                     overrides={"H": "2"}, num_nodes=2, max_steps=4, out_dir=tmp_path / "cmp",
                     progress=False)
    assert [r.label for r in result.rows] == ["diloco", "HalfOuter"]
    assert result.rows[1].changed == {"optim.lr": 0.05, "H": 2}  # the task's lr; scale default
    assert result.rows[0].metrics["eval_loss"].mean != result.rows[1].metrics["eval_loss"].mean


def test_the_process_engine_runs_a_strategy_and_model_from_a_file(user_code):
    from exogym.run.launch import fit_processes

    task = get_task(f"{user_code}/tiny_task.py:make_task")
    train, val = task.load_data(None, False)
    spec = f"{user_code}/halfouter_method.py:HalfOuter"
    torch.manual_seed(0)
    a = fit_processes(task.build_model(), train, val, strategy=strategies.make(spec, H=2),
                      num_nodes=2, max_steps=4, batch_size=8, progress=False, threads=1)
    torch.manual_seed(0)
    from exogym import Trainer
    b = Trainer(task.build_model(), train, val).fit(
        strategy=strategies.make(spec, H=2), num_nodes=2, max_steps=4, batch_size=8,
        progress=False)
    for (k, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values(),
                         strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-6, msg=k)


def test_load_object_lists_module_classes_only(user_code):
    with pytest.raises(ConfigError, match=r"module 'exogym.strategy.diloco' has no 'Nope'; it "
                                          r"defines: DiLoCo$"):
        load_object("exogym.strategy.diloco:Nope", "strategy")
