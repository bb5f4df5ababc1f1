"""SPARTA and SPARTA + DiLoCo: hand-computed sparse averages, index policies, bytes, global model.

The models are tiny parameter vectors whose values and gradients are written by hand; the
expected numbers are worked out in the comments (float64 where the arithmetic is checked, so it is
exact to ~1e-15; float32 where the byte counts are, to match the documented 4-byte formulas).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch
from support.by_hand import F64, TOL, Vec, set_rows, sgd, t
from support.by_hand import stack as build
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from exogym import Classifier, MnistCNN, Trainer
from exogym.sim.comm import InProcessCommunicator
from exogym.sim.engine import NodeStack
from exogym.strategy.diloco import DiLoCo
from exogym.strategy.fedavg import FedAvg
from exogym.strategy.sparta import SPARTA, SparseAverager, sample_distinct, step_seed
from exogym.strategy.sparta_diloco import SPARTADiLoCo
from exogym.utils.config import ConfigError, apply_overrides, config_fields


class TwoTensors(nn.Module):
    """``weight`` [2, 2] (flat indices 0..3, row-major) then ``bias`` [3] (flat indices 4..6)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(2, 2, dtype=F64))
        self.bias = nn.Parameter(torch.zeros(3, dtype=F64))


def log_of(comm: InProcessCommunicator) -> list[tuple[str, int, str]]:
    return [(r.op, r.payload_bytes, r.tag) for r in comm.log]


def pick(selected: Tensor, if_selected: Tensor, otherwise: Tensor) -> Tensor:
    """Row-wise: ``if_selected[j]`` at the selected flat indices, ``otherwise[j]`` elsewhere."""
    mask = torch.zeros(otherwise.shape[-1], dtype=torch.bool)
    mask[selected] = True
    return torch.where(mask, if_selected, otherwise)


# -- the sparse average itself, on indices chosen by hand ------------------------------------------
def test_average_replaces_exactly_the_given_entries_by_their_node_mean():
    # Prepare: 2 nodes, 8 entries
    nodes = NodeStack(Vec([0.0] * 8), 2, engine="loop")
    comm = InProcessCommunicator(2)
    set_rows(nodes.params["w"], [[1, 2, 3, 4, 5, 6, 7, 8], [3, 2, 5, 0, 9, 6, 1, 8]])
    averager = SparseAverager(nodes.params, 0.25, "random", 0)

    # Execute: average entries 1, 4, 6
    averager.average(torch.tensor([1, 4, 6]), comm)

    # Assert: entry 1: (2+2)/2 = 2; entry 4: (5+9)/2 = 7; entry 6: (7+1)/2 = 4; the rest unchanged
    assert torch.equal(nodes.params["w"], t([[1, 2, 3, 4, 7, 6, 4, 8], [3, 2, 5, 0, 7, 6, 4, 8]]))
    # one all-reduce of 3 float64 values = 24 bytes; ring: 2(N-1)/N * 24 = 24 sent per node
    assert log_of(comm) == [("all_reduce", 24, "sparta")]
    assert comm.bytes_sent == [24.0, 24.0] and comm.bytes_received == [24.0, 24.0]


def test_average_uses_one_flat_index_space_over_all_parameters():
    # Prepare: weight node0 [[1,2],[3,4]], node1 [[5,6],[7,8]]; bias node0 [1,1,1], node1 [3,5,7]
    nodes = NodeStack(TwoTensors(), 2, engine="loop")
    comm = InProcessCommunicator(2)
    set_rows(nodes.params["weight"], [[[1, 2], [3, 4]], [[5, 6], [7, 8]]])
    set_rows(nodes.params["bias"], [[1, 1, 1], [3, 5, 7]])
    averager = SparseAverager(nodes.params, 0.5, "random", 0)
    assert averager.num_elements == 7 and averager.k == 4  # round(0.5 * 7 = 3.5) = 4 (half up)

    # Execute: flat 1 = weight[0,1], flat 3 = weight[1,1], flat 5 = bias[1]
    averager.average(torch.tensor([1, 3, 5]), comm)

    # Assert: weight[0,1] = (2+6)/2 = 4; weight[1,1] = (4+8)/2 = 6; bias[1] = (1+5)/2 = 3
    assert torch.equal(nodes.params["weight"], t([[[1, 4], [3, 6]], [[5, 4], [7, 6]]]))
    assert torch.equal(nodes.params["bias"], t([[1, 3, 1], [3, 3, 7]]))

    # Execute: only bias entries (flat 4 and 6): one piece, 2 values
    averager.average(torch.tensor([4, 6]), comm)

    # Assert: bias[0] = (1+3)/2 = 2; bias[2] = (1+7)/2 = 4; weight untouched
    assert torch.equal(nodes.params["bias"], t([[2, 3, 4], [2, 3, 4]]))
    assert torch.equal(nodes.params["weight"], t([[[1, 4], [3, 6]], [[5, 4], [7, 6]]]))
    # one collective per step whatever the number of tensors: 3 values (24 B), then 2 (16 B)
    assert log_of(comm) == [("all_reduce", 24, "sparta"), ("all_reduce", 16, "sparta")]


def test_sparta_step_is_the_inner_step_then_the_average_of_the_steps_indices():
    # Prepare: w = 10 everywhere, inner SGD lr 0.5, p = 0.25 of 8 entries -> k = 2
    sparta = SPARTA(p=0.25, optim=sgd(0.5))
    nodes, comm = build(sparta, Vec([10.0] * 8))
    set_rows(nodes.grads["w"], [[2, 4, 6, 8, 0, 0, 0, 0], [0, 0, 0, 0, 2, 4, 6, 8]])
    selected = sparta.averager.indices(0)
    global_rng = torch.get_rng_state()

    # Execute
    sparta.step(0)

    # Assert: after SGD node0 = 10 - 0.5*g0 = [9,8,7,6,10,10,10,10],
    #         node1 = 10 - 0.5*g1 = [10,10,10,10,9,8,7,6]; mean = [9.5,9,8.5,8,9.5,9,8.5,8]
    node0 = t([9, 8, 7, 6, 10, 10, 10, 10])
    node1 = t([10, 10, 10, 10, 9, 8, 7, 6])
    mean = t([9.5, 9, 8.5, 8, 9.5, 9, 8.5, 8])
    assert selected.numel() == 2
    assert torch.equal(nodes.params["w"][0], pick(selected, mean, node0))
    assert torch.equal(nodes.params["w"][1], pick(selected, mean, node1))
    assert log_of(comm) == [("all_reduce", 16, "sparta")]  # 2 float64 values
    # the indices come from SPARTA's own generator: the global RNG (dropout's) is untouched
    assert torch.equal(torch.get_rng_state(), global_rng)


# -- index policies --------------------------------------------------------------------------------
def averager_for(m: int, p: float, policy: str, seed: int = 0) -> SparseAverager:
    return SparseAverager({"w": torch.zeros(2, m)}, p, policy, seed)


def test_partition_covers_every_entry_exactly_once_per_cycle():
    # Prepare: M = 8, p = 0.25 -> P = 4 parts of 2
    a = averager_for(8, 0.25, "partition", seed=3)
    assert (a.num_parts, a.k) == (4, 2)

    # Execute
    parts = [a.indices(step).tolist() for step in range(8)]

    # Assert: steps 0..3 are disjoint and cover 0..7; the cycle then repeats in the same order
    assert sorted(itertools.chain(*parts[:4])) == list(range(8))
    assert all(len(part) == 2 for part in parts)
    assert parts[4:] == parts[:4]
    assert all(part == sorted(part) for part in parts)


def test_partition_with_uneven_parts_and_non_integer_one_over_p():
    # M = 7, p = 0.3 -> P = ceil(3.33) = 4 parts; 7 = 4*1 + 3 -> sizes 2, 2, 2, 1 (larger first)
    a = averager_for(7, 0.3, "partition")
    parts = [a.indices(step).tolist() for step in range(4)]
    assert [len(part) for part in parts] == [2, 2, 2, 1]
    assert sorted(itertools.chain(*parts)) == list(range(7))
    # p = 0.1 -> 1/p is 10 parts (not 11 from 1/0.1's round-off); M = 8 < 10 -> P = 8 parts of 1
    assert averager_for(100, 0.1, "partition").num_parts == 10
    assert averager_for(8, 0.1, "partition").num_parts == 8
    # p = 0.005 -> 200 parts
    assert averager_for(1000, 0.005, "partition").num_parts == 200


def test_partition_permutation_depends_on_seed_only():
    a, b, c = (averager_for(64, 0.25, "partition", seed) for seed in (5, 5, 6))
    assert torch.equal(a.permutation, b.permutation)
    assert not torch.equal(a.permutation, c.permutation)
    assert sorted(a.permutation.tolist()) == list(range(64))


def test_random_policy_draws_k_distinct_indices_per_step_from_seed_and_step():
    # Prepare: M = 8, p = 0.25 -> k = 2
    a, b = averager_for(8, 0.25, "random", seed=0), averager_for(8, 0.25, "random", seed=0)
    other = averager_for(8, 0.25, "random", seed=1)

    # Execute
    draws = [a.indices(step) for step in range(50)]

    # Assert: 2 distinct sorted indices in [0, 8); the same for the same (seed, step), in any
    # order of calls; another seed or another step gives other subsets
    assert all(d.numel() == 2 and d[0] < d[1] and d[0] >= 0 and d[1] < 8 for d in draws)
    assert all(torch.equal(b.indices(step), draws[step]) for step in reversed(range(50)))
    assert len({tuple(d.tolist()) for d in draws}) > 10
    assert any(not torch.equal(other.indices(step), draws[step]) for step in range(50))


def test_random_policy_is_uniform_over_subsets():
    # 4000 steps of k = 2 out of 8: each entry ~ Binomial(4000, 1/4): 1000 +- 27 (sd);
    # each of the C(8,2) = 28 pairs ~ Binomial(4000, 1/28): 142.9 +- 11.7. Bounds are ~5 sd.
    a = averager_for(8, 0.25, "random")
    draws = [tuple(a.indices(step).tolist()) for step in range(4000)]
    entries = Counter(itertools.chain(*draws))
    pairs = Counter(draws)
    assert len(pairs) == 28
    assert all(abs(entries[j] - 1000) < 150 for j in range(8))
    assert all(abs(count - 4000 / 28) < 60 for count in pairs.values())


def test_sample_distinct_sparse_path_is_uniform_and_distinct():
    # k = 3 of m = 40 takes the rejection path (4k < m): each entry ~ Binomial(1500, 3/40):
    # 112.5 +- 10.2 (sd); bound ~5 sd
    counts: Counter[int] = Counter()
    for step in range(1500):
        s = sample_distinct(40, 3, torch.Generator().manual_seed(step_seed(0, step)))
        assert s.numel() == 3 and s.unique().numel() == 3
        counts.update(s.tolist())
    assert all(abs(counts[j] - 112.5) < 51 for j in range(40))
    # many duplicates among the draws (k^2/m large): still exactly k distinct values
    big = sample_distinct(1000, 240, torch.Generator().manual_seed(1))
    assert big.numel() == 240 and big.unique().numel() == 240 and big.max() < 1000


def test_step_seed_mixes_seed_and_step_into_32_bits():
    # torch's CPU generator keeps only the low 32 bits of manual_seed, so a packed
    # seed * 2**32 + step would draw the same indices for every seed: step_seed mixes all bits
    assert step_seed(0, 7) != step_seed(1 << 32, 7)
    assert step_seed(0, 7) != step_seed(1, 7) != step_seed(1, 8)
    assert all(0 <= step_seed(seed, 456) < 1 << 32 for seed in range(100))
    a, b = averager_for(1000, 0.01, "random", 0), averager_for(1000, 0.01, "random", 1)
    assert all(not torch.equal(a.indices(s), b.indices(s)) for s in range(5))


# -- bytes -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n, per_step", [(2, 8.0), (4, 12.0)])
def test_bytes_per_step_are_the_ring_all_reduce_of_the_k_selected_values(n, per_step):
    # Prepare: fp32, M = 8, p = 0.25 -> k = 2 values = 8 bytes per node
    sparta = SPARTA(p=0.25, optim=sgd(0.1))
    _, comm = build(sparta, Vec([0.0] * 8, dtype=torch.float32), n=n)

    # Execute: 3 steps (zero gradients)
    for step in range(3):
        sparta.step(step)

    # Assert: 2 (N-1)/N * 8 per step: N = 2 -> 8, N = 4 -> 12; indices are not sent
    assert log_of(comm) == [("all_reduce", 8, "sparta")] * 3
    assert comm.bytes_sent == [3 * per_step] * n
    assert comm.bytes_received == [3 * per_step] * n


def test_mnist_cnn_numbers_in_the_docstring():
    # M = 215,370; k = round(0.005 * 215370 = 1076.85) = 1077; S = 4308 bytes;
    # N = 4: 2 * 3/4 * 4308 = 6462 bytes per step
    nodes = NodeStack(Classifier(MnistCNN()), 4, engine="loop")
    comm = InProcessCommunicator(4)
    random = SparseAverager(nodes.params, 0.005, "random", 0)
    partition = SparseAverager(nodes.params, 0.005, "partition", 0)
    assert (random.num_elements, random.k) == (215_370, 1077)
    # 215370 = 200 * 1076 + 170 -> 170 parts of 1077, then 30 of 1076
    assert (partition.num_parts, partition.k) == (200, 1077)
    assert [partition.indices(s).numel() for s in (0, 169, 170, 199)] == [1077, 1077, 1076, 1076]
    random.average(random.indices(0), comm)
    assert comm.bytes_sent[0] == 6462.0


# -- the deployed model and equivalences -----------------------------------------------------------
def test_global_state_is_the_node_mean_with_node0_counters():
    # Prepare
    sparta = SPARTA(p=0.25, optim=sgd(0.1))
    nodes, _ = build(sparta, Vec([0.0, 0.0], bn=True))
    set_rows(nodes.params["w"], [[1.0, 2.0], [4.0, -2.0]])
    set_rows(nodes.buffers["bn.running_mean"], [[1.0, 2.0], [3.0, 4.0]])
    set_rows(nodes.buffers["bn.running_var"], [[1.0, 1.0], [3.0, 5.0]])
    nodes.buffers["bn.num_batches_tracked"].copy_(torch.tensor([3, 5]))

    # Execute
    g = sparta.global_state()

    # Assert: w = ([1,2] + [4,-2])/2 = [2.5, 0]; running_mean = [2, 3]; running_var = [2, 3];
    # the counter is node 0's; the state is a copy, not a view
    assert torch.allclose(g["w"], t([2.5, 0.0]), **TOL)
    assert torch.allclose(g["bn.running_mean"], t([2.0, 3.0]), **TOL)
    assert torch.allclose(g["bn.running_var"], t([2.0, 3.0]), **TOL)
    assert int(g["bn.num_batches_tracked"]) == 3
    assert set(g) == {"w", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}
    g["w"].zero_()
    assert torch.equal(nodes.params["w"], t([[1.0, 2.0], [4.0, -2.0]]))
    # buffers are not part of the sparse average: each node keeps its own
    sparta.step(0)
    assert torch.equal(nodes.buffers["bn.running_mean"], t([[1.0, 2.0], [3.0, 4.0]]))


@pytest.mark.parametrize("policy", ["random", "partition"])
def test_p_one_averages_everything_every_step_like_fedavg_h1(policy):
    # p = 1: k = M (random) or P = 1 part (partition): the full parameter average every step
    sparta = SPARTA(p=1.0, policy=policy, optim=sgd(0.1))
    fedavg = FedAvg(H=1, optim=sgd(0.1))
    s_nodes, s_comm = build(sparta, Vec([1.0, 2.0, 3.0]))
    f_nodes, f_comm = build(fedavg, Vec([1.0, 2.0, 3.0]))
    grads = [[[1, 0, 2], [3, 2, 0]], [[0, 1, 1], [-1, 1, 5]], [[2, 2, 2], [0, 0, 0]]]
    # step 0: node0 = [0.9, 2, 2.8], node1 = [0.7, 1.8, 3]; mean = [0.8, 1.9, 2.9]
    # step 1: mean(g) = [-0.5, 1, 3]: [0.85, 1.8, 2.6]; step 2: mean(g) = [1,1,1]: [0.75, 1.7, 2.5]
    for step, g in enumerate(grads):
        for strategy, nodes in ((sparta, s_nodes), (fedavg, f_nodes)):
            set_rows(nodes.grads["w"], g)
            strategy.step(step)
        assert torch.allclose(s_nodes.params["w"], f_nodes.params["w"], **TOL)
    assert torch.allclose(s_nodes.params["w"], t([[0.75, 1.7, 2.5]] * 2), **TOL)
    assert torch.allclose(sparta.global_state()["w"], t([0.75, 1.7, 2.5]), **TOL)
    assert s_comm.bytes_sent == f_comm.bytes_sent  # 3 values of 8 bytes per step for both


# -- SPARTA + DiLoCo -------------------------------------------------------------------------------
def test_sparta_diloco_sparse_average_every_step_and_outer_step_every_H_by_hand():
    # Prepare: theta0 = [1,2,3,4], N = 2, H = 2, p = 0.5 -> k = 2, inner SGD lr 0.1,
    # outer Nesterov SGD lr 0.7, momentum 0.9
    sd = SPARTADiLoCo(H=2, p=0.5, outer_lr=0.7, outer_momentum=0.9, outer_optimizer="nesterov",
                      optim=sgd(0.1))
    nodes, comm = build(sd, Vec([1.0, 2.0, 3.0, 4.0]))
    selected = sd.averager.indices(0)

    # Execute step 0 (not an outer step): g0 = [1,0,2,0], g1 = [3,2,0,4]
    set_rows(nodes.grads["w"], [[1, 0, 2, 0], [3, 2, 0, 4]])
    sd.step(0)

    # Assert: node0 = [0.9, 2, 2.8, 4]; node1 = [0.7, 1.8, 3, 3.6]; mean = [0.8, 1.9, 2.9, 3.8];
    # the 2 selected entries take the mean on both nodes; the global model is still theta0
    node0, node1 = t([0.9, 2.0, 2.8, 4.0]), t([0.7, 1.8, 3.0, 3.6])
    mean = t([0.8, 1.9, 2.9, 3.8])
    assert torch.allclose(nodes.params["w"][0], pick(selected, mean, node0), **TOL)
    assert torch.allclose(nodes.params["w"][1], pick(selected, mean, node1), **TOL)
    assert not torch.allclose(nodes.params["w"][0], nodes.params["w"][1])
    assert torch.equal(sd.global_state()["w"], t([1.0, 2.0, 3.0, 4.0]))
    assert log_of(comm) == [("all_reduce", 16, "sparta")]  # 2 float64 values

    # Execute step 1 (outer step): g0 = [1,1,0,0], g1 = [1,-1,2,0]
    set_rows(nodes.grads["w"], [[1, 1, 0, 0], [1, -1, 2, 0]])
    sd.step(1)

    # Assert: sparse averages keep the node mean, so after SGD the mean is
    # [0.8,1.9,2.9,3.8] - 0.1*mean(g) = [0.8,1.9,2.9,3.8] - 0.1*[1,0,1,0] = [0.7,1.9,2.8,3.8]
    # whichever entries were averaged; Delta = theta0 - mean = [0.3, 0.1, 0.2, 0.2];
    # first Nesterov step: Delta + 0.9*Delta = [0.57, 0.19, 0.38, 0.38];
    # theta1 = theta0 - 0.7*that = [1-0.399, 2-0.133, 3-0.266, 4-0.266]
    theta1 = t([0.601, 1.867, 2.734, 3.734])
    assert torch.allclose(nodes.params["w"], theta1.expand(2, 4), **TOL)
    assert torch.allclose(sd.global_state()["w"], theta1, **TOL)
    # the step's sparse average (2 values), then the pseudo-gradient (4 float64 = 32 bytes)
    assert log_of(comm)[1:] == [("all_reduce", 16, "sparta"), ("all_reduce", 32, "pseudo_grads")]


def test_sparta_diloco_bytes_over_two_rounds():
    # fp32, M = 8, N = 4, H = 3, p = 0.25 -> k = 2: a sparse average sends 2 * 3/4 * 8 = 12 bytes,
    # an outer step 2 * 3/4 * 32 = 48 bytes; 6 steps = 6 sparse + 2 outer = 72 + 96 = 168
    sd = SPARTADiLoCo(H=3, p=0.25, optim=sgd(0.1))
    _, comm = build(sd, Vec([0.0] * 8, dtype=torch.float32), n=4)
    for step in range(6):
        sd.step(step)
    assert [r.tag for r in comm.log] == ["sparta", "sparta", "sparta", "pseudo_grads"] * 2
    assert comm.bytes_sent == [168.0] * 4


def test_sparta_diloco_outer_step_ignores_the_sparse_average_before_it():
    # H = 1: every step is an outer step; the sparse average just before it keeps the node mean,
    # so the parameters follow DiLoCo's (to round-off), with k = 1 extra value sent per step
    sd = SPARTADiLoCo(H=1, p=0.5, optim=sgd(0.1))
    dl = DiLoCo(H=1, optim=sgd(0.1))
    sd_nodes, sd_comm = build(sd, Vec([1.0, 2.0]))
    dl_nodes, dl_comm = build(dl, Vec([1.0, 2.0]))
    for step, g in enumerate([[[1, 0], [3, 2]], [[2, 2], [0, -2]]]):
        for strategy, nodes in ((sd, sd_nodes), (dl, dl_nodes)):
            set_rows(nodes.grads["w"], g)
            strategy.step(step)
    # the values of test_strategy_math's DiLoCo example: theta2 = [0.4876, 1.8103]
    assert torch.allclose(sd_nodes.params["w"], t([[0.4876, 1.8103]] * 2), **TOL)
    assert torch.allclose(sd_nodes.params["w"], dl_nodes.params["w"], **TOL)
    assert log_of(sd_comm) == [("all_reduce", 8, "sparta"), ("all_reduce", 16, "pseudo_grads")] * 2
    assert log_of(dl_comm) == [("all_reduce", 16, "pseudo_grads")] * 2


# -- configuration ---------------------------------------------------------------------------------
BAD_VALUES = [
    ({"p": 0.0}, r"p must be in \(0.0, 1.0\], got 0.0"),
    ({"p": -0.1}, r"p must be in \(0.0, 1.0\], got -0.1"),
    ({"p": 1.5}, r"p must be in \(0.0, 1.0\], got 1.5"),
    ({"p": True}, r"p must be in \(0.0, 1.0\], got True"),
    ({"policy": "topk"}, r"policy must be one of \['random', 'partition'\], got 'topk'"),
    ({"seed": -1}, r"seed must be an integer in \[0, 2\^31\), got -1"),
    ({"seed": 1.5}, r"seed must be an integer in \[0, 2\^31\), got 1.5"),
    ({"seed": 2**31}, r"seed must be an integer in \[0, 2\^31\), got 2147483648"),
]


@pytest.mark.parametrize("cls", [SPARTA, SPARTADiLoCo])
@pytest.mark.parametrize("kwargs, message", BAD_VALUES)
def test_bad_hyperparameters_are_errors(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**kwargs)


def test_sparta_diloco_keeps_diloco_validation():
    with pytest.raises(ValueError, match="H must be an integer >= 1"):
        SPARTADiLoCo(H=0)


def test_overrides_parse_and_document_the_fields():
    s = apply_overrides(SPARTA, {"p": "0.01", "policy": "partition", "seed": "3"})
    assert (s.p, s.policy, s.seed) == (0.01, "partition", 3)
    with pytest.raises(ConfigError, match="policy"):
        apply_overrides(SPARTA, {"policy": "bernoulli"})
    for cls in (SPARTA, SPARTADiLoCo):
        spec = config_fields(cls)
        assert all(spec[key][2] for key in ("p", "policy", "seed"))
        assert spec["p"][1] == 0.005 and spec["policy"][1] == "random"
    assert {"H", "outer_lr"} <= set(config_fields(SPARTADiLoCo))


def test_sparta_rejects_a_codec_and_sparta_diloco_takes_one_for_its_pseudo_gradients():
    with pytest.raises(ValueError, match="does not support a transport codec"):
        SPARTA(codec="fp16")
    # fp16 codec on the pseudo-gradient only: fp32, M = 8, N = 2, H = 2, p = 0.25 -> k = 2;
    # steps 0 and 1 send the 2 sparse values exactly (8 bytes), step 1 the 8-entry pseudo-gradient
    # in fp16 (16 bytes); ring with N = 2: 2 * 1/2 * S = S
    sd = SPARTADiLoCo(H=2, p=0.25, codec="fp16", optim=sgd(0.1))
    _, comm = build(sd, Vec([0.0] * 8, dtype=torch.float32))
    sd.step(0)
    sd.step(1)
    assert [(r.payload_bytes, r.tag, r.codec) for r in comm.log] == [
        (8, "sparta", ""), (8, "sparta", ""), (16, "pseudo_grads", "fp16")]
    assert comm.bytes_sent == [32.0, 32.0]


# -- through the trainer ---------------------------------------------------------------------------
class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize("cls", [SPARTA, SPARTADiLoCo])
def test_fit_runs_deterministically_with_the_documented_bytes(cls):
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 6, generator=gen), torch.randint(0, 3, (256,),
                                                                           generator=gen))
    results = []
    for _ in range(2):
        torch.manual_seed(0)
        strategy = cls(p=0.1, H=4) if cls is SPARTADiLoCo else cls(p=0.1)
        results.append(Trainer(Classifier(TinyNet()), data, data).fit(
            strategy=strategy, num_nodes=3, max_steps=8, batch_size=16, eval_interval=8,
            seed=0, progress=False))
    a, b = results
    assert a.final == b.final
    # M = 6*8 + 8 + 8*3 + 3 = 83; k = round(8.3) = 8 -> 32 bytes; N = 3: 2 * 2/3 * 32 per step
    sparse = 2 * 2 / 3 * 32
    # SPARTA + DiLoCo (H = 4) adds 2 outer steps of 83 * 4 = 332 bytes
    outer = 2 * (2 * 2 / 3 * 332) if cls is SPARTADiLoCo else 0.0
    expected = 8 * sparse + outer
    assert math.isclose(a.bytes_sent[0], expected, rel_tol=1e-12)
