"""The tiny runs several test files share, and the models they train; each a ``Trainer.fit``
with its defaults here, a test passing what it varies (any of ``fit``'s arguments overrides a
default).

- :func:`small`: the overrides that make a strategy synchronise within a 6-step run (``exogym
  check``'s), for the registry-wide tests.
- :func:`check_run`: ``exogym check``'s model and data, a strategy id made with :func:`small`
  (test_conformance.py; test_paging.py with 20 nodes).
- :func:`client_run`: a population of clients, a row per client unless a test says otherwise
  (test_participation.py; test_population.py checks that a run holding only the round's clients
  gives the same numbers).
- :func:`world_run`: a world's failures, speeds and deadlines on a small classifier
  (test_world.py; test_trace.py with batch 2 and an output folder).
- :class:`TinyBN`: the process engine's model (test_dist.py), also --ft's (test_ft.py).
- :func:`sign_data`: 6 features labelled by the first one's sign (test_guards.py, test_compat.py,
  test_examples.py).
- :func:`noise_data`: 8 features and 4 classes drawn independently, nothing to learn
  (test_clock.py, test_per_node.py).
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from exogym import Trainer
from exogym.lab.check import TinyNet, short_period, tiny_data
from exogym.run.output.result import FitResult
from exogym.strategy import StackedStrategy, get, make
from support.resume_cases import Net, data


def small(sid: str) -> dict[str, Any]:
    """Overrides that make a strategy synchronise within a 6-step run (``exogym check``'s)."""
    return short_period(get(sid))


def check_run(strategy: StackedStrategy | str, *, dtype: torch.dtype = torch.float32,
              **settings: Any) -> FitResult:
    """``strategy`` (an id: made with :func:`small`'s overrides) on ``exogym check``'s model and
    data in ``dtype``: 3 nodes, 6 steps, batch 8, a row a step, an evaluation every 3 steps, the
    loop engine, seed 0; the model drawn after ``torch.manual_seed(1)``."""
    torch.manual_seed(1)
    if isinstance(strategy, str):
        strategy = make(strategy, **small(strategy))
    args: dict[str, Any] = dict(num_nodes=3, max_steps=6, batch_size=8, eval_interval=3,
                                log_interval=1, engine="loop", seed=0, progress=False)
    args.update(settings)
    return Trainer(TinyNet().to(dtype), tiny_data(dtype), tiny_data(dtype)).fit(
        strategy=strategy, **args)


def client_run(strategy: Any, *, nodes: int = 6, steps: int = 12, **settings: Any) -> FitResult:
    """``strategy`` on a population of ``nodes`` clients (``resume_cases``' model and data), a
    row per client (``clients_in_memory="all"``) unless ``settings`` say otherwise: batch 4,
    home-100mbps, 0.1 s a step (unless ``hardware`` prices it), a row a step, one evaluation
    at the end; warnings (short runs) silenced."""
    args: dict[str, Any] = dict(
        num_nodes=nodes, max_steps=steps, batch_size=4, network="home-100mbps",
        clients_in_memory="all", progress=False, log_interval=1, eval_interval=steps,
        **({} if "hardware" in settings else {"step_time": 0.1}))
    args.update(settings)
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Trainer(Net(), data(), data()).fit(strategy=strategy, **args)


def fedscale_round_run(tmp_path: Path, **extra: Any) -> FitResult:
    """FedScale's hand case (tests/run/test_round_policy_runs.py works it out): FedAvg (H = 3)
    over 3 clients with FedScale-form device profiles (10/50/20 ms a sample, 8/80/26.56 kbit/s),
    2 reports a round of the 3 drawn (over_selection 1.5), 6 steps, no latency."""
    import json

    table = tmp_path / "fedscale.json"
    table.write_text(json.dumps({"0": {"computation": 10, "communication": 8},
                                 "1": {"computation": 50, "communication": 80},
                                 "2": {"computation": 20, "communication": 26.56}}))
    return client_run(make("fedavg", H=3), nodes=3, participation=2, clients_in_memory="round",
                      steps=6, network="bw=1Gbps,latency=0s,efficiency=1,hop_latency=0s",
                      hardware=str(table), round_policy="over_selection=1.5", **extra)


class WorldNet(nn.Module):
    """Linear -> tanh -> Linear, 6 features to 3 classes, the loss alone; ``seed``: the global
    generator seeded with it before the weights are drawn."""

    def __init__(self, seed: int | None = None) -> None:
        super().__init__()
        if seed is not None:
            torch.manual_seed(seed)
        self.body = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        return F.cross_entropy(self.body(batch[0]), batch[1])


def world_data(n: int = 240) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, x[:, :3].argmax(1))


def world_run(strategy: Any, world: str | None, *, n: int = 4, steps: int = 12,
              batch_size: int = 8, model_seed: int = 1, **settings: Any) -> FitResult:
    """``strategy`` on ``n`` nodes in ``world`` (a ``--world`` spec, or None) for ``steps``
    steps: :class:`WorldNet` (``model_seed``) on :func:`world_data` (at least 2 samples a node),
    home-100mbps, 50 ms a step, one evaluation at the end; warnings (short runs) silenced."""
    args: dict[str, Any] = dict(num_nodes=n, max_steps=steps, batch_size=batch_size,
                                progress=False, network="home-100mbps", step_time=0.05,
                                eval_interval=steps, world=world)
    args.update(settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Trainer(WorldNet(model_seed), world_data(max(240, 2 * n)), world_data()).fit(
            strategy=strategy, **args)


class TinyBN(nn.Module):
    """Linear -> BatchNorm -> tanh -> Linear, cross-entropy: parameters, float and int buffers."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.fc1 = nn.Linear(6, 8, bias=False)  # a bias before BatchNorm has no gradient:
        # Adam would turn its round-off-sized gradient into full steps of either sign
        self.bn = nn.BatchNorm1d(8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.fc2(torch.tanh(self.bn(self.fc1(x)))), y)


def sign_data(n: int, seed: int = 0) -> TensorDataset:
    """``n`` seeded points of 6 features, labelled 1 where the first is positive, else 0."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


def noise_data(n: int, seed: int = 0) -> TensorDataset:
    """``n`` seeded points of 8 features, each with a label drawn from 4 classes independently
    of it (drawn after the features, from the same generator)."""
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g))


def resume_cut(full: Path, cut: Path, later: Sequence[int]) -> FitResult:
    """A copy of run folder ``full`` at ``cut`` without the checkpoints of steps ``later`` and
    its summary, resumed (``resume_cases``' model, seeded as :func:`client_run` seeds it)."""
    shutil.copytree(full, cut)
    for step in later:
        shutil.rmtree(cut / "checkpoints" / f"step-{step:08d}", ignore_errors=True)
    (cut / "summary.json").unlink()
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Trainer(Net(), data(), data()).fit(resume=cut, progress=False)
