"""One training step counted (exogym.sim.flops): the FLOPs of the MNIST CNN and of the GPT by
hand, PyTorch's own counter, ``6 N D``, the bytes and kernels, and nothing changed."""

from __future__ import annotations

import torch
from torch import nn

from exogym.sim.engine import loss_of
from exogym.sim.flops import Kernel, count_step, flop_counter
from exogym.strategy.optim import OptimSpec
from exogym.tasks.gpt import GPT, GPTConfig
from exogym.tasks.models import Classifier, MnistCNN

ADAMW = OptimSpec("adamw", lr=1e-3)


def _mnist(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return Classifier(MnistCNN()), (torch.randn(batch, 1, 28, 28),
                                    torch.randint(0, 10, (batch,)))


def _conv(b: int, cin: int, cout: int, k: int, h: int, w: int) -> int:
    return 2 * b * cout * cin * k * k * h * w


def test_mnist_cnn_counts_equal_the_hand_count() -> None:
    # MnistCNN: conv 1->16 5x5 on 28x28, pool, conv 16->32 5x5 on 14x14, pool, 1568->128->10.
    b = 16
    conv1, conv2 = _conv(b, 1, 16, 5, 28, 28), _conv(b, 16, 32, 5, 14, 14)
    fc1, fc2 = 2 * b * 32 * 7 * 7 * 128, 2 * b * 128 * 10
    model, batch = _mnist(b)
    c = count_step(model, batch, ADAMW)
    assert c.forward_flops == conv1 + conv2 + fc1 + fc2 == 96_780_288
    # backward: each layer's weight gradient and input gradient, but the first convolution's
    # input (the image) needs none
    assert c.backward_flops == conv1 + 2 * (conv2 + fc1 + fc2) == 183_525_376
    assert c.parameters == sum(p.numel() for p in model.parameters()) == 215_370
    assert c.samples == b
    # the fused AdamW step: one kernel over every parameter, one FLOP per element (stated
    # count), reading p, g, m, v and writing p, g, m, v (the fused kernel's schema mutates the
    # gradients too): 8 fp32 tensors of P elements; and the step counters (8 fp32 scalars, one
    # per tensor), incremented by a foreach add (read, written) and read by the fused kernel
    assert c.optimizer_kernels == 2
    assert c.optimizer_flops == c.parameters + 8
    assert c.optimizer_bytes == 8 * 4 * c.parameters + 3 * 8 * 4
    # the profile holds every kernel: its counts add up to the totals
    assert sum(n for _, n in c.profile) == c.kernels
    assert sum(k.bytes * n for k, n in c.profile) == c.bytes
    assert sum(k.flops * n for k, n in c.profile if k.kind != "ew") == c.matmul_flops
    assert {k.kind for k, _ in c.profile} == {"conv", "mm", "ew"}


def test_the_matmul_count_is_pytorchs_own() -> None:
    model, batch = _mnist(8)
    counter = flop_counter()
    with counter:
        loss_of(model(batch)).backward()
    assert count_step(model, batch, ADAMW).matmul_flops == counter.get_total_flops()


def _gpt(cfg: GPTConfig, b: int) -> tuple[GPT, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (b, cfg.block_size))
    return GPT(cfg), (ids, ids.roll(-1, dims=1))


def test_gpt_counts_equal_the_hand_count() -> None:
    cfg = GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64, bias=False)
    b, t, d, h = 8, cfg.block_size, cfg.n_embd, cfg.n_head
    n = b * t  # tokens
    linear = 2 * n * d * 3 * d + 2 * n * d * d + 2 * (2 * n * d * 4 * d)  # qkv, proj, MLP
    attention = 2 * (2 * b * h * t * t * (d // h))  # Q K^T and A V
    head = 2 * n * d * cfg.vocab_size
    c = count_step(*_gpt(cfg, b), ADAMW)
    assert c.forward_flops == cfg.n_layer * (linear + attention) + head == 121_700_352
    # backward: twice each matrix product; attention's backward (flash attention's) recomputes
    # Q K^T and takes four more products of the same size: five in all
    backward = cfg.n_layer * (2 * linear + 5 * attention // 2) + 2 * head
    assert c.backward_flops == backward == 251_789_312


def test_gpt_training_flops_are_6ND_within_the_attention_term() -> None:
    # 6 N D (Kaplan et al. 2020, section 2.1) leaves out attention's T x T products: per token
    # and layer 4 T d forward (Q K^T, A V) and 10 T d backward (flash attention's five
    # products), 14 T d in all. With N the matrices' parameters (every linear layer, the output
    # layer's too; embeddings and LayerNorms take no matrix product) the count is exactly
    # 6 N D plus that term, and within 2% of 6 N D where T is small beside d.
    cfg = GPTConfig(vocab_size=65, block_size=16, n_layer=2, n_head=4, n_embd=256, bias=False)
    b = 4
    model, batch = _gpt(cfg, b)
    tokens = b * cfg.block_size
    dense = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    c = count_step(model, batch, ADAMW)
    attention = 14 * cfg.n_layer * cfg.block_size * cfg.n_embd * tokens
    assert c.matmul_flops == 6 * dense * tokens + attention
    assert abs(c.matmul_flops / (6 * dense * tokens) - 1) < 0.02


def test_counting_changes_nothing() -> None:
    model, batch = _mnist(4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(7)
    rng = torch.get_rng_state()
    count_step(model, batch, ADAMW)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_micro_batches_keep_the_flops_and_launch_more_kernels() -> None:
    model, batch = _mnist(16)
    whole = count_step(model, batch, ADAMW)
    parts = count_step(model, batch, ADAMW, micro_batch_size=4)
    assert parts.matmul_flops == whole.matmul_flops
    assert parts.kernels > whole.kernels


def test_bf16_matrix_products_are_counted_in_bf16() -> None:
    model, batch = _mnist(8)
    c = count_step(model, batch, ADAMW, precision="bf16")
    assert {k.dtype for k, _ in c.profile if k.kind in ("mm", "conv")} == {"bf16"}
    assert c.matmul_flops == count_step(model, batch, ADAMW).matmul_flops


class _ForeachSGD:
    """An optimizer builder without a fused kernel: torch's SGD with momentum, foreach."""

    def build(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=True)


def test_an_optimizer_with_a_foreach_form_is_counted_in_it() -> None:
    # one kernel per operation over the parameters' list: the momentum buffers' mul_ and add_,
    # then the parameters' add_
    model, batch = _mnist(4)
    c = count_step(model, batch, _ForeachSGD())
    params = c.parameters
    assert c.optimizer_kernels == 3
    assert c.optimizer_flops == 3 * params
    # mul_: read and write the buffers; add_: read the buffers and the gradients, write the
    # buffers; add_: read the parameters and the buffers, write the parameters
    assert c.optimizer_bytes == 4 * params * (2 + 3 + 3)


def test_views_launch_nothing() -> None:
    class Viewer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(6))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (self.w.view(2, 3).t().reshape(6) * x).sum()

    c = count_step(Viewer(), torch.ones(6), OptimSpec("sgd", lr=0.1))
    kernels = [k for k, _ in c.profile]
    assert all(k.kind == "ew" for k in kernels)
    # forward: reshaping the transposed view copies it (clone), mul, sum; backward: the seed
    # gradient (ones_like), mul for w's gradient, the reshape's copy back (clone); the sum's
    # expand, view and t are views; then the fused SGD step
    assert c.kernels == 7 and c.optimizer_kernels == 1
    assert Kernel("ew", "fp32", 6, 6 * 4 * 3) in kernels  # the forward's mul: 2 reads, 1 write
