"""NodeStack micro-batches (gradient accumulation) and bf16 autocast."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor, nn

from exogym.sim.engine import NodeStack

N, B = 3, 8


class MLP(nn.Module):
    """5 -> 7 -> 3 classifier; returns ``{"loss", "accuracy"}`` like :class:`exogym.Classifier`."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))

    def forward(self, batch: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        x, y = batch
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits, y),
                "accuracy": (logits.argmax(-1) == y).float().mean()}


class DataDependent(MLP):
    """Python control flow on a value: vmap cannot run it, the first step falls back to the loop."""

    def forward(self, batch: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        out = super().forward(batch)
        if out["loss"].item() > -1.0:
            return out
        raise AssertionError("a cross-entropy is never negative")


class BNNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(5, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x: Tensor) -> Tensor:
        return self.bn(self.lin(x)).pow(2).mean()


def _batch(dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, B, 5, generator=g, dtype=dtype), torch.randint(0, 3, (N, B), generator=g)


def _run(model: nn.Module, engine: str, m: int | None, batch: object,
         precision: str = "fp32") -> tuple[Tensor, dict[str, Tensor], NodeStack]:
    nodes = NodeStack(model, N, engine=engine, micro_batch_size=m,  # type: ignore[arg-type]
                      precision=precision)  # type: ignore[arg-type]
    losses = nodes.forward_backward(batch)
    return losses, {k: g.clone() for k, g in nodes.grads.items()}, nodes


@pytest.mark.parametrize("engine", ["loop", "vmap"])
@pytest.mark.parametrize("m", [2, 4, 3])  # B/4, B/2, and 3 + 3 + 2 rows (a partial last one)
def test_micro_batches_give_the_full_batch_loss_and_gradient(engine: str, m: int) -> None:
    torch.manual_seed(0)
    model = MLP().double()
    batch = _batch()
    losses, grads, _ = _run(model, engine, m, batch)
    # Reference: node i's unmodified module on its whole batch, one backward.
    for i in range(N):
        ref = MLP().double()
        ref.load_state_dict(model.state_dict())
        loss = ref((batch[0][i], batch[1][i]))["loss"]
        loss.backward()
        torch.testing.assert_close(losses[i], loss.detach(), rtol=0, atol=1e-12)
        for name, p in ref.named_parameters():
            torch.testing.assert_close(grads[name][i], p.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("engine", ["loop", "vmap"])
def test_micro_batch_of_the_whole_batch_or_more_is_the_unsplit_path(engine: str) -> None:
    torch.manual_seed(0)
    model = MLP()
    batch = _batch(torch.float32)
    ref_losses, ref_grads, _ = _run(model, engine, None, batch)
    for m in (B, B + 5):
        losses, grads, _ = _run(model, engine, m, batch)
        assert torch.equal(losses, ref_losses)
        assert all(torch.equal(grads[k], ref_grads[k]) for k in grads)


@pytest.mark.parametrize("engine", ["loop", "vmap"])
def test_micro_batch_gradients_add_to_existing_gradients(engine: str) -> None:
    torch.manual_seed(0)
    batch = _batch()
    losses, grads, nodes = _run(MLP().double(), engine, 3, batch)
    again = nodes.forward_backward(batch)
    assert torch.equal(again, losses)
    for k, g in nodes.grads.items():
        torch.testing.assert_close(g, 2 * grads[k], rtol=0, atol=1e-12)


def test_vmap_fallback_keeps_micro_batches() -> None:
    torch.manual_seed(0)
    model = DataDependent().double()
    batch = _batch()
    ref_losses, ref_grads, _ = _run(model, "loop", None, batch)
    with pytest.warns(RuntimeWarning, match="falling back to engine='loop'"):
        losses, grads, nodes = _run(model, "vmap", 3, batch)
    assert nodes.engine == "loop"
    torch.testing.assert_close(losses, ref_losses, rtol=0, atol=1e-12)
    for k in grads:  # the failed vmap attempt left nothing behind
        torch.testing.assert_close(grads[k], ref_grads[k], rtol=0, atol=1e-12)


@pytest.mark.parametrize("engine", ["loop", "vmap"])
def test_batchnorm_updates_its_statistics_once_per_micro_batch(engine: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(N, B, 5)
    _, _, whole = _run(BNNet(), engine, None, x)
    _, _, split = _run(BNNet(), engine, 3, x)
    assert whole.buffers["bn.num_batches_tracked"].tolist() == [1] * N
    assert split.buffers["bn.num_batches_tracked"].tolist() == [3] * N  # 3 + 3 + 2 rows


def test_bad_arguments_are_rejected() -> None:
    for bad in (0, -2, True, 2.0, "4"):
        with pytest.raises(ValueError, match=f"micro_batch_size must be None or an integer >= 1, "
                                             f"got {bad!r}"):
            NodeStack(MLP(), 2, micro_batch_size=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"precision must be one of \('fp32', 'bf16'\), "
                                         r"got 'fp16'"):
        NodeStack(MLP(), 2, precision="fp16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="autocast does not run on device type 'meta'"):
        NodeStack(MLP(), 2, device=torch.device("meta"), precision="bf16")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"precision='bf16' needs cpu, cuda where .*"
                                             r"'cuda' is not available"):
            NodeStack(MLP(), 2, device=torch.device("cuda"), precision="bf16")


@pytest.mark.parametrize("engine", ["loop", "vmap"])
def test_micro_batches_need_one_batch_dimension(engine: str) -> None:
    nodes = NodeStack(MLP(), N, engine=engine, micro_batch_size=2)  # type: ignore[arg-type]
    x, y = _batch(torch.float32)
    with pytest.raises(ValueError, match=r"\[N, B, \.\.\.\] with one batch size B, got shapes "
                                         r"\[\(3, 8, 5\), \(3, 6\)\]"):
        nodes.forward_backward((x, y[:, :6]))
    with pytest.raises(ValueError, match=r"got shapes \[\(3, 8, 5\), \(3,\)\]"):
        nodes.forward_backward((x, y[:, 0]))


class Regressor(nn.Module):
    """A bias-free first layer: its output is bf16 under autocast in both engines (a Linear with a
    bias returns fp32 under vmap, see the engine's docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 32, bias=False)
        self.rest = nn.Sequential(nn.Tanh(), nn.Linear(32, 1))

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.rest(self.first(x)).squeeze(-1), y)


def _regression() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, 16, 8, generator=g)
    return x, x[..., 0] - 0.5 * x[..., 1]  # a target the MLP fits quickly


@pytest.mark.parametrize("engine", ["loop", "vmap"])
@pytest.mark.parametrize("m", [None, 6])
def test_bf16_autocast_on_cpu(engine: str, m: int | None) -> None:
    torch.manual_seed(0)
    model = Regressor()
    seen: list[torch.dtype] = []
    model.first.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    batch = _regression()
    fp32_losses, fp32_grads, _ = _run(model, engine, m, batch)
    assert set(seen) == {torch.float32}
    seen.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # autocast would warn if it disabled itself
        losses, grads, nodes = _run(model, engine, m, batch, precision="bf16")
    assert set(seen) == {torch.bfloat16}  # the forward ran under autocast
    assert losses.dtype == torch.float32
    assert all(g.dtype == torch.float32 for g in grads.values())
    assert all(p.dtype == torch.float32 for p in nodes.params.values())
    rel = ((losses - fp32_losses).abs() / fp32_losses).max().item()
    assert 0 < rel < 2e-2
    cos = nn.functional.cosine_similarity(
        torch.cat([g.flatten(1) for g in grads.values()], 1),
        torch.cat([g.flatten(1) for g in fp32_grads.values()], 1))
    assert (cos > 0.99).all()


@pytest.mark.parametrize("engine", ["loop", "vmap"])
def test_bf16_training_decreases_the_loss(engine: str) -> None:
    torch.manual_seed(0)
    nodes = NodeStack(Regressor(), N, engine=engine, precision="bf16")  # type: ignore[arg-type]
    batch = _regression()
    first = nodes.forward_backward(batch)
    for _ in range(20):
        with torch.no_grad():
            for name, p in nodes.params.items():
                p.sub_(0.1 * nodes.grads[name])
        nodes.zero_grad()
        last = nodes.forward_backward(batch)
    assert (last < 0.1 * first).all(), (first, last)
