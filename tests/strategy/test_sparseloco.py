"""SparseLoCo (arXiv:2508.15706; tplr-ai/templar compress.py / neurons.py): bit packing, the 2-bit
quantiser, chunked top-k with error feedback, the outer step, bytes; and the strategy-level
checkpoint round trip.

Expected values are worked out in the comments. Most hand cases use ``bits=8``: a handful of
distinct values then falls into distinct bins, each bin's mean is the value itself, and the
quantiser is exact, so the arithmetic stays that of the update rule. Float64 throughout.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from support.by_hand import F64, TOL, build, stack, step_with, t
from support.checkpoints import check_checkpoint_resume
from torch import nn

from exogym import MnistCNN
from exogym.strategy import make
from exogym.strategy.optim import OptimSpec
from exogym.strategy.sparseloco import SparseLoCo, index_bits, pack_bits, quantize, unpack_bits
from exogym.tasks.models import Classifier
from exogym.utils.config import ConfigError

SGD01 = OptimSpec(name="sgd", lr=0.1)  # x_i = theta - 0.1 g_i after one inner step


# -- bit packing ----------------------------------------------------------------------------------
def test_pack_bits_by_hand_and_round_trip():
    # 2 bits, [1, 2, 3]: stream (low bit first) 1,0 | 0,1 | 1,1 | pad 0,0 -> 1 + 8 + 16 + 32 = 57
    assert pack_bits(torch.tensor([[1, 2, 3]]), 2).tolist() == [[57]]
    # 12 bits, [0xABC, 0x123]: byte 0 = 0xBC, byte 1 = 0xA | 0x3 << 4 = 0x3A, byte 2 = 0x12
    # (the authors' pack_12bit_indices lays out a pair the same way)
    assert pack_bits(torch.tensor([[0xABC, 0x123]]), 12).tolist() == [[0xBC, 0x3A, 0x12]]
    # ceil(m bits / 8) bytes per row; rows independent; exact round trip
    g = torch.Generator().manual_seed(0)
    for bits, m in ((2, 13), (12, 7), (3, 8), (8, 5), (13, 3)):
        v = torch.randint(0, 1 << bits, (3, m), generator=g)
        packed = pack_bits(v, bits)
        assert packed.dtype == torch.uint8 and packed.shape == (3, math.ceil(m * bits / 8))
        assert torch.equal(unpack_bits(packed, bits, m), v)


def test_index_bits_are_the_authors_12_up_to_4096_entries():
    assert [index_bits(a) for a in (1, 16, 640, 4096)] == [12, 12, 12, 12]
    assert index_bits(4097) == 13 and index_bits(1 << 16) == 16


# -- the quantiser --------------------------------------------------------------------------------
def test_two_bit_quantiser_by_hand():
    # [4, 2, -2, -4]: shift 0, std = sqrt(40/3) = 3.6515, scale = 6 std / 4 = 5.4772;
    # v/scale + 2 = [2.730, 2.365, 1.635, 1.270] -> codes [3, 2, 2, 1];
    # lookup: bin 3 -> 4, bin 2 -> mean(2, -2) = 0, bin 1 -> -4, bin 0 empty -> 0
    codes, shift, lookup = quantize(t([[4.0, 2.0, -2.0, -4.0]]), 2, 6.0)
    assert codes.tolist() == [[3, 2, 2, 1]]
    assert torch.allclose(shift, t([[0.0]]), **TOL)
    assert torch.allclose(lookup, t([[0.0, -4.0, 0.0, 4.0]]), **TOL)
    # [1, 2, 3, 10]: shift 4, centred [-3, -2, -1, 6], std = sqrt(50/3) = 4.0825, scale 6.1237;
    # c/scale + 2 = [1.510, 1.673, 1.837, 2.980] -> [2, 2, 2, 3]; bin 2 -> -2, bin 3 -> 6:
    # decoded [2, 2, 2, 10]. Rows are separate nodes: row 2 is row 1 plus 100.
    codes, shift, lookup = quantize(t([[1.0, 2.0, 3.0, 10.0], [101.0, 102.0, 103.0, 110.0]]),
                                    2, 6.0)
    assert codes.tolist() == [[2, 2, 2, 3], [2, 2, 2, 3]]
    decoded = shift + lookup.gather(1, codes)
    assert torch.allclose(decoded, t([[2.0, 2.0, 2.0, 10.0], [102.0, 102.0, 102.0, 110.0]]),
                          **TOL)
    # one value: no spread, scale falls back to 1, the value is kept exactly
    codes, shift, lookup = quantize(t([[0.7]]), 2, 6.0)
    assert (shift + lookup.gather(1, codes)).item() == 0.7


# -- the outer step by hand -----------------------------------------------------------------------
def sparse(**kw) -> SparseLoCo:
    # w has 4 entries; s = 2 cuts it into the chunks [w0, w1], [w2, w3]; k = 1 per chunk
    defaults = {"H": 1, "beta": 0.5, "k": 1, "s": 2, "bits": 8, "alpha": 1.0, "optim": SGD01}
    return SparseLoCo(**{**defaults, **kw})


def test_three_outer_steps_by_hand_mean_aggregation():
    # Prepare: theta = [1, 2, 3, 4], N = 2
    s = sparse()
    nodes, comm = build(s, (1.0, 2.0, 3.0, 4.0))

    # Execute step 0: Delta_0 = 0.1 g_0 = [1, 0, 0, 0.5], Delta_1 = [0, 2, 0.5, 0]
    step_with(s, nodes, [[10.0, 0.0, 0.0, 5.0], [0.0, 20.0, 5.0, 0.0]], 0)

    # Assert: e = Delta; node 0 sends w0 = 1 (chunk 0) and w3 = 0.5 (chunk 1), node 1 w1 = 2 and
    # w2 = 0.5; nothing is left. Delta = ([1,0,0,.5] + [0,2,.5,0]) / 2 = [.5, 1, .25, .25]
    theta1 = t([0.5, 1.0, 2.75, 3.75])
    assert torch.allclose(s.global_state()["w"], theta1, **TOL)
    assert torch.allclose(nodes.params["w"], theta1.expand(2, 4), **TOL)
    assert torch.allclose(s.error["w"], torch.zeros(2, 4, dtype=F64), **TOL)

    # Execute step 1: Delta_0 = [.3, .1, 0, 0], Delta_1 = [0, 0, .2, .4]
    step_with(s, nodes, [[3.0, 1.0, 0.0, 0.0], [0.0, 0.0, 2.0, 4.0]], 1)

    # Assert: e_0 = [.3, .1, 0, 0] sends .3 (chunk 0) and a zero (chunk 1), keeps [0, .1, 0, 0];
    # e_1 = [0, 0, .2, .4] sends .4, keeps [0, 0, .2, 0]; Delta = [.15, 0, 0, .2]
    assert torch.allclose(s.global_state()["w"], t([0.35, 1.0, 2.75, 3.55]), **TOL)
    assert torch.allclose(s.error["w"], t([[0.0, 0.1, 0.0, 0.0], [0.0, 0.0, 0.2, 0.0]]), **TOL)

    # Execute step 2: no gradient, Delta_r = 0: e decays by beta = 0.5 and is sent
    step_with(s, nodes, [[0.0] * 4, [0.0] * 4], 2)

    # Assert: e_0 = [0, .05, 0, 0], e_1 = [0, 0, .1, 0] are sent whole: Delta = [0, .025, .05, 0]
    assert torch.allclose(s.global_state()["w"], t([0.35, 0.975, 2.7, 3.55]), **TOL)
    assert torch.allclose(s.error["w"], torch.zeros(2, 4, dtype=F64), **TOL)
    # bytes: 2 kept entries -> 3 bytes of 12-bit indices, 2 bytes of 8-bit codes, shift + 256
    # lookup entries in float64 (2,056 bytes): S = 2,061; all-gather (N-1) S = 2,061 per node
    assert s.payload_bytes() == 2061
    assert [(r.op, r.payload_bytes, r.tag) for r in comm.log] == [
        ("all_gather", 2061, "sparseloco")] * 3
    assert comm.bytes_sent == [3 * 2061.0] * 2


class Lost:
    """Who is heard (``attendance.heard``): the messages of ``lost`` (node ids) at every
    synchronisation."""

    def __init__(self, lost: set[int]) -> None:
        self.lost = lost

    def __call__(self, active, deadline):
        heard = [(active is None or active[i]) and i not in self.lost for i in range(3)]
        return None if all(heard) else heard


def test_absent_nodes_neither_accumulate_nor_send_and_lost_messages_leave_the_accumulator():
    # Prepare: theta = [1, 2, 3, 4], N = 3; node 2 holds an accumulator e_2 = [.4, 0, 0, 0]
    s = sparse()
    nodes, comm = build(s, (1.0, 2.0, 3.0, 4.0), n=3)
    s.error["w"][2] = t([0.4, 0.0, 0.0, 0.0])

    # Execute: node 2 is down (computed nothing: its gradient row is zero, its parameters stay)
    comm.attendance.active = [True, True, False]
    step_with(s, nodes, [[10.0, 0.0, 0.0, 5.0], [0.0, 20.0, 5.0, 0.0], [0.0] * 4], 0)

    # Assert: the mean over the M = 2 senders, as in the 2-node test: theta = [.5, 1, 2.75,
    # 3.75]; nodes 0 and 1 restart from it, node 2 keeps its parameters and its accumulator
    # (down, it accumulates nothing); the all-gather is among nodes 0 and 1 only: (M-1) S each
    theta1 = t([0.5, 1.0, 2.75, 3.75])
    assert torch.allclose(s.global_state()["w"], theta1, **TOL)
    assert torch.allclose(nodes.params["w"], torch.stack([theta1, theta1, t([1.0, 2.0, 3.0,
                                                                            4.0])]), **TOL)
    assert torch.allclose(s.error["w"][2], t([0.4, 0.0, 0.0, 0.0]), **TOL)
    assert comm.log[-1].members == 0b011 and comm.bytes_sent == [2061.0, 2061.0, 0.0]

    # Execute: every node computes; node 1's message is lost. Delta_0 = 0.1 [3, 1, 0, 0],
    # Delta_1 = [0, 0, .2, .4]; node 2 did not restart (zero gradient): Delta_2 = theta1 -
    # [1, 2, 3, 4] = [-.5, -1, -.25, -.25], and e_2 = .5 [.4, 0, 0, 0] + Delta_2
    comm.attendance.active, comm.attendance.heard = None, Lost({1})
    step_with(s, nodes, [[3.0, 1.0, 0.0, 0.0], [0.0, 0.0, 2.0, 4.0], [0.0] * 4], 1)

    # Assert: e_2 = [-.3, -1, -.25, -.25] sends -1 (chunk 0) and -.25 (chunk 1, the first of
    # the tie), keeping [-.3, 0, 0, -.25]; node 0 sends .3 and keeps [0, .1, 0, 0]. Node 1's
    # message is lost: it keeps its accumulator as before the round, [0, 0, 0, 0], and its
    # parameters (its next pseudo-gradient measures the round again; keeping [0, 0, .2, 0] too
    # would count .2 twice). Delta = mean over nodes 0 and 2:
    # ([.3, 0, 0, 0] + [0, -1, -.25, 0]) / 2 = [.15, -.5, -.125, 0]
    assert torch.allclose(s.global_state()["w"], t([0.35, 1.5, 2.875, 3.75]), **TOL)
    assert torch.allclose(s.error["w"], t([[0.0, 0.1, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0],
                                           [-0.3, 0.0, 0.0, -0.25]]), **TOL)
    assert comm.log[-1].members == 0b101


def test_senders_aggregation_averages_each_entry_over_its_senders():
    # Prepare / Execute: step 0 of the test above; every entry has exactly one sender
    s = sparse(aggregation="senders")
    nodes, _ = build(s, (1.0, 2.0, 3.0, 4.0))
    step_with(s, nodes, [[10.0, 0.0, 0.0, 5.0], [0.0, 20.0, 5.0, 0.0]], 0)

    # Assert: Delta = [1, 2, .5, .5] (not halved) -> theta = [0, 0, 2.5, 3.5]
    assert torch.allclose(s.global_state()["w"], t([0.0, 0.0, 2.5, 3.5]), **TOL)


def test_alpha_scales_the_outer_step_only():
    # Prepare: alpha = 0.5; the data of step 0 above
    s = sparse(alpha=0.5)
    nodes, _ = build(s, (1.0, 2.0, 3.0, 4.0))

    # Execute
    step_with(s, nodes, [[10.0, 0.0, 0.0, 5.0], [0.0, 20.0, 5.0, 0.0]], 0)

    # Assert: theta = [1,2,3,4] - 0.5 [.5, 1, .25, .25]; the accumulator holds Delta, not alpha
    # Delta (the paper's placement), and was sent whole
    assert torch.allclose(s.global_state()["w"], t([0.75, 1.5, 2.875, 3.875]), **TOL)
    assert torch.allclose(s.error["w"], torch.zeros(2, 4, dtype=F64), **TOL)


def test_median_clip_scales_a_large_node_down_to_the_median_norm():
    # Prepare: N = 3, w of 2 entries, s = 2, k = 2 (everything is sent), theta = [0, 0]
    # Delta_r = 0.1 g_r: [.3, .4] (norm .5), [0, 1] (norm 1), [6, 8] (norm 10)
    grads = [[3.0, 4.0], [0.0, 10.0], [60.0, 80.0]]
    clipped, plain = sparse(k=2, median_clip=True), sparse(k=2)
    for s in (clipped, plain):
        nodes, _ = build(s, (0.0, 0.0), n=3)
        step_with(s, nodes, grads, 0)

    # Assert: median norm 1 -> factors min(1, 1 / (norm + 1e-8)) (the code's epsilon): node 0
    # 1, node 1 (the median itself) 1 / (1 + 1e-8), node 2 1 / (10 + 1e-8); theta = -mean
    f1, f2 = 1.0 / (1.0 + 1e-8), 1.0 / (10.0 + 1e-8)
    expected = (t([0.3, 0.4]) + f1 * t([0.0, 1.0]) + f2 * t([6.0, 8.0])) / 3
    assert torch.allclose(clipped.global_state()["w"], -expected, **TOL)
    assert torch.allclose(plain.global_state()["w"], -t([2.1, 9.4 / 3]), **TOL)


# -- error feedback: what was sent plus what is kept is what was accumulated ---------------------
@pytest.mark.parametrize("bits", [2, 3])
def test_sent_plus_kept_equals_accumulated_and_sent_is_what_the_step_used(bits: int):
    # Prepare: N = 3 nodes, a 12 x 10 matrix, chunks of 4 x 5 (6 chunks of 20), k = 3, H = 1,
    # inner SGD lr 0.1 (so Delta_r = 0.1 g_r), beta = 0.9, random gradients
    n, beta = 3, 0.9
    s = SparseLoCo(H=1, beta=beta, k=3, s=5, bits=bits, optim=SGD01)
    module = nn.Module()
    module.register_parameter("w", nn.Parameter(torch.randn(12, 10, dtype=F64)))
    nodes, _ = stack(s, module, n)
    lay = s.layouts["w"]
    assert (lay.h, lay.w, lay.num_chunks, lay.k) == (4, 5, 6, 3)
    g = torch.Generator().manual_seed(0)
    for step in range(5):
        theta = s.global_params["w"].clone()
        grads = torch.randn(n, 12, 10, generator=g, dtype=F64)
        accumulated = beta * s.error["w"] + 0.1 * grads  # e <- beta e + Delta

        # Execute
        nodes.grads["w"].copy_(grads)
        s.step(step)

        # Assert: sent_r = accumulated_r - e_r is k entries per chunk taking at most 2^bits
        # values per node, and the global step applied exactly their mean
        sent = accumulated - s.error["w"]
        for r in range(n):
            chunks = sent[r].reshape(3, 4, 2, 5).permute(0, 2, 1, 3).reshape(6, 20)
            assert ((chunks.abs() > 1e-15).sum(1) <= 3).all()
            kept = chunks[chunks.abs() > 1e-15]
            assert len(torch.unique(kept.round(decimals=12))) <= 1 << bits
        assert torch.allclose(theta - s.global_params["w"], sent.mean(0), rtol=0, atol=1e-12)
        assert torch.allclose(sent + s.error["w"], accumulated, rtol=0, atol=1e-12)


# -- bytes of the MNIST CNN -----------------------------------------------------------------------
def test_mnist_cnn_bytes_equal_the_documented_formula():
    # Prepare: the MNIST CNN on N = 4 nodes, defaults (s = 64, k = 64, 2 bits), H = 1
    s = SparseLoCo(H=1)
    nodes, comm = stack(s, Classifier(MnistCNN()), 4, 10)
    # kept entries and S per tensor: ceil(12 c / 8) + ceil(2 c / 8) + 5 * 4
    kept = {"net.features.0.weight": 64, "net.features.0.bias": 16, "net.features.3.weight": 512,
            "net.features.3.bias": 32, "net.head.1.weight": 3584, "net.head.1.bias": 128,
            "net.head.3.weight": 128, "net.head.3.bias": 10}
    assert {k: lay.num_chunks * lay.k for k, lay in s.layouts.items()} == kept
    payload = sum(math.ceil(12 * c / 8) + math.ceil(2 * c / 8) + 20 for c in kept.values())
    assert payload == s.payload_bytes() == 7990

    # Execute: one outer step on random gradients
    g = torch.Generator().manual_seed(0)
    for grad in nodes.grads.values():
        grad.copy_(torch.randn(grad.shape, generator=g))
    s.step(0)

    # Assert: one all-gather, (N - 1) S = 23,970 bytes per node (no buffers to average)
    assert [(r.op, r.payload_bytes) for r in comm.log] == [("all_gather", 7990)]
    assert comm.bytes_sent == [23970.0] * 4 and comm.bytes_received == [23970.0] * 4


# -- configuration --------------------------------------------------------------------------------
def test_defaults_are_the_authors_production_settings():
    s = make("sparseloco")
    assert (s.H, s.beta, s.k, s.s, s.bits, s.sigmas, s.alpha) == (30, 0.95, 64, 64, 2, 6.0, 1.0)
    assert (s.aggregation, s.median_clip) == ("mean", False)


@pytest.mark.parametrize(("overrides", "match"), [
    ({"bits": "0"}, "bits must be an integer in"), ({"bits": "9"}, "bits must be an integer in"),
    ({"beta": "1.5"}, "beta"), ({"k": "0"}, "k must be"), ({"s": "0"}, "s must be"),
    ({"aggregation": "median"}, "aggregation must be one of"), ({"alpha": "0"}, "alpha"),
    ({"codec": "int8"}, "does not support a transport codec"), ({"H": "0"}, "H must be"),
])
def test_invalid_settings_are_errors_that_name_them(overrides, match):
    with pytest.raises(ConfigError, match=match):
        make("sparseloco", **overrides)


# -- checkpoint round trip (support.checkpoints) -------------------------------------------------
def test_checkpoint_resume_is_exact(tmp_path: Path):
    # H = 2, stop at 5: mid-round, with a non-zero accumulator and AdamW moments to restore
    check_checkpoint_resume(lambda: SparseLoCo(H=2, k=4, s=4), tmp_path)
