"""DES-LOC (arXiv:2505.22549): parameters averaged every K_x steps, the first moment every K_u,
the second every K_v, each after that step's update (the authors' code) or before it (the
paper's Algorithm 1 as written); bytes per period; the node-mean global model; checkpoints.
Expectations are worked out in the comments; float64 throughout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.by_hand import F64, TOL, build, stack, step_with, t
from support.checkpoints import check_checkpoint_resume
from torch import nn

from exogym import MnistCNN
from exogym.strategy import make
from exogym.strategy.desloc import DESLOC
from exogym.strategy.optim import OptimSpec
from exogym.tasks.models import Classifier
from exogym.utils.config import ConfigError


def test_sgd_momentum_by_hand_averages_after_the_step():
    # Prepare: N = 2, w = [1, 2], inner SGD lr 0.1 with momentum 0.5 (torch: buf <- 0.5 buf + g,
    # first buf = g; w <- w - 0.1 buf); K_x = 2, K_u = 3, K_v = 6 (SGD has no second moment);
    # the default placement, after the step
    s = DESLOC(K_x=2, K_u=3, K_v=6, optim=OptimSpec(name="sgd", lr=0.1, momentum=0.5))
    assert s.average == "after"
    nodes, comm = build(s, (1.0, 2.0))

    # Execute t = 1 (no average): buf = g; w_0 = [0.9, 2], w_1 = [0.7, 1.8]
    step_with(s, nodes, [[1.0, 0.0], [3.0, 2.0]], 0)
    assert torch.allclose(nodes.params["w"], t([[0.9, 2.0], [0.7, 1.8]]), **TOL)

    # Execute t = 2: buf_0 = .5 [1, 0] + [2, 2] = [2.5, 2], buf_1 = .5 [3, 2] + [0, -2] =
    # [1.5, -1]; w_0 = [0.9, 2] - [0.25, 0.2] = [0.65, 1.8], w_1 = [0.7, 1.8] - [0.15, -0.1] =
    # [0.55, 1.9]; then 2 mod K_x = 0 -> both w <- mean = [0.6, 1.85]
    step_with(s, nodes, [[2.0, 2.0], [0.0, -2.0]], 1)
    assert torch.allclose(nodes.params["w"], t([[0.6, 1.85], [0.6, 1.85]]), **TOL)

    # Execute t = 3: buf_0 = .5 [2.5, 2] + [1, 0] = [2.25, 1], buf_1 = .5 [1.5, -1] + [0, 1] =
    # [0.75, 0.5]; w_0 = [0.6, 1.85] - [0.225, 0.1], w_1 = [0.6, 1.85] - [0.075, 0.05]; then
    # 3 mod K_u = 0 -> both buf <- mean = [1.5, 0.75] (the parameters stay local)
    step_with(s, nodes, [[1.0, 0.0], [0.0, 1.0]], 2)

    # Assert
    assert torch.allclose(nodes.params["w"], t([[0.375, 1.75], [0.525, 1.8]]), **TOL)
    buf = s.optimizer.state[nodes.params["w"]]["momentum_buffer"]
    assert torch.allclose(buf, t([[1.5, 0.75], [1.5, 0.75]]), **TOL)
    assert torch.allclose(s.global_state()["w"], t([0.45, 1.775]), **TOL)
    # bytes: one all-reduce of w at t = 2, one of buf at t = 3, 16 bytes each: 2 (N-1)/N * 16
    assert [(r.op, r.payload_bytes, r.tag, r.step) for r in comm.log] == [
        ("all_reduce", 16, "params", -1), ("all_reduce", 16, "first_moment", -1)]
    assert comm.bytes_sent == [32.0, 32.0]


def test_sgd_momentum_by_hand_averages_before_the_step():
    # Prepare: as above with average="before" (the paper's Algorithm 1 as written)
    s = DESLOC(K_x=2, K_u=3, K_v=6, average="before",
               optim=OptimSpec(name="sgd", lr=0.1, momentum=0.5))
    nodes, comm = build(s, (1.0, 2.0))

    # Execute t = 1 (no average): buf = g; w_0 = [0.9, 2], w_1 = [0.7, 1.8]
    step_with(s, nodes, [[1.0, 0.0], [3.0, 2.0]], 0)
    assert torch.allclose(nodes.params["w"], t([[0.9, 2.0], [0.7, 1.8]]), **TOL)

    # Execute t = 2: 2 mod K_x = 0 -> w <- mean = [0.8, 1.9] before the update (the gradient was
    # taken at each node's own w); buf_0 = .5 [1, 0] + [2, 2] = [2.5, 2],
    # buf_1 = .5 [3, 2] + [0, -2] = [1.5, -1]
    step_with(s, nodes, [[2.0, 2.0], [0.0, -2.0]], 1)
    assert torch.allclose(nodes.params["w"], t([[0.55, 1.7], [0.65, 2.0]]), **TOL)

    # Execute t = 3: 3 mod K_u = 0 -> buf <- mean = [2, 0.5] before the update;
    # buf_0 = .5 [2, 0.5] + [1, 0] = [2, 0.25], buf_1 = .5 [2, 0.5] + [0, 1] = [1, 1.25]
    step_with(s, nodes, [[1.0, 0.0], [0.0, 1.0]], 2)

    # Assert: w_0 = [0.55, 1.7] - [0.2, 0.025], w_1 = [0.65, 2.0] - [0.1, 0.125]
    assert torch.allclose(nodes.params["w"], t([[0.35, 1.675], [0.55, 1.875]]), **TOL)
    buf = s.optimizer.state[nodes.params["w"]]["momentum_buffer"]
    assert torch.allclose(buf, t([[2.0, 0.25], [1.0, 1.25]]), **TOL)
    assert torch.allclose(s.global_state()["w"], t([0.45, 1.775]), **TOL)
    assert [(r.op, r.payload_bytes, r.tag, r.step) for r in comm.log] == [
        ("all_reduce", 16, "params", -1), ("all_reduce", 16, "first_moment", -1)]


@pytest.mark.parametrize(("average", "after_two"), [
    ("after", [[2.0, 1.0], [2.0, 1.0]]),
    ("before", [[1.5, 0.5], [2.5, 1.5]]),
])
def test_where_the_gradient_after_an_average_is_taken(average: str, after_two):
    # Prepare: node m minimises 0.5 |w - c_m|^2, so its gradient at w is w - c_m, computed here
    # from the parameters the node holds (as a training step would); c_0 = [1, 0], c_1 = [3, 2];
    # w = [0, 0]; SGD lr 0.5, momentum 0.5; K_x = 1 (parameters averaged every step), no moment
    # averages within two steps
    c = t([[1.0, 0.0], [3.0, 2.0]])
    s = DESLOC(K_x=1, K_u=100, K_v=100, average=average,
               optim=OptimSpec(name="sgd", lr=0.5, momentum=0.5))
    nodes, _ = build(s, (0.0, 0.0))

    # Execute t = 1: g = [[-1, 0], [-3, -2]] at w = 0; w_0 = [0.5, 0], w_1 = [1.5, 1]
    # ("after": then both w <- [1, 0.5]; "before": the average of the equal w = 0 came first)
    step_with(s, nodes, (nodes.params["w"].detach() - c).tolist(), 0)
    first = [[1.0, 0.5], [1.0, 0.5]] if average == "after" else [[0.5, 0.0], [1.5, 1.0]]
    assert torch.allclose(nodes.params["w"], t(first), **TOL)

    # Execute t = 2. "after": g at the averaged w = [1, 0.5]: [[0, 0.5], [-2, -1.5]];
    # buf_0 = .5 [-1, 0] + [0, .5] = [-.5, .5], buf_1 = .5 [-3, -2] + [-2, -1.5] = [-3.5, -2.5];
    # w_0 = [1.25, 0.25], w_1 = [2.75, 1.75]; then both <- [2, 1].
    # "before": g at the node's own w: [[-.5, 0], [-1.5, -1]]; w <- mean = [1, .5] first;
    # buf_0 = [-1, 0], buf_1 = [-3, -2]; w_0 = [1, .5] + [.5, 0], w_1 = [1, .5] + [1.5, 1]
    step_with(s, nodes, (nodes.params["w"].detach() - c).tolist(), 1)

    # Assert
    assert torch.allclose(nodes.params["w"], t(after_two), **TOL)


@pytest.mark.parametrize("average", ["after", "before"])
def test_a_moment_period_of_one_is_sent_at_the_first_step_only_after(average: str):
    # After the step the optimizer has its state from t = 1 on; before the first step it has
    # none (all zeros on every node), so nothing is sent there
    s = DESLOC(K_x=10, K_u=1, K_v=10, average=average,
               optim=OptimSpec(name="sgd", lr=0.1, momentum=0.5))
    nodes, comm = build(s, (1.0, 2.0))
    step_with(s, nodes, [[1.0, 0.0], [3.0, 2.0]], 0)
    buf = s.optimizer.state[nodes.params["w"]]["momentum_buffer"]
    if average == "after":
        assert [r.tag for r in comm.log] == ["first_moment"]
        assert torch.allclose(buf, t([[2.0, 1.0], [2.0, 1.0]]), **TOL)
    else:
        assert comm.log == []
        assert torch.allclose(buf, t([[1.0, 0.0], [3.0, 2.0]]), **TOL)


@pytest.mark.parametrize("average", ["after", "before"])
def test_adam_equals_per_node_adams_with_averaged_states(average: str):
    # Prepare: N = 3, K_x = 4, K_u = 2, K_v = 3, inner AdamW; the reference: one torch AdamW per
    # node, its exp_avg averaged when t mod 2 = 0, exp_avg_sq when t mod 3 = 0, parameters when
    # t mod 4 = 0, after that step's update (or before it)
    n = 3
    spec = OptimSpec(name="adamw", lr=0.05, betas=(0.8, 0.9), weight_decay=0.1)
    s = DESLOC(K_x=4, K_u=2, K_v=3, average=average, optim=spec)
    nodes, comm = build(s, (0.5, -1.0, 2.0), n=n)
    rows = [t([0.5, -1.0, 2.0]).requires_grad_(True) for _ in range(n)]
    refs = [spec.build([r]) for r in rows]
    g = torch.Generator().manual_seed(0)

    for step in range(8):
        grads = torch.randn(n, 3, generator=g, dtype=F64)
        # Execute
        step_with(s, nodes, grads.tolist(), step)
        # the reference
        if average == "before":
            _average_reference(refs, rows, step + 1)
        for i in range(n):
            rows[i].grad = grads[i].clone()
            refs[i].step()
        if average == "after":
            _average_reference(refs, rows, step + 1)

        # Assert: every node after every step
        expected = torch.stack([r.detach() for r in rows])
        torch.testing.assert_close(nodes.params["w"].detach(), expected, rtol=0, atol=1e-12)
    # 8 steps: params at t = 4, 8; v at 3, 6; u at 2, 4, 6, 8 (before the step at t = 2 the
    # first u exists: the optimizer stepped at t = 1)
    tags = [r.tag for r in comm.log]
    assert tags.count("params") == 2 and tags.count("first_moment") == 4
    assert tags.count("second_moment") == 2


@torch.no_grad()
def _average_reference(refs: list, rows: list, tt: int) -> None:
    """The reference's averages at step ``tt``: exp_avg every 2, exp_avg_sq every 3, the
    parameters every 4 steps, each replaced by its node mean."""
    n = len(rows)
    for key, period in (("exp_avg", 2), ("exp_avg_sq", 3)):
        if tt % period == 0:
            mean = torch.stack([refs[i].state[rows[i]][key] for i in range(n)]).mean(0)
            for i in range(n):
                refs[i].state[rows[i]][key].copy_(mean)
    if tt % 4 == 0:
        mean = torch.stack([r.detach() for r in rows]).mean(0)
        for r in rows:
            r.copy_(mean)


def test_mnist_cnn_bytes_equal_the_documented_formula():
    # Prepare: MNIST CNN (P = 861,480 bytes, no buffers), N = 4, defaults K_x = 4, K_u = 12,
    # K_v = K_u = 12, inner AdamW
    s = make("desloc")
    assert (s.K_x, s.K_u, s.K_v, s.average) == (4, 12, 12, "after")
    _, comm = stack(s, Classifier(MnistCNN()), 4, 24)

    # Execute: 24 steps on zero gradients (the bytes do not depend on the values)
    for step in range(24):
        s.step(step)

    # Assert: parameters at t = 4, 8, ..., 24 (6), u at 12, 24 (2), v at 12, 24 (2): ten ring
    # all-reduces of P, 2 (3/4) P = 1,292,220 bytes each; 538,425 bytes per step on average
    assert [r.payload_bytes for r in comm.log] == [861480] * 10
    assert [r.tag for r in comm.log[:4]] == ["params", "params", "first_moment",
                                             "second_moment"]
    assert comm.bytes_sent == [10 * 1292220.0] * 4
    assert comm.bytes_sent[0] / 24 == 538425.0


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


def test_defaults_validation_and_the_periods():
    s = make("desloc", K_x="8")
    assert (s.K_u, s.K_v) == (24, 24)
    assert (make("desloc", K_x="8", K_u="5").K_v, make("desloc", K_v="7").K_v) == (5, 7)
    assert make("desloc", average="before").average == "before"
    with pytest.raises(ConfigError, match=r"average must be one of \['after', 'before'\], got "
                                          r"'pre'"):
        make("desloc", average="pre")
    with pytest.raises(ConfigError, match="K_x must be"):
        make("desloc", K_x="0")
    with pytest.raises(ConfigError, match="K_u must be"):
        make("desloc", K_u="-3")
    with pytest.raises(ConfigError, match=r"optim\.name must be adam, adamw, muon or sgd with "
                                          r"momentum > 0, got 'sgd'"):
        make("desloc", **{"optim.name": "sgd"})
    with pytest.raises(ConfigError, match="does not support a transport codec"):
        make("desloc", codec="int8")


@pytest.mark.parametrize("average", ["after", "before"])
def test_checkpoint_resume_is_exact(tmp_path: Path, average: str):
    # K_x = 2, K_u = 3, K_v = 4, stop at 5: local AdamW moments and diverged nodes to restore
    check_checkpoint_resume(lambda: DESLOC(K_x=2, K_u=3, K_v=4, average=average), tmp_path)


def test_checkpoint_resume_with_muon_is_exact(tmp_path: Path):
    check_checkpoint_resume(
        lambda: DESLOC(K_x=2, K_u=3, K_v=4, optim=OptimSpec(name="muon")), tmp_path)


def test_an_absent_node_is_neither_averaged_in_nor_charged_and_keeps_its_values():
    # Prepare: w = [1, 2] on 3 nodes, SGD lr 0.1 momentum 0.5, parameters averaged every step
    s = DESLOC(K_x=1, K_u=100, K_v=100, optim=OptimSpec(name="sgd", lr=0.1, momentum=0.5))
    nodes, comm = build(s, (1.0, 2.0), n=3)

    # Execute: node 2 is down (computed nothing: zero gradient, no optimizer step)
    comm.attendance.active = [True, True, False]
    step_with(s, nodes, [[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]], 0)

    # Assert: nodes 0 and 1 step to [0.9, 2], [1, 1.8] and average among themselves to
    # [0.95, 1.9]; node 2 keeps [1, 2]; a ring of M = 2: 2 (M-1)/M * 16 = 16 bytes each, none
    # for node 2
    assert torch.allclose(nodes.params["w"], t([[0.95, 1.9], [0.95, 1.9], [1.0, 2.0]]), **TOL)
    assert comm.log[-1].members == 0b011 and comm.bytes_sent == [16.0, 16.0, 0.0]
