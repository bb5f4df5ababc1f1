"""DeMo (arXiv:2411.19870): chunked DCT, top-k, error feedback, combination, signum step, bytes.

Expected values are worked out by hand in the comments. Two transforms make that possible:

- for a chunk of 2, ``D_2 = [[1, 1], [1, -1]] / sqrt(2)``, so the 2-D DCT of ``[[a, b], [c, d]]``
  is ``[[a+b+c+d, a-b+c-d], [a+b-c-d, a-b-c+d]] / 2``, and the inverse has the same formula;
- for a chunk of 8, row 0 of ``D_8`` is ``1/sqrt(8)`` everywhere and row 4 is
  ``sqrt(2/8) cos(pi (2i+1) 4 / 16) = p_i / sqrt(8)`` with ``p = (1,-1,-1,1,1,-1,-1,1)``, so the
  basis images ``B_fg[i, j] = D[f, i] D[g, j]`` are ``B_00 = 1/8``, ``B_04 = p_j / 8``,
  ``B_40 = p_i / 8``, ``B_44 = p_i p_j / 8``.

Everything runs in float64, so "exact" means to ~1e-15.
"""

from __future__ import annotations

import math

import pytest
import torch
from support.by_hand import F64, TOL, stack, t
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from exogym import MnistCNN
from exogym.sim.engine import NodeStack
from exogym.strategy._dct import ChunkLayout, chunk_size, dct_matrix, index_dtype
from exogym.strategy.demo import DeMo
from exogym.strategy.optim import LRSchedule, OptimSpec

P8 = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0, 1.0], dtype=F64)


class Params(nn.Module):
    """Parameters set by hand (float64); the gradients are written by hand too."""

    def __init__(self, **shapes: tuple[int, ...]) -> None:
        super().__init__()
        for name, shape in shapes.items():
            self.register_parameter(name, nn.Parameter(torch.zeros(shape, dtype=F64)))


def build(strategy: DeMo, module: nn.Module, n: int, total_steps: int = 10):
    return stack(strategy, module, n, total_steps)


# -- the transform --------------------------------------------------------------------------------
def test_dct_matrix_is_orthonormal_dct_ii():
    d = dct_matrix(8)
    assert torch.allclose(d @ d.T, torch.eye(8, dtype=F64), **TOL)
    # D[0, i] = sqrt(1/8); D[1, 0] = sqrt(2/8) cos(pi/16) = 0.5 * 0.98078528...; D[4, :] = p/sqrt(8)
    assert torch.allclose(d[0], torch.full((8,), 1 / math.sqrt(8), dtype=F64), **TOL)
    assert d[1, 0].item() == pytest.approx(0.5 * 0.9807852804032304, abs=1e-15)
    assert torch.allclose(d[4], P8 / math.sqrt(8), **TOL)
    assert torch.allclose(dct_matrix(2), t([[1, 1], [1, -1]]) / math.sqrt(2), **TOL)


def test_2d_dct_of_8x8_by_hand_and_exact_round_trip():
    lay = ChunkLayout.of((8, 8), s=8, k=4)
    mats = {8: dct_matrix(8)}
    # x = 1 + 0.5 p_j + 0.25 p_i + 0.125 p_i p_j = 8 B_00 + 4 B_04 + 2 B_40 + 1 B_44
    x = 1 + 0.5 * P8[None, :] + 0.25 * P8[:, None] + 0.125 * P8[:, None] * P8[None, :]
    c = lay.encode(x.unsqueeze(0), mats)
    assert c.shape == (1, 1, 64)  # one 8x8 chunk, index a * 8 + b
    expected = torch.zeros(64, dtype=F64)
    expected[[0, 4, 32, 36]] = t([8.0, 4.0, 2.0, 1.0])  # (0,0), (0,4), (4,0), (4,4)
    assert torch.allclose(c[0, 0], expected, **TOL)
    # Orthonormal: energy kept (sum x^2 = 64 * (1 + 1/4 + 1/16 + 1/64) = 85 = 8^2+4^2+2^2+1^2).
    assert (x**2).sum().item() == pytest.approx(85.0, abs=1e-12)
    assert (c**2).sum().item() == pytest.approx(85.0, abs=1e-12)
    # Round trip of an arbitrary 8x8 tensor.
    y = torch.randn(3, 8, 8, dtype=F64, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(lay.decode(lay.encode(y, mats), mats), y, **TOL)


def test_2x2_chunks_match_the_hand_formula():
    # [[a, b], [c, d]] = [[4, 2], [2, 0]] -> [[8, 4], [4, 0]] / 2 = [[4, 2], [2, 0]]
    lay = ChunkLayout.of((2, 2), s=2, k=4)
    c = lay.encode(t([[[4.0, 2.0], [2.0, 0.0]]]), {2: dct_matrix(2)})
    assert torch.allclose(c, t([[[4.0, 2.0, 2.0, 0.0]]]), **TOL)


def test_chunk_size_is_the_largest_divisor_up_to_s():
    assert chunk_size(10, 4) == 2  # divisors 1, 2, 5, 10
    assert chunk_size(64, 4) == 4
    assert chunk_size(7, 64) == 7  # n <= s: the whole dimension
    assert chunk_size(13, 4) == 1  # prime
    assert chunk_size(1568, 64) == 56  # 1568 = 2^5 7^2; 64 does not divide it
    assert chunk_size(400, 64) == 50
    with pytest.raises(ValueError):
        chunk_size(0, 4)


def test_layouts_of_1d_2d_4d_and_scalar_tensors():
    lay = ChunkLayout.of((10, 64), s=4, k=3)
    assert (lay.rows, lay.cols, lay.h, lay.w, lay.num_chunks, lay.k) == (10, 64, 2, 4, 80, 3)
    bias = ChunkLayout.of((128,), s=64, k=32)  # 1-D: [1, 128], two 1-D chunks of 64
    assert (bias.h, bias.w, bias.num_chunks) == (1, 64, 2)
    conv = ChunkLayout.of((32, 16, 5, 5), s=64, k=32)  # [32, 400] -> 32 x 50 chunks
    assert (conv.rows, conv.cols, conv.h, conv.w, conv.num_chunks) == (32, 400, 32, 50, 8)
    small = ChunkLayout.of((10,), s=64, k=32)  # fewer than k components: all of them
    assert small.k == 10
    scalar = ChunkLayout.of((), s=64, k=32)
    assert (scalar.num_chunks, scalar.k) == (1, 1)
    # A 1-D chunk is a 1-D DCT: [1, 4] with s = 2 -> chunks [x0, x1], [x2, x3],
    # DCT [x0 + x1, x0 - x1] / sqrt(2): [3, 1, 5, 7] -> [4, 2, 12, -2] / sqrt(2).
    c = ChunkLayout.of((4,), s=2, k=2).encode(t([[3.0, 1.0, 5.0, 7.0]]), {1: dct_matrix(1),
                                                                         2: dct_matrix(2)})
    assert torch.allclose(c, t([[[4.0, 2.0], [12.0, -2.0]]]) / math.sqrt(2), **TOL)


def test_index_dtype_is_the_smallest_that_holds_a_chunk():
    assert index_dtype(64) == torch.uint8 and index_dtype(256) == torch.uint8
    assert index_dtype(257) == torch.int16
    assert index_dtype(64 * 64) == torch.int16  # 4,096 positions
    assert index_dtype(1 << 15) == torch.int16 and index_dtype((1 << 15) + 1) == torch.int32


# -- one node: top-k and error feedback --------------------------------------------------------
def test_top_k_on_8x8_sends_the_largest_components_and_keeps_the_rest():
    # Prepare: one node, lr 1, beta 0.5 (m starts at 0, so after step 0 m = 1 * g).
    demo = DeMo(s=8, k=2, beta=0.5, optim=OptimSpec(lr=1.0))
    nodes, comm = build(demo, Params(w=(8, 8)), n=1)
    g = 1 + 0.5 * P8[None, :] + 0.25 * P8[:, None] + 0.125 * P8[:, None] * P8[None, :]
    nodes.grads["w"].copy_(g.unsqueeze(0))
    sent: dict[str, Tensor] = {}
    real_all_gather = comm.all_gather

    def spy(x, **kw):
        out = real_all_gather(x, **kw)
        sent["idx"], sent["val"] = out
        return out

    comm.all_gather = spy  # type: ignore[method-assign]

    # Execute
    demo.step(0)

    # Assert: DCT(m) = 8, 4, 2, 1 at indices 0, 4, 32, 36 -> top-2 = {0: 8, 4: 4}.
    order = sent["idx"][0, 0].long().argsort()
    assert sent["idx"].dtype == torch.uint8  # 64 positions fit in one byte
    assert sent["idx"][0, 0][order].tolist() == [0, 4]
    assert torch.allclose(sent["val"][0, 0][order], t([8.0, 4.0]), **TOL)
    # transmitted = 8 B_00 + 4 B_04 = 1 + 0.5 p_j; residual = m - transmitted
    #             = 0.25 p_i + 0.125 p_i p_j (what stays in the local momentum).
    residual = 0.25 * P8[:, None] + 0.125 * P8[:, None] * P8[None, :]
    assert torch.allclose(demo.momentum["w"][0], residual, **TOL)
    assert torch.allclose(demo.momentum["w"][0] + (1 + 0.5 * P8[None, :]), g, **TOL)
    # Q = the same two components -> update 1 + 0.5 p_j >= 0.5 > 0 everywhere: w = 0 - 1 * 1.
    assert torch.allclose(nodes.params["w"], -torch.ones(1, 8, 8, dtype=F64), **TOL)

    # Step 1 with a zero gradient: m = 0.5 * residual, whose components 0.5 * (2, 1) at
    # (4,0) and (4,4) are both sent (k = 2): nothing is left, and Q = 0.5 * residual, whose sign
    # is sign(p_i) (|0.125 p_i| > |0.0625 p_i p_j|): w = -1 - p_i.
    nodes.grads["w"].zero_()
    demo.step(1)
    assert torch.allclose(demo.momentum["w"], torch.zeros(1, 8, 8, dtype=F64), **TOL)
    assert torch.allclose(nodes.params["w"][0], -1 - P8[:, None].expand(8, 8), **TOL)


# -- two nodes: combination, signum step, weight decay ----------------------------------------
def _two_node_grads(nodes: NodeStack) -> None:
    # lr 0.5: m_i = 0.5 g_i. Chosen so that DCT(m_0) = [[3, 1], [-1.5, 0.5]] and
    # DCT(m_1) = [[1, -4], [0.5, 0.25]] (inverse with the 2x2 formula):
    #   m_0 = [[1.5, 0], [2.5, 2]]  (e.g. (3 + 1 - 1.5 + 0.5) / 2 = 1.5)
    #   m_1 = [[-1.125, 2.625], [-1.875, 2.375]]
    nodes.grads["w"].copy_(2 * t([[[1.5, 0.0], [2.5, 2.0]], [[-1.125, 2.625], [-1.875, 2.375]]]))


def test_two_nodes_combined_update_by_hand():
    # Prepare: one 2x2 chunk, k = 2, eta = 0.5, lambda = 0.2, all parameters 1.
    demo = DeMo(s=2, k=2, optim=OptimSpec(lr=0.5, weight_decay=0.2))
    nodes, comm = build(demo, Params(w=(2, 2)), n=2)
    nodes.params["w"].data.fill_(1.0)
    _two_node_grads(nodes)

    # Execute
    demo.step(0)

    # Node 0 sends {0: 3, 2: -1.5}; node 1 sends {1: -4, 0: 1}.
    # Residuals: node 0 keeps components [[0, 1], [0, 0.5]] -> [[0.75, -0.75], [0.25, -0.25]];
    #            node 1 keeps [[0, 0], [0.5, 0.25]] -> [[0.375, 0.125], [-0.375, -0.125]].
    assert torch.allclose(demo.momentum["w"], t([[[0.75, -0.75], [0.25, -0.25]],
                                                 [[0.375, 0.125], [-0.375, -0.125]]]), **TOL)
    # Q (mean over the nodes that sent each component): index 0: (3 + 1) / 2 = 2, index 1: -4
    # (node 1 only), index 2: -1.5 (node 0 only), index 3: 0 -> [[2, -4], [-1.5, 0]];
    # IDCT: [[(2-4-1.5)/2, (2+4-1.5)/2], [(2-4+1.5)/2, (2+4+1.5)/2]]
    #     = [[-1.75, 2.25], [-0.25, 3.75]] -> sign [[-1, 1], [-1, 1]].
    # (A mean over all N would give index 1: -2, index 2: -0.75 and IDCT[1][0] = +0.375: the
    # test tells the two apart.)
    # theta = 1 (1 - 0.5 * 0.2) - 0.5 sign = 0.9 -/+ 0.5 = [[1.4, 0.4], [1.4, 0.4]] on both nodes.
    expected = t([[1.4, 0.4], [1.4, 0.4]])
    assert torch.allclose(nodes.params["w"], expected.expand(2, 2, 2), **TOL)
    assert torch.allclose(demo.global_state()["w"], expected, **TOL)
    # Bytes: 1 chunk x 2 components x (1-byte index + 8-byte float64 value) = 18; ring all-gather
    # sends (N - 1) * 18 = 18 per node.
    assert [(r.op, r.payload_bytes, r.tag) for r in comm.log] == [("all_gather", 18, "demo")]
    assert comm.bytes_sent == [18.0, 18.0]


def test_combine_is_the_mean_over_senders():
    lay = ChunkLayout.of((2, 2), s=2, k=2)
    idx = torch.tensor([[[0, 2]], [[1, 0]]])
    val = t([[[3.0, -1.5]], [[-4.0, 1.0]]])
    assert torch.allclose(lay.combine(idx, val), t([[[2.0, -4.0, -1.5, 0.0]]]), **TOL)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_signum_step_with_lr_and_weight_decay(weight_decay):
    # Prepare: 1-D parameter of 2 -> one chunk [x0, x1], k = 2 (everything is sent), one node.
    demo = DeMo(s=2, k=2, optim=OptimSpec(lr=0.1, weight_decay=weight_decay))
    nodes, _ = build(demo, Params(w=(2,)), n=1)
    nodes.params["w"].data.copy_(t([[2.0, -4.0]]))
    nodes.grads["w"].copy_(t([[3.0, -0.5]]))  # everything sent: Q = IDCT(DCT(0.1 g)) = 0.1 g

    # Execute
    demo.step(0)

    # theta = theta (1 - 0.1 lambda) - 0.1 sign(g) = [2, -4] (1 - 0.1 lambda) - 0.1 [1, -1]
    # lambda = 0:   [1.9, -3.9];   lambda = 0.1: [2 * 0.99 - 0.1, -4 * 0.99 + 0.1] = [1.88, -3.86]
    expected = t([[1.9, -3.9]]) if weight_decay == 0.0 else t([[1.88, -3.86]])
    assert torch.allclose(nodes.params["w"], expected, **TOL)
    assert torch.allclose(demo.momentum["w"], torch.zeros(1, 2, dtype=F64), **TOL)


def test_schedule_scales_the_step_the_decay_and_the_accumulated_gradient():
    # Warm-up of 4 steps: eta_0 = 0.4 / 4 = 0.1, eta_1 = 0.2. 1-D chunk of 2, k = 1.
    # For [x0, x1]: DCT = [x0 + x1, x0 - x1] / sqrt(2) and IDCT = [c0 + c1, c0 - c1] / sqrt(2).
    demo = DeMo(s=2, k=1, beta=0.5, optim=OptimSpec(lr=0.4, weight_decay=0.5),
                schedule=LRSchedule(warmup_steps=4))
    nodes, _ = build(demo, Params(w=(2,)), n=1)
    nodes.params["w"].data.copy_(t([[1.0, 1.0]]))
    nodes.grads["w"].copy_(t([[3.0, 1.0]]))

    demo.step(0)

    # m = 0.1 [3, 1] = [0.3, 0.1]; DCT = [0.4, 0.2] / sqrt(2) -> sends index 0:
    # transmitted = [0.2, 0.2], residual = [0.1, -0.1]; theta = 1 (1 - 0.1 * 0.5) - 0.1 = 0.85.
    assert demo.lr == pytest.approx(0.2)  # the scheduler stepped once
    assert torch.allclose(demo.momentum["w"], t([[0.1, -0.1]]), **TOL)
    assert torch.allclose(nodes.params["w"], t([[0.85, 0.85]]), **TOL)

    nodes.grads["w"].copy_(t([[1.0, 0.0]]))
    demo.step(1)

    # m = 0.5 [0.1, -0.1] + 0.2 [1, 0] = [0.25, -0.05]; DCT = [0.2, 0.3] / sqrt(2) -> sends
    # index 1: transmitted = [0.15, -0.15], residual = [0.1, 0.1] (with eta = 0.4 by mistake it
    # would be [0.2, 0.2]); theta = 0.85 (1 - 0.2 * 0.5) -/+ 0.2 = 0.765 -/+ 0.2.
    assert torch.allclose(demo.momentum["w"], t([[0.1, 0.1]]), **TOL)
    assert torch.allclose(nodes.params["w"], t([[0.565, 0.965]]), **TOL)


def test_clipping_applies_before_the_momentum():
    # g = [3, 4] (norm 5) is clipped to c [3, 4], c = 1 / (5 + 1e-6); lr 1, k = 1 of 2:
    # DCT(m) = c [7, -1] / sqrt(2) -> sends index 0; residual = IDCT([0, -c / sqrt(2)])
    # = c [-0.5, 0.5] (unclipped it would be [-0.5, 0.5]).
    demo = DeMo(s=2, k=1, max_grad_norm=1.0, optim=OptimSpec(lr=1.0))
    nodes, _ = build(demo, Params(w=(2,)), n=1)
    nodes.grads["w"].copy_(t([[3.0, 4.0]]))
    demo.step(0)
    coef = 1.0 / (5.0 + 1e-6)
    assert torch.allclose(demo.momentum["w"], t([[-0.5, 0.5]]) * coef, atol=1e-12, rtol=0)
    # update = IDCT([7 c / sqrt(2), 0]) = 3.5 c [1, 1] > 0: theta = 0 - 1 * 1 = -1
    assert torch.allclose(nodes.params["w"], t([[-1.0, -1.0]]), **TOL)


# -- bytes -------------------------------------------------------------------------------------
def test_bytes_per_step_on_the_mnist_cnn():
    # Per tensor: chunks x k x (index bytes + 4): conv1 [16, 25] 1 x 32 x (2+4) = 192, bias 16:
    # 1 x 16 x (1+4) = 80, conv2 [32, 400] -> 32 x 50 chunks: 8 x 32 x 6 = 1536, bias 32: 160,
    # fc1 [128, 1568] -> 64 x 56 chunks: 56 x 32 x 6 = 10752, bias 128: 2 x 32 x 5 = 320,
    # fc2 [10, 128] -> 10 x 64: 2 x 32 x 6 = 384, bias 10: 10 x 5 = 50. S = 13,474.
    demo = DeMo()
    nodes, comm = build(demo, MnistCNN(), n=4)
    assert demo.payload_bytes() == 13_474
    gen = torch.Generator().manual_seed(0)
    for g in nodes.grads.values():
        g.copy_(torch.randn(g.shape, generator=gen))
    demo.step(0)
    demo.step(1)
    assert [r.payload_bytes for r in comm.log] == [13_474, 13_474]
    assert comm.bytes_sent == [2 * 3 * 13_474.0] * 4  # (N-1) S per step, 2 steps
    assert comm.bytes_received == [2 * 3 * 13_474.0] * 4
    for p in nodes.params.values():  # the replicas stay identical
        assert torch.equal(p[0], p[3])


# -- config ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"beta": 1.0}, "beta must be in"),
    ({"beta": -0.1}, "beta must be in"),
    ({"s": 0}, "s must be an integer >= 1"),
    ({"k": 2.5}, "k must be an integer >= 1"),
    ({"optim": OptimSpec(name="sgd")}, "optim.name must stay at its default 'adamw'"),
    ({"optim": OptimSpec(betas=(0.8, 0.9))}, "optim.betas"),
    ({"optim": OptimSpec(name="sgd", momentum=0.9)}, "optim.name"),
])
def test_invalid_hyperparameters_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DeMo(**kwargs)


def test_overrides_from_strings_reach_the_fields_and_eta():
    from exogym.utils.config import apply_overrides

    demo = apply_overrides(DeMo, {"s": "32", "k": "16", "beta": "0.9", "lr": "0.01",
                                  "optim.weight_decay": "0.1"})
    assert (demo.s, demo.k, demo.beta) == (32, 16, 0.9)
    assert (demo.optim.lr, demo.optim.weight_decay) == (0.01, 0.1)
    with pytest.raises(ValueError, match="codec"):
        DeMo(codec="int8")


def test_takes_no_codec_and_documents_every_field():
    from exogym.utils.config import config_fields

    assert DeMo.supports_codec is False
    spec = config_fields(DeMo)
    assert spec["beta"][1] == 0.999 and spec["s"][1] == 64 and spec["k"][1] == 32
    assert all(spec[key][2] for key in ("beta", "s", "k"))


# -- end to end --------------------------------------------------------------------------------
@pytest.mark.usefixtures("single_thread")
def test_trains_a_tiny_model_end_to_end():
    from exogym import Trainer

    class Linear(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 4)

        def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
            x, y = batch
            return nn.functional.cross_entropy(self.fc(x), y)

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=gen)
    y = (x[:, :4] * 2).argmax(1)
    data = TensorDataset(x, y)
    torch.manual_seed(0)
    result = Trainer(Linear(), data, data).fit(
        strategy=DeMo(s=4, k=4, optim=OptimSpec(lr=0.02)), num_nodes=3, max_steps=60,
        batch_size=16, eval_interval=60, seed=0, progress=False, engine="loop",
    )
    first = result.history[0]["train_loss"]
    assert result.final["eval_loss"] < 0.6 * first
    # fc.weight [4, 8] -> 4 x 4 chunks: 2 x 4 x (1 + 4) = 40; bias [4]: 1 x 4 x 5 = 20 -> S = 60
    # bytes per step per node: (3 - 1) * 60 = 120; 60 steps -> 7,200.
    assert result.bytes_sent[0] == pytest.approx(7_200.0)
