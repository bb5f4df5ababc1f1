"""OptimSpec validation and build, LRSchedule factors by hand, the strategy's lr over steps, and
the engine's premise: one elementwise optimizer over a node-stacked tensor equals N optimizers."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from exogym.sim.comm import InProcessCommunicator
from exogym.sim.engine import NodeStack
from exogym.strategy import DDP, DiLoCo
from exogym.strategy.optim import LRSchedule, OptimSpec

# -- OptimSpec ------------------------------------------------------------------------------------


def test_unknown_optimizer_name_lists_allowed_names():
    with pytest.raises(ValueError, match=r"\['adam', 'adamw', 'sgd'\].*'lamb'"):
        OptimSpec(name="lamb")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lr": 0.0}, "lr must be a finite number > 0"),
        ({"lr": -1e-3}, "lr must be a finite number > 0"),
        ({"lr": float("nan")}, "lr must be a finite number > 0"),
        ({"lr": float("inf")}, "lr must be a finite number > 0, got inf"),
        ({"weight_decay": float("inf")}, "weight_decay must be a finite number >= 0"),
        ({"weight_decay": -0.1}, "weight_decay must be a finite number >= 0"),
        ({"eps": 0.0}, "eps must be a finite number > 0"),
        ({"betas": (0.9, 1.0)}, "betas"),
        ({"betas": (-0.1, 0.999)}, "betas"),
        ({"betas": (0.9,)}, "betas"),
        ({"betas": (0.9, 0.99, 0.999)}, "betas"),
        ({"name": "sgd", "momentum": 1.0}, "momentum must be in"),
        ({"name": "sgd", "momentum": -0.5}, "momentum must be in"),
        ({"name": "sgd", "nesterov": True}, "nesterov"),
        ({"name": "sgd", "momentum": 0.0, "nesterov": True}, "nesterov"),
        ({"name": "adamw", "momentum": 0.9, "nesterov": True}, "nesterov"),
    ],
)
def test_optim_spec_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OptimSpec(**kwargs)


def test_betas_list_becomes_tuple():
    assert OptimSpec(betas=[0.8, 0.9]).betas == (0.8, 0.9)


def _param() -> list[torch.Tensor]:
    return [torch.zeros(2, 3, requires_grad=True)]


@pytest.mark.parametrize(
    ("spec", "cls", "group"),
    [
        (OptimSpec(name="adamw", lr=3e-4, weight_decay=0.1, betas=(0.8, 0.95), eps=1e-6),
         torch.optim.AdamW,
         {"lr": 3e-4, "weight_decay": 0.1, "betas": (0.8, 0.95), "eps": 1e-6}),
        (OptimSpec(name="adam", lr=2e-3, weight_decay=0.01),
         torch.optim.Adam,
         {"lr": 2e-3, "weight_decay": 0.01, "betas": (0.9, 0.999), "eps": 1e-8}),
        (OptimSpec(name="sgd", lr=0.5, momentum=0.9, nesterov=True, weight_decay=1e-4),
         torch.optim.SGD,
         {"lr": 0.5, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-4}),
        (OptimSpec(name="sgd", lr=0.1),
         torch.optim.SGD,
         {"lr": 0.1, "momentum": 0.0, "nesterov": False, "weight_decay": 0.0}),
    ],
)
def test_build_returns_the_torch_optimizer_with_the_values(spec, cls, group):
    params = _param()

    opt = spec.build(params)

    assert type(opt) is cls
    assert opt.param_groups[0]["params"] == params
    for key, value in group.items():
        assert opt.param_groups[0][key] == value, key


# -- LRSchedule -----------------------------------------------------------------------------------
def test_warmup_factors():
    s = LRSchedule(warmup_steps=4)
    # (t+1)/4 for t < 4, then 1
    assert [s.factor(t, 10) for t in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert s.active


def test_cosine_factors_by_hand():
    s = LRSchedule(warmup_steps=2, cosine=True, min_lr_ratio=0.1)
    # W = 2, T = 10, r = 0.1: t = 0, 1 warm-up -> 0.5, 1.0
    assert s.factor(0, 10) == pytest.approx(0.5)
    assert s.factor(1, 10) == pytest.approx(1.0)
    # t = 2: progress 0 -> 0.1 + 0.9 * 0.5 * (1 + cos 0) = 1.0
    assert s.factor(2, 10) == pytest.approx(1.0)
    # t = 6: progress 4/8 -> 0.1 + 0.9 * 0.5 * (1 + cos(pi/2)) = 0.55
    assert s.factor(6, 10) == pytest.approx(0.55)
    # t = 4: progress 2/8 -> 0.1 + 0.45 * (1 + cos(pi/4)) = 0.1 + 0.45 * 1.70710678 = 0.86819805
    assert s.factor(4, 10) == pytest.approx(0.86819805)
    # t = 10: progress 1 -> 0.1; beyond T stays at r
    assert s.factor(10, 10) == pytest.approx(0.1)
    assert s.factor(15, 10) == pytest.approx(0.1)


def test_cosine_without_warmup_starts_at_one():
    s = LRSchedule(cosine=True)
    # T = 4, r = 0: t = 0 -> 1; t = 2 -> 0.5 * (1 + cos(pi/2)) = 0.5; t = 4 -> 0
    assert s.factor(0, 4) == pytest.approx(1.0)
    assert s.factor(2, 4) == pytest.approx(0.5)
    assert s.factor(4, 4) == pytest.approx(0.0, abs=1e-12)


def test_default_schedule_is_inactive_and_flat():
    s = LRSchedule()
    assert not s.active
    assert s.factor(0, 10) == 1.0
    assert s.factor(9, 10) == 1.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"warmup_steps": -1}, "warmup_steps"), ({"min_lr_ratio": 1.5}, "min_lr_ratio"),
     ({"min_lr_ratio": -0.1}, "min_lr_ratio")],
)
def test_schedule_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LRSchedule(**kwargs)


class Scalar(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1, dtype=torch.float64))


def test_strategy_lr_follows_the_schedule_and_is_the_lr_used():
    # Prepare: peak lr 0.1, W = 2, cosine to r = 0.1 over T = 10; grad 1 so each step moves w by
    # exactly the lr used in that step
    strategy = DDP(optim=OptimSpec(name="sgd", lr=0.1),
                   schedule=LRSchedule(warmup_steps=2, cosine=True, min_lr_ratio=0.1))
    nodes = NodeStack(Scalar(), 2, engine="loop")
    strategy.setup(nodes, InProcessCommunicator(2), total_steps=10)
    # factors: t=0 0.5, t=1 1.0, t>=2: 0.1 + 0.45 * (1 + cos(pi * (t-2)/8))
    factors = [0.5, 1.0] + [0.1 + 0.45 * (1 + math.cos(math.pi * (t - 2) / 8))
                            for t in range(2, 10)]
    # spot checks of the list above: t=2 -> 1.0, t=6 -> 0.55
    assert factors[2] == pytest.approx(1.0)
    assert factors[6] == pytest.approx(0.55)

    w_before = 0.0
    for step in range(10):
        # Assert: the lr about to be used is 0.1 * factor(step)
        assert strategy.lr == pytest.approx(0.1 * factors[step]), step
        # Execute
        with torch.no_grad():
            nodes.grads["w"].fill_(1.0)
        strategy.step(step)
        # Assert: w moved by that lr
        w_now = float(nodes.params["w"][0, 0].detach())
        assert w_before - w_now == pytest.approx(0.1 * factors[step], abs=1e-12), step
        w_before = w_now
    # after the last step the scheduler is at t = T: r * lr = 0.01
    assert strategy.lr == pytest.approx(0.01)


def test_strategy_lr_warmup_only():
    strategy = DiLoCo(H=100, optim=OptimSpec(name="adamw", lr=1e-3),
                      schedule=LRSchedule(warmup_steps=4))
    nodes = NodeStack(Scalar(), 2, engine="loop")
    strategy.setup(nodes, InProcessCommunicator(2), total_steps=8)

    seen = []
    for step in range(6):
        seen.append(strategy.lr)
        strategy.step(step)

    # 1e-3 * [0.25, 0.5, 0.75, 1, 1, 1]
    assert seen == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])


def test_strategy_lr_without_schedule_is_constant():
    strategy = DDP(optim=OptimSpec(name="sgd", lr=0.3))
    nodes = NodeStack(Scalar(), 2, engine="loop")
    strategy.setup(nodes, InProcessCommunicator(2), total_steps=3)
    assert strategy.scheduler is None
    for step in range(3):
        strategy.step(step)
        assert strategy.lr == 0.3


# -- stacked optimizer == N optimizers ------------------------------------------------------------
@pytest.mark.parametrize(
    "spec",
    [
        OptimSpec(name="adamw", lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95)),
        OptimSpec(name="adam", lr=1e-2, weight_decay=0.01),
        OptimSpec(name="sgd", lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    ],
    ids=["adamw", "adam", "sgd-nesterov"],
)
def test_stacked_optimizer_equals_separate_optimizers(spec):
    # Prepare: N = 3 nodes, two parameters of different shapes, float64, different start rows
    n = 3
    gen = torch.Generator().manual_seed(0)
    init_a = torch.randn(n, 4, 5, generator=gen, dtype=torch.float64)
    init_b = torch.randn(n, 7, generator=gen, dtype=torch.float64)
    stacked_a = init_a.clone().requires_grad_(True)
    stacked_b = init_b.clone().requires_grad_(True)
    stacked_opt = spec.build([stacked_a, stacked_b])
    rows = [[init_a[i].clone().requires_grad_(True), init_b[i].clone().requires_grad_(True)]
            for i in range(n)]
    row_opts = [spec.build(r) for r in rows]

    for _ in range(5):
        grad_a = torch.randn(n, 4, 5, generator=gen, dtype=torch.float64)
        grad_b = torch.randn(n, 7, generator=gen, dtype=torch.float64)
        # Execute
        stacked_a.grad, stacked_b.grad = grad_a.clone(), grad_b.clone()
        stacked_opt.step()
        for i in range(n):
            rows[i][0].grad, rows[i][1].grad = grad_a[i].clone(), grad_b[i].clone()
            row_opts[i].step()

    # Assert: every row equals its own optimizer's result, and the parameters actually moved
    for i in range(n):
        assert torch.allclose(stacked_a[i], rows[i][0], rtol=0, atol=1e-12)
        assert torch.allclose(stacked_b[i], rows[i][1], rtol=0, atol=1e-12)
    assert not torch.allclose(stacked_a, init_a, atol=1e-3)
