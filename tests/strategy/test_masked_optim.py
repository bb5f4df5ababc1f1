"""Masked optimizer steps (exogym.strategy.masked): some nodes step, each with its own count, and
every node's row equals ``torch.optim`` run on that node alone (float64, 1e-12)."""

from __future__ import annotations

import pytest
import torch

from exogym.strategy.masked import masked_step, supports_masked_step

MASKS = [[1, 1, 1], [1, 0, 1], [0, 1, 0], [1, 1, 1], [0, 0, 1], [1, 1, 0]]
OPTIMIZERS = [
    (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
    (torch.optim.AdamW, {"lr": 3e-3, "betas": (0.8, 0.95), "eps": 1e-6}),
    (torch.optim.Adam, {"lr": 1e-2, "weight_decay": 0.1}),
    # fused groups (exogym's inner optimizers on a CPU): torch's fused kernel on each row
    (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1, "fused": True}),
    (torch.optim.Adam, {"lr": 1e-2, "weight_decay": 0.1, "fused": True}),
    (torch.optim.SGD, {"lr": 1e-2}),
    (torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9}),
    (torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9, "nesterov": True, "weight_decay": 0.05}),
    (torch.optim.SGD, {"lr": 1e-2, "momentum": 0.5, "dampening": 0.3}),
]


@pytest.mark.parametrize(("cls", "kwargs"), OPTIMIZERS)
def test_each_node_steps_as_torch_alone(cls: type[torch.optim.Optimizer],
                                        kwargs: dict[str, object]) -> None:
    # Prepare: 3 nodes stacked, and 3 single-node reference optimizers
    g = torch.Generator().manual_seed(0)
    stacked = torch.randn(3, 4, 5, dtype=torch.float64, generator=g).requires_grad_(True)
    opt = cls([stacked], **kwargs)
    refs = [stacked[i].detach().clone().requires_grad_(True) for i in range(3)]
    ref_opts = [cls([r], **kwargs) for r in refs]
    counts = torch.zeros(3, dtype=torch.long)

    # Execute: six steps, each with its own set of nodes that computed
    for mask in MASKS:
        grad = torch.randn(3, 4, 5, dtype=torch.float64, generator=g)
        stacked.grad = grad.clone()
        masked_step(opt, torch.tensor(mask, dtype=torch.bool), counts)
        for i in range(3):
            if mask[i]:
                refs[i].grad = grad[i].clone()
                ref_opts[i].step()

    # Assert: every row as its own optimizer (fused: the same kernel on the same elements,
    # exactly); counts are each node's steps
    atol = 0.0 if kwargs.get("fused") else 1e-12
    for i in range(3):
        torch.testing.assert_close(stacked[i].detach(), refs[i].detach(), rtol=0, atol=atol)
    assert counts.tolist() == [sum(m[i] for m in MASKS) for i in range(3)] == [4, 4, 4]


def test_inactive_rows_and_their_state_are_untouched() -> None:
    w = torch.randn(2, 3, dtype=torch.float64).requires_grad_(True)
    opt = torch.optim.AdamW([w], lr=0.1)
    counts = torch.zeros(2, dtype=torch.long)
    w.grad = torch.ones(2, 3, dtype=torch.float64)
    before = w.detach().clone()
    masked_step(opt, torch.tensor([True, False]), counts)
    assert torch.equal(w[1], before[1]) and not torch.equal(w[0], before[0])
    state = opt.state[w]
    assert torch.equal(state["exp_avg"][1], torch.zeros(3, dtype=torch.float64))
    assert counts.tolist() == [1, 0]


def test_optimizers_it_cannot_mask_are_refused() -> None:
    w = torch.zeros(2, 3, requires_grad=True)
    opt = torch.optim.RMSprop([w])
    assert not supports_masked_step(opt)
    with pytest.raises(TypeError, match="RMSprop cannot step a subset of the nodes"):
        masked_step(opt, torch.tensor([True, False]), torch.zeros(2, dtype=torch.long))
