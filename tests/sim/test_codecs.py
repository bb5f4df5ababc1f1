"""Codecs (exogym.sim.codecs), the communicator's ``codec=`` keyword, the strategies' codec
fields.

Every codec is checked by hand on tiny tensors (values chosen so that the arithmetic is exact in
binary floating point), and the byte accounting against the formulas of the codecs' docstring:

    fp16/bf16 2n | int8 n + 4s | int4/fp4 ceil(n/2) + 4s | topk k*e + 4k | randk k*e

(n elements per row, s scales: 1 or ceil(n/C), k = ceil(F n), e = element size).
"""

from __future__ import annotations

import hashlib
import math

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from exogym import Classifier, Trainer
from exogym.sim.codecs import (
    CastCodec,
    ErrorFeedback,
    FP4Codec,
    IntCodec,
    RandKCodec,
    TopKCodec,
    make_codec,
)
from exogym.sim.comm import CommRecord, InProcessCommunicator
from exogym.sim.engine import NodeStack
from exogym.strategy.base import StackedStrategy
from exogym.strategy.ddp import DDP
from exogym.strategy.fedavg import FedAvg
from exogym.strategy.optim import OptimSpec
from exogym.utils.config import ConfigError, apply_overrides

F32, F64 = torch.float32, torch.float64


def t(rows, dtype=F32) -> torch.Tensor:
    return torch.tensor(rows, dtype=dtype)


# -- fp16 / bf16 ----------------------------------------------------------------------------------
def test_fp16_rounds_to_nearest_even_and_overflows():
    x = t([[1 + 2**-11, 1 + 3 * 2**-12, 70000.0, -0.5]])

    out = make_codec("fp16").roundtrip(x, "k")

    # fp16 has 10 fraction bits: 1 + 2^-11 is a tie -> even (1.0); 1 + 0.75 * 2^-10 -> 1 + 2^-10;
    # 70000 > 65504 (max fp16) -> inf; -0.5 exact. Result is fp32 again.
    assert out.dtype == F32
    assert out.tolist() == [[1.0, 1 + 2**-10, math.inf, -0.5]]


def test_bf16_keeps_range_with_8_significant_bits():
    x = t([[1 + 2**-8, 1 + 3 * 2**-9, 70000.0, 3.0]])

    out = make_codec("bf16").roundtrip(x, "k")

    # 7 fraction bits: 1 + 2^-8 tie -> 1; 1 + 0.75 * 2^-7 -> 1 + 2^-7;
    # 70000 = 136.72 * 512 (spacing 2^9 in [2^16, 2^17)) -> 137 * 512 = 70144
    assert out.tolist() == [[1.0, 1 + 2**-7, 70144.0, 3.0]]


# -- int8 / int4 ----------------------------------------------------------------------------------
def test_int8_per_tensor_one_scale_per_node_row():
    x = t([[127.0, -50.5, 3.25, 0.5], [254.0, 3.0, -5.0, 1.0]])

    out = make_codec("int8").roundtrip(x, "k")

    # row 0: absmax 127 -> scale 1; round(-50.5) = -50 and round(0.5) = 0 (half to even), 3.25 -> 3
    # row 1: absmax 254 -> scale 2; 3/2 = 1.5 -> 2 -> 4; -5/2 = -2.5 -> -2 -> -4; 1/2 -> 0 -> 0
    assert out.tolist() == [[127.0, -50.0, 3.0, 0.0], [254.0, 4.0, -4.0, 0.0]]


def test_int8_per_chunk_scales():
    x = t([[127.0, -50.5, 3.25, 0.5, -0.254]])

    out = make_codec("int8:2").roundtrip(x, "k")

    # chunks [127, -50.5] (scale 1) | [3.25, 0.5] (scale 3.25/127) | [-0.254] (scale 0.002)
    s2 = 3.25 / 127  # 0.5 / s2 = 19.54 -> 20
    want = [127.0, -50.0, 3.25, 20 * s2, -0.254]
    assert out[0].tolist() == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("spec", ["int8", "int8:7", "int8:64", "int4", "int4:5"])
def test_int_quantization_error_bound(spec):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 10, 13, generator=gen) * torch.tensor([1.0, 100.0, 1e-3]).view(3, 1, 1)
    codec = make_codec(spec)
    q_max = 127 if spec.startswith("int8") else 7

    out = codec.roundtrip(x, "k")

    # |x - q(x)| <= scale / 2, scale = absmax / q_max of the element's row or chunk
    chunk = int(spec.split(":")[1]) if ":" in spec else 130
    rows = x.reshape(3, -1)
    err = (rows - out.reshape(3, -1)).abs()
    for i in range(3):
        for c0 in range(0, 130, chunk):
            scale = rows[i, c0:c0 + chunk].abs().max() / q_max
            assert err[i, c0:c0 + chunk].max() <= scale / 2 * (1 + 1e-5)
    # the largest entry of every row is exact
    assert torch.allclose(out.reshape(3, -1).abs().amax(1), rows.abs().amax(1), rtol=1e-6)


def test_int4_symmetric_to_plus_minus_seven():
    x = t([[7.0, 3.5, -2.5, 1.2, -0.4]])

    out = make_codec("int4").roundtrip(x, "k")

    # scale = 7/7 = 1: 3.5 -> 4 (half to even), -2.5 -> -2, 1.2 -> 1, -0.4 -> -0
    assert out.tolist() == [[7.0, 4.0, -2.0, 1.0, 0.0]]


def test_all_zero_row_quantizes_to_zero():
    x = torch.zeros(2, 5)
    for spec in ("int8", "int8:2", "int4", "fp4"):
        assert torch.equal(make_codec(spec).roundtrip(x, "k"), x)


# -- fp4 (E3M0) -----------------------------------------------------------------------------------
def test_fp4_e3m0_levels_and_rounding_by_hand():
    x = t([[8.0, 5.0, -3.0, 2.9, 0.0625, 0.03, 0.1, 0.0]])

    out = make_codec("fp4").roundtrip(x, "k")

    # scale = absmax = 8; y = x/8 = [1, .625, -.375, .3625, 2^-7, .00375, .0125, 0]
    # levels {0, 2^-6, ..., 2^-1, 1}: 1 -> 1; .625 < .75 -> .5; -.375 is the tie between .25 and
    # .5 -> -.5 (ties up); .3625 < .375 -> .25; 2^-7 is the tie between 0 and 2^-6 -> 2^-6;
    # .00375 < 2^-7 -> 0; .0125 in [2^-7, 1.5 * 2^-6) -> 2^-6; times 8:
    assert out.tolist() == [[8.0, 4.0, -4.0, 2.0, 0.125, 0.0, 0.125, 0.0]]


def test_fp4_levels_are_signed_powers_of_two_of_the_scale():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 1000, generator=gen)

    out = make_codec("fp4").roundtrip(x, "k")

    levels = {0.0} | {2.0**-e for e in range(7)}
    for i in range(2):
        y = (out[i] / x[i].abs().max()).abs()
        assert set(torch.unique(y).tolist()) <= levels
        # relative error at most 1/3 above 2^-6 (midpoint 0.75 * 2^m vs 2^(m-1) or 2^m)
        big = (x[i] / x[i].abs().max()).abs() >= 2**-6
        rel = ((out[i] - x[i]).abs() / x[i].abs())[big]
        assert rel.max() <= 1 / 3 + 1e-6


def test_fp4_per_chunk():
    x = t([[8.0, 3.0, 0.5, 0.1]])

    out = make_codec("fp4:2").roundtrip(x, "k")

    # chunk [8, 3]: y = [1, .375] -> [1, .5] * 8 = [8, 4]; chunk [.5, .1]: y = [1, .2] -> [1, .25]
    assert out[0].tolist() == pytest.approx([8.0, 4.0, 0.5, 0.125])


# -- top-k / random-k -----------------------------------------------------------------------------
def test_topk_keeps_each_nodes_largest_magnitudes():
    x = t([[1.0, -4.0, 3.0, 2.0], [0.5, 0.1, -0.2, -0.9]])

    out = make_codec("topk:0.5").roundtrip(x, "k")

    # k = ceil(0.5 * 4) = 2 per node, each node its own indices
    assert torch.equal(out, t([[0.0, -4.0, 3.0, 0.0], [0.5, 0.0, 0.0, -0.9]]))


def test_k_is_ceil_of_exact_fraction():
    # 0.7 * 10 is 7.000000000000001 in floats; the exact rational gives 7
    assert TopKCodec("0.7").k(10) == 7
    assert TopKCodec(0.7).k(10) == 7
    assert TopKCodec("0.25").k(10) == 3  # ceil(2.5)
    assert TopKCodec("0.001").k(10) == 1
    assert RandKCodec("1").k(10) == 10


def test_randk_same_indices_on_every_node_from_seed_and_call_counter():
    x = torch.arange(1.0, 21.0).view(2, 10)
    codec = make_codec("randk:0.3", seed=5)

    first = codec.roundtrip(x, "a")
    second = codec.roundtrip(x, "a")

    # k = 3; call c draws randperm(10)[:3] from a generator seeded with the 32-bit hash of (5, c)
    for c, out in enumerate((first, second)):
        digest = hashlib.blake2b(f"5:{c}".encode(), digest_size=8).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest, "little") & 0xFFFFFFFF)
        idx = torch.randperm(10, generator=gen)[:3]
        want = torch.zeros_like(x)
        want[:, idx] = x[:, idx]
        assert torch.equal(out, want)  # unscaled: kept entries as they are
    assert not torch.equal(first != 0, second != 0)  # a fresh index set per call
    # a fresh codec with the same seed repeats the sequence; another seed does not
    assert torch.equal(make_codec("randk:0.3", seed=5).roundtrip(x, "a"), first)
    assert not torch.equal(make_codec("randk:0.3", seed=6).roundtrip(x, "a"), first)


# -- error feedback -------------------------------------------------------------------------------
def test_error_feedback_topk_two_calls_by_hand():
    codec = make_codec("topk:0.25", error_feedback=True)  # k = 1 of 4
    x1 = t([[1.0, 2.0, -3.0, 0.5], [0.0, 1.0, 0.0, 0.0]])
    x2 = t([[1.0, 0.5, 1.0, 0.0], [0.0, 0.0, 0.5, 0.0]])

    c1 = codec.roundtrip(x1, "g")
    e1 = codec.residuals["g"].clone()
    c2 = codec.roundtrip(x2, "g")

    # node 0, call 1: x+e = [1, 2, -3, .5] -> send [0, 0, -3, 0], e = [1, 2, 0, .5]
    # node 0, call 2: x+e = [2, 2.5, 1, .5] -> send [0, 2.5, 0, 0], e = [2, 0, 1, .5]
    # node 1, call 1: [0, 1, 0, 0] -> send it all, e = 0; call 2: [0, 0, .5, 0] -> sent, e = 0
    assert c1.tolist() == [[0.0, 0.0, -3.0, 0.0], [0.0, 1.0, 0.0, 0.0]]
    assert e1.tolist() == [[1.0, 2.0, 0.0, 0.5], [0.0, 0.0, 0.0, 0.0]]
    assert c2.tolist() == [[0.0, 2.5, 0.0, 0.0], [0.0, 0.0, 0.5, 0.0]]
    assert codec.residuals["g"].tolist() == [[2.0, 0.0, 1.0, 0.5], [0.0, 0.0, 0.0, 0.0]]


def test_error_feedback_int8_two_calls_by_hand_and_per_key():
    codec = make_codec("int8", error_feedback=True)
    x1 = t([[127.0, 0.25, 0.5, -0.75]])
    x2 = t([[127.0, 0.25, 0.25, 0.0]])

    c1 = codec.roundtrip(x1, "a")
    other = codec.roundtrip(x1, "b")  # another call site: its own residual
    c2 = codec.roundtrip(x2, "a")

    # scale 1 throughout. call 1: q = [127, 0, 0 (0.5 half-even), -1]; e = [0, .25, .5, .25]
    # call 2: x+e = [127, .5, .75, .25] -> q = [127, 0, 1, 0]; e = [0, .5, -.25, .25]
    assert c1.tolist() == [[127.0, 0.0, 0.0, -1.0]]
    assert torch.equal(other, c1)
    assert c2.tolist() == [[127.0, 0.0, 1.0, 0.0]]
    assert codec.residuals["a"].tolist() == [[0.0, 0.5, -0.25, 0.25]]
    assert codec.residuals["b"].tolist() == [[0.0, 0.25, 0.5, 0.25]]
    # the sum of what was sent plus the residual is the sum of what was given
    assert torch.equal(c1 + c2 + codec.residuals["a"], x1 + x2)


def test_error_feedback_rejects_shape_change_under_one_key():
    codec = make_codec("int8", error_feedback=True)
    codec.roundtrip(torch.ones(2, 3), "k")
    with pytest.raises(ValueError, match="shape"):
        codec.roundtrip(torch.ones(2, 4), "k")


# -- bytes per codec ------------------------------------------------------------------------------
# (spec, bytes of a row of 3 fp32 + bytes of a row of 10 fp32, by hand)
BYTES = [
    ("fp16", 2 * 3 + 2 * 10),  # 26
    ("bf16", 26),
    ("int8", (3 + 4) + (10 + 4)),  # 21
    ("int8:4", (3 + 4 * 1) + (10 + 4 * 3)),  # 29
    ("int4", (2 + 4) + (5 + 4)),  # ceil(3/2) = 2: 15
    ("int4:4", (2 + 4) + (5 + 12)),  # 23
    ("fp4", 15),
    ("fp4:4", 23),
    ("topk:0.5", (2 * 4 + 2 * 4) + (5 * 4 + 5 * 4)),  # k = 2 and 5: 56
    ("randk:0.5", 2 * 4 + 5 * 4),  # values only: 28
]


@pytest.mark.parametrize(("spec", "payload"), BYTES)
def test_payload_bytes_formula(spec, payload):
    codec = make_codec(spec)
    assert codec.payload_bytes(3, F32) + codec.payload_bytes(10, F32) == payload
    with_ef = make_codec(spec, error_feedback=True)
    assert with_ef.payload_bytes(3, F32) == codec.payload_bytes(3, F32)


def test_payload_bytes_depend_on_dtype_only_where_values_travel_as_is():
    # 10 fp16 / fp64 elements: casts and quantizers ignore the dtype, sparse values keep it
    assert make_codec("fp16").payload_bytes(10, F64) == 20
    assert make_codec("int8").payload_bytes(10, torch.float16) == 14
    assert make_codec("topk:0.5").payload_bytes(10, torch.float16) == 5 * 2 + 5 * 4
    assert make_codec("randk:0.5").payload_bytes(10, F64) == 5 * 8


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize(("spec", "payload"), BYTES)
def test_communicator_bytes_equal_formula(n, spec, payload):
    codec = make_codec(spec)
    xs = [torch.randn(n, 3), torch.randn(n, 2, 5)]

    comm = InProcessCommunicator(n)
    comm.all_reduce(xs, "mean", tag="g", codec=codec)
    reduce_sent = (n - 1) * payload if codec.sparse else 2 * (n - 1) / n * payload
    assert comm.bytes_sent == pytest.approx([reduce_sent] * n)
    assert comm.bytes_received == pytest.approx([reduce_sent] * n)
    op = "all_gather" if codec.sparse else "all_reduce"
    assert comm.log == [CommRecord(op, payload, -1, "g", False, codec.name)]

    comm = InProcessCommunicator(n)
    comm.all_reduce_(xs, "sum", tag="g", codec=codec)
    assert comm.bytes_sent == pytest.approx([reduce_sent] * n)

    comm = InProcessCommunicator(n)
    comm.all_gather(xs, tag="g", codec=codec)
    assert comm.bytes_sent == pytest.approx([(n - 1) * payload] * n)
    assert comm.log[0].op == "all_gather" and comm.log[0].payload_bytes == payload

    comm = InProcessCommunicator(n)
    comm.broadcast(xs, 1, tag="b", codec=codec)
    assert comm.bytes_sent == pytest.approx([(n - 1) * payload if i == 1 else 0 for i in range(n)])
    assert comm.bytes_received == pytest.approx([0 if i == 1 else payload for i in range(n)])


def test_only_topk_is_sparse():
    assert [s for s, _ in BYTES if make_codec(s).sparse] == ["topk:0.5"]
    assert make_codec("topk:0.5", error_feedback=True).sparse


# -- values through the communicator --------------------------------------------------------------
def test_all_reduce_averages_the_reconstructions():
    comm = InProcessCommunicator(2)
    x = t([[127.0, -50.5, 3.25, 0.5], [254.0, 3.0, -5.0, 1.0]])

    out = comm.all_reduce(x, "mean", codec=make_codec("int8"))
    comm.all_reduce_(x, "sum", codec=make_codec("int8"))

    # reconstructions [127, -50, 3, 0] and [254, 4, -4, 0] (see the int8 test)
    assert out.tolist() == [190.5, -23.0, -0.5, 0.0]
    assert x.tolist() == [[381.0, -46.0, -1.0, 0.0]] * 2


def test_sparse_all_reduce_and_gather_values():
    comm = InProcessCommunicator(2)
    x = t([[1.0, -4.0, 3.0, 2.0], [0.5, 0.1, -0.2, -0.9]])

    mean = comm.all_reduce(x, "mean", codec=make_codec("topk:0.5"))
    gathered = comm.all_gather(x, codec=make_codec("topk:0.5"))

    # [0, -4, 3, 0] and [.5, 0, 0, -.9]: mean [.25, -2, 1.5, -.45]; gather returns both rows
    assert torch.allclose(mean, t([0.25, -2.0, 1.5, -0.45]))
    assert torch.equal(gathered, t([[0.0, -4.0, 3.0, 0.0], [0.5, 0.0, 0.0, -0.9]]))


def test_broadcast_sends_the_sources_reconstruction():
    comm = InProcessCommunicator(3)
    x = t([[1.0, 1.0], [127.0, 0.5], [9.0, 9.0]])

    out = comm.broadcast(x, 1, codec=make_codec("int8"))

    # node 1's row through int8 (scale 1): [127, 0]; the other rows are not sent
    assert out.tolist() == [127.0, 0.0]
    assert x.tolist() == [[1.0, 1.0], [127.0, 0.5], [9.0, 9.0]]  # input untouched


def test_one_node_sends_nothing_and_skips_the_codec():
    comm = InProcessCommunicator(1)
    codec = make_codec("int8", error_feedback=True)
    x = t([[127.0, 0.5]])

    out = comm.all_reduce(x, codec=codec)
    comm.all_reduce_(x, codec=codec)

    assert out.tolist() == [127.0, 0.5] and x.tolist() == [[127.0, 0.5]]
    assert comm.bytes_sent == [0.0] and codec.residuals == {}


def test_codec_rejects_integer_tensors_before_accounting():
    comm = InProcessCommunicator(2)
    with pytest.raises(ValueError, match="floating-point"):
        comm.all_reduce(torch.ones(2, 3, dtype=torch.int64), codec=make_codec("fp16"))
    assert comm.bytes_sent == [0.0, 0.0] and comm.log == []


def test_error_feedback_keys_are_tag_and_tensor_index():
    comm = InProcessCommunicator(2)
    codec = make_codec("topk:0.5", error_feedback=True)

    comm.all_reduce([torch.ones(2, 2), torch.ones(2, 4)], tag="g", codec=codec)

    assert set(codec.residuals) == {("g", 0), ("g", 1)}


# -- make_codec errors ----------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["int9", "fp8", "int8:0", "int8:x", "topk", "topk:0", "topk:1.5",
                                  "randk:-0.1", "randk:abc", "fp16:2", ""])
def test_invalid_spec_is_a_value_error(spec):
    with pytest.raises(ValueError, match=spec.split(":")[0] or "codec"):
        make_codec(spec)


def test_unknown_spec_lists_valid_ones():
    with pytest.raises(ValueError, match=r"valid specs: none, fp16, bf16, int8, int8:CHUNK"):
        make_codec("zip")


def test_none_and_error_feedback_without_codec():
    assert make_codec(None) is None and make_codec("none") is None
    with pytest.raises(ValueError, match="error_feedback=True needs a codec"):
        make_codec(None, error_feedback=True)


def test_make_codec_types_and_names():
    assert isinstance(make_codec("bf16"), CastCodec)
    assert isinstance(make_codec("int4:16"), IntCodec) and make_codec("int4:16").name == "int4:16"
    assert isinstance(make_codec("fp4"), FP4Codec)
    ef = make_codec("randk:0.1", error_feedback=True, seed=3)
    assert isinstance(ef, ErrorFeedback) and ef.name == "randk:0.1+ef"
    assert isinstance(ef.inner, RandKCodec) and ef.inner.seed == 3


# -- strategies -----------------------------------------------------------------------------------
class Vec(nn.Module):
    def __init__(self, values: list[float]) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(values, dtype=F64))


def test_ddp_int8_by_hand():
    ddp = DDP(optim=OptimSpec(name="sgd", lr=0.5), codec="int8")
    nodes = NodeStack(Vec([0.0, 0.0]), 2, engine="loop")
    comm = InProcessCommunicator(2)
    ddp.setup(nodes, comm, 10)
    with torch.no_grad():
        nodes.grads["w"].copy_(t([[127.0, 0.5], [1.0, 2.0]], F64))

    ddp.step(0)

    # node 0: scale 1 -> [127, 0]; node 1: scale 2/127, 1/(2/127) = 63.5 -> 64 -> 64 * 2/127
    g = [(127 + 64 * 2 / 127) / 2, (0 + 2) / 2]
    want = t([[-0.5 * g[0], -0.5 * g[1]]] * 2, F64)
    assert torch.allclose(nodes.params["w"], want, rtol=0, atol=1e-12)
    # payload 2 + 4 = 6 bytes (int8 codes + one fp32 scale); ring: 2 * 1/2 * 6 = 6 per node
    assert comm.log == [CommRecord("all_reduce", 6, -1, "grads", False, "int8")]
    assert comm.bytes_sent == [6.0, 6.0]


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 5)
        self.fc2 = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def tiny_fit(strategy: StackedStrategy, num_nodes: int = 4, steps: int = 6):
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 6, generator=gen), torch.randint(0, 3, (256,),
                                                                          generator=gen))
    torch.manual_seed(0)
    return Trainer(Classifier(TinyNet()), data, data).fit(
        strategy=strategy, num_nodes=num_nodes, max_steps=steps, batch_size=8, eval_interval=steps,
        engine="loop", device="cpu", seed=0, progress=False)


@pytest.mark.parametrize(("spec", "payload"), [
    ("int8", (30 + 4) + (5 + 4) + (15 + 4) + (3 + 4)),  # fc1.w 30, fc1.b 5, fc2.w 15, fc2.b 3: 69
    ("topk:0.2", 8 * (6 + 1 + 3 + 1)),  # k = 6, 1, 3, 1; 4 + 4 bytes each: 88
])
def test_ddp_with_codec_trains_and_bytes_equal_formula(spec, payload):
    result = tiny_fit(DDP(codec=spec, error_feedback=spec.startswith("topk")))

    per_step = 3 * payload if spec.startswith("topk") else 2 * 3 / 4 * payload
    assert result.bytes_sent == pytest.approx([6 * per_step] * 4)
    assert math.isfinite(result.final["eval_loss"])


def test_fedavg_int8_averages_reconstructed_parameters():
    fedavg = FedAvg(H=1, optim=OptimSpec(name="sgd", lr=0.1), codec="int8")
    nodes = NodeStack(Vec([0.0, 0.0]), 2, engine="loop")
    comm = InProcessCommunicator(2)
    fedavg.setup(nodes, comm, 10)
    with torch.no_grad():
        nodes.params["w"].copy_(t([[127.0, 0.5], [254.0, 3.0]], F64))  # grads zero: no SGD move

    fedavg.step(0)

    # int8: [127, 0] and (scale 2) [254, 4]; mean [190.5, 2] on every node and as server model
    assert nodes.params["w"].tolist() == [[190.5, 2.0]] * 2
    assert fedavg.global_state()["w"].tolist() == [190.5, 2.0]
    assert comm.log == [CommRecord("all_reduce", 6, -1, "params", False, "int8")]


def test_fedavg_rejects_sparsifying_codecs():
    with pytest.raises(ValueError, match=r"topk:0\.1"):
        FedAvg(codec="topk:0.1")
    with pytest.raises(ValueError, match="randk"):
        FedAvg(codec="randk:0.5", error_feedback=True)


def test_setup_builds_a_fresh_codec_per_run():
    ddp = DDP(optim=OptimSpec(name="sgd", lr=0.1), codec="topk:0.5", error_feedback=True)
    for _ in range(2):
        nodes = NodeStack(Vec([0.0, 0.0]), 2, engine="loop")
        ddp.setup(nodes, InProcessCommunicator(2), 10)
        assert ddp.transport_codec is not None and ddp.transport_codec.residuals == {}
        with torch.no_grad():
            nodes.grads["w"].copy_(t([[1.0, 2.0], [3.0, 4.0]], F64))
        ddp.step(0)
        assert set(ddp.transport_codec.residuals) == {("grads", 0)}


def test_no_codec_means_no_transport_codec():
    ddp = DDP()
    ddp.setup(NodeStack(Vec([0.0]), 2, engine="loop"), InProcessCommunicator(2), 10)
    assert ddp.transport_codec is None


def test_strategy_codec_validation():
    with pytest.raises(ValueError, match="valid specs"):
        DDP(codec="int7")
    with pytest.raises(ValueError, match="needs a codec"):
        DDP(error_feedback=True)
    with pytest.raises(ValueError, match="codec_seed"):
        DDP(codec="randk:0.1", codec_seed=-1)

    class NoCodec(DDP):
        supports_codec = False

    assert NoCodec().codec is None
    with pytest.raises(ValueError, match="NoCodec does not support"):
        NoCodec(codec="int8")


def test_cli_overrides_reach_the_codec_fields():
    ddp = apply_overrides(DDP, {"codec": "int8:256", "error_feedback": "true", "codec_seed": "7"})
    assert (ddp.codec, ddp.error_feedback, ddp.codec_seed) == ("int8:256", True, 7)
    assert apply_overrides(DDP, {"codec": "none"}).codec is None
    with pytest.raises(ConfigError, match="valid specs"):
        apply_overrides(DDP, {"codec": "int3"})
    assert DDP(codec="fp4").hyperparameters()["codec"] == "fp4"
