"""NodeStack details: tied weights, input validation, device resolution, the model contract."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from exogym import Trainer
from exogym.sim.engine import NodeStack, loss_of, metrics_of, resolve_device


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
    with pytest.raises(TypeError, match="a mapping without 'loss' \\(keys \\['acc'\\]\\)"):
        loss_of({"acc": torch.tensor(1.0)})
    with pytest.raises(TypeError, match=r"scalar loss tensor.*got Tensor\(3,\)"):
        loss_of(torch.ones(3))
    with pytest.raises(TypeError, match=r"scalar loss tensor.*got str"):
        loss_of({"loss": "0.5"})


class _ModelOutput(OrderedDict):
    """The shape of ``transformers.utils.ModelOutput``: an OrderedDict whose entries are also
    attributes (a dataclass in transformers; its None fields are left out of the mapping)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class _LossObject:
    def __init__(self, loss: torch.Tensor) -> None:
        self.loss, self.logits = loss, torch.zeros(4, 3)


def test_metrics_of_keeps_scalar_numbers_and_ignores_the_rest() -> None:
    out = _ModelOutput(loss=torch.tensor(0.25), logits=torch.zeros(8, 10),
                       hidden_states=(torch.zeros(8, 4),), aux=torch.tensor([0.5]),
                       tokens=7, note="text", flag=torch.tensor(True), past=None)
    got = metrics_of(out)
    assert sorted(got) == ["aux", "loss", "tokens"]
    assert got["loss"] == 0.25 and got["aux"] == 0.5 and got["tokens"] == 7
    assert all(v.shape == () for v in got.values())
    assert loss_of(out) == 0.25 and loss_of(_LossObject(torch.tensor(1.5))) == 1.5
    assert metrics_of(_LossObject(torch.tensor(1.5))) == {"loss": torch.tensor(1.5)}
    assert metrics_of(torch.tensor(3.0)) == {"loss": torch.tensor(3.0)}


NO_LOSS = ("A Hugging Face causal LM (GPT-2, ...) computes its loss only when given labels: the "
           "dataset needs a 'labels' column (or the batch a 'labels' key; for a causal LM, the "
           "input_ids themselves). model(batch) must return a scalar loss tensor")


def test_an_output_without_a_loss_says_where_labels_go() -> None:
    """A Hugging Face model given no labels returns a ModelOutput without its (None) loss, or
    an object whose ``.loss`` is None: the error says no loss came back and where labels go."""
    outputs = (_ModelOutput(logits=torch.zeros(2, 3)), {"logits": torch.zeros(2, 3), "loss": None},
               _LossObject(None))  # type: ignore[arg-type]
    for out in outputs:
        with pytest.raises(TypeError) as err:
            loss_of(out)
        keys = "[]" if isinstance(out, _LossObject) else "['logits']"
        assert str(err.value).startswith(
            f"the model returned no loss: a mapping without 'loss' (keys {keys}). {NO_LOSS}")


class _HFStyleClassifier(nn.Module):
    """A model that returns what every ``transformers`` model returns: a ModelOutput with the
    loss, the logits (not a metric) and a scalar extra."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> _ModelOutput:
        x, y = batch
        logits = self.lin(x)
        return _ModelOutput(loss=F.cross_entropy(logits, y), logits=logits,
                            accuracy=(logits.argmax(-1) == y).float().mean(), name="hf")


@pytest.mark.parametrize("engine", ["loop", "vmap"])
def test_a_transformers_shaped_model_trains_and_evaluates(engine: str) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
    data = TensorDataset(x, y)
    result = Trainer(_HFStyleClassifier(), data, data).fit(
        strategy="ddp", num_nodes=2, max_steps=4, batch_size=8, eval_interval=2,
        engine=engine, progress=False, network=None, eval_at_start=True)
    assert sorted(result.final) == ["eval_accuracy", "eval_loss"]
    assert all(math.isfinite(v) for v in result.final.values())
    assert [r["step"] for r in result.history if "eval_loss" in r] == [0, 2, 4]


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
