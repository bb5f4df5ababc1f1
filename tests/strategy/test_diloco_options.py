"""DiLoCo's options: the outer optimizer, a transport codec, and dropped outer gradients.

Douillard et al., arXiv:2311.08105: section 3.1 "Outer Optimizers" (Nesterov, SGD, Adam) and
"Asynchronous Communication" (each outer gradient dropped with a probability; a dropped worker
continues from its own parameters). Tiny float64 models, gradients written by hand, inner SGD
(``x_i = theta - lr g_i`` after one step), expectations worked out in the comments.
"""

from __future__ import annotations

import math

import pytest
import torch
from support import by_hand
from support.by_hand import TOL, step_with, t

from exogym.strategy import make
from exogym.strategy.diloco import DiLoCo
from exogym.strategy.optim import OptimSpec
from exogym.utils.config import ConfigError


def build(strategy, values=(1.0, 2.0), *, n=2, bn=False):
    return by_hand.build(strategy, values, n=n, bn=bn)


SGD01 = OptimSpec(name="sgd", lr=0.1)
# With theta = [1, 2], N = 2, H = 1, inner SGD lr 0.1 (the data of test_strategy_math.py):
# step 0: g0 = [1,0], g1 = [3,2] -> x = [[0.9, 2], [0.7, 1.8]] -> Delta = mean(theta - x)
#         = [0.2, 0.1]
# step 1: g0 = [2,2], g1 = [0,-2] -> Delta = 0.1 * mean(g) = [0.1, 0.0] (whatever theta is)
STEP0 = [[1.0, 0.0], [3.0, 2.0]]
STEP1 = [[2.0, 2.0], [0.0, -2.0]]


# -- the outer optimizer --------------------------------------------------------------------------
def test_outer_optimizer_choice_and_no_nesterov_switch(tmp_path):
    from exogym.run.resolve import strategy_from_config as _strategy_from_config

    # default: the paper's Nesterov SGD
    d = DiLoCo()
    assert d.outer_optimizer == "nesterov" and not hasattr(d, "nesterov")
    # the old switch nesterov=False is gone: outer_optimizer="sgd" is heavy-ball SGD
    with pytest.raises(TypeError, match="unexpected keyword argument 'nesterov'"):
        DiLoCo(nesterov=False)  # type: ignore[call-arg]
    # a run recorded with it (config.json, a checkpoint) is refused on resume, naming the key
    recorded = {"strategy": "diloco", "hyperparameters": {**d.hyperparameters(),
                                                          "nesterov": False}}
    with pytest.raises(ConfigError, match=r"^cannot resume .*step-4: its strategy DiLoCo was "
                                          r"recorded with nesterov=False, which DiLoCo no longer "
                                          r"has \(a run of an earlier version of exogym or of "
                                          r"the class\); resume it with the version that "
                                          r"wrote it$"):
        _strategy_from_config(recorded, tmp_path / "step-4")
    del recorded["hyperparameters"]["nesterov"]
    assert _strategy_from_config(recorded, tmp_path / "step-4") == d
    # the torch optimizer built for each
    kinds = {}
    for name in ("nesterov", "sgd", "adam"):
        s = DiLoCo(outer_optimizer=name, outer_lr=0.5, optim=SGD01)
        build(s)
        kinds[name] = (type(s.outer_opt).__name__, s.outer_opt.defaults.get("nesterov"))
    assert kinds == {"nesterov": ("SGD", True), "sgd": ("SGD", False), "adam": ("Adam", None)}


def test_outer_plain_sgd_by_hand():
    # Prepare: outer SGD without momentum, lr 0.5
    diloco = DiLoCo(H=1, outer_optimizer="sgd", outer_lr=0.5, outer_momentum=0.0, optim=SGD01)
    nodes, _ = build(diloco)

    # Execute / Assert: theta1 = [1,2] - 0.5*[0.2, 0.1] = [0.9, 1.95]
    step_with(diloco, nodes, STEP0, 0)
    assert torch.allclose(diloco.global_state()["w"], t([0.9, 1.95]), **TOL)
    assert torch.allclose(nodes.params["w"], t([[0.9, 1.95]] * 2), **TOL)

    # Execute / Assert: theta2 = [0.9, 1.95] - 0.5*[0.1, 0] = [0.85, 1.95]; no momentum buffer
    step_with(diloco, nodes, STEP1, 1)
    assert torch.allclose(diloco.global_state()["w"], t([0.85, 1.95]), **TOL)
    p = diloco.global_params["w"]
    assert diloco.outer_opt.state[p].get("momentum_buffer") is None


def test_outer_adam_two_steps_by_hand():
    # Prepare: torch Adam (bias-corrected), lr 0.5, betas (0.5, 0.75), eps 0.1
    diloco = DiLoCo(H=1, outer_optimizer="adam", outer_lr=0.5, outer_betas=(0.5, 0.75),
                    outer_eps=0.1, optim=SGD01)
    nodes, comm = build(diloco)

    # Execute step 0: Delta = [0.2, 0.1]
    step_with(diloco, nodes, STEP0, 0)

    # Assert: m = 0.5*Delta = [0.1, 0.05], v = 0.25*Delta^2 = [0.01, 0.0025]
    # m_hat = m/(1-0.5) = [0.2, 0.1], v_hat = v/(1-0.75) = [0.04, 0.01], sqrt = [0.2, 0.1]
    # theta1 = [1,2] - 0.5*[0.2/(0.2+0.1), 0.1/(0.1+0.1)] = [1 - 1/3, 2 - 0.25] = [2/3, 1.75]
    theta1 = t([2.0 / 3.0, 1.75])
    assert torch.allclose(diloco.global_state()["w"], theta1, **TOL)
    assert torch.allclose(nodes.params["w"], theta1.expand(2, 2), **TOL)

    # Execute step 1: Delta = [0.1, 0]
    step_with(diloco, nodes, STEP1, 1)

    # Assert: m = 0.5*[0.1,0.05] + 0.5*[0.1,0] = [0.1, 0.025]
    #         v = 0.75*[0.01,0.0025] + 0.25*[0.01,0] = [0.01, 0.001875]
    # bias corrections 1-0.5^2 = 0.75, 1-0.75^2 = 0.4375:
    #   m_hat = [2/15, 1/30] ~ [0.133333, 0.033333]; v_hat = [4/175, 3/700] ~ [0.022857, 0.004286]
    # theta2 = theta1 - 0.5 * m_hat / (sqrt(v_hat) + 0.1) ~ theta1 - [0.265410, 0.101209]
    step = [0.5 * (2 / 15) / (math.sqrt(4 / 175) + 0.1),
            0.5 * (1 / 30) / (math.sqrt(3 / 700) + 0.1)]
    theta2 = theta1 - t(step)
    assert torch.allclose(diloco.global_state()["w"], theta2, **TOL)
    assert [(r.op, r.payload_bytes, r.tag) for r in comm.log] == [
        ("all_reduce", 16, "pseudo_grads")] * 2


# -- dropping: q = 0 is the DiLoCo of before ------------------------------------------------------
@pytest.mark.parametrize("q", [0.0, 1e-12])
def test_no_drop_reproduces_the_nesterov_numbers(q):
    # Prepare: the hand-worked Nesterov example of test_strategy_math.py (lr 0.7, momentum 0.9);
    # q = 1e-12 drops nobody in practice but runs the masked sum / M path
    diloco = DiLoCo(H=1, outer_lr=0.7, outer_momentum=0.9, q=q, seed=3, optim=SGD01)
    nodes, comm = build(diloco)

    # Execute / Assert: theta1 = [1,2] - 0.7*(Delta + 0.9 Delta) = [0.734, 1.867]
    step_with(diloco, nodes, STEP0, 0)
    assert torch.allclose(nodes.params["w"], t([[0.734, 1.867]] * 2), **TOL)

    # Execute / Assert: buf = [0.28, 0.09]; update = [0.352, 0.081]; theta2 = [0.4876, 1.8103]
    step_with(diloco, nodes, STEP1, 1)
    assert torch.allclose(nodes.params["w"], t([[0.4876, 1.8103]] * 2), **TOL)
    assert torch.allclose(diloco.global_state()["w"], t([0.4876, 1.8103]), **TOL)
    assert not diloco.dropped(0).any() and not diloco.dropped(1).any()
    assert [(r.op, r.payload_bytes) for r in comm.log] == [("all_reduce", 16)] * 2
    assert comm.bytes_sent == [32.0, 32.0]  # 2 * 2(2-1)/2 * 16


# -- dropping by hand -----------------------------------------------------------------------------
def test_drop_decisions_are_deterministic_per_seed_and_outer_step():
    # seed 2, N = 4: rows of uniforms u[0] ~ [0.615, 0.381, 0.637, 0.474] -> nodes 1, 3 below 0.5;
    # u[1] ~ [0.714, 0.619, 0.443, 0.096] -> nodes 2, 3. seed 0: u[0] ~ [0.496, 0.768, 0.088, 0.132]
    a, b, c = (DiLoCo(q=0.5, seed=s, optim=SGD01) for s in (2, 2, 0))
    for s in (a, b, c):
        build(s, n=4)

    assert a.dropped(0).tolist() == [False, True, False, True]
    assert a.dropped(1).tolist() == [False, False, True, True]
    assert torch.equal(a.dropped(1), b.dropped(1)) and torch.equal(a.dropped(0), b.dropped(0))
    assert c.dropped(0).tolist() == [True, False, True, True]
    # the decision for step t does not depend on having asked for other steps
    assert b.dropped(5).tolist() == a.dropped(5).tolist()


def test_dropped_nodes_are_left_out_of_the_mean_and_keep_their_parameters():
    # Prepare: N = 4, seed 2, q = 0.5 (drops nodes {1, 3} at outer step 0, {2, 3} at step 1);
    # outer SGD lr 1, no momentum: theta_new = theta - mean over survivors of (theta - x_i)
    diloco = DiLoCo(H=1, outer_optimizer="sgd", outer_lr=1.0, outer_momentum=0.0, q=0.5, seed=2,
                    optim=SGD01)
    nodes, comm = build(diloco, n=4)

    # Execute outer step 0: g = [[1,0],[3,2],[-1,2],[5,5]]
    # x = [1,2] - 0.1 g = [[0.9,2], [0.7,1.8], [1.1,1.8], [0.5,1.5]]
    step_with(diloco, nodes, [[1.0, 0.0], [3.0, 2.0], [-1.0, 2.0], [5.0, 5.0]], 0)

    # Assert: survivors 0, 2: Delta = mean([0.1, 0], [-0.1, 0.2]) = [0, 0.1] -> theta1 = [1, 1.9]
    # nodes 0, 2 restart from theta1; nodes 1, 3 keep their own parameters
    assert torch.allclose(diloco.global_state()["w"], t([1.0, 1.9]), **TOL)
    assert torch.allclose(nodes.params["w"], t([[1.0, 1.9], [0.7, 1.8], [1.0, 1.9], [0.5, 1.5]]),
                          **TOL)

    # Execute outer step 1: g = [[1,1],[0,-1],[2,0],[1,1]]
    # x = [[0.9,1.8], [0.7,1.9], [0.8,1.9], [0.4,1.4]]
    step_with(diloco, nodes, [[1.0, 1.0], [0.0, -1.0], [2.0, 0.0], [1.0, 1.0]], 1)

    # Assert: survivors 0, 1, against the current theta1 = [1, 1.9]:
    # Delta = mean([0.1, 0.1], [0.3, 0]) = [0.2, 0.05] -> theta2 = [0.8, 1.85]
    assert torch.allclose(diloco.global_state()["w"], t([0.8, 1.85]), **TOL)
    assert torch.allclose(nodes.params["w"],
                          t([[0.8, 1.85], [0.8, 1.85], [0.8, 1.9], [0.4, 1.4]]), **TOL)
    # bytes: a ring among the M = 2 survivors only, 2 (M-1)/M * 16 = 16 per survivor, nothing
    # from a dropped node (earlier versions charged all N: 24 to every node, an overstatement)
    assert [(r.op, r.payload_bytes, r.tag, r.members) for r in comm.log] == [
        ("all_reduce", 16, "pseudo_grads", 0b0101), ("all_reduce", 16, "pseudo_grads", 0b0011)]
    assert comm.bytes_sent == [32.0, 16.0, 16.0, 0.0]


def test_when_every_node_drops_nothing_is_sent_and_nothing_moves():
    # Prepare: q = 1 (always dropped), Nesterov outer optimizer
    diloco = DiLoCo(H=1, q=1.0, optim=SGD01)
    nodes, comm = build(diloco)

    # Execute: x = [[0.9, 2], [0.7, 1.8]]
    step_with(diloco, nodes, STEP0, 0)

    # Assert: no outer step, no message, the global model is theta0, nodes keep their own
    assert comm.log == [] and comm.bytes_sent == [0.0, 0.0]
    assert torch.equal(diloco.global_state()["w"], t([1.0, 2.0]))
    assert torch.allclose(nodes.params["w"], t([[0.9, 2.0], [0.7, 1.8]]), **TOL)
    assert len(diloco.outer_opt.state) == 0  # the momentum was never touched
    assert diloco.outer_steps == 1


def test_dropping_averages_survivors_float_buffers_only():
    # Prepare: N = 4, seed 2, q = 0.5 -> nodes 1, 3 dropped at outer step 0; zero grads
    diloco = DiLoCo(H=1, q=0.5, seed=2, optim=SGD01)
    nodes, _ = build(diloco, (0.0, 0.0), n=4, bn=True)
    nodes.buffers["bn.running_mean"].copy_(t([[1.0, 2.0], [30.0, 40.0], [5.0, 6.0], [7.0, 8.0]]))

    # Execute
    diloco.step(0)

    # Assert: survivors' mean ([1,2] + [5,6])/2 = [3, 4] on nodes 0, 2 and globally; nodes 1, 3
    # keep their own statistics
    assert torch.allclose(nodes.buffers["bn.running_mean"],
                          t([[3.0, 4.0], [30.0, 40.0], [3.0, 4.0], [7.0, 8.0]]), **TOL)
    assert torch.allclose(diloco.global_state()["bn.running_mean"], t([3.0, 4.0]), **TOL)


# -- codec ----------------------------------------------------------------------------------------
def test_pseudo_gradients_go_through_the_codec():
    # Prepare: fp16 transport, outer SGD lr 1 without momentum (theta - Delta)
    diloco = DiLoCo(H=1, outer_optimizer="sgd", outer_lr=1.0, outer_momentum=0.0, codec="fp16",
                    optim=SGD01)
    nodes, comm = build(diloco)

    # Execute: both nodes g = [1, 0] -> Delta_i = [1 - 0.9, 0] = [0.09999999999999998, 0]
    step_with(diloco, nodes, [[1.0, 0.0], [1.0, 0.0]], 0)

    # Assert: fp16 rounds 0.1 to 0.0999755859375 (1638.4 -> 1638 / 2^14): theta1 = 1 - that
    assert torch.allclose(diloco.global_state()["w"], t([1.0 - 0.0999755859375, 2.0]), **TOL)
    # 2 elements x 2 bytes; the record names the codec
    assert [(r.op, r.payload_bytes, r.tag, r.codec) for r in comm.log] == [
        ("all_reduce", 4, "pseudo_grads", "fp16")]


def test_with_a_codec_buffers_travel_uncompressed_in_their_own_all_reduce():
    diloco = DiLoCo(H=1, codec="int8", optim=SGD01)
    nodes, comm = build(diloco, (0.0, 0.0), bn=True)
    nodes.buffers["bn.running_mean"].copy_(t([[1.0, 2.0], [3.0, 4.0]]))

    diloco.step(0)

    # pseudo-grads: int8, 2 elements + one fp32 scale = 6 bytes; buffers: 2 x 16 bytes float64
    assert [(r.op, r.payload_bytes, r.tag, r.codec) for r in comm.log] == [
        ("all_reduce", 6, "pseudo_grads", "int8"), ("all_reduce", 32, "buffers", "")]
    assert torch.allclose(diloco.global_state()["bn.running_mean"], t([2.0, 3.0]), **TOL)


# -- validation and the command line --------------------------------------------------------------
@pytest.mark.parametrize(
    ("factory", "name"),
    [
        (lambda: DiLoCo(outer_optimizer="lamb"), "outer_optimizer"),
        (lambda: DiLoCo(outer_optimizer="nesterov", outer_momentum=0.0), "outer_momentum"),
        (lambda: DiLoCo(outer_betas=(0.9, 1.0)), "outer_betas"),
        (lambda: DiLoCo(outer_betas=(0.9,)), "outer_betas"),
        (lambda: DiLoCo(outer_eps=0.0), "outer_eps"),
        (lambda: DiLoCo(q=1.5), "q"),
        (lambda: DiLoCo(q=-0.1), "q"),
        (lambda: DiLoCo(seed=-1), "seed"),
        (lambda: DiLoCo(seed=True), "seed"),
        (lambda: DiLoCo(q=0.1, codec="int8", error_feedback=True), "error_feedback"),
        (lambda: DiLoCo(codec="bogus"), "codec"),
    ],
)
def test_invalid_options_raise_value_error_naming_them(factory, name):
    with pytest.raises(ValueError, match=name):
        factory()


def test_options_from_the_command_line():
    s = make("diloco", outer_optimizer="adam", outer_lr="0.01", outer_betas="0.8,0.95", q="0.25",
             seed="7")
    assert (s.outer_optimizer, s.outer_lr, s.outer_betas, s.q, s.seed) == (
        "adam", 0.01, (0.8, 0.95), 0.25, 7)
    with pytest.raises(ConfigError, match=r"outer_optimizer must be one of"):
        make("diloco", outer_optimizer="lion")
