"""The threads engine: nodes in worker threads, each node's random numbers from its own generator.

What it must give: the loop engine's numbers (to float round-off) for models without randomness;
the same numbers run after run (dropout included) without touching torch's global generator
(beyond one draw per step that used randomness); the dropout math of ATen; a clear fallback or
error for a model drawing from the global generator inside its kernels.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from exogym import Trainer
from exogym.sim.engine import NodeStack, auto_engine
from exogym.sim.threads import (
    NodeRandomness,
    attention,
    dropout,
    intra_op_threads,
    node_seeds,
    pool_shape,
)
from exogym.strategy import make


class BNNet(nn.Module):
    """Conv + BatchNorm + linear, no randomness: the engines must agree."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        # no bias before BatchNorm: its gradient is round-off, which Adam turns into full steps
        self.conv = nn.Conv2d(1, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(p)
        self.fc = nn.Linear(4 * 6 * 6, 3)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        h = self.drop(F.relu(self.bn(self.conv(x))).flatten(1))
        return F.cross_entropy(self.fc(h), y)


def _batch(n: int, b: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, b, 1, 6, 6, generator=g), torch.randint(0, 3, (n, b), generator=g)


# -- the dropout math ----------------------------------------------------------------------------
def test_dropout_is_aten_s_formula_with_the_generator_s_mask() -> None:
    x = torch.tensor([1.0, -2.0, 3.0, 4.0, -5.0, 6.0])
    mask = torch.empty(6).bernoulli_(0.75, generator=torch.Generator().manual_seed(7))
    out = dropout(x, 0.25, True, torch.Generator().manual_seed(7))
    assert torch.equal(out, x * mask / 0.75)
    assert 0 < int(mask.sum()) < 6  # the seed gives a mixed mask: the test can fail
    # alpha dropout: a (x m + alpha' (m - 1 + p)), a = 1 / sqrt((alpha'^2 p + 1)(1 - p))
    alpha, p = 1.7580993408473766, 0.25
    a = 1 / math.sqrt((alpha ** 2 * p + 1) * (1 - p))
    out = dropout(x, p, True, torch.Generator().manual_seed(7), alpha=True)
    expected = [a * (xi * mi + alpha * (mi - 1 + p)) for xi, mi in zip(x.tolist(), mask.tolist(),
                                                                        strict=True)]
    torch.testing.assert_close(out, torch.tensor(expected), rtol=1e-6, atol=1e-6)
    assert torch.equal(dropout(x, 0.25, False, torch.Generator()), x)
    assert torch.equal(dropout(x, 1.0, True, torch.Generator()), torch.zeros(6))
    with pytest.raises(ValueError, match=r"between 0 and 1, but got 1\.5"):
        dropout(x, 1.5, True, torch.Generator())


def test_feature_dropout_drops_whole_channels() -> None:
    x = torch.ones(2, 8, 3, 3)
    out = dropout(x, 0.5, True, torch.Generator().manual_seed(1), feature=True)
    per_channel = out.flatten(2)
    assert torch.equal(per_channel.amin(2), per_channel.amax(2))  # one value per channel
    assert set(per_channel[..., 0].unique().tolist()) == {0.0, 2.0}


def test_node_randomness_routes_dropout_and_random_ops_to_the_node_s_generator() -> None:
    x = torch.randn(4, 3, 5, 5)
    state = torch.get_rng_state()

    def draw(seed: int) -> list[torch.Tensor]:
        mode = NodeRandomness(torch.Generator().manual_seed(seed))
        with mode:
            outs = [F.dropout(x, 0.3), F.dropout2d(x, 0.3), F.alpha_dropout(x, 0.3, True),
                    F.dropout1d(x[0], 0.5), torch.randn(5), torch.rand_like(x),
                    x.clone().bernoulli_(0.5), F.rrelu(x, training=True), nn.Dropout(0.4)(x)]
        assert mode.used
        return outs

    a, b, c = draw(3), draw(3), draw(4)
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert not any(torch.equal(p, q) for p, q in zip(a, c, strict=True))
    assert torch.equal(torch.get_rng_state(), state)  # the global generator untouched
    mode = NodeRandomness(torch.Generator())
    with mode:
        assert torch.equal(F.dropout(x, 0.3, training=False), x)
        assert torch.equal(F.alpha_dropout(x, 0.3), x)  # training defaults to False there
    assert not mode.used


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"scale": 0.3},
                                    {"attn_mask": torch.tensor([[True, False, True]] * 3)},
                                    {"attn_mask": torch.full((3, 3), -0.5).triu()}])
def test_attention_is_sdpa_s_math_with_the_node_s_dropout(kwargs: dict) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 3, 4, dtype=torch.float64, generator=g) for _ in range(3))
    if "attn_mask" in kwargs and kwargs["attn_mask"].is_floating_point():
        kwargs = {"attn_mask": kwargs["attn_mask"].double()}
    torch.testing.assert_close(attention(q, k, v, **kwargs, generator=torch.Generator()),
                               F.scaled_dot_product_attention(q, k, v, **kwargs),
                               rtol=1e-12, atol=1e-12)
    # with dropout: the weights' mask from the node's generator, scaled by 1 / (1 - p)
    weights = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)  # 1 / sqrt(E), E = 4
    mask = torch.empty_like(weights).bernoulli_(0.75, generator=torch.Generator().manual_seed(9))
    mode = NodeRandomness(torch.Generator().manual_seed(9))
    with mode:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.25)
    assert mode.used and 0 < int(mask.sum()) < mask.numel()
    torch.testing.assert_close(out, (weights * mask / 0.75) @ v, rtol=1e-12, atol=1e-12)


def test_node_seeds_depend_on_the_global_state_and_the_node_without_drawing() -> None:
    torch.manual_seed(0)
    state = torch.get_rng_state()
    seeds = node_seeds(4)
    assert torch.equal(torch.get_rng_state(), state)
    assert len(set(seeds)) == 4 and seeds == node_seeds(4)
    torch.manual_seed(1)
    assert node_seeds(4) != seeds


def test_pool_shape_splits_the_intra_op_threads() -> None:
    assert pool_shape(1, 2) == (1, 2)
    assert pool_shape(4, 2) == (2, 1)
    assert pool_shape(3, 16) == (3, 5)
    assert pool_shape(64, 16) == (16, 1)


def test_the_pool_leaves_the_process_s_thread_count_and_ends_with_its_owner() -> None:
    import gc
    import threading

    from exogym.sim.threads import NodePool

    with intra_op_threads(2):
        pool = NodePool(2, 1, lambda: None)
        assert pool.map(lambda i: (i, torch.get_num_threads()), [0, 1, 2]) == [
            (0, 1), (1, 1), (2, 1)]
        seen: list[int] = []  # a thread started later takes the process's count, not 1
        t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        t.start()
        t.join()
        assert seen == [2] and torch.get_num_threads() == 2
        workers = list(pool._threads)
        assert all(w.is_alive() for w in workers)
        del pool
        gc.collect()
        for w in workers:
            w.join(timeout=5)
        assert not any(w.is_alive() for w in workers)
        with pytest.raises(ZeroDivisionError):  # a task's error reaches the caller
            NodePool(1, 1, lambda: None).map(lambda i: 1 // i, [1, 0])


def test_the_caller_is_one_of_the_pool_s_workers() -> None:
    import threading

    from exogym.sim.threads import NodePool

    alone = NodePool(1, 1, lambda: None)  # one worker: the caller, no thread started
    assert alone._threads == []
    assert alone.map(lambda i: threading.current_thread(), [0, 1]) == [
        threading.current_thread()] * 2
    three = NodePool(3, 1, lambda: None)
    assert len(three._threads) == 2
    met = threading.Barrier(3, timeout=10)  # passed only by three runners at once
    runners = three.map(lambda i: (met.wait(), threading.current_thread())[1], [0, 1, 2])
    assert len(set(runners)) == 3 and threading.current_thread() in runners
    with pytest.raises(ValueError, match="workers >= 1"):
        NodePool(0, 1, lambda: None)


# -- the engine ------------------------------------------------------------------------------------
def test_auto_picks_threads_for_several_nodes_on_a_cpu() -> None:
    cpu = torch.device("cpu")
    assert auto_engine(cpu, 1) == "loop"
    assert auto_engine(torch.device("cuda"), 4) == "vmap"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert auto_engine(cpu, 2) == "threads"
        torch.set_num_threads(1)
        assert auto_engine(cpu, 2) == "loop"
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("micro", [None, 4])
def test_threads_give_the_loop_s_gradients_buffers_and_losses(micro: int | None) -> None:
    torch.manual_seed(0)
    model = BNNet().double()
    batch = tuple(t.double() if t.is_floating_point() else t for t in _batch(5))
    active = [True, False, True, True, True]
    out = {}
    for engine in ("loop", "threads"):
        nodes = NodeStack(model, 5, engine=engine, micro_batch_size=micro)
        state = torch.get_rng_state()
        losses = [nodes.forward_backward(batch), nodes.forward_backward(batch, active)]
        assert nodes.engine == engine
        assert torch.equal(torch.get_rng_state(), state)  # no randomness: no draw
        out[engine] = (losses, dict(nodes.grads), dict(nodes.buffers))
    (la, ga, ba), (lb, gb, bb) = out["loop"], out["threads"]
    for x, y in zip(la, lb, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
    assert lb[1][1] == 0  # the absent node
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], rtol=1e-12, atol=1e-12)
    for name in ba:
        torch.testing.assert_close(ba[name], bb[name], rtol=1e-12, atol=1e-12)


def test_a_step_leaves_the_caller_one_intra_op_thread_and_restores_its_count() -> None:
    with intra_op_threads(2):
        nodes = NodeStack(BNNet(), 4, engine="threads")
        with nodes.stepping():
            assert torch.get_num_threads() == 1
            nodes.forward_backward(_batch(4))
        assert torch.get_num_threads() == 2
        assert (nodes._pool.workers, nodes._pool.threads_per_worker) == (2, 1)  # sized by 2
        loop = NodeStack(BNNet(), 4, engine="loop")
        with loop.stepping():  # other engines: unchanged
            assert torch.get_num_threads() == 2
        with pytest.raises(ZeroDivisionError), nodes.stepping():
            raise ZeroDivisionError("in a step")
        assert torch.get_num_threads() == 2


def test_threads_with_dropout_are_deterministic_and_draw_once_per_step() -> None:
    torch.manual_seed(0)
    model = BNNet(p=0.5)
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        nodes = NodeStack(model, 4, engine="threads")
        losses = [nodes.forward_backward(_batch(4, seed=s)) for s in range(3)]
        runs.append((losses, {k: g.clone() for k, g in nodes.grads.items()},
                     torch.get_rng_state()))
    assert all(torch.equal(a, b) for a, b in zip(runs[0][0], runs[1][0], strict=True))
    assert all(torch.equal(runs[0][1][k], runs[1][1][k]) for k in runs[0][1])
    torch.manual_seed(5)
    for _ in range(3):
        torch.randint(2, ())
    assert torch.equal(runs[0][2], torch.get_rng_state())  # one draw per step, nothing else
    # each node its own masks: same batch and weights, other losses
    nodes = NodeStack(model, 2, engine="threads")
    x, y = _batch(1)
    losses = nodes.forward_backward((x.expand(2, *x.shape[1:]), y.expand(2, *y.shape[1:])))
    assert losses[0] != losses[1]


class GlobalDraw(nn.Module):
    """Draws from the global generator where a node's generator cannot reach (inside
    ``F.gumbel_softmax``, a torch function that draws in its body) from call ``late`` on."""

    def __init__(self, late: int = 0) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.late, self.calls = late, 0

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        h = self.fc(batch)
        if self.calls > self.late:
            h = F.gumbel_softmax(h)
        return h.square().mean()


def test_a_model_drawing_from_the_global_generator_falls_back_to_the_loop() -> None:
    batch = torch.randn(2, 3, 4)
    nodes = NodeStack(GlobalDraw(), 2, engine="threads")
    with pytest.warns(RuntimeWarning, match="engine='threads': the model draws from torch's "
                                            "global random generator .* running engine='loop'"):
        nodes.forward_backward(batch)
    assert nodes.engine == "loop"
    nodes = NodeStack(GlobalDraw(), 2, engine="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # auto: no warning, a log line
        nodes.forward_backward(batch)
    assert nodes.engine == "loop"


def test_a_global_draw_after_the_first_step_is_an_error() -> None:
    nodes = NodeStack(GlobalDraw(late=2), 2, engine="threads")  # the worker copies count calls
    batch = torch.randn(2, 3, 4)
    nodes.forward_backward(batch)
    with pytest.raises(RuntimeError, match="drew from torch's global random generator inside a "
                                           "node's forward"):
        for _ in range(3):
            nodes.forward_backward(batch)


def _fit(engine: str, p: float, seed: int = 0):
    torch.manual_seed(0)
    x, y = _batch(1, b=96)
    data = TensorDataset(x[0], y[0])
    return Trainer(BNNet(p), data).fit(
        strategy=make("diloco", H=2), num_nodes=3, max_steps=4, batch_size=8, log_interval=1,
        engine=engine, seed=seed, progress=False)  # type: ignore[arg-type]


def test_fit_with_threads_is_deterministic_and_equals_the_loop_without_dropout() -> None:
    a, b = _fit("threads", p=0.3), _fit("threads", p=0.3)
    assert a.engine == "threads"
    assert [r["train_loss"] for r in a.history] == [r["train_loss"] for r in b.history]
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters(),
                                                 strict=True))
    loop, threads = _fit("loop", p=0.0), _fit("threads", p=0.0)
    for p, q in zip(loop.model.parameters(), threads.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert loop.bytes_sent == threads.bytes_sent


def test_a_process_that_ran_threads_exits_cleanly() -> None:
    # The workers end, joined, when their pool goes (here as main() returns, just before the
    # process exits): a worker thread still ending while the process tears torch down aborted
    # it ("terminate called without an active exception"; half of such runs before the join).
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import torch
        from torch import nn
        from torch.utils.data import TensorDataset
        from exogym import Classifier, Trainer

        def main():
            data = TensorDataset(torch.randn(64, 1, 8, 8), torch.randint(0, 3, (64,)))
            net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(144, 3))
            r = Trainer(Classifier(net), data).fit(strategy="ddp", num_nodes=4, max_steps=2,
                                                   batch_size=8, engine="threads",
                                                   progress=False)
            assert r.engine == "threads"

        main()
    """)
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode == 0 and "terminate" not in done.stderr, done.stderr[-2000:]
