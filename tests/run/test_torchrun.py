"""Runs launched by ``torchrun`` (``python -m torch.distributed.run --standalone``, 2 processes,
gloo) end with the simulator's summary: the Python API (:meth:`exogym.Trainer.fit` joins
torchrun's process group by itself) and ``python -m exogym run``.

What is compared: steps, samples, bytes per node, the collective count and the simulated clock
(the same trace with a given step time) exactly; losses and evaluation to float round-off (the
reductions sum in another order across processes).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from support.exo_gym_readme import QuantizationStrategy
from support.scripts import child_env
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from exogym import Trainer
from exogym.run.dist.ranks import torchrun_env
from exogym.run.launch import free_port


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, batch: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        x, y = batch
        logits = self.fc2(torch.tanh(self.fc1(x)))
        return {"loss": F.cross_entropy(logits, y),
                "accuracy": (logits.argmax(-1) == y).float().mean()}


def tiny_data() -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(256, 6, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())


FIT = dict(strategy="diloco", num_nodes=4, max_steps=12, batch_size=8, eval_interval=4,
           log_interval=2, engine="loop", device="cpu", seed=3, progress=False,
           network="home-100mbps", step_time=0.01)

SCRIPT = textwrap.dedent("""
    import os
    import sys

    import torch
    from test_torchrun import FIT, Tiny, tiny_data  # this file's folder is on PYTHONPATH
    from exogym import Trainer
    from exogym.strategy import make

    torch.manual_seed(0)
    fit = dict(FIT, strategy=make("diloco", H=4))
    result = Trainer(Tiny(), tiny_data(), tiny_data()).fit(out_dir={out!r}, **fit)
    # Every rank returns the same result; only rank 0 wrote the folder. fit() joined torchrun's
    # process group and left it again.
    assert not torch.distributed.is_initialized()
    torch.save(result.to_dict(), {out!r} + "/rank" + os.environ["RANK"] + ".pt")
""")


def _torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = child_env(Path(__file__).resolve().parent, OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "--rdzv-endpoint", f"localhost:{free_port()}", *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def _same_summary(got: dict[str, Any], ref: dict[str, Any], tol: float) -> None:
    for key in ("strategy", "num_nodes", "steps", "samples", "bytes_sent_per_node",
                "bytes_received_per_node", "collectives", "sim_time_s", "sim_comm_s"):
        assert got[key] == ref[key], key
    assert got["processes"] == 2 and ref["processes"] == 1
    assert got["final"].keys() == ref["final"].keys()
    for key, value in ref["final"].items():
        assert abs(got["final"][key] - value) <= tol, (key, got["final"][key], value)


def test_the_python_api_under_torchrun_matches_the_simulator(tmp_path: Path) -> None:
    out = tmp_path / "dist"
    out.mkdir()
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(out=str(out)))
    _torchrun([str(script)], cwd=tmp_path)

    from exogym.strategy import make

    torch.manual_seed(0)
    ref = Trainer(Tiny(), tiny_data(), tiny_data()).fit(
        out_dir=tmp_path / "sim", **dict(FIT, strategy=make("diloco", H=4)))
    got = json.loads((out / "summary.json").read_text())
    _same_summary(got, json.loads(json.dumps(ref.to_dict())), tol=1e-5)
    # Rank 0 alone wrote the run folder; both ranks returned the same result.
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "metrics.jsonl", "model.pt", "rank0.pt", "rank1.pt", "summary.json"]
    r0, r1 = (torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["final"] == r1["final"] and r0["bytes_sent_per_node"] == r1["bytes_sent_per_node"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [r["step"] for r in ref.history] == [2, 4, 6, 8, 10, 12]
    for a, b in zip(rows, ref.history, strict=True):
        assert a["sim_time_s"] == b["sim_time_s"]
        assert abs(a["train_loss"] - b["train_loss"]) <= 1e-5


def test_exogym_run_under_torchrun_matches_the_simulator(tmp_path: Path,
                                                         mnist_data: Path) -> None:
    args = ["--task", "mnist", "--strategy", "diloco", "--set", "H=2", "--nodes", "4",
            "--steps", "4", "--batch-size", "16", "--eval-interval", "2", "--step-time", "10ms",
            "--network", "home-1gbps", "--no-progress", "--device", "cpu", "--no-download",
            "--data-dir", str(mnist_data)]
    proc = _torchrun(["-m", "exogym", "run", *args, "--out", str(tmp_path / "dist")],
                     cwd=tmp_path)
    assert proc.stdout.count("final eval") == 1  # rank 0 alone prints the summary
    assert "processes 2" in proc.stdout
    sim = subprocess.run([sys.executable, "-m", "exogym", "run", *args, "--out",
                          str(tmp_path / "sim")], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert sim.returncode == 0, sim.stderr[-3000:]
    got = json.loads((tmp_path / "dist" / "summary.json").read_text())
    ref = json.loads((tmp_path / "sim" / "summary.json").read_text())
    # Adam turns reduction-order round-off into small differences: close, not bit-equal.
    _same_summary(got, ref, tol=2e-3)


EXO_GYM_FIT = dict(num_epochs=1, num_nodes=2, max_steps=6, batch_size=8, val_size=32,
                   val_interval=3, device="cpu")

EXO_GYM_SCRIPT = textwrap.dedent("""
    import os

    import torch
    from support.exo_gym_readme import QuantizationStrategy
    from test_torchrun import EXO_GYM_FIT, Tiny, tiny_data
    from exogym import Trainer
    from exogym.strategy.optim import OptimSpec

    torch.manual_seed(0)
    trainer = Trainer(Tiny(), tiny_data(), tiny_data())
    model = trainer.fit(strategy=QuantizationStrategy(OptimSpec(torch.optim.AdamW, lr=1e-2),
                                                      'int8'), **EXO_GYM_FIT)
    torch.save({{"model": model.state_dict(), "bytes": trainer.result.bytes_sent,
                "processes": trainer.result.processes}},
               {out!r} + "/rank" + os.environ["RANK"] + ".pt")
""")


def test_exo_gym_s_readme_custom_algorithm_under_torchrun_matches_the_simulator(
        tmp_path: Path) -> None:
    # EXO Gym's custom strategy, per-node code, one node per torchrun process, through
    # exogym.Trainer in EXO Gym's form (the model returned): the simulator's numbers
    out = tmp_path / "dist"
    out.mkdir()
    (tmp_path / "train.py").write_text(EXO_GYM_SCRIPT.format(out=str(out)))
    _torchrun([str(tmp_path / "train.py")], cwd=tmp_path)

    from exogym.strategy.optim import OptimSpec

    torch.manual_seed(0)
    trainer = Trainer(Tiny(), tiny_data(), tiny_data())
    model = trainer.fit(strategy=QuantizationStrategy(OptimSpec(torch.optim.AdamW, lr=1e-2),
                                                      "int8"), **EXO_GYM_FIT)
    assert trainer.result is not None and trainer.result.processes == 1
    for rank in (0, 1):
        got = torch.load(out / f"rank{rank}.pt", weights_only=False)
        assert got["processes"] == 2 and got["bytes"] == trainer.result.bytes_sent
        for name, value in model.state_dict().items():
            torch.testing.assert_close(got["model"][name], value, atol=1e-5, rtol=0)


def test_torchrun_env_is_read_from_the_environment() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "10.0.0.1",
           "MASTER_PORT": "29500"}
    got = torchrun_env(env)
    assert got is not None
    assert (got.rank, got.world_size, got.local_rank, got.master_addr, got.master_port) == (
        1, 4, 0, "10.0.0.1", 29500)
    assert torchrun_env({}) is None
    with pytest.raises(ValueError, match="RANK, WORLD_SIZE but not LOCAL_RANK"):
        torchrun_env({"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="WORLD_SIZE='two' in the environment is not an integer"):
        torchrun_env(dict(env, WORLD_SIZE="two"))
    with pytest.raises(ValueError, match=r"RANK=4 must be in \[0, WORLD_SIZE=4\)"):
        torchrun_env(dict(env, RANK="4"))


def test_distributed_true_without_a_process_group_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"distributed=True needs torch\.distributed"):
        Trainer(Tiny(), tiny_data()).fit(strategy="ddp", num_nodes=2, max_steps=1, batch_size=4,
                                         progress=False, network=None, distributed=True)
