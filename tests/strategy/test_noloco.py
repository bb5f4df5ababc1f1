"""NoLoCo (arXiv:2506.10911): random groups per outer step, slow weights and pseudo-gradients
exchanged point to point, the modified Nesterov step with the pull toward the group's mean; bytes
per pair; absent nodes; checkpoints. Expectations are worked out in the comments; float64."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from support.by_hand import F64, TOL, build, sgd, stack, step_with, t
from support.checkpoints import check_checkpoint_resume

from exogym import MnistCNN
from exogym.sim.engine import NodeStack
from exogym.strategy import make
from exogym.strategy.diloco import DiLoCo
from exogym.strategy.noloco import NoLoCo
from exogym.tasks.models import Classifier
from exogym.utils.config import ConfigError


def _set(s: NoLoCo, nodes: NodeStack, *, phi, theta, delta) -> None:
    with torch.no_grad():
        s.slow["w"].copy_(t(phi))
        nodes.params["w"].copy_(t(theta))
        s.momentum["w"].copy_(t(delta))


def test_one_outer_step_by_hand_with_an_untied_pull():
    # Prepare: N = 2 (one pair), H = 1, inner SGD lr 0.1; alpha = 0.5, beta = 0.7, gamma = 0.2;
    # slow weights that differ: phi_0 = [1, 2], phi_1 = [3, 0] (theta = phi), momenta
    # delta_0 = [0.1, 0], delta_1 = [0, -0.2]
    s = NoLoCo(H=1, alpha=0.5, beta=0.7, gamma=0.2, optim=sgd(0.1))
    nodes, comm = build(s, (0.0, 0.0))
    _set(s, nodes, phi=[[1.0, 2.0], [3.0, 0.0]], theta=[[1.0, 2.0], [3.0, 0.0]],
         delta=[[0.1, 0.0], [0.0, -0.2]])

    # Execute: g_0 = [1, -2], g_1 = [2, 0] -> theta_0 = [0.9, 2.2], theta_1 = [2.8, 0];
    # Delta_0 = phi_0 - theta_0 = [0.1, -0.2], Delta_1 = [0.2, 0]: mean [0.15, -0.1];
    # mean phi = [2, 1]
    step_with(s, nodes, [[1.0, -2.0], [2.0, 0.0]], 0)

    # Assert: delta_0 = .5 [.1, 0] - .7 [.15, -.1] - .2 ([1, 2] - [2, 1]) = [0.145, -0.13],
    # phi_0 = [1.145, 1.87]; delta_1 = .5 [0, -.2] - .7 [.15, -.1] - .2 ([3, 0] - [2, 1])
    # = [-0.305, 0.17], phi_1 = [2.695, 0.17]; every node restarts from its phi
    assert torch.allclose(s.momentum["w"], t([[0.145, -0.13], [-0.305, 0.17]]), **TOL)
    assert torch.allclose(s.slow["w"], t([[1.145, 1.87], [2.695, 0.17]]), **TOL)
    assert torch.equal(nodes.params["w"], s.slow["w"])
    # the global model: the node mean of the slow weights
    assert torch.allclose(s.global_state()["w"], t([1.92, 1.02]), **TOL)
    # bytes: one message each way of phi and Delta (2 x 16 bytes), nothing else
    assert sorted((r.op, r.payload_bytes, r.tag, r.src, r.dst) for r in comm.log) == [
        ("send", 32, "gossip", 0, 1), ("send", 32, "gossip", 1, 0)]
    assert comm.bytes_sent == [32.0, 32.0] and comm.bytes_received == [32.0, 32.0]


def test_gamma_none_is_tied_to_beta():
    # Prepare: the same start as above, gamma = None (the authors' code: pull = outer_lr)
    s = NoLoCo(H=1, alpha=0.5, beta=0.7, optim=sgd(0.1))
    nodes, _ = build(s, (0.0, 0.0))
    _set(s, nodes, phi=[[1.0, 2.0], [3.0, 0.0]], theta=[[1.0, 2.0], [3.0, 0.0]],
         delta=[[0.1, 0.0], [0.0, -0.2]])

    # Execute
    step_with(s, nodes, [[1.0, -2.0], [2.0, 0.0]], 0)

    # Assert: delta_0 = [.05, 0] - [.105, -.07] - .7 [-1, 1] = [0.645, -0.63]
    assert s.pull == 0.7
    assert torch.allclose(s.momentum["w"][0], t([0.645, -0.63]), **TOL)


def test_only_every_H_steps_and_momentum_carries_over():
    # Prepare: N = 2, H = 2, inner SGD lr 1, alpha = 0.5, beta = 1, w = [0, 0] on both nodes
    s = NoLoCo(H=2, alpha=0.5, beta=1.0, optim=sgd(1.0))
    nodes, comm = build(s, (0.0, 0.0))

    # Execute step 0: no outer step (theta moves, phi does not, nothing is sent)
    step_with(s, nodes, [[1.0, 0.0], [3.0, 0.0]], 0)
    assert comm.log == [] and torch.equal(s.slow["w"], torch.zeros(2, 2, dtype=F64))

    # Execute step 1: theta_0 = [-1, 0] - [1, 2] = [-2, -2], theta_1 = [-3, 0] - [1, 0]
    # = [-4, 0]; Delta = [2, 2], [4, 0], mean [3, 1]; equal phi: no pull;
    # delta = -[3, 1], phi = [-3, -1] on both nodes
    step_with(s, nodes, [[1.0, 2.0], [1.0, 0.0]], 1)
    assert torch.allclose(s.slow["w"], t([[-3.0, -1.0]] * 2), **TOL)

    # Execute steps 2-3 with zero gradients: Delta = 0; delta = 0.5 (-[3, 1]) -> phi = [-4.5, -1.5]
    step_with(s, nodes, [[0.0, 0.0]] * 2, 2)
    step_with(s, nodes, [[0.0, 0.0]] * 2, 3)

    # Assert
    assert torch.allclose(nodes.params["w"], t([[-4.5, -1.5]] * 2), **TOL)
    assert len(comm.log) == 4


def test_groups_are_a_seeded_permutation_dealt_as_the_authors_batched():
    # Prepare: N = 8, pairs; the authors' batched: group g = perm[g], perm[g + 4]
    s = NoLoCo(seed=5)
    build(s, (0.0, 0.0), n=8)

    # Execute
    rounds = [s.groups(r) for r in range(20)]

    # Assert: each round partitions the 8 ids into 4 pairs, as dealt from numpy's permutation
    for r, groups in enumerate(rounds):
        perm = np.random.default_rng([5, r]).permutation(8).tolist()
        assert groups == [[perm[g], perm[g + 4]] for g in range(4)]
        assert sorted(i for g in groups for i in g) == list(range(8))
    # reproducible per seed, different across rounds and seeds
    again, other = NoLoCo(seed=5), NoLoCo(seed=6)
    build(again, (0.0, 0.0), n=8)
    build(other, (0.0, 0.0), n=8)
    assert [again.groups(r) for r in range(20)] == rounds
    assert [other.groups(r) for r in range(20)] != rounds
    assert len({tuple(map(tuple, g)) for g in rounds}) > 10


def test_odd_nodes_leave_one_alone_with_its_own_step():
    # Prepare: N = 3, pairs: each round one node is alone (the last id of the permutation)
    s = NoLoCo(H=1, alpha=0.5, beta=1.0, optim=sgd(1.0), seed=0)
    nodes, comm = build(s, (0.0, 0.0), n=3)
    groups = s.groups(0)
    (a, b), (alone,) = groups
    assert sorted([a, b, alone]) == [0, 1, 2]
    grads = [[1.0, 0.0], [0.0, 2.0], [4.0, 4.0]]

    # Execute: theta_i = -g_i, Delta_i = g_i
    step_with(s, nodes, grads, 0)

    # Assert: the pair steps by -mean(g_a, g_b), the lone node by -g (no pull: its own mean)
    pair = (t(grads[a]) + t(grads[b])) / 2
    assert torch.allclose(s.slow["w"][a], -pair, **TOL)
    assert torch.allclose(s.slow["w"][b], -pair, **TOL)
    assert torch.allclose(s.slow["w"][alone], -t(grads[alone]), **TOL)
    # the lone node sent and received nothing
    assert comm.bytes_sent[alone] == 0.0 and comm.bytes_received[alone] == 0.0
    assert comm.bytes_sent[a] == comm.bytes_sent[b] == 32.0


def test_a_down_node_takes_no_step_and_its_partner_steps_alone():
    # Prepare: N = 4, node 0 down at the outer step (comm.active, as the trainer sets it)
    s = NoLoCo(H=1, alpha=0.5, beta=1.0, optim=sgd(1.0), seed=1)
    nodes, comm = build(s, (0.0, 0.0), n=4)
    (partner,) = [j for g in s.groups(0) if 0 in g for j in g if j != 0]
    comm.attendance.active = [False, True, True, True]
    grads = [[1.0, 1.0], [2.0, 0.0], [0.0, 2.0], [4.0, 0.0]]

    # Execute
    step_with(s, nodes, grads, 0)

    # Assert: node 0 did not compute (masked step), sent nothing and kept phi = 0, delta = 0;
    # its partner stepped alone by its own pseudo-gradient
    assert torch.equal(s.slow["w"][0], torch.zeros(2, dtype=F64))
    assert torch.equal(s.momentum["w"][0], torch.zeros(2, dtype=F64))
    assert torch.allclose(s.slow["w"][partner], -t(grads[partner]), **TOL)
    assert comm.bytes_sent[0] == comm.bytes_received[0] == 0.0
    assert comm.bytes_sent[partner] == 0.0


class _Loses:
    """Who is heard (``attendance.heard``): synchronisations that lose the messages of the given
    nodes."""

    def __init__(self, lost: set[int]) -> None:
        self.lost = lost

    def __call__(self, active, deadline):
        return [i not in self.lost for i in range(2)]


def test_a_lost_message_is_heard_by_one_side_only():
    # Prepare: N = 2, node 1's message is lost: node 1 hears node 0, node 0 hears nobody
    s = NoLoCo(H=1, alpha=0.5, beta=1.0, optim=sgd(1.0))
    nodes, comm = build(s, (0.0, 0.0))
    comm.attendance.heard = _Loses({1})

    # Execute: theta_i = -g_i, Delta_i = g_i
    step_with(s, nodes, [[2.0, 0.0], [0.0, 4.0]], 0)

    # Assert: node 0 steps alone by -g_0 = [-2, 0]; node 1 by -mean(g) = [-1, -2] (equal phi:
    # no pull); only node 0's message travelled
    assert torch.allclose(s.slow["w"], t([[-2.0, 0.0], [-1.0, -2.0]]), **TOL)
    assert [(r.src, r.dst) for r in comm.log] == [(0, 1)]
    assert comm.bytes_sent == [32.0, 0.0] and comm.bytes_received == [0.0, 32.0]


def test_a_group_of_all_nodes_is_diloco_with_the_heavy_ball_outer_step():
    # Prepare: N = 4, n = 4: every phi stays equal, the pull vanishes; DiLoCo with outer SGD
    # (heavy ball) lr beta, momentum alpha; the same inner AdamW
    noloco = NoLoCo(H=3, n=4, alpha=0.5, beta=0.7)
    diloco = DiLoCo(H=3, outer_optimizer="sgd", outer_lr=0.7, outer_momentum=0.5)
    a, _ = build(noloco, (0.5, -1.0), n=4)
    b, _ = build(diloco, (0.5, -1.0), n=4)
    g = torch.Generator().manual_seed(0)

    # Execute: 12 steps, 4 outer steps, the same random gradients
    for step in range(12):
        grads = torch.randn(4, 2, generator=g, dtype=F64).tolist()
        step_with(noloco, a, grads, step)
        step_with(diloco, b, grads, step)

    # Assert: the same parameters to rounding (delta = -beta b: a product and a sum reordered)
    assert torch.allclose(a.params["w"], b.params["w"], rtol=0, atol=1e-12)
    assert torch.allclose(noloco.global_state()["w"], diloco.global_state()["w"], atol=1e-12)


def test_mnist_cnn_bytes_per_pair():
    # Prepare: MNIST CNN (P = 861,480 bytes, no buffers), N = 4, pairs, H = 2
    s = make("noloco", H=2)
    _, comm = stack(s, Classifier(MnistCNN()), 4, 4)

    # Execute: 4 steps on zero gradients (2 outer steps)
    for step in range(4):
        s.step(step)

    # Assert: per outer step each node sends one message of phi and Delta (2 P = 1,722,960
    # bytes) to its partner: 4 messages per outer step
    assert [r.payload_bytes for r in comm.log] == [1722960] * 8
    assert comm.bytes_sent == [2 * 1722960.0] * 4 == comm.bytes_received


def test_checkpoint_resume_is_exact(tmp_path: Path):
    check_checkpoint_resume(lambda: NoLoCo(H=2), tmp_path)


@pytest.mark.parametrize("key, value, message", [
    ("n", "1", "n (the local group size) must be an integer >= 2, got 1"),
    ("alpha", "1.0", "alpha"),
    ("beta", "0", "beta"),
    ("gamma", "-0.1", "gamma"),
    ("H", "0", "H"),
    ("codec", "int8", "does not support a transport codec"),
])
def test_rejects_bad_settings(key: str, value: str, message: str):
    with pytest.raises((ConfigError, ValueError), match=message.replace("(", r"\(")
                       .replace(")", r"\)")):
        make("noloco", **{key: value})
