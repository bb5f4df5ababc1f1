"""NodeStack details: tied weights, input validation, device resolution."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exogym.engine import NodeStack, loss_of, resolve_device


class TiedLM(nn.Module):
    """Embedding and output projection share one weight (registered under two names)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.out = nn.Linear(3, 5, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.out(self.emb(batch[:, :-1])).flatten(0, 1),
                                           batch[:, 1:].flatten())


@pytest.mark.parametrize("engine", ["loop", "vmap"])
def test_tied_weights_get_the_gradient_of_both_uses(engine: str) -> None:
    torch.manual_seed(0)
    model = TiedLM()
    batch = torch.randint(0, 5, (2, 4, 6))  # [N=2, B=4, T=6]
    nodes = NodeStack(model, 2, engine=engine)  # type: ignore[arg-type]
    assert list(nodes.params) == ["emb.weight"]  # one tensor, one stacked parameter
    losses = nodes.forward_backward(batch)
    for i in range(2):
        ref = TiedLM()
        ref.load_state_dict(model.state_dict())
        loss = ref(batch[i])
        loss.backward()
        torch.testing.assert_close(losses[i], loss.detach())
        # The shared weight's gradient sums the embedding's and the projection's parts.
        torch.testing.assert_close(nodes.grads["emb.weight"][i], ref.emb.weight.grad)


def test_node_stack_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_nodes must be >= 1, got 0"):
        NodeStack(nn.Linear(2, 1), 0)
    with pytest.raises(ValueError, match="engine must be one of"):
        NodeStack(nn.Linear(2, 1), 2, engine="jit")  # type: ignore[arg-type]
    frozen = nn.Linear(2, 1)
    frozen.bias.requires_grad_(False)
    with pytest.raises(ValueError, match="'bias' has requires_grad=False"):
        NodeStack(frozen, 2)


def test_loss_of_accepts_scalar_or_mapping_only() -> None:
    assert loss_of(torch.tensor([2.0])).shape == ()
    assert loss_of({"loss": torch.tensor(1.0), "accuracy": torch.tensor(0.5)}) == 1.0
    with pytest.raises(TypeError, match="must include 'loss'"):
        loss_of({"acc": torch.tensor(1.0)})
    with pytest.raises(TypeError, match=r"scalar loss tensor.*\(3,\)"):
        loss_of(torch.ones(3))


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda", "mps")
    with pytest.raises(ValueError, match="device must be one of"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            resolve_device("cuda")


def test_parameters_change_in_place_only() -> None:
    """The loop engine's per-node views must keep seeing the stacked tensors after updates."""
    nodes = NodeStack(nn.Linear(2, 1), 2, engine="loop")
    with torch.no_grad():
        nodes.params["weight"].add_(1.0)
    assert torch.equal(nodes._node_params[1]["weight"], nodes.params["weight"][1])
