"""Closed-form checks of DDP, FedAvg and DiLoCo on hand-made node-stacked tensors.

Every test builds a tiny model whose parameters are set by hand, stacks it on N nodes, writes the
per-node gradients by hand and calls ``strategy.step`` directly. The expected values are worked out
in the comments (float64 throughout, so the arithmetic is exact to ~1e-15).
"""

from __future__ import annotations

import pytest
import torch
from support.by_hand import F64, TOL, Vec, build, set_rows, sgd, t
from torch import nn

from exogym.sim.comm import InProcessCommunicator
from exogym.sim.engine import NodeStack
from exogym.strategy import DDP, DiLoCo, FedAvg


class TwoParams(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.zeros(2, dtype=F64))
        self.b = nn.Parameter(torch.zeros(1, dtype=F64))


# -- DDP ------------------------------------------------------------------------------------------
def test_ddp_averages_grads_then_steps_every_node_identically():
    # Prepare
    ddp = DDP(optim=sgd(0.1))
    nodes, comm = build(ddp, [0.5, -1.0])
    set_rows(nodes.grads["w"], [[1.0, 2.0], [3.0, 4.0]])

    # Execute
    ddp.step(0)

    # Assert: g = ([1,2] + [3,4]) / 2 = [2,3]; p = [0.5,-1] - 0.1*[2,3] = [0.3, -1.3] on both nodes
    assert torch.allclose(nodes.grads["w"], t([[2.0, 3.0], [2.0, 3.0]]), **TOL)
    assert torch.allclose(nodes.params["w"], t([[0.3, -1.3], [0.3, -1.3]]), **TOL)
    assert torch.equal(nodes.params["w"][0], nodes.params["w"][1])
    assert torch.allclose(ddp.global_state()["w"], t([0.3, -1.3]), **TOL)
    # one all-reduce of 2 float64 = 16 bytes; no buffers so no broadcast
    assert [(r.op, r.payload_bytes, r.tag) for r in comm.log] == [("all_reduce", 16, "grads")]


def test_ddp_broadcasts_node0_buffers():
    # Prepare
    ddp = DDP(optim=sgd(0.1))
    nodes, comm = build(ddp, [0.0, 0.0], bn=True)
    set_rows(nodes.buffers["bn.running_mean"], [[1.0, 2.0], [3.0, 4.0]])
    set_rows(nodes.buffers["bn.running_var"], [[5.0, 6.0], [7.0, 8.0]])
    nodes.buffers["bn.num_batches_tracked"].copy_(torch.tensor([3, 5]))

    # Execute
    ddp.step(0)

    # Assert: every node gets node 0's buffers, counters included
    assert torch.equal(nodes.buffers["bn.running_mean"], t([[1.0, 2.0], [1.0, 2.0]]))
    assert torch.equal(nodes.buffers["bn.running_var"], t([[5.0, 6.0], [5.0, 6.0]]))
    assert nodes.buffers["bn.num_batches_tracked"].tolist() == [3, 3]
    # buffers: 16 + 16 + 8 bytes broadcast from node 0
    assert [(r.op, r.payload_bytes, r.tag) for r in comm.log] == [
        ("all_reduce", 16, "grads"), ("broadcast", 40, "buffers")]


def test_ddp_without_broadcast_buffers_leaves_buffers_per_node():
    ddp = DDP(optim=sgd(0.1), broadcast_buffers=False)
    nodes, comm = build(ddp, [0.0, 0.0], bn=True)
    set_rows(nodes.buffers["bn.running_mean"], [[1.0, 2.0], [3.0, 4.0]])

    ddp.step(0)

    assert torch.equal(nodes.buffers["bn.running_mean"], t([[1.0, 2.0], [3.0, 4.0]]))
    assert [r.op for r in comm.log] == ["all_reduce"]


# -- FedAvg ---------------------------------------------------------------------------------------
def test_fedavg_averages_every_H_steps():
    # Prepare: theta0 = [1, 2], sgd lr 0.1, H = 2
    fedavg = FedAvg(H=2, optim=sgd(0.1))
    nodes, comm = build(fedavg, [1.0, 2.0])

    # Execute step 0: g0 = [1,0], g1 = [3,2]
    set_rows(nodes.grads["w"], [[1.0, 0.0], [3.0, 2.0]])
    fedavg.step(0)

    # Assert: no sync: node0 = [1,2] - 0.1*[1,0] = [0.9, 2.0]; node1 = [1,2] - [0.3,0.2] = [0.7,1.8]
    assert torch.allclose(nodes.params["w"], t([[0.9, 2.0], [0.7, 1.8]]), **TOL)
    assert torch.equal(fedavg.global_state()["w"], t([1.0, 2.0]))  # the initial model
    assert comm.log == []

    # Execute step 1: g0 = [1,1], g1 = [-1,1]
    set_rows(nodes.grads["w"], [[1.0, 1.0], [-1.0, 1.0]])
    fedavg.step(1)

    # Assert: node0 = [0.8, 1.9]; node1 = [0.8, 1.7]; (step+1) % 2 == 0 -> mean = [0.8, 1.8]
    assert torch.allclose(nodes.params["w"], t([[0.8, 1.8], [0.8, 1.8]]), **TOL)
    assert torch.allclose(fedavg.global_state()["w"], t([0.8, 1.8]), **TOL)
    assert [(r.op, r.payload_bytes, r.tag) for r in comm.log] == [("all_reduce", 16, "params")]


def test_fedavg_averages_float_buffers_and_keeps_counters():
    # Prepare
    fedavg = FedAvg(H=1, optim=sgd(0.1))
    nodes, _ = build(fedavg, [0.0, 0.0], bn=True)
    set_rows(nodes.buffers["bn.running_mean"], [[1.0, 2.0], [3.0, 4.0]])
    set_rows(nodes.buffers["bn.running_var"], [[1.0, 1.0], [3.0, 5.0]])
    nodes.buffers["bn.num_batches_tracked"].copy_(torch.tensor([3, 5]))
    before = fedavg.global_state()

    # Execute
    fedavg.step(0)

    # Assert: running_mean = ([1,2]+[3,4])/2 = [2,3]; running_var = ([1,1]+[3,5])/2 = [2,3]
    assert torch.equal(before["bn.running_mean"], t([0.0, 0.0]))
    assert torch.allclose(nodes.buffers["bn.running_mean"], t([[2.0, 3.0], [2.0, 3.0]]), **TOL)
    assert torch.allclose(nodes.buffers["bn.running_var"], t([[2.0, 3.0], [2.0, 3.0]]), **TOL)
    assert nodes.buffers["bn.num_batches_tracked"].tolist() == [3, 5]  # not averaged
    g = fedavg.global_state()
    assert torch.allclose(g["bn.running_mean"], t([2.0, 3.0]), **TOL)
    assert torch.allclose(g["bn.running_var"], t([2.0, 3.0]), **TOL)
    assert int(g["bn.num_batches_tracked"]) == 3  # node 0's counter


# -- DiLoCo ---------------------------------------------------------------------------------------
def test_diloco_two_outer_steps_nesterov_by_hand():
    # Prepare: theta0 = [1, 2], N = 2, H = 1, inner sgd lr 0.1, outer lr 0.7, mu 0.9, nesterov
    diloco = DiLoCo(H=1, outer_lr=0.7, outer_momentum=0.9, outer_optimizer="nesterov",
                    optim=sgd(0.1))
    nodes, comm = build(diloco, [1.0, 2.0])

    # Execute outer step 1: g0 = [1,0], g1 = [3,2]
    set_rows(nodes.grads["w"], [[1.0, 0.0], [3.0, 2.0]])
    diloco.step(0)

    # Assert: theta_0 = [0.9, 2.0], theta_1 = [0.7, 1.8]
    # Delta = mean([0.1,0], [0.3,0.2]) = [0.2, 0.1]
    # buf = Delta = [0.2, 0.1]; update = Delta + 0.9*buf = [0.38, 0.19]
    # theta1 = [1,2] - 0.7*[0.38,0.19] = [0.734, 1.867]
    theta1 = t([0.734, 1.867])
    assert torch.allclose(nodes.params["w"], theta1.expand(2, 2), **TOL)
    assert torch.allclose(diloco.global_state()["w"], theta1, **TOL)

    # Execute outer step 2: g0 = [2,2], g1 = [0,-2]
    set_rows(nodes.grads["w"], [[2.0, 2.0], [0.0, -2.0]])
    diloco.step(1)

    # Assert: theta_0 = theta1 - [0.2,0.2], theta_1 = theta1 - [0,-0.2]; Delta = [0.1, 0.0]
    # buf = 0.9*[0.2,0.1] + [0.1,0] = [0.28, 0.09]; update = [0.1,0] + 0.9*[0.28,0.09]
    #     = [0.352, 0.081]; theta2 = [0.734 - 0.2464, 1.867 - 0.0567] = [0.4876, 1.8103]
    theta2 = t([0.4876, 1.8103])
    assert torch.allclose(nodes.params["w"], theta2.expand(2, 2), **TOL)
    assert torch.allclose(diloco.global_state()["w"], theta2, **TOL)
    # one all-reduce of the pseudo-gradient (2 float64 = 16 bytes) per outer step
    assert [(r.op, r.payload_bytes, r.tag) for r in comm.log] == [
        ("all_reduce", 16, "pseudo_grads")] * 2


def test_diloco_two_outer_steps_heavy_ball_by_hand():
    # Prepare: same as above but outer_optimizer="sgd" (heavy ball: update = buf)
    diloco = DiLoCo(H=1, outer_lr=0.7, outer_momentum=0.9, outer_optimizer="sgd", optim=sgd(0.1))
    nodes, _ = build(diloco, [1.0, 2.0])

    # Execute outer step 1: Delta = [0.2, 0.1] (as above); buf = [0.2, 0.1]
    set_rows(nodes.grads["w"], [[1.0, 0.0], [3.0, 2.0]])
    diloco.step(0)

    # Assert: theta1 = [1,2] - 0.7*[0.2,0.1] = [0.86, 1.93]
    theta1 = t([0.86, 1.93])
    assert torch.allclose(nodes.params["w"], theta1.expand(2, 2), **TOL)
    assert torch.allclose(diloco.global_state()["w"], theta1, **TOL)

    # Execute outer step 2: g0 = [2,2], g1 = [0,-2] -> Delta = mean([0.2,0.2],[0,-0.2]) = [0.1,0]
    set_rows(nodes.grads["w"], [[2.0, 2.0], [0.0, -2.0]])
    diloco.step(1)

    # Assert: buf = 0.9*[0.2,0.1] + [0.1,0] = [0.28,0.09]; theta2 = [0.86-0.196, 1.93-0.063]
    #       = [0.664, 1.867]
    theta2 = t([0.664, 1.867])
    assert torch.allclose(nodes.params["w"], theta2.expand(2, 2), **TOL)
    assert torch.allclose(diloco.global_state()["w"], theta2, **TOL)


def test_diloco_H2_syncs_only_every_second_step():
    # Prepare: theta0 = [1,2], H = 2
    diloco = DiLoCo(H=2, outer_lr=0.7, outer_momentum=0.9, outer_optimizer="nesterov",
                    optim=sgd(0.1))
    nodes, comm = build(diloco, [1.0, 2.0])

    # Execute step 0: g0 = [1,0], g1 = [3,2]
    set_rows(nodes.grads["w"], [[1.0, 0.0], [3.0, 2.0]])
    diloco.step(0)

    # Assert: no sync, nodes differ, the global model is still theta0
    assert torch.allclose(nodes.params["w"], t([[0.9, 2.0], [0.7, 1.8]]), **TOL)
    assert torch.equal(diloco.global_state()["w"], t([1.0, 2.0]))
    assert comm.log == []

    # Execute step 1: g0 = [1,0], g1 = [1,0]
    set_rows(nodes.grads["w"], [[1.0, 0.0], [1.0, 0.0]])
    diloco.step(1)

    # Assert: theta_0 = [0.8, 2.0], theta_1 = [0.6, 1.8]
    # Delta = mean([0.2,0], [0.4,0.2]) = [0.3, 0.1]
    # first nesterov step: update = Delta + 0.9*Delta = [0.57, 0.19]
    # theta1 = [1 - 0.399, 2 - 0.133] = [0.601, 1.867]
    theta1 = t([0.601, 1.867])
    assert torch.allclose(nodes.params["w"], theta1.expand(2, 2), **TOL)
    assert torch.allclose(diloco.global_state()["w"], theta1, **TOL)
    assert len(comm.log) == 1


def test_diloco_with_lr1_no_momentum_equals_fedavg():
    # Prepare: same data for both; theta0 = [1,2], H = 2, inner sgd lr 0.1
    diloco = DiLoCo(H=2, outer_lr=1.0, outer_momentum=0.0, outer_optimizer="sgd", optim=sgd(0.1))
    fedavg = FedAvg(H=2, optim=sgd(0.1))
    d_nodes, _ = build(diloco, [1.0, 2.0])
    f_nodes, _ = build(fedavg, [1.0, 2.0])
    grads = [
        [[1.0, 0.0], [3.0, 2.0]],
        [[1.0, 1.0], [-1.0, 1.0]],
        [[2.0, 0.0], [0.0, 0.0]],
        [[0.0, 0.0], [0.0, -4.0]],
    ]
    # round 1: node0 = [1,2] - 0.1*[2,1] = [0.8,1.9]; node1 = [1,2] - 0.1*[2,3] = [0.8,1.7]
    #          mean = [0.8, 1.8]
    # round 2: node0 = [0.8,1.8] - 0.1*[2,0] = [0.6,1.8]; node1 = [0.8,1.8] - 0.1*[0,-4] = [0.8,2.2]
    #          mean = [0.7, 2.0]
    expected_after_sync = {1: t([0.8, 1.8]), 3: t([0.7, 2.0])}

    for step, g in enumerate(grads):
        # Execute
        for strategy, nodes in ((diloco, d_nodes), (fedavg, f_nodes)):
            set_rows(nodes.grads["w"], g)
            strategy.step(step)

        # Assert
        assert torch.allclose(d_nodes.params["w"], f_nodes.params["w"], **TOL)
        if step in expected_after_sync:
            want = expected_after_sync[step]
            assert torch.allclose(d_nodes.params["w"], want.expand(2, 2), **TOL)
            assert torch.allclose(diloco.global_state()["w"], want, **TOL)
            assert torch.allclose(fedavg.global_state()["w"], want, **TOL)


def test_diloco_keeps_each_nodes_inner_momentum_across_outer_steps():
    # Prepare: inner sgd lr 0.1 momentum 0.5; outer step = plain averaging (lr 1, mu 0)
    diloco = DiLoCo(H=1, outer_lr=1.0, outer_momentum=0.0, outer_optimizer="sgd",
                    optim=sgd(0.1, momentum=0.5))
    nodes, _ = build(diloco, [1.0, 2.0])
    w = nodes.params["w"]

    # Execute step 0: g0 = [1,0], g1 = [3,2]
    set_rows(nodes.grads["w"], [[1.0, 0.0], [3.0, 2.0]])
    diloco.step(0)

    # Assert: first torch SGD step: buf_i = g_i (one row per node, not reset by the outer step)
    # node0 = [0.9, 2.0], node1 = [0.7, 1.8] -> mean [0.8, 1.9]
    assert torch.allclose(diloco.optimizer.state[w]["momentum_buffer"],
                          t([[1.0, 0.0], [3.0, 2.0]]), **TOL)
    assert torch.allclose(w, t([[0.8, 1.9], [0.8, 1.9]]), **TOL)

    # Execute step 1: g0 = [0,2], g1 = [2,0]
    set_rows(nodes.grads["w"], [[0.0, 2.0], [2.0, 0.0]])
    diloco.step(1)

    # Assert: buf0 = 0.5*[1,0] + [0,2] = [0.5,2]; buf1 = 0.5*[3,2] + [2,0] = [3.5,1]
    # node0 = [0.8,1.9] - 0.1*[0.5,2] = [0.75,1.7]; node1 = [0.8,1.9] - 0.1*[3.5,1] = [0.45,1.8]
    # mean = [0.6, 1.75]  (a reset buffer would give node0 = [0.8,1.7], node1 = [0.6,1.9])
    assert torch.allclose(diloco.optimizer.state[w]["momentum_buffer"],
                          t([[0.5, 2.0], [3.5, 1.0]]), **TOL)
    assert torch.allclose(w, t([[0.6, 1.75], [0.6, 1.75]]), **TOL)


def test_diloco_averages_float_buffers_and_keeps_counters():
    # Prepare
    diloco = DiLoCo(H=1, optim=sgd(0.1))
    nodes, comm = build(diloco, [0.0, 0.0], bn=True)
    set_rows(nodes.buffers["bn.running_mean"], [[1.0, 2.0], [3.0, 4.0]])
    set_rows(nodes.buffers["bn.running_var"], [[1.0, 1.0], [3.0, 5.0]])
    nodes.buffers["bn.num_batches_tracked"].copy_(torch.tensor([3, 5]))
    before = diloco.global_state()

    # Execute (zero grads: the parameters do not move)
    diloco.step(0)

    # Assert: before the sync the global buffers are the initial ones (mean 0, var 1)
    assert torch.equal(before["bn.running_mean"], t([0.0, 0.0]))
    assert torch.equal(before["bn.running_var"], t([1.0, 1.0]))
    # running_mean = [2,3], running_var = [2,3] on every node and globally; counters kept
    assert torch.allclose(nodes.buffers["bn.running_mean"], t([[2.0, 3.0], [2.0, 3.0]]), **TOL)
    assert torch.allclose(nodes.buffers["bn.running_var"], t([[2.0, 3.0], [2.0, 3.0]]), **TOL)
    assert nodes.buffers["bn.num_batches_tracked"].tolist() == [3, 5]
    g = diloco.global_state()
    assert torch.allclose(g["bn.running_mean"], t([2.0, 3.0]), **TOL)
    assert torch.allclose(g["bn.running_var"], t([2.0, 3.0]), **TOL)
    assert int(g["bn.num_batches_tracked"]) == 3
    # pseudo-grads (16 B) + running_mean (16 B) + running_var (16 B) in one all-reduce
    assert [(r.op, r.payload_bytes) for r in comm.log] == [("all_reduce", 48)]


# -- clipping -------------------------------------------------------------------------------------
def test_clip_grad_norm_is_per_node():
    # Prepare: node 0 grad [3,4] (norm 5), node 1 grad [0.3,0.4] (norm 0.5)
    nodes = NodeStack(Vec([0.0, 0.0]), 2, engine="loop")
    set_rows(nodes.grads["w"], [[3.0, 4.0], [0.3, 0.4]])

    # Execute
    norms = nodes.clip_grad_norm_(1.0)

    # Assert: coef0 = 1/(5+1e-6); coef1 = min(1, 1/(0.5+1e-6)) = 1
    assert torch.allclose(norms, t([5.0, 0.5]), **TOL)
    coef0 = 1.0 / (5.0 + 1e-6)
    assert torch.allclose(nodes.grads["w"][0], t([3.0 * coef0, 4.0 * coef0]), **TOL)
    assert torch.equal(nodes.grads["w"][1], t([0.3, 0.4]))
    # the stacked tensor is still the optimizer's .grad
    assert nodes.params["w"].grad is nodes.grads["w"]


def test_clip_grad_norm_spans_all_parameters_of_a_node():
    # Prepare: node 0: a = [1,2], b = [2] -> norm sqrt(1+4+4) = 3; node 1: a = [0,0], b = [0.5]
    nodes = NodeStack(TwoParams(), 2, engine="loop")
    set_rows(nodes.grads["a"], [[1.0, 2.0], [0.0, 0.0]])
    set_rows(nodes.grads["b"], [[2.0], [0.5]])

    # Execute
    norms = nodes.clip_grad_norm_(1.5)

    # Assert: coef0 = 1.5/(3+1e-6) applied to both tensors of node 0; node 1 (0.5) untouched
    assert torch.allclose(norms, t([3.0, 0.5]), **TOL)
    c = 1.5 / (3.0 + 1e-6)
    assert torch.allclose(nodes.grads["a"], t([[1.0 * c, 2.0 * c], [0.0, 0.0]]), **TOL)
    assert torch.allclose(nodes.grads["b"], t([[2.0 * c], [0.5]]), **TOL)


def test_strategy_max_grad_norm_clips_before_inner_step():
    # Prepare: FedAvg without a sync in sight; sgd lr 1 from theta0 = [0, 0]
    fedavg = FedAvg(H=100, optim=sgd(1.0), max_grad_norm=1.0)
    nodes, _ = build(fedavg, [0.0, 0.0])
    set_rows(nodes.grads["w"], [[3.0, 4.0], [0.3, 0.4]])

    # Execute
    fedavg.step(0)

    # Assert: node0 = -[3,4]/(5+1e-6) ~ -[0.6, 0.8]; node1 = -[0.3, 0.4] (norm 0.5 < 1)
    c = 1.0 / (5.0 + 1e-6)
    assert torch.allclose(nodes.params["w"], t([[-3.0 * c, -4.0 * c], [-0.3, -0.4]]), **TOL)


def test_ddp_without_max_grad_norm_does_not_clip():
    ddp = DDP(optim=sgd(1.0))
    nodes, _ = build(ddp, [0.0, 0.0])
    set_rows(nodes.grads["w"], [[3.0, 4.0], [3.0, 4.0]])

    ddp.step(0)

    # p = 0 - 1*[3,4]
    assert torch.allclose(nodes.params["w"], t([[-3.0, -4.0], [-3.0, -4.0]]), **TOL)


# -- validation -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("factory", "name"),
    [
        (lambda: DiLoCo(H=0), "H"),
        (lambda: DiLoCo(H=-3), "H"),
        (lambda: DiLoCo(H=2.0), "H"),
        (lambda: DiLoCo(outer_momentum=1.0), "outer_momentum"),
        (lambda: DiLoCo(outer_momentum=-0.1), "outer_momentum"),
        (lambda: DiLoCo(outer_lr=0.0), "outer_lr"),
        (lambda: DiLoCo(outer_optimizer="nesterov", outer_momentum=0.0), "outer_momentum"),
        (lambda: FedAvg(H=-1), "H"),
        (lambda: FedAvg(H=True), "H"),
        (lambda: DDP(max_grad_norm=0.0), "max_grad_norm"),
        (lambda: DiLoCo(max_grad_norm=-1.0), "max_grad_norm"),
    ],
)
def test_invalid_hyperparameters_raise_value_error_naming_them(factory, name):
    with pytest.raises(ValueError, match=name):
        factory()


def test_setup_rejects_non_positive_total_steps():
    nodes = NodeStack(Vec([0.0, 0.0]), 2, engine="loop")
    with pytest.raises(ValueError, match="total_steps"):
        DDP().setup(nodes, InProcessCommunicator(2), 0)
