"""A node's tensors bound into a template module (exogym.sim.binding): the numbers of
functional_call, tied weights, buffers updated in place, the template's own tensors back."""

import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.nn.utils import parametrize

from exogym.sim.binding import bound, slots_of


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.norm = nn.BatchNorm1d(4)
        self.head = nn.Linear(4, 5, bias=False)
        self.head.weight = self.embed.weight  # one tensor, two names

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(x))).logsumexp(-1).mean()


def _state(module: nn.Module, seed: int) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(seed)
    params = {n: torch.randn(p.shape, generator=g).requires_grad_(True)
              for n, p in module.named_parameters()}
    buffers = {n: b.clone() for n, b in module.named_buffers()}
    return params, buffers


def test_slots_name_each_place_a_tied_tensor_is_kept():
    module = Tied()
    slots = slots_of(module)
    assert sorted((s.key, s.name) for s in slots.params) == [
        ("bias", "norm.bias"), ("weight", "embed.weight"), ("weight", "embed.weight"),
        ("weight", "norm.weight")]
    assert sorted(s.name for s in slots.buffers) == [
        "norm.num_batches_tracked", "norm.running_mean", "norm.running_var"]
    assert slots_of(module) is slots  # found once


def test_bound_call_is_functional_call_and_the_template_is_restored():
    module = Tied().train()
    own = {n: t for n, t in module.named_parameters(remove_duplicate=False)}
    own_buffers = dict(module.named_buffers())
    x = torch.tensor([[0, 1, 2], [3, 4, 0]]).reshape(-1)
    params, buffers = _state(module, 0)
    ref_params = {n: p.detach().clone().requires_grad_(True) for n, p in params.items()}
    ref_buffers = {n: b.clone() for n, b in buffers.items()}

    with bound(module, params, buffers) as m:
        loss = m(x)
    loss.backward()
    ref = functional_call(module, (ref_params, ref_buffers), (x,), tie_weights=True)
    ref.backward()

    assert torch.equal(loss, ref)
    for name in params:
        assert torch.equal(params[name].grad, ref_params[name].grad), name
    # the tied head used the node's embedding: its gradient holds both uses
    assert module.head.weight is module.embed.weight is own["embed.weight"]
    # BatchNorm's running statistics were updated in place, in the node's buffers
    assert buffers["norm.num_batches_tracked"].item() == 1
    assert torch.equal(buffers["norm.running_mean"], ref_buffers["norm.running_mean"])
    assert not torch.equal(buffers["norm.running_mean"], torch.zeros(4))
    for name, t in module.named_parameters(remove_duplicate=False):
        assert t is own[name]
    for name, t in module.named_buffers():
        assert t is own_buffers[name] and (name != "norm.running_mean" or t.abs().sum() == 0)


def test_the_template_is_restored_after_an_error():
    module = nn.Linear(3, 2)
    weight, bias = module.weight, module.bias
    params = {"weight": torch.zeros(2, 3), "bias": torch.zeros(2)}
    with pytest.raises(RuntimeError, match="shape"), bound(module, params, {}) as m:
        m(torch.zeros(4, 5))
    assert module.weight is weight and module.bias is bias


def test_a_parametrized_weight_is_bound_through_its_original():
    module = nn.Linear(3, 2)
    parametrize.register_parametrization(module, "weight", _Double())
    params, _ = _state(module, 1)
    assert sorted(params) == ["bias", "parametrizations.weight.original"]
    x = torch.ones(1, 3)
    with bound(module, params, {}) as m:
        out = m(x)
    expected = x @ (2 * params["parametrizations.weight.original"]).T + params["bias"]
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


class _Double(nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return 2 * w


def test_a_reassigned_buffer_is_undone_as_functional_call_undoes_it():
    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("seen", torch.zeros(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.seen = self.seen + 1  # reassigned, not updated in place
            return x.sum()

    module = Counter()
    own = module.seen
    node = {"seen": torch.zeros(())}
    with bound(module, {}, node) as m:
        m(torch.ones(2))
    assert module.seen is own and own.item() == 0 and node["seen"].item() == 0
