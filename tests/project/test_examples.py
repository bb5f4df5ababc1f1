"""The scripts of ``examples/``: the custom strategy of the tutorial is a correct strategy, and
every example runs on a tiny budget."""

from __future__ import annotations

import json
import re
import runpy
import sys
from pathlib import Path

import pytest
import torch
from support.runs import sign_data
from support.scripts import ROOT
from torch import nn

from exogym import Trainer
from exogym.strategy import make
from exogym.tasks.models import Classifier
from exogym.utils.config import ConfigError

EXAMPLES = ROOT / "examples"
SPEC = f"{EXAMPLES}/custom_strategy.py:GrowingLocalSGD"


def _fit(strategy, steps: int = 20):
    torch.manual_seed(0)
    return Trainer(Classifier(nn.Linear(6, 2)), sign_data(512), None).fit(
        strategy=strategy, num_nodes=3, max_steps=steps, batch_size=4, progress=False)


def test_rounds_grow_by_rho_up_to_H_max():
    # H=2, rho=2, H_max=5: rounds of 2, 4, 5, 5 steps end after steps 2, 6, 11, 16
    result = _fit(make(SPEC, H=2, rho=2.0, H_max=5), steps=20)
    assert [r.step for r in result.comm_log] == [1, 5, 10, 15]  # 0-based step of each all-reduce
    assert all(r.tag == "params" for r in result.comm_log)


def test_rho_1_is_fedavg_bit_for_bit():
    a = _fit(make(SPEC, H=3, rho=1.0), steps=21)
    b = _fit(make("fedavg", H=3), steps=21)
    for (k, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values(),
                         strict=True):
        assert torch.equal(x, y), k
    assert a.bytes_sent == b.bytes_sent


def test_hyperparameters_are_validated():
    with pytest.raises(ConfigError, match=r"rho must be a finite number >= 1, got 0\.5"):
        make(SPEC, rho="0.5")
    with pytest.raises(ConfigError, match="H_max must be >= H=10, got 4"):
        make(SPEC, H_max="4")


def test_the_custom_strategy_script_trains_against_fedavg(capsys, monkeypatch, mnist_data):
    _run_script("custom_strategy.py", ["--steps", "20"], monkeypatch, mnist_data)
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0].strip() for line in out] == ["fedavg", "growing_local_sgd"]
    assert all("accuracy" in line for line in out)


def _run_script(name: str, args: list[str], monkeypatch: pytest.MonkeyPatch,
                data: Path) -> None:
    monkeypatch.setattr(sys, "argv", [name, *args, "--data-dir", str(data),
                                      "--eval-samples", "64"])
    runpy.run_path(str(EXAMPLES / name), run_name="__main__")


def test_the_mnist_example_trains_the_five_strategies(capsys, monkeypatch, mnist_data):
    _run_script("mnist.py", ["--steps", "10", "--nodes", "2"], monkeypatch, mnist_data)
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0].strip() for line in out] == [
        "ddp", "sparta", "diloco", "fedavg", "demo"]
    assert all("home-100mbps" in line and "accuracy" in line for line in out)
    # the simulated time in units that fit it (10 steps: seconds, not "0.0 min")
    assert all(re.search(r"home-100mbps: [0-9.]+ (ms|s)$", line) for line in out), out


def test_the_cifar_example_trains_one_node_against_two(capsys, monkeypatch, cifar10_data):
    _run_script("cifar.py", ["--steps", "6", "--H", "3"], monkeypatch, cifar10_data)
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0].strip() for line in out] == ["1 node, AdamW",
                                                            "2 nodes, DiLoCo H=3"]


@pytest.mark.slow  # keeps the default suite under 10 min on 2 cores; CI's slow step runs it
def test_the_nanogpt_example_trains_and_samples(capsys, monkeypatch, tmp_path, shakespeare_data):
    _run_script("nanogpt.py", ["--steps", "4", "--H", "2", "--nodes", "2", "--out",
                               str(tmp_path / "runs")], monkeypatch, shakespeare_data)
    out = capsys.readouterr().out
    assert "adamw, 1 node: val loss" in out and "diloco H=2, 2 nodes: val loss" in out
    assert "ROMEO:" in out
    assert (tmp_path / "runs" / "run1" / "model.pt").is_file()


def test_the_per_node_example_equals_the_node_stacked_methods(capsys, monkeypatch, mnist_data):
    _run_script("per_node.py", ["--steps", "10", "--nodes", "2"], monkeypatch, mnist_data)
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0].strip() for line in out] == [
        "ddp", "PerNodeDDP", "diloco", "PerNodeDiLoCo"]
    loss = [float(line.split("loss ")[1].split(",")[0]) for line in out]
    assert loss[0] == pytest.approx(loss[1], abs=2e-4) and loss[2] == pytest.approx(loss[3],
                                                                                   abs=2e-4)


# -- examples/my_method.py: the README's "your own method" ------------------------------------
TOPK = f"{EXAMPLES}/my_method.py:TopKDiLoCo"


def _cli(data: Path, *args: str) -> int:
    from exogym.cli import main

    return main([*args, "--data-dir", str(data), "--no-download", "--no-progress",
                 "--eval-samples", "64"])


def test_my_method_runs_through_the_cli_and_sends_top_k(tmp_path, mnist_data):
    out = tmp_path / "run"
    assert _cli(mnist_data, "run", "--task", "mnist", "--strategy", TOPK, "--set", "H=2",
                "--nodes", "2", "--steps", "4", "--batch-size", "8", "--eval-interval", "4",
                "--out", str(out)) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["strategy"] == "TopKDiLoCo"
    hyper = summary["hyperparameters"]
    assert (hyper["H"], hyper["codec"], hyper["error_feedback"]) == (2, "topk:0.01", True)
    # 2 outer steps, each an all-gather among N = 2 of the MNIST CNN's top 1% per tensor:
    # k = ceil(n / 100) of n = 400, 16, 12800, 32, 200704, 128, 1280, 10 -> 2,158 entries,
    # each a fp32 value and an int32 index: S = 8 x 2,158 = 17,264 bytes; (N-1) S per node.
    assert summary["bytes_sent_per_node"] == [2 * 17_264] * 2


def test_my_method_is_labelled_by_its_class_in_compare(tmp_path, mnist_data):
    out = tmp_path / "cmp"
    assert _cli(mnist_data, "compare", "--task", "mnist", "--strategies", f"{TOPK},{TOPK}-h2",
                "--set", "TopKDiLoCo-h2.H=2", "--set", "TopKDiLoCo.H=4", "--nodes", "2",
                "--steps", "4", "--batch-size", "8", "--out", str(out)) == 0
    runs = {json.loads(p.read_text())["hyperparameters"]["H"]: p.parent.name
            for p in (out / "runs").glob("*/summary.json")}
    assert runs == {4: "TopKDiLoCo-seed0", 2: "TopKDiLoCo-h2-seed0"}


def test_my_method_refuses_another_codec():
    with pytest.raises(ConfigError, match=r"codec must be topk:F .* got 'int8'"):
        make(TOPK, codec="int8")
    with pytest.raises(ConfigError, match="error_feedback"):
        make(TOPK, q="0.1")  # DiLoCo's own check: dropping and error feedback do not mix
