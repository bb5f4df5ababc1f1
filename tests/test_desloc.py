"""DES-LOC (arXiv:2505.22549): parameters averaged every K_x steps, the first moment every K_u,
the second every K_v, each before that step's update; bytes per period; the node-mean global
model; checkpoints. Expectations are worked out in the comments; float64 throughout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from by_hand import F64, TOL, build, stack, step_with, t
from test_sparseloco import check_checkpoint_resume
from torch import nn

from exogym import MnistCNN
from exogym.strategy import make
from exogym.strategy.desloc import DESLOC
from exogym.strategy.optim import OptimSpec
from exogym.tasks.models import Classifier
from exogym.utils.config import ConfigError


def test_sgd_momentum_by_hand():
    # Prepare: N = 2, w = [1, 2], inner SGD lr 0.1 with momentum 0.5 (torch: buf <- 0.5 buf + g,
    # first buf = g; w <- w - 0.1 buf); K_x = 2, K_u = 3, K_v = 6 (SGD has no second moment)
    s = DESLOC(K_x=2, K_u=3, optim=OptimSpec(name="sgd", lr=0.1, momentum=0.5))
    nodes, comm = build(s, (1.0, 2.0))

    # Execute t = 1 (no average): buf = g; w_0 = [0.9, 2], w_1 = [0.7, 1.8]
    step_with(s, nodes, [[1.0, 0.0], [3.0, 2.0]], 0)
    assert torch.allclose(nodes.params["w"], t([[0.9, 2.0], [0.7, 1.8]]), **TOL)

    # Execute t = 2: 2 mod K_x = 0 -> w <- mean = [0.8, 1.9] before the update (the gradient was
    # taken at each node's own w); buf_0 = .5 [1, 0] + [2, 2] = [2.5, 2],
    # buf_1 = .5 [3, 2] + [0, -2] = [1.5, -1]
    step_with(s, nodes, [[2.0, 2.0], [0.0, -2.0]], 1)
    assert torch.allclose(nodes.params["w"], t([[0.55, 1.7], [0.65, 2.0]]), **TOL)

    # Execute t = 3: 3 mod K_u = 0 -> buf <- mean = [2, 0.5] before the update; g = 0;
    # buf = 0.5 [2, 0.5] = [1, 0.25] on both nodes
    step_with(s, nodes, [[0.0, 0.0], [0.0, 0.0]], 2)

    # Assert: w_0 = [0.55, 1.7] - [0.1, 0.025], w_1 = [0.65, 2.0] - [0.1, 0.025]
    assert torch.allclose(nodes.params["w"], t([[0.45, 1.675], [0.55, 1.975]]), **TOL)
    buf = s.optimizer.state[nodes.params["w"]]["momentum_buffer"]
    assert torch.allclose(buf, t([[1.0, 0.25], [1.0, 0.25]]), **TOL)
    # the global model is the node mean
    assert torch.allclose(s.global_state()["w"], t([0.5, 1.825]), **TOL)
    # bytes: one all-reduce of w at t = 2, one of buf at t = 3, 16 bytes each: 2 (N-1)/N * 16
    assert [(r.op, r.payload_bytes, r.tag, r.step) for r in comm.log] == [
        ("all_reduce", 16, "params", -1), ("all_reduce", 16, "first_moment", -1)]
    assert comm.bytes_sent == [32.0, 32.0]


def test_adam_equals_per_node_adams_with_averaged_states():
    # Prepare: N = 3, K_x = 4, K_u = 2, K_v = 3, inner AdamW; the reference: one torch AdamW per
    # node, its exp_avg averaged when t mod 2 = 0, exp_avg_sq when t mod 3 = 0, parameters when
    # t mod 4 = 0, all before that step's update
    n = 3
    spec = OptimSpec(name="adamw", lr=0.05, betas=(0.8, 0.9), weight_decay=0.1)
    s = DESLOC(K_x=4, K_u=2, K_v=3, optim=spec)
    nodes, comm = build(s, (0.5, -1.0, 2.0), n=n)
    rows = [t([0.5, -1.0, 2.0]).requires_grad_(True) for _ in range(n)]
    refs = [spec.build([r]) for r in rows]
    g = torch.Generator().manual_seed(0)

    for step in range(8):
        grads = torch.randn(n, 3, generator=g, dtype=F64)
        tt = step + 1
        # Execute
        step_with(s, nodes, grads.tolist(), step)
        # the reference
        with torch.no_grad():
            for key, period in (("exp_avg", 2), ("exp_avg_sq", 3)):
                if tt % period == 0:
                    mean = torch.stack([refs[i].state[rows[i]][key] for i in range(n)]).mean(0)
                    for i in range(n):
                        refs[i].state[rows[i]][key].copy_(mean)
            if tt % 4 == 0:
                mean = torch.stack([r.detach() for r in rows]).mean(0)
                for r in rows:
                    r.copy_(mean)
        for i in range(n):
            rows[i].grad = grads[i].clone()
            refs[i].step()

        # Assert: every node after every step
        expected = torch.stack([r.detach() for r in rows])
        torch.testing.assert_close(nodes.params["w"].detach(), expected, rtol=0, atol=1e-12)
    # 8 steps: params at t = 4, 8; u at 2, 4, 6, 8; v at 3, 6 (the first u at t = 2 exists)
    tags = [r.tag for r in comm.log]
    assert tags.count("params") == 2 and tags.count("first_moment") == 4
    assert tags.count("second_moment") == 2


def test_mnist_cnn_bytes_equal_the_documented_formula():
    # Prepare: MNIST CNN (P = 861,480 bytes, no buffers), N = 4, defaults K_x = 4, K_u = 12,
    # K_v = 24, inner AdamW
    s = make("desloc")
    assert (s.K_x, s.K_u, s.K_v) == (4, 12, 24)
    _, comm = stack(s, Classifier(MnistCNN()), 4, 24)

    # Execute: 24 steps on zero gradients (the bytes do not depend on the values)
    for step in range(24):
        s.step(step)

    # Assert: parameters at t = 4, 8, ..., 24 (6), u at 12, 24 (2), v at 24 (1): nine ring
    # all-reduces of P, 2 (3/4) P = 1,292,220 bytes each; 484,582.5 bytes per step on average
    assert [r.payload_bytes for r in comm.log] == [861480] * 9
    assert comm.bytes_sent == [9 * 1292220.0] * 4
    assert comm.bytes_sent[0] / 24 == 484582.5


def test_with_muon_the_second_moment_is_the_adamw_part_only():
    # Prepare: Linear(3, 2): weight 2 x 3 (Muon: momentum_buffer), bias 2 (AdamW: exp_avg,
    # exp_avg_sq); K_x = 10, K_u = K_v = 2; float64, N = 2
    s = DESLOC(K_x=10, K_u=2, K_v=2, optim=OptimSpec(name="muon", muon_ns_dtype="fp64"))
    nodes, comm = stack(s, nn.Linear(3, 2).to(F64), n=2)
    g = torch.Generator().manual_seed(1)

    # Execute: two steps with different gradients per node
    for step in range(2):
        for grad in nodes.grads.values():
            grad.copy_(torch.randn(grad.shape, generator=g, dtype=F64))
        s.step(step)

    # Assert: at t = 2, u = the weight's momentum_buffer + the bias's exp_avg (8 float64 = 64
    # bytes), v = the bias's exp_avg_sq (16 bytes)
    assert [(r.tag, r.payload_bytes) for r in comm.log] == [("first_moment", 64),
                                                          ("second_moment", 16)]
    state = s.optimizer.state
    weight, bias = state[nodes.params["weight"]], state[nodes.params["bias"]]
    first = s.moments(("exp_avg", "momentum_buffer"))
    assert len(first) == 2
    assert first[0] is weight["momentum_buffer"] and first[1] is bias["exp_avg"]


def test_global_model_is_the_node_mean_with_buffers():
    s = DESLOC(K_x=100, optim=OptimSpec(name="sgd", lr=0.1, momentum=0.9))
    nodes, _ = build(s, (1.0, 2.0), bn=True)
    nodes.buffers["bn.running_mean"].copy_(t([[1.0, 2.0], [3.0, 8.0]]))
    step_with(s, nodes, [[1.0, 0.0], [3.0, 2.0]], 0)
    state = s.global_state()
    assert torch.allclose(state["w"], t([0.8, 1.9]), **TOL)
    assert torch.allclose(state["bn.running_mean"], t([2.0, 5.0]), **TOL)
    assert s.sync_period is None


def test_defaults_validation_and_the_recommended_ratios():
    s = make("desloc", K_x="8")
    assert (s.K_u, s.K_v) == (24, 48)
    assert (make("desloc", K_x="8", K_u="5").K_u, make("desloc", K_v="7").K_v) == (5, 7)
    with pytest.raises(ConfigError, match="K_x must be"):
        make("desloc", K_x="0")
    with pytest.raises(ConfigError, match="K_u must be"):
        make("desloc", K_u="-3")
    with pytest.raises(ConfigError, match=r"optim\.name must be adam, adamw, muon or sgd with "
                                          r"momentum > 0, got 'sgd'"):
        make("desloc", **{"optim.name": "sgd"})
    with pytest.raises(ConfigError, match="does not support a transport codec"):
        make("desloc", codec="int8")


def test_checkpoint_resume_is_exact(tmp_path: Path):
    # K_x = 2, K_u = 3, K_v = 4, stop at 5: local AdamW moments and diverged nodes to restore
    check_checkpoint_resume(lambda: DESLOC(K_x=2, K_u=3, K_v=4), tmp_path)


def test_checkpoint_resume_with_muon_is_exact(tmp_path: Path):
    check_checkpoint_resume(
        lambda: DESLOC(K_x=2, K_u=3, K_v=4, optim=OptimSpec(name="muon")), tmp_path)
