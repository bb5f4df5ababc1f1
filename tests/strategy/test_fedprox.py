"""Closed-form checks of FedProx (Li et al., arXiv:1812.06127): FedAvg + (mu/2)||w - w^t||^2.

Tiny float64 model stacked on N nodes, gradients written by hand, inner SGD; the proximal term
adds ``mu (w - w^t)`` to each node's gradient, ``w^t`` the model at the start of the round.
"""

from __future__ import annotations

import pytest
import torch
from support import by_hand
from support.by_hand import F64, TOL, step_with, t

from exogym.strategy.fedavg import FedAvg
from exogym.strategy.fedprox import FedProx
from exogym.strategy.optim import OptimSpec


def build(strategy, values=(1.0, 2.0), *, n=2):
    return by_hand.build(strategy, values, n=n)


def test_proximal_gradient_by_hand_over_two_rounds():
    # Prepare: w0 = [1, 2], N = 2, H = 2, inner SGD lr 0.5, mu = 0.5
    prox = FedProx(H=2, mu=0.5, optim=OptimSpec(name="sgd", lr=0.5))
    nodes, comm = build(prox)

    # Execute step 0: every node is at w0, so the proximal term is 0; g = [[1,0],[2,2]]
    step_with(prox, nodes, [[1.0, 0.0], [2.0, 2.0]], 0)

    # Assert: x = w0 - 0.5 g = [[0.5, 2], [0, 1]]; no averaging yet
    assert torch.allclose(nodes.grads["w"], t([[1.0, 0.0], [2.0, 2.0]]), **TOL)
    assert torch.allclose(nodes.params["w"], t([[0.5, 2.0], [0.0, 1.0]]), **TOL)

    # Execute step 1: raw gradients 0, so the gradient is the proximal term alone
    step_with(prox, nodes, [[0.0, 0.0], [0.0, 0.0]], 1)

    # Assert: grad = 0.5 (w - w0): node0 0.5*[-0.5, 0] = [-0.25, 0];
    #                             node1 0.5*[-1, -1] = [-0.5, -0.5]
    # x = w - 0.5 grad: node0 [0.625, 2]; node1 [0.25, 1.25]; round end: mean = [0.4375, 1.625]
    assert torch.allclose(nodes.grads["w"], t([[-0.25, 0.0], [-0.5, -0.5]]), **TOL)
    w1 = t([0.4375, 1.625])
    assert torch.allclose(nodes.params["w"], w1.expand(2, 2), **TOL)
    assert torch.allclose(prox.global_state()["w"], w1, **TOL)

    # Execute step 2 (round 2): the anchor is now w1 = every node's start, so the term is 0 again
    step_with(prox, nodes, [[1.0, 1.0], [0.0, 0.0]], 2)

    # Assert: grads are the raw ones (an anchor left at w0 would add 0.5*(w1 - w0) =
    # [-0.28125, -0.1875]); x = [[0.4375 - 0.5, 1.625 - 0.5], w1] = [[-0.0625, 1.125], w1]
    assert torch.allclose(nodes.grads["w"], t([[1.0, 1.0], [0.0, 0.0]]), **TOL)
    assert torch.allclose(nodes.params["w"], t([[-0.0625, 1.125], [0.4375, 1.625]]), **TOL)
    assert torch.allclose(prox.round_start["w"], w1.unsqueeze(0), **TOL)

    # Execute step 3: raw 0 -> grad = 0.5 (w - w1): node0 0.5*[-0.5, -0.5] = [-0.25, -0.25]
    step_with(prox, nodes, [[0.0, 0.0], [0.0, 0.0]], 3)

    # Assert: node0 = [-0.0625 + 0.125, 1.125 + 0.125] = [0.0625, 1.25]; node1 = w1;
    # mean = [0.25, 1.4375]; bytes: FedAvg's one all-reduce of the parameters per round
    assert torch.allclose(prox.global_state()["w"], t([0.25, 1.4375]), **TOL)
    assert [(r.op, r.payload_bytes, r.tag) for r in comm.log] == [("all_reduce", 16, "params")] * 2
    assert comm.bytes_sent == [32.0, 32.0]  # 2 rounds x 2(2-1)/2 x 16


def test_clipping_applies_to_the_full_proximal_gradient():
    # Prepare: w0 = [0, 0], N = 1, H = 10, SGD lr 1, mu = 5, clip at norm 2
    prox = FedProx(H=10, mu=5.0, max_grad_norm=2.0, optim=OptimSpec(name="sgd", lr=1.0))
    nodes, _ = build(prox, (0.0, 0.0), n=1)

    # Execute step 0: g = [-0.6, -0.8] (norm 1 < 2: not clipped) -> w = [0.6, 0.8]
    step_with(prox, nodes, [[-0.6, -0.8]], 0)
    # Execute step 1: raw 0 -> grad = 5*[0.6, 0.8] = [3, 4], norm 5 -> times 2/(5 + 1e-6)
    step_with(prox, nodes, [[0.0, 0.0]], 1)

    # Assert: w = [0.6, 0.8] - [3, 4] * 2/(5 + 1e-6) ~ [-0.6, -0.8]
    c = 2.0 / (5.0 + 1e-6)
    assert torch.allclose(nodes.params["w"], t([[0.6 - 3.0 * c, 0.8 - 4.0 * c]]), **TOL)


def test_mu_zero_is_fedavg_exactly():
    # Prepare: random gradients, N = 3, H = 3, inner AdamW
    gen = torch.Generator().manual_seed(0)
    grads = torch.randn(9, 3, 2, generator=gen, dtype=F64)
    inner = OptimSpec(name="adamw", lr=0.05, weight_decay=0.01)
    prox, avg = FedProx(H=3, mu=0.0, optim=inner), FedAvg(H=3, optim=inner)
    p_nodes, _ = build(prox, n=3)
    a_nodes, _ = build(avg, n=3)
    other = FedProx(H=3, mu=0.1, optim=inner)
    o_nodes, _ = build(other, n=3)

    # Execute
    for step, g in enumerate(grads):
        for strategy, nodes in ((prox, p_nodes), (avg, a_nodes), (other, o_nodes)):
            step_with(strategy, nodes, g.tolist(), step)

    # Assert: mu = 0 is bit-identical to FedAvg; mu = 0.1 is not
    assert torch.equal(p_nodes.params["w"], a_nodes.params["w"])
    assert torch.equal(prox.global_state()["w"], avg.global_state()["w"])
    assert not torch.allclose(o_nodes.params["w"], a_nodes.params["w"], rtol=0, atol=1e-6)


def test_fedprox_is_a_fedavg_with_its_own_id():
    prox = FedProx()
    assert isinstance(prox, FedAvg)
    assert (prox.id, prox.mu, prox.H) == ("fedprox", 0.01, 100)


@pytest.mark.parametrize(
    ("factory", "name"),
    [
        (lambda: FedProx(mu=-0.1), "mu"),
        (lambda: FedProx(mu=float("nan")), "mu"),
        (lambda: FedProx(H=0), "H"),
        (lambda: FedProx(max_grad_norm=0.0), "max_grad_norm"),
    ],
)
def test_invalid_hyperparameters_raise_value_error_naming_them(factory, name):
    with pytest.raises(ValueError, match=name):
        factory()


# -- stragglers doing partial work (the paper's Section 5.2, "systems heterogeneity") ---------
def test_straggler_budgets_are_seeded_per_round():
    strategy = FedAvg(H=5, stragglers=0.5, straggler_seed=3)
    build(strategy, n=4)
    b0, b1 = strategy.budgets(0), strategy.budgets(1)
    assert torch.equal(b0, strategy.budgets(0)) and not torch.equal(b0, b1)
    for b in (b0, b1):  # round(0.5 * 4) = 2 stragglers with U{1..5} steps, the others H = 5
        assert b.shape == (4,) and int((b == 5).sum()) >= 2 and int(b.min()) >= 1
    none = FedAvg(H=5)
    build(none, n=4)
    assert none.budgets(0) is None
    kept = b0.clone()
    b0.zero_()  # a caller's change to what budgets() gave does not reach the round's steps
    assert torch.equal(strategy.budgets(0), kept) and torch.equal(strategy._budgets(0), kept)


def test_the_stragglers_follow_the_run_s_seed_unless_given_one():
    # the draw ignored the run's seed: every seed of a study had the same stragglers
    draws = []
    for run_seed in (0, 1, 2):
        s = FedAvg(H=5, stragglers=0.5)
        by_hand.build(s, (1.0, 2.0), n=8, seed=run_seed)
        draws.append(s.budgets(0))
    assert not torch.equal(draws[0], draws[1]) or not torch.equal(draws[0], draws[2])
    fixed = []
    for run_seed in (0, 1):
        s = FedAvg(H=5, stragglers=0.5, straggler_seed=7)
        by_hand.build(s, (1.0, 2.0), n=8, seed=run_seed)
        fixed.append(s.budgets(0))
    assert torch.equal(fixed[0], fixed[1])  # a seed of its own: the same draw in every run


@pytest.mark.parametrize("drop", [False, True])
def test_partial_work_is_averaged_or_dropped_by_hand(drop):
    # Prepare: w0 = [0, 0], N = 3, H = 3, SGD lr 1, every node a straggler; gradient [1, 1]
    # at every step, so a node that takes e steps ends at -e [1, 1]
    strategy = FedAvg(H=3, stragglers=1.0, drop_stragglers=drop,
                      optim=OptimSpec(name="sgd", lr=1.0))
    nodes, comm = build(strategy, (0.0, 0.0), n=3)
    budget = strategy.budgets(0).tolist()

    # Execute: round 0 (steps 0, 1, 2)
    for step in range(3):
        step_with(strategy, nodes, [[1.0, 1.0]] * 3, step)

    # Assert: partial work averaged: w = -mean(e); dropped: only the nodes with e = H send,
    # w = -H = -3 (and every node adopts it); nobody finished: no round, each keeps -e
    if not drop:
        want = -sum(budget) / 3
    elif 3 in budget:
        want = -3.0
    else:
        want = None
    if want is not None:
        assert torch.allclose(strategy.global_state()["w"], t([want, want]), **TOL)
        assert torch.allclose(nodes.params["w"], t([[want, want]] * 3), **TOL)
    senders = 3 if not drop else budget.count(3)
    assert len(comm.log) == (1 if senders else 0)


def test_fedprox_stragglers_stop_and_keep_their_optimizer_state():
    # Prepare: N = 2, H = 4, inner AdamW; stragglers = 1: each node steps e times only
    inner = OptimSpec(name="adamw", lr=0.1)
    prox = FedProx(H=4, mu=0.5, stragglers=1.0, optim=inner)
    nodes, _ = build(prox, (1.0, 2.0), n=2)
    budget = prox.budgets(0).tolist()
    seen = []
    for step in range(3):  # the last step of the round (3) averages: stop before it
        before = nodes.params["w"].clone()
        step_with(prox, nodes, [[1.0, -1.0], [0.5, 0.5]], step)
        seen.append((nodes.params["w"] != before).any(dim=1).tolist())
    # Assert: node k moved at steps 0 .. e_k - 1 only
    for k in range(2):
        assert [s[k] for s in seen] == [step < budget[k] for step in range(3)], (k, budget)


# -- FedAvg's weighting: McMahan et al.'s Algorithm 1, sum_k (n_k / m) w_k -----------------------
@pytest.mark.parametrize(("examples", "weighting", "want"), [
    ([1, 2, 3], "examples", (1 * 1 + 2 * 2 + 3 * 3) / 6),  # 14 / 6
    ([1, 2, 3], "uniform", 2.0),
    (None, "examples", 2.0),  # equal shards: the plain mean
    ([5, 5, 5], "examples", 2.0),
])
def test_fedavg_weights_each_model_by_its_examples_by_hand(examples, weighting, want):
    # Prepare: w0 = [0], 3 nodes, H = 1, SGD lr 1, gradients -1, -2, -3: w_k = 1, 2, 3
    s = FedAvg(H=1, weighting=weighting, optim=OptimSpec(name="sgd", lr=1.0))
    nodes, comm = by_hand.build(s, (0.0,), n=3)
    comm.attendance.examples = examples

    # Execute
    step_with(s, nodes, [[-1.0], [-2.0], [-3.0]], 0)

    # Assert: every node and the server model hold the weighted mean
    (p,) = nodes.params.values()
    assert p[:, 0].tolist() == pytest.approx([want] * 3, rel=1e-15)
    assert s.global_state()[next(iter(nodes.params))].item() == pytest.approx(want, rel=1e-15)


def test_equal_weights_are_the_plain_mean_bit_for_bit():
    values = torch.tensor([[0.1], [0.7], [0.3]], dtype=torch.float64)
    out = []
    for examples in (None, [4, 4, 4]):
        s = FedAvg(H=1, optim=OptimSpec(name="sgd", lr=1.0))
        nodes, comm = by_hand.build(s, (0.0,), n=3)
        comm.attendance.examples = examples
        step_with(s, nodes, (-values).tolist(), 0)
        out.append(next(iter(nodes.params.values())).clone())
    assert torch.equal(out[0], out[1])
    with pytest.raises(ValueError, match=r"weighting must be one of \['examples', 'uniform'\]"):
        FedAvg(weighting="clients")
