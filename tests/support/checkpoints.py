"""The strategy-level checkpoint round trip (test_sparseloco.py, test_muon.py, test_desloc.py,
test_noloco.py): a strategy trained straight against the same strategy stopped, its state saved
and loaded (``weights_only=True``) into a fresh set-up, and trained on; float64 throughout."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from exogym.sim.comm import InProcessCommunicator
from exogym.sim.engine import NodeStack
from exogym.strategy.base import StackedStrategy

F64 = torch.float64


class _TinyBN(nn.Module):
    """Linear -> BatchNorm -> tanh -> Linear (float64): matrices, biases and float buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.fc2(torch.tanh(self.bn(self.fc1(x)))), y)


def _fresh(make_strategy: Callable[[], StackedStrategy], n: int, steps: int):
    torch.manual_seed(0)
    strategy = make_strategy()
    nodes = NodeStack(_TinyBN().to(F64), n, engine="loop")
    comm = InProcessCommunicator(n)
    strategy.setup(nodes, comm, steps)
    return strategy, nodes, comm


def _train(strategy: StackedStrategy, nodes: NodeStack, comm: InProcessCommunicator,
           steps: range) -> None:
    for step in steps:  # the batch of a step depends on the step only, so a resumed run sees it
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(nodes.num_nodes, 8, 6, generator=g, dtype=F64)
        comm.attendance.step = step
        nodes.forward_backward((x, x[..., :3].argmax(-1)))
        strategy.step(step)
        nodes.zero_grad()


def _snapshot(strategy: StackedStrategy, nodes: NodeStack) -> dict[str, Tensor]:
    out = {f"node.{k}": v.detach().clone() for k, v in nodes.params.items()}
    out.update({f"node.{k}": v.clone() for k, v in nodes.buffers.items()})
    out.update({f"global.{k}": v.clone() for k, v in strategy.global_state().items()})
    return out


def check_checkpoint_resume(make_strategy: Callable[[], StackedStrategy], tmp_path: Path, *,
                            steps: int = 12, stop: int = 5, n: int = 3) -> None:
    """Train ``steps`` steps straight; train ``stop`` steps, save the strategy's state_dict and the
    nodes' tensors (torch.save), load them with ``weights_only=True`` into a fresh set-up, train
    the rest: every node tensor and the global model must be exactly equal. A fresh set-up that
    skips ``load_state_dict`` must differ (the state matters, so the check can fail)."""
    straight = _fresh(make_strategy, n, steps)
    _train(*straight, range(steps))

    first = _fresh(make_strategy, n, steps)
    _train(*first, range(stop))
    strategy, nodes, _ = first
    path = tmp_path / "ckpt.pt"
    torch.save({"strategy": strategy.state_dict(), "params": dict(nodes.params),
                "buffers": dict(nodes.buffers)}, path)
    loaded = torch.load(path, weights_only=True)

    results = {}
    for restore in (True, False):
        resumed = _fresh(make_strategy, n, steps)
        with torch.no_grad():
            for k, v in loaded["params"].items():
                resumed[1].params[k].copy_(v)
            for k, v in loaded["buffers"].items():
                resumed[1].buffers[k].copy_(v)
        if restore:
            resumed[0].load_state_dict(loaded["strategy"])
        _train(*resumed, range(stop, steps))
        results[restore] = _snapshot(resumed[0], resumed[1])

    expected = _snapshot(straight[0], straight[1])
    assert results[True].keys() == expected.keys()
    for k, v in expected.items():
        assert torch.equal(results[True][k], v), k
    assert any(not torch.equal(results[False][k], v) for k, v in expected.items())
