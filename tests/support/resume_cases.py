"""The runs of the exact-resume tests (test_resume.py), importable by a fresh process, and how
two runs' folders and checkpoints are compared.

A case is a tiny training run, named; :func:`fit_case` trains it into a folder (with checkpoints
every ``T`` steps), and ``python -m support.resume_cases NAME=DIR ...`` (``tests/`` on
``PYTHONPATH``: :func:`support.scripts.child_env`) resumes each folder in a new process (the way a
crashed run is continued), with the same model and data built here.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from exogym import Trainer
from exogym.lab.check import short_period
from exogym.run.output.result import FitResult
from exogym.strategy import get, make, registry

T = 4  # steps before the checkpoint that is resumed from; the runs take 2T


class Net(nn.Module):
    """A tiny classifier; ``norm``: with BatchNorm (per-node running statistics), ``drop``: with
    dropout (random masks from the global generator)."""

    def __init__(self, norm: bool = False, drop: bool = False) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(6, 8)]
        if norm:
            layers.append(nn.BatchNorm1d(8))
        layers.append(nn.Tanh())
        if drop:
            layers.append(nn.Dropout(0.3))
        layers.append(nn.Linear(8, 3))
        self.body = nn.Sequential(*layers)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        x, y = batch
        logits = self.body(x)
        return {"loss": nn.functional.cross_entropy(logits, y),
                "accuracy": (logits.argmax(-1) == y).float().mean()}


class Labelled(TensorDataset):
    """``(x, y)`` pairs with ``targets`` (what a Dirichlet partition splits by)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        super().__init__(x, y)
        self.targets = y


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 6, generator=g)
    return Labelled(x, x[:, :3].argmax(1))


@dataclass(frozen=True)
class Case:
    strategy: str
    overrides: tuple[tuple[str, Any], ...] = ()
    norm: bool = False
    drop: bool = False
    partition: str = "iid"
    world: str | None = None


def cases() -> dict[str, Case]:
    """Every registered strategy, and the special cases the issue names."""
    # exogym check's short periods (support.runs.small; that module imports this one)
    out = {sid: Case(sid, tuple(short_period(get(sid)).items())) for sid in registry()}
    out["ddp-int8-ef"] = Case("ddp", (("codec", "int8"), ("error_feedback", True)))
    out["diloco-topk-ef"] = Case("diloco", (("H", 2), ("codec", "topk:0.25"),
                                            ("error_feedback", True)))
    out["diloco-randk"] = Case("diloco", (("H", 2), ("codec", "randk:0.5")))
    out["diloco-q"] = Case("diloco", (("H", 2), ("q", 0.5), ("seed", 3)))
    out["diloco-cosine"] = Case("diloco", (("H", 2), ("schedule.warmup_steps", 2),
                                           ("schedule.cosine", True)))
    out["diloco-batchnorm"] = Case("diloco", (("H", 2),), norm=True)
    out["ddp-dropout"] = Case("ddp", drop=True)
    out["diloco-dropout"] = Case("diloco", (("H", 2),), drop=True)
    out["fedavg-dirichlet"] = Case("fedavg", (("H", 2),), partition="dirichlet:0.5")
    # per-node timelines: pushes in flight and nodes waiting for the server at a checkpoint
    out["async-dn-dylu-speeds"] = Case("async_local_sgd", (("H", 2), ("outer", "delayed_nesterov"),
                                                           ("dylu", True)), world="speed=1:0.5:0.3")
    out["fedbuff-speeds"] = Case("fedbuff", (("H", 2),), world="speed=1:0.5:0.3")
    return out


def build(case: Case) -> Trainer:
    torch.manual_seed(1)
    return Trainer(Net(case.norm, case.drop), data(), data())


def fit_case(name: str, engine: str, out_dir: Path) -> FitResult:
    """The whole 2T-step run, checkpointed every T steps (so after T and at the end)."""
    case = cases()[name]
    return build(case).fit(
        strategy=make(case.strategy, **dict(case.overrides)), num_nodes=3, max_steps=2 * T,
        batch_size=8, log_interval=1, eval_interval=2, eval_samples=40, engine=engine,
        partition=case.partition, network="home-100mbps", step_time=0.01, seed=5,
        world=case.world,
        out_dir=out_dir, checkpoint_every=T, keep_checkpoints=3, progress=False)


def resume(name: str, run_dir: Path) -> FitResult:
    """Continue ``run_dir`` from its newest usable checkpoint, as a crashed run is."""
    return build(cases()[name]).fit(resume=run_dir, progress=False)


# -- comparing runs ------------------------------------------------------------------------------
WALL = {"wall_s", "train_time_s", "wall_time_s", "samples_per_s", "out_dir", "resumed_from"}
"""What two runs of the same numbers may differ in: this machine's timings, the folders."""


def run_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``run_dir``'s ``metrics.jsonl``, wall times aside."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in WALL} for r in rows]


def run_summary(run_dir: Path) -> dict[str, Any]:
    """``run_dir``'s ``summary.json``, wall times aside."""
    return {k: v for k, v in json.loads((run_dir / "summary.json").read_text()).items()
            if k not in WALL}


def assert_same_state(a: Any, b: Any, where: str = "",
                      ignore: frozenset[str] = frozenset()) -> None:
    """Exact equality of two checkpoint states (tensors by torch.equal), wall times aside."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, set(a) ^ set(b))
        for k in a:
            if k not in WALL and k not in ignore:
                assert_same_state(a[k], b[k], f"{where}.{k}", ignore)
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_state(x, y, f"{where}[{i}]", ignore)
    else:
        assert a == b or (a != a and b != b), (where, a, b)  # NaN equals NaN here


if __name__ == "__main__":  # python -m support.resume_cases NAME=DIR ...
    torch.set_num_threads(1)
    for item in sys.argv[1:]:
        case_name, _, folder = item.partition("=")
        resume(case_name, Path(folder))
