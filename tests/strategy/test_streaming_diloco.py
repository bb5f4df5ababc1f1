"""Streaming DiLoCo (arXiv:2501.18512) checked by hand on tiny node-stacked models.

Most tests build a model whose parameters are set by hand, stack it on N nodes, write the per-node
gradients by hand and call ``strategy.step`` directly, with an SGD inner optimizer so that each
inner step is ``theta <- theta - lr * g``. The expected values are worked out in the comments
(float64, so the arithmetic is exact to ~1e-15). ``t`` is the number of inner steps taken
(``t = step + 1``).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from support.by_hand import F64, TOL, sgd, t
from support.by_hand import stack as build
from torch import Tensor, nn

from exogym.sim.codecs import make_codec
from exogym.sim.comm import InProcessCommunicator
from exogym.sim.engine import NodeStack
from exogym.strategy.diloco import DiLoCo
from exogym.strategy.optim import OptimSpec
from exogym.strategy.streaming_diloco import StreamingDiLoCo, strided_fragments
from exogym.utils.config import apply_overrides, config_fields

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny tensors: threads only cost time


class Layer(nn.Module):
    def __init__(self, values: list[float], dtype: torch.dtype) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(values, dtype=dtype))


class Layers(nn.Module):
    """``layers.i.w`` for each list of values: one "layer" (a module owning parameters) each."""

    def __init__(self, *values: list[float], dtype: torch.dtype = F64) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(v, dtype) for v in values)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.fc2(torch.tanh(self.fc1(x))), y)


class BNNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.fc2(torch.relu(self.bn(self.fc1(x)))), y)


@torch.no_grad()
def run_step(strategy, nodes, comm, step: int, grads: dict[str, list]) -> None:
    """Write the per-node gradients by hand, then the strategy's step ``step`` (0-based)."""
    for name, rows in grads.items():
        nodes.grads[name].copy_(torch.tensor(rows, dtype=nodes.grads[name].dtype))
    comm.attendance.step = step
    strategy.step(step)
    nodes.zero_grad()


def rows_equal(x: Tensor) -> bool:
    return bool((x == x[0]).all())


# -- the fragments and the schedule ---------------------------------------------------------------
def test_schedule_and_fragments_P3_H6_tau1_by_hand():
    # Prepare: 6 one-element layers -> strided fragments {0,3}, {1,4}, {2,5}; offsets
    # t_p = floor(p * 6 / 3) = 0, 2, 4: fragment 1 starts at t = 2, 8, fragment 2 at t = 4, 10,
    # fragment 0 at t = 6, 12 (t = 0 excluded); each merge lands tau = 1 step later.
    s = StreamingDiLoCo(H=6, P=3, tau=1, alpha=0.0, quantization=None, optim=sgd(0.1))
    nodes, comm = build(s, Layers(*[[float(i)] for i in range(6)]))

    assert s.offsets == [0, 2, 4]
    assert [s.fragment_syncing(step) for step in range(0, 13)] == [
        None, None, 1, None, 2, None, 0, None, 1, None, 2, None, 0]
    assert s.fragment_params == [["layers.0.w", "layers.3.w"], ["layers.1.w", "layers.4.w"],
                                 ["layers.2.w", "layers.5.w"]]

    # Execute: 13 steps; every layer gets a different gradient on each node every step, so the
    # nodes' rows of a fragment are equal after a step exactly when that fragment merged then.
    merged_at: dict[int, list[int]] = {}
    for step in range(13):
        run_step(s, nodes, comm, step, {f"layers.{i}.w": [[1.0], [-1.0]] for i in range(6)})
        merged_at[step + 1] = [p for p, names in enumerate(s.fragment_params)
                               if all(rows_equal(nodes.params[k]) for k in names)]

    # Assert: sync starts (the all-reduce, logged at step = t - 1) and merges at t + 1.
    assert [(r.step + 1, r.tag, r.overlap) for r in comm.log] == [
        (2, "fragment1", True), (4, "fragment2", True), (6, "fragment0", True),
        (8, "fragment1", True), (10, "fragment2", True), (12, "fragment0", True)]
    assert merged_at == {1: [], 2: [], 3: [1], 4: [], 5: [2], 6: [], 7: [0], 8: [], 9: [1],
                         10: [], 11: [2], 12: [], 13: [0]}


def test_strided_fragments_and_floor_offsets():
    # 5 layers, P = 2: layers 0, 2, 4 -> fragment 0; 1, 3 -> fragment 1
    layers = [["a"], ["b"], ["c", "c2"], ["d"], ["e"]]
    assert strided_fragments(layers, 2) == [["a", "c", "c2", "e"], ["b", "d"]]
    with pytest.raises(ValueError, match="P=6 fragments need at least 6 layers"):
        strided_fragments(layers, 6)
    # H = 10, P = 3: t_p = floor(0), floor(10/3) = 3, floor(20/3) = 6
    s = StreamingDiLoCo(H=10, P=3, tau=2)
    assert s.offsets == [0, 3, 6]
    assert [s.fragment_syncing(step) for step in range(1, 21)] == [
        None, None, 1, None, None, 2, None, None, None, 0,
        None, None, 1, None, None, 2, None, None, None, 0]


def test_buffers_ride_with_their_module_and_too_few_layers_is_an_error():
    # Layers in registration order: fc1, bn (weight, bias + running stats), fc2. P = 2:
    # fragment 0 = fc1 + fc2, fragment 1 = bn; the integer counter is node 0's.
    s = StreamingDiLoCo(H=4, P=2, tau=0, quantization=None)
    build(s, BNNet())
    assert s.fragment_params == [["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
                                 ["bn.weight", "bn.bias"]]
    assert s.fragment_buffers == [[], ["bn.running_mean", "bn.running_var"]]
    assert s.int_buffers == ["bn.num_batches_tracked"]

    with pytest.raises(ValueError, match="P=4 fragments need at least 4 layers"):
        build(StreamingDiLoCo(H=4, P=4, tau=0), BNNet())


# -- the update, by hand --------------------------------------------------------------------------
def test_two_fragments_tau0_alpha0_is_diloco_per_fragment_by_hand():
    # Prepare: a = [1], b = [2]; H = 2, P = 2 -> fragment 0 = {a} syncs at t = 2, 4, fragment 1
    # = {b} at t = 1, 3. Inner SGD lr 0.1; outer Nesterov lr 0.5, momentum 0.5.
    s = StreamingDiLoCo(H=2, P=2, tau=0, alpha=0.0, quantization=None, outer_lr=0.5,
                        outer_momentum=0.5, optim=sgd(0.1))
    nodes, comm = build(s, Layers([1.0], [2.0]))
    a, b = "layers.0.w", "layers.1.w"

    # t = 1: a -> [0.9, 0.7] (g = 1, 3); b -> [1.8, 1.6] (g = 2, 4). Fragment 1 syncs:
    # Delta_b = mean(2 - 1.8, 2 - 1.6) = 0.3; buf = 0.3; theta_b = 2 - 0.5 (0.3 + 0.5 * 0.3)
    # = 2 - 0.225 = 1.775 on both nodes; a untouched.
    run_step(s, nodes, comm, 0, {a: [[1.0], [3.0]], b: [[2.0], [4.0]]})
    assert torch.allclose(nodes.params[a], t([[0.9], [0.7]]), **TOL)
    assert torch.allclose(nodes.params[b], t([[1.775], [1.775]]), **TOL)
    assert torch.allclose(s.global_state()[a], t([1.0]), **TOL)
    assert torch.allclose(s.global_state()[b], t([1.775]), **TOL)

    # t = 2: a -> [0.8, 0.6] (g = 1, 1); b -> [1.775, 1.575] (g = 0, 2). Fragment 0 syncs:
    # Delta_a = mean(0.2, 0.4) = 0.3; theta_a = 1 - 0.5 * 0.45 = 0.775; b untouched.
    run_step(s, nodes, comm, 1, {a: [[1.0], [1.0]], b: [[0.0], [2.0]]})
    assert torch.allclose(nodes.params[a], t([[0.775], [0.775]]), **TOL)
    assert torch.allclose(nodes.params[b], t([[1.775], [1.575]]), **TOL)

    # t = 3: a stays (g = 0); b -> [1.675, 1.675] (g = 1, -1). Fragment 1's second outer step:
    # Delta_b = 1.775 - 1.675 = 0.1; buf = 0.5 * 0.3 + 0.1 = 0.25;
    # theta_b = 1.775 - 0.5 (0.1 + 0.5 * 0.25) = 1.775 - 0.1125 = 1.6625.
    run_step(s, nodes, comm, 2, {a: [[0.0], [0.0]], b: [[1.0], [-1.0]]})
    assert torch.allclose(nodes.params[b], t([[1.6625], [1.6625]]), **TOL)
    assert torch.allclose(s.global_state()[a], t([0.775]), **TOL)
    assert torch.allclose(s.global_state()[b], t([1.6625]), **TOL)

    # Bytes: 3 all-reduces of one float64 (S = 8), blocking; 2 (N-1)/N * 8 = 8 each.
    assert [(r.op, r.payload_bytes, r.tag, r.overlap) for r in comm.log] == [
        ("all_reduce", 8, "fragment1", False), ("all_reduce", 8, "fragment0", False),
        ("all_reduce", 8, "fragment1", False)]
    assert comm.bytes_sent == [24.0, 24.0]


def test_alpha_mixes_local_and_global_by_hand():
    # Prepare: w = [1, 2], H = P = 1, tau = 0, alpha = 0.5; inner SGD lr 0.1; outer lr 1,
    # Nesterov momentum 0.5.
    s = StreamingDiLoCo(H=1, P=1, tau=0, alpha=0.5, quantization=None, outer_lr=1.0,
                        outer_momentum=0.5, optim=sgd(0.1))
    nodes, comm = build(s, Layers([1.0, 2.0]))
    w = "layers.0.w"

    # t = 1: nodes -> [0.9, 2.0], [0.7, 1.8]; Delta = mean([0.1, 0], [0.3, 0.2]) = [0.2, 0.1];
    # theta = [1, 2] - 1.5 * [0.2, 0.1] = [0.7, 1.85]. Merge: node0 = (0.9 + 0.7) / 2,
    # (2 + 1.85) / 2 = [0.8, 1.925]; node1 = [(0.7 + 0.7) / 2, (1.8 + 1.85) / 2] = [0.7, 1.825].
    run_step(s, nodes, comm, 0, {w: [[1.0, 0.0], [3.0, 2.0]]})
    assert torch.allclose(nodes.params[w], t([[0.8, 1.925], [0.7, 1.825]]), **TOL)
    assert torch.allclose(s.global_state()[w], t([0.7, 1.85]), **TOL)

    # t = 2 (g = 0): the pseudo-gradient is against the global [0.7, 1.85], not the local rows:
    # Delta = mean([-0.1, -0.075], [0, 0.025]) = [-0.05, -0.025]; buf = 0.5 [0.2, 0.1] + Delta
    # = [0.05, 0.025]; theta = [0.7, 1.85] - (Delta + 0.5 buf) = [0.7, 1.85] + [0.025, 0.0125]
    # = [0.725, 1.8625]. Merge: node0 = [(0.8 + 0.725) / 2, (1.925 + 1.8625) / 2]
    # = [0.7625, 1.89375]; node1 = [(0.7 + 0.725) / 2, (1.825 + 1.8625) / 2] = [0.7125, 1.84375].
    run_step(s, nodes, comm, 1, {w: [[0.0, 0.0], [0.0, 0.0]]})
    assert torch.allclose(s.global_state()[w], t([0.725, 1.8625]), **TOL)
    assert torch.allclose(nodes.params[w], t([[0.7625, 1.89375], [0.7125, 1.84375]]), **TOL)


def test_tau1_applies_the_sync_start_update_one_step_later_by_hand():
    # Prepare: w = [1]; H = 2, P = 1, tau = 1, alpha = 0.5; inner SGD lr 0.1; outer plain SGD
    # (heavy ball with momentum 0) lr 0.5: theta <- theta - 0.5 Delta.
    s = StreamingDiLoCo(H=2, P=1, tau=1, alpha=0.5, quantization=None, outer_lr=0.5,
                        outer_momentum=0.0, nesterov=False, optim=sgd(0.1))
    nodes, comm = build(s, Layers([1.0]))
    w = "layers.0.w"

    # t = 1: no sync; nodes -> [0.9, 0.7]
    run_step(s, nodes, comm, 0, {w: [[1.0], [3.0]]})
    assert comm.log == []

    # t = 2: nodes -> [0.8, 0.6]; the sync starts: Delta = mean(0.2, 0.4) = 0.3;
    # theta = 1 - 0.5 * 0.3 = 0.85 (the global model), but the nodes keep training on their own.
    run_step(s, nodes, comm, 1, {w: [[1.0], [1.0]]})
    assert torch.allclose(nodes.params[w], t([[0.8], [0.6]]), **TOL)
    assert torch.allclose(s.global_state()[w], t([0.85]), **TOL)
    assert [(r.step, r.tag, r.overlap) for r in comm.log] == [(1, "fragment0", True)]

    # t = 3 = 2 + tau: nodes -> [0.6, 0.5] (g = 2, 1), then merge the update from t = 2:
    # node0 = (0.6 + 0.85) / 2 = 0.725, node1 = (0.5 + 0.85) / 2 = 0.675. (A pseudo-gradient
    # taken now would be mean(0.4, 0.5) = 0.45 and give theta = 0.775 instead.)
    run_step(s, nodes, comm, 2, {w: [[2.0], [1.0]]})
    assert torch.allclose(nodes.params[w], t([[0.725], [0.675]]), **TOL)
    assert torch.allclose(s.global_state()[w], t([0.85]), **TOL)
    assert len(comm.log) == 1  # nothing sent at the merge

    # t = 4 (g = 0): the next sync, against theta = 0.85: Delta = mean(0.125, 0.175) = 0.15;
    # theta = 0.85 - 0.075 = 0.775; merged at t = 5.
    run_step(s, nodes, comm, 3, {w: [[0.0], [0.0]]})
    assert torch.allclose(s.global_state()[w], t([0.775]), **TOL)
    assert torch.allclose(nodes.params[w], t([[0.725], [0.675]]), **TOL)
    run_step(s, nodes, comm, 4, {w: [[0.0], [0.0]]})
    # node0 = (0.725 + 0.775) / 2 = 0.75; node1 = (0.675 + 0.775) / 2 = 0.725
    assert torch.allclose(nodes.params[w], t([[0.75], [0.725]]), **TOL)


def test_fp4_quantized_pseudo_gradient_by_hand():
    # Prepare: w = [2, 1]; H = P = 1, tau = 0, alpha = 0; inner SGD lr 1 so that each node's
    # pseudo-gradient is its gradient; outer plain SGD lr 1: theta <- theta - mean(Q(Delta_m)).
    s = StreamingDiLoCo(H=1, P=1, tau=0, alpha=0.0, quantization="fp4", outer_lr=1.0,
                        outer_momentum=0.0, nesterov=False, optim=sgd(1.0))
    nodes, comm = build(s, Layers([2.0, 1.0]))
    w = "layers.0.w"

    # Delta_0 = [1, 0.3]: scale 1, 0.3 lies in [0.25, 0.5) below 0.375 -> 0.25: Q = [1, 0.25].
    # Delta_1 = [0.5, -0.2]: scale 0.5, y = [1, -0.4]; 0.4 >= 0.375 -> 0.5: Q = [0.5, -0.25].
    # Mean [0.75, 0] (fp32 would give [0.75, 0.05]); theta = [2 - 0.75, 1 - 0] = [1.25, 1].
    run_step(s, nodes, comm, 0, {w: [[1.0, 0.3], [0.5, -0.2]]})
    assert torch.allclose(s.global_state()[w], t([1.25, 1.0]), **TOL)
    assert torch.allclose(nodes.params[w], t([[1.25, 1.0], [1.25, 1.0]]), **TOL)
    # 2 elements at 4 bits = 1 byte + one fp32 scale = 5 bytes
    assert [(r.payload_bytes, r.codec) for r in comm.log] == [(5, "fp4")]


def test_fp4_bytes_per_fragment_sync_match_the_formula():
    # Prepare: float32 layers of 5, 4 and 3 elements, P = 2: fragment 0 = layers 0 and 2,
    # fragment 1 = layer 1. FP4 payload per tensor: ceil(numel / 2) + 4 (one fp32 scale):
    # S_0 = (3 + 4) + (2 + 4) = 13, S_1 = 2 + 4 = 6. N = 4: 2 (N-1)/N = 1.5 per byte.
    s = StreamingDiLoCo(H=2, P=2, tau=0, optim=sgd(0.1))  # quantization "fp4" by default
    nodes, comm = build(s, Layers([1.0] * 5, [1.0] * 4, [1.0] * 3, dtype=torch.float32), n=4)
    g = {f"layers.{i}.w": [[float(j + 1)] * size for j in range(4)]
         for i, size in enumerate((5, 4, 3))}
    codec = make_codec("fp4")

    # t = 1: fragment 1 syncs -> 1.5 * 6 = 9 bytes; t = 2: fragment 0 -> 1.5 * 13 = 19.5 bytes.
    run_step(s, nodes, comm, 0, g)
    assert comm.bytes_sent == [9.0] * 4
    run_step(s, nodes, comm, 1, g)
    assert comm.bytes_sent == [28.5] * 4
    assert [(r.tag, r.payload_bytes, r.codec, r.overlap) for r in comm.log] == [
        ("fragment1", 6, "fp4", False), ("fragment0", 13, "fp4", False)]
    # the docstring's formula: 2 (N-1)/N * sum_k (ceil(numel_k / 2) + 4)
    for p, sizes in ((0, (5, 3)), (1, (4,))):
        formula = 2 * 3 / 4 * sum(math.ceil(n / 2) + 4 for n in sizes)
        via_codec = 2 * 3 / 4 * sum(codec.payload_bytes(n, torch.float32) for n in sizes)
        assert formula == via_codec == (19.5 if p == 0 else 9.0)


# -- against DiLoCo -------------------------------------------------------------------------------
def _train(strategy, model: nn.Module, steps: int, n: int = 3):
    torch.manual_seed(0)
    nodes = NodeStack(model, n, engine="loop")
    comm = InProcessCommunicator(n)
    strategy.setup(nodes, comm, steps)
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        x = torch.randn(n, 5, 6, generator=gen, dtype=F64)
        y = torch.randint(0, 4, (n, 5), generator=gen)
        comm.attendance.step = step
        nodes.forward_backward((x, y))
        strategy.step(step)
        nodes.zero_grad()
    return nodes, comm


@pytest.mark.parametrize("quantization", [None, "fp4"])
def test_one_fragment_blocking_alpha0_equals_diloco_exactly(quantization):
    # P = 1, tau = 0, alpha = 0 is DiLoCo; with the same codec the numbers are bit-identical.
    adamw = OptimSpec(lr=1e-2, weight_decay=1e-2)
    ref = DiLoCo(H=3, outer_lr=0.7, outer_momentum=0.9, optim=adamw, codec=quantization)
    ours = StreamingDiLoCo(H=3, P=1, tau=0, alpha=0.0, quantization=quantization, outer_lr=0.7,
                           outer_momentum=0.9, optim=adamw)
    torch.manual_seed(0)
    model = MLP().to(F64)
    ref_nodes, ref_comm = _train(ref, model, 8)
    nodes, comm = _train(ours, model, 8)

    for k in nodes.params:  # 8 steps: outer steps at t = 3, 6, then 2 local steps
        assert torch.equal(nodes.params[k], ref_nodes.params[k]), k
    for k, v in ref.global_state().items():
        assert torch.equal(ours.global_state()[k], v), k
    assert comm.bytes_sent == ref_comm.bytes_sent
    assert [(r.op, r.payload_bytes, r.step, r.overlap) for r in comm.log] == [
        (r.op, r.payload_bytes, r.step, r.overlap) for r in ref_comm.log]
    assert not rows_equal(nodes.params["fc1.weight"])  # the nodes did train apart after t = 6


def test_batchnorm_buffers_averaged_like_diloco():
    # Same equivalence with BatchNorm: buffers averaged at the sync (one fp32 all-reduce of its
    # own here, tagged fragment0/buffers; DiLoCo sends them in its pseudo-gradient call).
    adamw = OptimSpec(lr=1e-2)
    ref = DiLoCo(H=2, optim=adamw)
    ours = StreamingDiLoCo(H=2, P=1, tau=0, alpha=0.0, quantization=None, optim=adamw)
    torch.manual_seed(0)
    model = BNNet().to(F64)
    ref_nodes, ref_comm = _train(ref, model, 4)
    nodes, comm = _train(ours, model, 4)
    for k in list(nodes.params) + list(nodes.buffers):
        ref_v = ref_nodes.params[k] if k in nodes.params else ref_nodes.buffers[k]
        v = nodes.params[k] if k in nodes.params else nodes.buffers[k]
        assert torch.allclose(v, ref_v, rtol=0.0, atol=1e-12), k
    for k, v in ref.global_state().items():
        assert torch.allclose(ours.global_state()[k], v, rtol=0.0, atol=1e-12), k
    # the same bytes, split over two calls (float sums: equal to round-off)
    assert comm.bytes_sent == pytest.approx(ref_comm.bytes_sent, rel=1e-15)
    assert [r.tag for r in comm.log] == ["fragment0", "fragment0/buffers"] * 2


# -- configuration --------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"H": 0}, "H must be an integer >= 1"),
    ({"P": 0}, "P must be an integer >= 1"),
    ({"H": 4, "P": 5}, "P must be <= H"),
    ({"H": 6, "P": 3, "tau": 2}, r"0 <= tau < H // P = 2"),
    ({"tau": -1}, "tau must be an integer"),
    ({"tau": True}, "tau must be an integer"),
    ({"alpha": 1.5}, r"alpha must be in \[0.0, 1.0\]"),
    ({"outer_lr": 0.0}, "outer_lr"),
    ({"outer_momentum": 1.0}, "outer_momentum"),
    ({"outer_momentum": 0.0}, "nesterov=True needs outer_momentum > 0"),
    ({"quantization": "fp5"}, "quantization='fp5': unknown codec"),
    ({"quantization": None, "error_feedback": True}, "error_feedback=True needs a codec"),
    ({"codec": "int8"}, "set quantization='int8'"),
])
def test_invalid_hyperparameters_are_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StreamingDiLoCo(**kwargs)


def test_cli_overrides_and_documented_fields():
    s = apply_overrides(StreamingDiLoCo, {"H": "60", "P": "3", "tau": "2", "alpha": "0",
                                          "quantization": "none"})
    assert (s.H, s.P, s.tau, s.alpha, s.quantization) == (60, 3, 2, 0.0, None)
    s = apply_overrides(StreamingDiLoCo, {"quantization": "int8", "error_feedback": "true"})
    assert s._make_codec().name == "int8+ef"
    fields = config_fields(StreamingDiLoCo)
    for key in ("H", "P", "tau", "alpha", "quantization", "outer_lr", "outer_momentum",
                "nesterov"):
        assert fields[key][2], f"{key} is undocumented"
    assert fields["quantization"][1] == "fp4"
