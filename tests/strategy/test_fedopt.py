"""Closed-form checks of the FedOpt family (FedAdam, FedYogi, FedAdagrad, FedAvgM).

Reddi et al., "Adaptive Federated Optimization", arXiv:2003.00295, Algorithm 2; Hsu et al.,
arXiv:1909.06335 (FedAvgM). Every test stacks a tiny float64 model on N nodes, writes the per-node
gradients by hand, and runs rounds of H = 1 step of inner SGD with lr 1, so that each client ends
at ``x_i = x - g_i`` and the mean client update is ``Delta = mean_i(x_i - x) = -mean_i(g_i)``
whatever ``x`` is. The expected values are worked out in the comments; the hyperparameters are
dyadic (0.5, 0.75, ...) so that most of the arithmetic is exact.
"""

from __future__ import annotations

import math

import pytest
import torch
from support import by_hand
from support.by_hand import F64, TOL, step_with, t

from exogym.strategy.diloco import DiLoCo
from exogym.strategy.fedadagrad import FedAdagrad
from exogym.strategy.fedadam import FedAdam
from exogym.strategy.fedavgm import FedAvgM
from exogym.strategy.fedopt import FedOpt
from exogym.strategy.fedyogi import FedYogi
from exogym.strategy.optim import OptimSpec

SQRT2, SQRT5, SQRT7, SQRT13, SQRT15 = (math.sqrt(v) for v in (2, 5, 7, 13, 15))

# Round 1: g0 = [-1, -0.5, 0.5], g1 = [-1, 0, 0.5] -> Delta1 = -mean = [1, 0.25, -0.5]
GRADS_1 = [[-1.0, -0.5, 0.5], [-1.0, 0.0, 0.5]]
# Round 2: g0 = [0, -1, 1], g1 = [0, -1, 1] -> Delta2 = [0, 1, -1]
GRADS_2 = [[0.0, -1.0, 1.0], [0.0, -1.0, 1.0]]


def build(strategy, values=(0.0, 0.0, 0.0), *, n=2, bn=False):
    return by_hand.build(strategy, values, n=n, bn=bn)


SGD1 = OptimSpec(name="sgd", lr=1.0)


# -- FedYogi --------------------------------------------------------------------------------------
def test_fedyogi_two_rounds_on_three_scalars_by_hand():
    # Prepare: x0 = [0,0,0]; beta1 = 0.5, beta2 = 0.75, tau = 0.5 -> v_{-1} = tau^2 = 0.25; eta = 1
    yogi = FedYogi(H=1, eta=1.0, beta1=0.5, beta2=0.75, tau=0.5, optim=SGD1)
    nodes, comm = build(yogi)
    assert torch.equal(yogi.v["w"], t([0.25, 0.25, 0.25]))
    assert torch.equal(yogi.m["w"], t([0.0, 0.0, 0.0]))

    # Execute round 1: Delta1 = [1, 0.25, -0.5], Delta1^2 = [1, 0.0625, 0.25]
    step_with(yogi, nodes, GRADS_1, 0)

    # Assert: m = 0.5*0 + 0.5*Delta1 = [0.5, 0.125, -0.25]
    # v = v - (1-beta2) Delta^2 sign(v - Delta^2), 1-beta2 = 0.25:
    #   a: sign(0.25 - 1) = -1      -> 0.25 + 0.25*1      = 0.5       (v grows toward Delta^2)
    #   b: sign(0.25 - 0.0625) = +1 -> 0.25 - 0.25*0.0625 = 0.234375  (v shrinks additively)
    #   c: sign(0.25 - 0.25) = 0    -> 0.25                            (unchanged)
    assert torch.allclose(yogi.m["w"], t([0.5, 0.125, -0.25]), **TOL)
    assert torch.allclose(yogi.v["w"], t([0.5, 0.234375, 0.25]), **TOL)
    # x1 = x0 + m / (sqrt(v) + 0.5):
    #   a: 0.5 / (1/sqrt2 + 1/2) = 1/(sqrt2 + 1) = sqrt2 - 1     ~ 0.414214
    #   b: 0.125 / (sqrt15/8 + 1/2) = 1/(sqrt15 + 4) = 4 - sqrt15  ~ 0.127017
    #   c: -0.25 / (0.5 + 0.5) = -0.25
    x1 = t([SQRT2 - 1, 4 - SQRT15, -0.25])
    assert torch.allclose(yogi.global_state()["w"], x1, **TOL)
    assert torch.allclose(nodes.params["w"], x1.expand(2, 3), **TOL)  # every node restarts at x1

    # Execute round 2: Delta2 = [0, 1, -1], Delta2^2 = [0, 1, 1]
    step_with(yogi, nodes, GRADS_2, 1)

    # Assert: m = 0.5*[0.5, 0.125, -0.25] + 0.5*[0, 1, -1] = [0.25, 0.5625, -0.625]
    # v: a: sign(0.5 - 0) = +1 -> 0.5 - 0 = 0.5; b: sign(0.234375 - 1) = -1 -> 0.484375;
    #    c: sign(0.25 - 1) = -1 -> 0.25 + 0.25 = 0.5
    assert torch.allclose(yogi.m["w"], t([0.25, 0.5625, -0.625]), **TOL)
    assert torch.allclose(yogi.v["w"], t([0.5, 0.484375, 0.5]), **TOL)
    # x2 = x1 + m / (sqrt(v) + 0.5), with 1/(sqrt(0.5) + 0.5) = 2(sqrt2 - 1):
    #   a: (sqrt2 - 1) + 0.25 * 2(sqrt2 - 1) = 1.5 (sqrt2 - 1)               ~ 0.621320
    #   b: (4 - sqrt15) + 0.5625 / (sqrt(0.484375) + 0.5)                    ~ 0.127017 + 0.478190
    #   c: -0.25 - 0.625 * 2(sqrt2 - 1) = -0.25 - 1.25 (sqrt2 - 1)          ~ -0.767767
    x2 = t([1.5 * (SQRT2 - 1), (4 - SQRT15) + 0.5625 / (math.sqrt(0.484375) + 0.5),
            -0.25 - 1.25 * (SQRT2 - 1)])
    assert torch.allclose(yogi.global_state()["w"], x2, **TOL)
    assert yogi.rounds == 2
    # one all-reduce of the client updates (3 float64 = 24 bytes) per round
    assert [(r.op, r.payload_bytes, r.tag) for r in comm.log] == [
        ("all_reduce", 24, "client_updates")] * 2


# -- FedAdam --------------------------------------------------------------------------------------
def test_fedadam_two_rounds_by_hand_no_bias_correction():
    # Prepare: as the Yogi test: beta1 = 0.5, beta2 = 0.75, tau = 0.5, eta = 1
    adam = FedAdam(H=1, eta=1.0, beta1=0.5, beta2=0.75, tau=0.5, optim=SGD1)
    nodes, _ = build(adam)

    # Execute round 1: Delta1 = [1, 0.25, -0.5]
    step_with(adam, nodes, GRADS_1, 0)

    # Assert: m = [0.5, 0.125, -0.25]; v = 0.75*0.25 + 0.25*Delta^2 = [0.4375, 0.203125, 0.25]
    assert torch.allclose(adam.m["w"], t([0.5, 0.125, -0.25]), **TOL)
    assert torch.allclose(adam.v["w"], t([0.4375, 0.203125, 0.25]), **TOL)
    # x1 = m / (sqrt(v) + 0.5) with no bias correction:
    #   a: 0.5 / (sqrt7/4 + 1/2) = 2/(sqrt7 + 2)     ~ 0.430501
    #   b: 0.125 / (sqrt13/8 + 1/2) = 1/(sqrt13 + 4)  ~ 0.131483
    #   c: -0.25 / (0.5 + 0.5) = -0.25
    x1 = t([2 / (SQRT7 + 2), 1 / (SQRT13 + 4), -0.25])
    assert torch.allclose(adam.global_state()["w"], x1, **TOL)

    # Execute round 2: Delta2 = [0, 1, -1]
    step_with(adam, nodes, GRADS_2, 1)

    # Assert: m = [0.25, 0.5625, -0.625]; v = 0.75*v + 0.25*[0, 1, 1]
    #   = [0.328125, 0.40234375, 0.4375]
    assert torch.allclose(adam.m["w"], t([0.25, 0.5625, -0.625]), **TOL)
    assert torch.allclose(adam.v["w"], t([0.328125, 0.40234375, 0.4375]), **TOL)
    # x2 = x1 + m / (sqrt(v) + 0.5); c: sqrt(0.4375) = sqrt7/4 -> -0.25 - 0.625 * 4/(sqrt7 + 2)
    x2 = x1 + t([0.25 / (math.sqrt(0.328125) + 0.5), 0.5625 / (math.sqrt(0.40234375) + 0.5),
                 -2.5 / (SQRT7 + 2)])
    assert torch.allclose(adam.global_state()["w"], x2, **TOL)


# -- FedAdagrad -----------------------------------------------------------------------------------
def test_fedadagrad_two_rounds_by_hand():
    # Prepare: beta1 = 0.5, tau = 0.5 (v_{-1} = 0.25), eta = 1
    adagrad = FedAdagrad(H=1, eta=1.0, beta1=0.5, tau=0.5, optim=SGD1)
    nodes, _ = build(adagrad)

    # Execute round 1: Delta1 = [1, 0.25, -0.5]
    step_with(adagrad, nodes, GRADS_1, 0)

    # Assert: m = [0.5, 0.125, -0.25]; v = 0.25 + Delta^2 = [1.25, 0.3125, 0.5]
    assert torch.allclose(adagrad.v["w"], t([1.25, 0.3125, 0.5]), **TOL)
    # x1 = m / (sqrt(v) + 0.5):
    #   a: 0.5 / (sqrt5/2 + 1/2) = 1/(sqrt5 + 1) = (sqrt5 - 1)/4      ~ 0.309017
    #   b: 0.125 / (sqrt5/4 + 1/2) = 0.5/(sqrt5 + 2) = (sqrt5 - 2)/2   ~ 0.118034
    #   c: -0.25 / (1/sqrt2 + 1/2) = -0.5/(sqrt2 + 1) = -(sqrt2 - 1)/2  ~ -0.207107
    x1 = t([(SQRT5 - 1) / 4, (SQRT5 - 2) / 2, -(SQRT2 - 1) / 2])
    assert torch.allclose(adagrad.global_state()["w"], x1, **TOL)

    # Execute round 2: Delta2 = [0, 1, -1]
    step_with(adagrad, nodes, GRADS_2, 1)

    # Assert: v = [1.25, 1.3125, 1.5] (only ever grows); m = [0.25, 0.5625, -0.625]
    assert torch.allclose(adagrad.v["w"], t([1.25, 1.3125, 1.5]), **TOL)
    x2 = x1 + t([0.25 / (SQRT5 / 2 + 0.5), 0.5625 / (math.sqrt(1.3125) + 0.5),
                 -0.625 / (math.sqrt(1.5) + 0.5)])
    assert torch.allclose(adagrad.global_state()["w"], x2, **TOL)


# -- FedAvgM --------------------------------------------------------------------------------------
def test_fedavgm_two_rounds_by_hand():
    # Prepare: x0 = [0,0,0], beta = 0.5, eta = 1 (Hsu et al.'s form)
    avgm = FedAvgM(H=1, beta=0.5, optim=SGD1)
    nodes, comm = build(avgm)
    assert avgm.eta == 1.0

    # Execute round 1: Delta w = x - mean(x_i) = -Delta1 = [-1, -0.25, 0.5]
    step_with(avgm, nodes, GRADS_1, 0)

    # Assert: v = Delta w = [-1, -0.25, 0.5]; w1 = w0 - v = [1, 0.25, -0.5] (plain FedAvg)
    assert torch.allclose(avgm.momentum["w"], t([-1.0, -0.25, 0.5]), **TOL)
    assert torch.allclose(avgm.global_state()["w"], t([1.0, 0.25, -0.5]), **TOL)

    # Execute round 2: Delta w = -[0, 1, -1] = [0, -1, 1]
    step_with(avgm, nodes, GRADS_2, 1)

    # Assert: v = 0.5*[-1, -0.25, 0.5] + [0, -1, 1] = [-0.5, -1.125, 1.25]
    #         w2 = [1, 0.25, -0.5] - v = [1.5, 1.375, -1.75]
    assert torch.allclose(avgm.momentum["w"], t([-0.5, -1.125, 1.25]), **TOL)
    assert torch.allclose(avgm.global_state()["w"], t([1.5, 1.375, -1.75]), **TOL)
    assert torch.allclose(nodes.params["w"], t([[1.5, 1.375, -1.75]] * 2), **TOL)
    assert len(comm.log) == 2


def test_fedavgm_server_lr_scales_the_momentum_step():
    # Prepare: eta = 0.5, beta = 0.5
    avgm = FedAvgM(H=1, eta=0.5, beta=0.5, optim=SGD1)
    nodes, _ = build(avgm)

    # Execute: two rounds as above
    step_with(avgm, nodes, GRADS_1, 0)
    step_with(avgm, nodes, GRADS_2, 1)

    # Assert: w1 = -0.5*[-1, -0.25, 0.5] = [0.5, 0.125, -0.25];
    #         w2 = w1 - 0.5*[-0.5, -1.125, 1.25] = [0.75, 0.6875, -0.875]
    assert torch.allclose(avgm.global_state()["w"], t([0.75, 0.6875, -0.875]), **TOL)


def test_fedavgm_equals_diloco_with_heavy_ball_sgd_outer_optimizer():
    # Prepare: random gradients, H = 2, N = 3, inner AdamW; FedAvgM(eta, beta) should equal
    # DiLoCo(outer_optimizer="sgd", outer_lr=eta, outer_momentum=beta): w - eta v either way
    gen = torch.Generator().manual_seed(0)
    grads = torch.randn(8, 3, 3, generator=gen, dtype=F64)
    inner = OptimSpec(name="adamw", lr=0.1, weight_decay=0.01)
    avgm = FedAvgM(H=2, eta=0.7, beta=0.9, optim=inner)
    diloco = DiLoCo(H=2, outer_optimizer="sgd", outer_lr=0.7, outer_momentum=0.9, optim=inner)
    a_nodes, _ = build(avgm, (0.3, -0.2, 0.1), n=3)
    d_nodes, _ = build(diloco, (0.3, -0.2, 0.1), n=3)

    # Execute
    for step, g in enumerate(grads):
        step_with(avgm, a_nodes, g.tolist(), step)
        step_with(diloco, d_nodes, g.tolist(), step)

        # Assert
        assert torch.allclose(a_nodes.params["w"], d_nodes.params["w"], rtol=0, atol=1e-12)
    assert torch.allclose(avgm.global_state()["w"], diloco.global_state()["w"], rtol=0,
                          atol=1e-12)


# -- the FedOpt contract --------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [FedAdam, FedYogi, FedAdagrad, FedAvgM])
def test_a_server_step_moves_toward_the_clients_mean(cls):
    # Prepare: defaults except H = 3; x0 = [0.5, -0.5, 2]; N = 3 nodes with random gradients
    strategy = cls(H=3, optim=OptimSpec(name="sgd", lr=0.1))
    nodes, _ = build(strategy, (0.5, -0.5, 2.0), n=3)
    x0 = strategy.global_state()["w"]
    gen = torch.Generator().manual_seed(1)

    # Execute: three local steps, the third ends the round
    for step in range(3):
        nodes.grads["w"].copy_(torch.randn(3, 3, generator=gen, dtype=F64) + 1.0)
        if step == 2:
            with torch.no_grad():
                clients_mean = (nodes.params["w"] - 0.1 * nodes.grads["w"]).mean(0)
        strategy.step(step)

    # Assert: Delta = mean(x_i) - x0 (client minus server); x1 - x0 has Delta's sign in every
    # coordinate. First round: adaptive x1 - x0 = eta (1 - beta1) Delta / (sqrt(v) + tau), a
    # positive multiple of Delta; FedAvgM: v = -Delta, x1 - x0 = -eta v = eta Delta
    delta = clients_mean - x0
    step_taken = strategy.global_state()["w"] - x0
    assert (delta.abs() > 1e-3).all()
    assert torch.equal(torch.sign(step_taken), torch.sign(delta))


@pytest.mark.parametrize("cls", [FedAdam, FedYogi, FedAdagrad, FedAvgM])
def test_nodes_do_not_sync_between_rounds(cls):
    strategy = cls(H=2, optim=SGD1)
    nodes, comm = build(strategy)

    step_with(strategy, nodes, GRADS_1, 0)

    # node0 = -g0, node1 = -g1; the server model is still x0; nothing sent
    assert torch.allclose(nodes.params["w"], -t(GRADS_1), **TOL)
    assert torch.equal(strategy.global_state()["w"], t([0.0, 0.0, 0.0]))
    assert comm.log == [] and comm.bytes_sent == [0.0, 0.0]


def test_fedopt_bytes_per_round_match_the_formula():
    # N = 4, 3 float64 parameters: S = 24 bytes; ring all-reduce 2 (N-1)/N * S = 36 bytes per node
    adam = FedAdam(H=1, optim=SGD1)
    nodes, comm = build(adam, n=4)
    nodes.grads["w"].fill_(1.0)

    adam.step(0)
    adam.step(1)

    assert comm.bytes_sent == [72.0] * 4 and comm.bytes_received == [72.0] * 4


def test_fedopt_averages_float_buffers_and_keeps_counters():
    # Prepare: a BatchNorm's buffers only (2 float64 each), no parameter movement (zero grads)
    adam = FedAdam(H=1, optim=SGD1)
    nodes, comm = build(adam, (0.0, 0.0), bn=True)
    nodes.buffers["bn.running_mean"].copy_(t([[1.0, 2.0], [3.0, 4.0]]))
    nodes.buffers["bn.num_batches_tracked"].copy_(torch.tensor([3, 5]))

    # Execute
    adam.step(0)

    # Assert: running_mean = [2, 3] on every node and in the server model; counters of node 0
    assert torch.allclose(nodes.buffers["bn.running_mean"], t([[2.0, 3.0], [2.0, 3.0]]), **TOL)
    state = adam.global_state()
    assert torch.allclose(state["bn.running_mean"], t([2.0, 3.0]), **TOL)
    assert int(state["bn.num_batches_tracked"]) == 3
    # w (16 B) + running_mean (16 B) + running_var (16 B) in one all-reduce
    assert [(r.op, r.payload_bytes) for r in comm.log] == [("all_reduce", 48)]


def test_fedopt_sends_client_updates_through_the_codec():
    # Prepare: fp16 transport; Delta1 = [1, 0.25, -0.5] is exact in fp16, so the numbers are the
    # FedAvgM ones; a 0.1 update is not: fp16(0.1) = 0.0999755859375
    avgm = FedAvgM(H=1, beta=0.0, codec="fp16", optim=SGD1)
    nodes, comm = build(avgm)

    # Execute
    step_with(avgm, nodes, GRADS_1, 0)
    step_with(avgm, nodes, [[-0.1, 0.0, 0.0], [-0.1, 0.0, 0.0]], 1)

    # Assert: w1 = [1, 0.25, -0.5]; w2 = w1 + fp16(0.1) on the first coordinate (1 + 0.1 = 1.1 in
    # float64 gives an update of 0.10000000000000009, still 0.0999755859375 in fp16)
    assert torch.allclose(avgm.global_state()["w"], t([1.0 + 0.0999755859375, 0.25, -0.5]),
                          **TOL)
    # payload 2 bytes per element: 6 bytes; the record names the codec
    assert [(r.op, r.payload_bytes, r.codec) for r in comm.log] == [("all_reduce", 6, "fp16")] * 2


# -- validation -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("factory", "name"),
    [
        (lambda: FedAdam(H=0), "H"),
        (lambda: FedAdam(eta=0.0), "eta"),
        (lambda: FedAdam(beta1=1.0), "beta1"),
        (lambda: FedAdam(beta2=-0.1), "beta2"),
        (lambda: FedAdam(tau=0.0), "tau"),
        (lambda: FedYogi(beta2=1.0), "beta2"),
        (lambda: FedYogi(tau=-1.0), "tau"),
        (lambda: FedAdagrad(beta1=-0.5), "beta1"),
        (lambda: FedAdagrad(eta=-1.0), "eta"),
        (lambda: FedAvgM(beta=1.0), "beta"),
        (lambda: FedAvgM(H=2.5), "H"),
        (lambda: FedAdam(codec="int3"), "codec"),
    ],
)
def test_invalid_hyperparameters_raise_value_error_naming_them(factory, name):
    with pytest.raises(ValueError, match=name):
        factory()


def test_fedopt_is_abstract_and_variants_have_ids():
    with pytest.raises(TypeError):
        FedOpt()  # type: ignore[abstract]
    assert [c.id for c in (FedAdam, FedYogi, FedAdagrad, FedAvgM)] == [
        "fedadam", "fedyogi", "fedadagrad", "fedavgm"]
    # the paper's defaults (beta1 0.9, beta2 0.99, tau 1e-3) and ours for the server lr
    assert (FedAdam().beta1, FedAdam().beta2, FedAdam().tau, FedAdam().eta) == (0.9, 0.99, 1e-3,
                                                                                 1e-2)
    assert (FedAdagrad().eta, FedAvgM().eta, FedAvgM().beta) == (0.1, 1.0, 0.5)
