"""Engine equivalence: loop engine == vmap engine == a plain sequential PyTorch reference.

The reference below uses no exogym engine or strategy code: N ``copy.deepcopy`` replicas of the
model, each with its own ``torch.optim.AdamW``, stepped node by node (0..N-1), with the
communication of each strategy done by hand (gradient averaging for DDP, parameter averaging for
FedAvg, an outer Nesterov SGD on a global copy for DiLoCo). Everything runs in float64 so that the
1e-6 tolerance measures real disagreement, not float32 round-off.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from exogym.sim.comm import InProcessCommunicator
from exogym.sim.engine import NodeStack
from exogym.strategy.ddp import DDP
from exogym.strategy.diloco import DiLoCo
from exogym.strategy.fedavg import FedAvg
from exogym.strategy.optim import LRSchedule, OptimSpec

N = 3  # nodes
STEPS = 20
H = 5  # 20 steps -> 4 syncs
BATCH = 8
MID = 17  # a step inside a round (FedAvg/DiLoCo nodes differ there)
DTYPE = torch.float64
TOL = {"atol": 1e-6, "rtol": 0.0}

# Inner optimizer, shared by the strategies and the reference (AdamW with weight decay).
LR, WD, BETAS, EPS = 1e-2, 1e-2, (0.9, 0.99), 1e-8
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9  # DiLoCo's outer optimizer: SGD with Nesterov momentum
CLIP = 0.05
WARMUP, MIN_LR_RATIO = 4, 0.1

STRATEGIES = ("ddp", "fedavg", "diloco")
ENGINES = ("loop", "vmap")

pytestmark = pytest.mark.usefixtures("single_thread")


# -- tiny models: model(batch) -> scalar loss ----------------------------------------------------
class MLP(nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.fc2(self.drop(torch.tanh(self.fc1(x)))), y)


class BNConvNet(nn.Module):
    """Conv -> BatchNorm2d (running statistics) -> ReLU -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 4 * 4, 4)

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        h = F.relu(self.bn(self.conv(x)))
        return F.cross_entropy(self.fc(h.flatten(1)), y)


class DictMLP(MLP):
    """Returns ``{"loss": ..., "acc": ...}`` instead of a bare loss."""

    def forward(self, batch: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        x, y = batch
        logits = self.fc2(torch.tanh(self.fc1(x)))
        acc = (logits.argmax(-1) == y).to(logits.dtype).mean()
        return {"loss": F.cross_entropy(logits, y), "acc": acc}


class ItemModel(nn.Module):
    """Calls ``.item()`` in forward (vmap cannot), after BatchNorm and dropout have already run,
    so that a fallback must also undo their side effects (running stats, RNG draws)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.bn = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        h = self.drop(self.bn(self.fc1(x)))
        # data-dependent Python control flow
        h = torch.tanh(h) if h.sum().item() > 0 else torch.sigmoid(h)
        return F.cross_entropy(self.fc2(h), y)


MODELS = {
    "mlp": (MLP, (6,)),
    "bn_cnn": (BNConvNet, (1, 6, 6)),
    "dropout_mlp": (lambda: MLP(dropout=0.5), (6,)),
    "dict_mlp": (DictMLP, (6,)),
    "item_model": (ItemModel, (6,)),
}


def build_model(kind: str) -> nn.Module:
    torch.manual_seed(1234)
    return MODELS[kind][0]().to(DTYPE)


def make_batches(kind: str, seed: int = 0) -> list[tuple[Tensor, Tensor]]:
    """Fixed node-stacked batches: ``STEPS`` x (x ``[N, B, ...]``, y ``[N, B]``)."""
    gen = torch.Generator().manual_seed(seed)
    shape = MODELS[kind][1]
    return [
        (torch.randn(N, BATCH, *shape, generator=gen, dtype=DTYPE),
         torch.randint(0, 4, (N, BATCH), generator=gen))
        for _ in range(STEPS)
    ]


# -- the learning-rate schedule, from LRSchedule's docstring ---------------------------------------
def lr_factor(t: int, total: int, warmup: int, min_ratio: float) -> float:
    if t < warmup:
        return (t + 1) / warmup
    progress = (t - warmup) / (total - warmup)
    return min_ratio + (1 - min_ratio) * (1 + math.cos(math.pi * progress)) / 2


def make_strategy(name: str, *, clip: float | None = None, schedule: bool = False):
    common = {
        "optim": OptimSpec(name="adamw", lr=LR, weight_decay=WD, betas=BETAS, eps=EPS),
        "schedule": (LRSchedule(warmup_steps=WARMUP, cosine=True, min_lr_ratio=MIN_LR_RATIO)
                     if schedule else LRSchedule()),
        "max_grad_norm": clip,
    }
    if name == "ddp":
        return DDP(**common)
    if name == "fedavg":
        return FedAvg(H=H, **common)
    return DiLoCo(H=H, outer_lr=OUTER_LR, outer_momentum=OUTER_MOMENTUM, outer_optimizer="nesterov",
                  **common)


# -- the plain-PyTorch reference -------------------------------------------------------------------
@dataclass
class RefRun:
    node_states: list[dict[str, Tensor]]  # after STEPS
    mid_states: list[dict[str, Tensor]]  # after MID steps
    global_state: dict[str, Tensor]
    losses: Tensor  # [STEPS, N]
    lrs: list[float]
    max_norm_seen: float


def _loss(out) -> Tensor:
    return out["loss"] if isinstance(out, dict) else out


def _snapshot(module: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@torch.no_grad()
def _average_params(modules: list[nn.Module]) -> None:
    """Every module's parameters <- their mean across modules."""
    for ps in zip(*[list(m.parameters()) for m in modules], strict=True):
        mean = torch.stack(ps).mean(0)
        for p in ps:
            p.copy_(mean)


@torch.no_grad()
def _average_float_buffers(modules: list[nn.Module]) -> None:
    """Every module's floating-point buffers <- their mean (counters are left alone)."""
    for bs in zip(*[list(m.buffers()) for m in modules], strict=True):
        if bs[0].is_floating_point():
            mean = torch.stack(bs).mean(0)
            for b in bs:
                b.copy_(mean)


def reference_run(model: nn.Module, batches, strategy: str, *, clip: float | None = None,
                  schedule: bool = False, seed: int = 0) -> RefRun:
    replicas = [copy.deepcopy(model).train() for _ in range(N)]
    opts = [torch.optim.AdamW(r.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
            for r in replicas]
    global_model = copy.deepcopy(model)
    outer = torch.optim.SGD(global_model.parameters(), lr=OUTER_LR, momentum=OUTER_MOMENTUM,
                            nesterov=True)
    losses, lrs, mid_states = [], [], []
    max_norm_seen = 0.0
    torch.manual_seed(seed)
    for t, (x, y) in enumerate(batches):
        step_losses = []
        for i, r in enumerate(replicas):  # node by node: forward, backward
            loss = _loss(r((x[i], y[i])))
            loss.backward()
            step_losses.append(loss.detach())
        losses.append(torch.stack(step_losses))
        with torch.no_grad():
            if strategy == "ddp":  # all-reduce (mean) of the gradients
                for ps in zip(*[list(r.parameters()) for r in replicas], strict=True):
                    mean = torch.stack([p.grad for p in ps]).mean(0)
                    for p in ps:
                        p.grad.copy_(mean)
            lr = LR * (lr_factor(t, STEPS, WARMUP, MIN_LR_RATIO) if schedule else 1.0)
            lrs.append(lr)
            for r, opt in zip(replicas, opts, strict=True):
                if clip is not None:
                    norm = torch.nn.utils.clip_grad_norm_(r.parameters(), clip)
                    max_norm_seen = max(max_norm_seen, float(norm))
                for g in opt.param_groups:
                    g["lr"] = lr
                opt.step()
                opt.zero_grad(set_to_none=True)
            if strategy == "ddp":  # broadcast_buffers: node 0's buffers to everyone
                for bs in zip(*[list(r.buffers()) for r in replicas], strict=True):
                    for b in bs[1:]:
                        b.copy_(bs[0])
                global_model.load_state_dict(replicas[0].state_dict())
            elif (t + 1) % H == 0 and strategy == "fedavg":
                _average_params(replicas)
                _average_float_buffers(replicas)
                global_model.load_state_dict(replicas[0].state_dict())
            elif (t + 1) % H == 0 and strategy == "diloco":
                for gp, *ps in zip(global_model.parameters(),
                                   *[list(r.parameters()) for r in replicas], strict=True):
                    gp.grad = gp.detach() - torch.stack([p.detach() for p in ps]).mean(0)
                outer.step()
                outer.zero_grad(set_to_none=True)
                for r in replicas:
                    for p, gp in zip(r.parameters(), global_model.parameters(), strict=True):
                        p.copy_(gp)
                _average_float_buffers(replicas)
                for gb, b0 in zip(global_model.buffers(), replicas[0].buffers(), strict=True):
                    gb.copy_(b0)  # float: the mean; counters: node 0's
        if t + 1 == MID:
            mid_states = [_snapshot(r) for r in replicas]
    return RefRun([_snapshot(r) for r in replicas], mid_states, _snapshot(global_model),
                  torch.stack(losses), lrs, max_norm_seen)


# -- exogym, driven through its public pieces ---------------------------------------------------
@dataclass
class ExoRun:
    nodes: NodeStack
    strategy: object
    node_states: list[dict[str, Tensor]]
    mid_states: list[dict[str, Tensor]]
    global_state: dict[str, Tensor]
    losses: Tensor
    lrs: list[float]


def exogym_run(model: nn.Module, batches, strategy_name: str, engine: str, *,
               clip: float | None = None, schedule: bool = False, seed: int = 0) -> ExoRun:
    nodes = NodeStack(model, N, engine=engine)
    comm = InProcessCommunicator(N)
    strategy = make_strategy(strategy_name, clip=clip, schedule=schedule)
    strategy.setup(nodes, comm, STEPS)
    losses, lrs, mid = [], [], []
    torch.manual_seed(seed)
    for step, batch in enumerate(batches):
        comm.attendance.step = step
        lrs.append(strategy.lr)
        losses.append(nodes.forward_backward(batch))
        strategy.step(step)
        nodes.zero_grad()
        if step + 1 == MID:
            mid = [{k: v.clone() for k, v in nodes.node_state(i).items()} for i in range(N)]
    states = [{k: v.clone() for k, v in nodes.node_state(i).items()} for i in range(N)]
    return ExoRun(nodes, strategy, states, mid, strategy.global_state(), torch.stack(losses), lrs)


def assert_states_close(actual: dict[str, Tensor], expected: dict[str, Tensor], what: str,
                        **tol) -> None:
    assert sorted(actual) == sorted(expected), what
    for k in expected:
        torch.testing.assert_close(actual[k], expected[k], **(tol or TOL),
                                   msg=lambda m, k=k: f"{what} {k}: {m}")


def assert_matches_reference(exo: ExoRun, ref: RefRun) -> None:
    torch.testing.assert_close(exo.losses, ref.losses, **TOL)
    for i in range(N):
        assert_states_close(exo.mid_states[i], ref.mid_states[i], f"node {i} after step {MID}")
        assert_states_close(exo.node_states[i], ref.node_states[i], f"node {i} after {STEPS}")
    assert_states_close(exo.global_state, ref.global_state, "global model")


# -- the grid ------------------------------------------------------------------------------------
GRID = [
    pytest.param(s, m, e, id=f"{s}-{m}-{e}")
    for s in STRATEGIES
    for m in ("mlp", "bn_cnn", "dropout_mlp")
    for e in ENGINES
    if not (m == "dropout_mlp" and e == "vmap")  # vmap draws other masks by design: see below
]


@pytest.mark.parametrize(("strategy", "kind", "engine"), GRID)
def test_engine_matches_sequential_reference(strategy: str, kind: str, engine: str) -> None:
    model = build_model(kind)
    batches = make_batches(kind)
    ref = reference_run(model, batches, strategy)
    exo = exogym_run(model, batches, strategy, engine)
    assert exo.nodes.engine == engine
    assert_matches_reference(exo, ref)
    mid0 = ref.mid_states[0]
    if strategy == "ddp":  # DDP keeps the replicas identical at every step
        for i in range(1, N):
            assert_states_close(exo.mid_states[i], mid0, f"ddp node {i} vs node 0")
    else:  # mid-round, local training has made the nodes differ: the syncs are not vacuous
        diff = max((exo.mid_states[1][k] - exo.mid_states[0][k]).abs().max().item()
                   for k in dict(model.named_parameters()))
        assert diff > 1e-4


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_clipping_and_lr_schedule_match_reference(strategy: str, engine: str) -> None:
    model = build_model("mlp")
    batches = make_batches("mlp", seed=1)
    ref = reference_run(model, batches, strategy, clip=CLIP, schedule=True)
    assert ref.max_norm_seen > CLIP  # clipping really changed some gradients
    exo = exogym_run(model, batches, strategy, engine, clip=CLIP, schedule=True)
    assert exo.lrs == pytest.approx(ref.lrs, rel=1e-12, abs=0)
    assert exo.lrs[0] == pytest.approx(LR / WARMUP)
    assert exo.lrs[WARMUP] == pytest.approx(LR)
    assert_matches_reference(exo, ref)
    # and the clipped run really differs from an unclipped one
    plain = exogym_run(model, batches, strategy, engine, schedule=True)
    w = "fc1.weight"
    assert not torch.allclose(plain.node_states[0][w], exo.node_states[0][w], **TOL)


# -- dropout under vmap --------------------------------------------------------------------------
class DropoutProbe(nn.Module):
    """loss = sum(dropout(w * x)): with x = 1, dL/dw counts the kept entries (shows the mask)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(width, dtype=DTYPE))
        self.drop = nn.Dropout(0.5)

    def forward(self, batch: Tensor) -> Tensor:
        return self.drop(self.w * batch).sum()


@pytest.mark.parametrize("engine", ENGINES)
def test_every_node_draws_its_own_dropout_mask(engine: str) -> None:
    nodes = NodeStack(DropoutProbe(), 4, engine=engine)
    x = torch.ones(4, BATCH, 32, dtype=DTYPE)  # identical params and inputs on every node
    torch.manual_seed(0)
    losses = nodes.forward_backward(x)
    assert nodes.engine == engine
    g = nodes.grads["w"]
    # dropout happened: each entry of the grad is 2 * (kept count over the batch), not BATCH
    assert not torch.equal(g[0], torch.full_like(g[0], float(BATCH)))
    assert torch.all(g.remainder(2) == 0)
    for i in range(4):
        for j in range(i):
            assert not torch.equal(g[i], g[j]), f"nodes {i} and {j} drew the same masks"
    torch.testing.assert_close(losses, g.sum(1))  # loss = 2 * kept = sum of the grad


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dropout_vmap_runs_and_is_seeded(strategy: str) -> None:
    model = build_model("dropout_mlp")
    batches = make_batches("dropout_mlp")
    a = exogym_run(model, batches, strategy, "vmap", seed=3)
    b = exogym_run(model, batches, strategy, "vmap", seed=3)
    c = exogym_run(model, batches, strategy, "vmap", seed=4)
    assert a.nodes.engine == "vmap"
    assert torch.isfinite(a.losses).all()
    assert_states_close(b.node_states[0], a.node_states[0], "same seed", atol=0.0, rtol=0.0)
    assert not torch.equal(a.losses, c.losses)  # the seed reaches the masks
    # The strategy's invariants still hold: after the last sync every node equals the global model.
    for i in range(N):
        assert_states_close(a.node_states[i], a.global_state, f"node {i} vs global")


# -- vmap -> loop fallback -----------------------------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_vmap_falls_back_to_loop_for_item_calls(strategy: str) -> None:
    model = build_model("item_model")
    batches = make_batches("item_model")
    with pytest.warns(RuntimeWarning, match="falling back to engine='loop'"):
        fell_back = exogym_run(model, batches, strategy, "vmap", seed=5)
    assert fell_back.nodes.engine == "loop"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the loop engine itself does not warn
        loop = exogym_run(model, batches, strategy, "loop", seed=5)
    exact = {"atol": 0.0, "rtol": 0.0}
    torch.testing.assert_close(fell_back.losses, loop.losses, **exact)
    for i in range(N):
        assert_states_close(fell_back.node_states[i], loop.node_states[i], f"node {i}", **exact)
    assert_states_close(fell_back.global_state, loop.global_state, "global", **exact)
    # and both are the sequential reference
    assert_matches_reference(loop, reference_run(model, batches, strategy, seed=5))


# -- models returning a mapping -------------------------------------------------------------------
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("strategy", ["ddp", "diloco"])
def test_model_returning_a_dict(strategy: str, engine: str) -> None:
    model = build_model("dict_mlp")
    batches = make_batches("dict_mlp")
    exo = exogym_run(model, batches, strategy, engine)
    assert exo.nodes.engine == engine
    assert_matches_reference(exo, reference_run(model, batches, strategy))


def test_diloco_outer_step_averages_batchnorm_statistics() -> None:
    """Regression: DiLoCo.outer_step zipped the parameter names with the reduced parameters AND
    buffers (strict=True), so any model with a float buffer crashed at the first outer step."""
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)).to(DTYPE)
    nodes = NodeStack(SquareLoss(model), 2, engine="loop")
    strategy = DiLoCo(H=1)
    strategy.setup(nodes, InProcessCommunicator(2), 1)
    nodes.forward_backward(torch.randn(2, 4, 3, dtype=DTYPE))
    stats_before = nodes.buffers["net.1.running_mean"].clone()
    strategy.step(0)
    mean = stats_before.mean(0)
    torch.testing.assert_close(nodes.buffers["net.1.running_mean"], mean.expand(2, 2))
    torch.testing.assert_close(strategy.global_state()["net.1.running_mean"], mean)


class SquareLoss(nn.Module):
    """Wraps ``net``: loss = sum of squares of ``net(x)``."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x).pow(2).sum()
