"""Muon over node-stacked parameters (exogym.strategy.muon) and MuLoCo (arXiv:2505.23725).

The Newton-Schulz references below are written per node, one matrix at a time, from the formulas
of Keller Jordan's muon.py and the MuLoCo code; a diagonal matrix makes the whole step a scalar
computation (the iteration maps each singular value through the same quintic), which gives the
hand-checked cases. Float64 unless said otherwise.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from support.by_hand import F64, stack, t
from support.checkpoints import check_checkpoint_resume
from torch import Tensor, nn

from exogym.sim.comm import InProcessCommunicator
from exogym.sim.engine import NodeStack
from exogym.strategy import make
from exogym.strategy.diloco import DiLoCo
from exogym.strategy.muloco import MuLoCo
from exogym.strategy.muon import (
    NS_COEFFICIENTS,
    Muon,
    matrix_shape,
    orthogonalize,
    outer_layers,
    update_scale,
)
from exogym.strategy.optim import OptimSpec
from exogym.tasks.gpt import GPT, GPTConfig
from exogym.tasks.models import MnistCNN
from exogym.utils.config import ConfigError

JORDAN = ((3.4445, -4.7750, 2.0315),) * 5


def ns_reference(g: Tensor, steps, eps: float) -> Tensor:
    """One matrix, written out: normalise, transpose a tall matrix, five quintic steps
    ``X <- a X + (b A + c A^2) X`` (both authors' association: in float32 another order of the
    products differs by ~1e-6 after five steps)."""
    x = g.clone()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (torch.linalg.matrix_norm(x) + eps)
    for a, b, c in steps:
        gram = x @ x.T
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.T if tall else x


def quintic(x: float, steps) -> float:
    """What the iteration does to one singular value (as a fraction of the Frobenius norm)."""
    for a, b, c in steps:
        x = a * x + b * x**3 + c * x**5
    return x


# -- the orthogonalisation ------------------------------------------------------------------------
@pytest.mark.parametrize("ns", ["jordan", "muloco"])
@pytest.mark.parametrize("shape", [(5, 7), (7, 5), (6, 6), (1, 9), (40, 300)])
def test_batched_orthogonalisation_equals_the_per_node_reference(ns, shape):
    # Prepare: N = 4 different matrices, float64
    g = torch.Generator().manual_seed(0)
    u = torch.randn(4, *shape, generator=g, dtype=F64)
    steps, eps = NS_COEFFICIENTS[ns]

    # Execute
    out = orthogonalize(u, ns, torch.float64)

    # Assert: each node's matrix is the written-out single-matrix iteration of its input
    assert out.shape == u.shape and out.dtype == F64
    for i in range(4):
        torch.testing.assert_close(out[i], ns_reference(u[i], steps, eps), rtol=0, atol=1e-6)


@pytest.mark.parametrize("ns_dtype", [torch.float32, torch.bfloat16])
def test_low_precision_batch_equals_one_node_at_a_time(ns_dtype):
    # Prepare: float32 matrices (float32 round-off, amplified by five steps of slope up to 3.4,
    # moves the result by ~1e-6 under another order of the same products, so the reference here
    # is the same function on a one-node batch)
    g = torch.Generator().manual_seed(0)
    u = torch.randn(4, 7, 5, generator=g)

    # Execute
    out = orthogonalize(u, "jordan", ns_dtype)

    # Assert: bit-for-bit what each node gets alone, and close to the float64 iteration
    assert out.dtype == torch.float32
    for i in range(4):
        assert torch.equal(out[i:i + 1], orthogonalize(u[i:i + 1], "jordan", ns_dtype))
    tol = 2e-5 if ns_dtype == torch.float32 else 0.1
    torch.testing.assert_close(out, orthogonalize(u.double(), "jordan", F64).float(), rtol=0,
                               atol=tol)


def test_orthogonalisation_never_mixes_nodes():
    # Prepare: the same batch twice, node 1 changed in the second
    g = torch.Generator().manual_seed(1)
    u = torch.randn(3, 8, 5, generator=g, dtype=F64)
    v = u.clone()
    v[1] = 100 * torch.randn(8, 5, generator=g, dtype=F64)

    # Execute
    a, b = orthogonalize(u), orthogonalize(v)

    # Assert: nodes 0 and 2 are bit-for-bit unchanged
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
    assert not torch.allclose(a[1], b[1])


@pytest.mark.parametrize(("ns", "band"), [("jordan", (0.68, 1.14)), ("muloco", (0.977, 1.032))])
def test_singular_values_land_in_the_documented_band_and_are_not_exactly_one(ns, band):
    # Prepare: U = Q1 diag(sigma) Q2^T with sigma / ||sigma|| from 0.01 to ~0.7 (6 x 9 matrices)
    g = torch.Generator().manual_seed(2)
    q1, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=F64))
    q2, _ = torch.linalg.qr(torch.randn(9, 6, generator=g, dtype=F64))
    rel = t([0.7, 0.5, 0.35, 0.2, 0.05, 0.01])
    sigma = rel / rel.norm()
    sigma = sigma * 3.0  # any overall scale: the iteration normalises it away
    u = (q1 @ torch.diag(sigma) @ q2.T).unsqueeze(0)

    # Execute
    out = orthogonalize(u, ns, torch.float64)[0]

    # Assert: singular value i becomes quintic(sigma_i / ||U||_F), inside the band, not 1
    steps, eps = NS_COEFFICIENTS[ns]
    got = torch.linalg.svdvals(out)
    want = sorted((quintic(s / (3.0 + eps), steps) for s in sigma.tolist()), reverse=True)
    torch.testing.assert_close(got, t(want), rtol=0, atol=1e-10)
    assert band[0] <= got.min().item() and got.max().item() <= band[1]
    assert (got - 1).abs().max().item() > 0.005  # approximately orthogonal, not exactly


def test_scales_and_matrix_views_by_hand():
    assert matrix_shape((16, 1, 5, 5)) == (16, 25) and matrix_shape((4, 2)) == (4, 2)
    with pytest.raises(ValueError, match=">= 2 dimensions"):
        matrix_shape((7,))
    # 4 x 2: jordan max(1, 2) ** .5, moonlight 0.2 sqrt(4), spectral sqrt(4 / 2)
    assert update_scale(4, 2, "jordan") == pytest.approx(math.sqrt(2))
    assert update_scale(4, 2, "moonlight") == pytest.approx(0.4)
    assert update_scale(4, 2, "spectral") == pytest.approx(math.sqrt(2))
    # 2 x 8: jordan 1, moonlight 0.2 sqrt(8), spectral 1/2
    assert update_scale(2, 8, "jordan") == 1.0
    assert update_scale(2, 8, "moonlight") == pytest.approx(0.2 * math.sqrt(8))
    assert update_scale(2, 8, "spectral") == pytest.approx(0.5)


# -- the Muon step by hand ------------------------------------------------------------------------
def diag_param(n: int, values) -> Tensor:
    """``[n, 2, 2]`` diagonal matrices, the same on every node."""
    return torch.diag(t(values)).expand(n, 2, 2).clone().requires_grad_(True)


def test_two_muon_steps_on_a_diagonal_matrix_by_hand():
    # Prepare: W = diag(1, 1) on 1 node, eta = 0.1, mu = 0.5, Nesterov, lambda = 0.2, jordan
    w = diag_param(1, [1.0, 1.0])
    opt = Muon([w], muon_lr=0.1, momentum=0.5, weight_decay=0.2, ns_dtype="fp64")
    steps, eps = NS_COEFFICIENTS["jordan"]

    # Execute step 1: G = diag(3, 4)
    w.grad = torch.diag(t([3.0, 4.0])).unsqueeze(0)
    opt.step()

    # Assert: M = 0.5 G, U = 0.5 G + 0.5 M = 0.75 G; X = U/||U|| = diag(.6, .8) (eps aside);
    # O = diag(f(.6), f(.8)); s = 1 (2 x 2); W = W (1 - 0.1 * 0.2) - 0.1 O
    o1 = [quintic(0.6 * 3.75 / (3.75 + eps), steps), quintic(0.8 * 3.75 / (3.75 + eps), steps)]
    w1 = [0.98 - 0.1 * o1[0], 0.98 - 0.1 * o1[1]]
    torch.testing.assert_close(w.detach()[0], torch.diag(t(w1)), rtol=0, atol=1e-12)

    # Execute step 2: G = diag(1, -2)
    w.grad = torch.diag(t([1.0, -2.0])).unsqueeze(0)
    opt.step()

    # Assert: M = 0.5 diag(1.5, 2) + 0.5 diag(1, -2) = diag(1.25, 0); U = 0.5 G + 0.5 M =
    # diag(1.125, -1); the odd quintic keeps signs: O = diag(f(1.125/r), -f(1/r)), r = |U|_F
    r = math.hypot(1.125, 1.0)
    o2 = [quintic(1.125 / (r + eps), steps), -quintic(1.0 / (r + eps), steps)]
    w2 = [w1[0] * 0.98 - 0.1 * o2[0], w1[1] * 0.98 - 0.1 * o2[1]]
    torch.testing.assert_close(w.detach()[0], torch.diag(t(w2)), rtol=0, atol=1e-12)
    assert opt.state[w]["step"].tolist() == [2]


def test_muloco_sum_form_momentum_gives_the_same_update():
    # Prepare: the MuLoCo code's form M <- mu M + G, U = M (no Nesterov), per node, against
    # Muon's EMA form M <- mu M + (1 - mu) G; 3 nodes of 5 x 3 matrices, 4 steps, spectral scale
    g = torch.Generator().manual_seed(3)
    grads = torch.randn(4, 3, 5, 3, generator=g, dtype=F64)
    w = torch.randn(3, 5, 3, generator=g, dtype=F64)
    stacked = w.clone().requires_grad_(True)
    opt = Muon([stacked], muon_lr=0.05, momentum=0.9, nesterov=False, ns="muloco",
               ns_dtype="fp64", scale="spectral")
    steps, eps = NS_COEFFICIENTS["muloco"]
    ref = w.clone()
    m_sum = torch.zeros_like(w)

    for k in range(4):
        # Execute
        stacked.grad = grads[k].clone()
        opt.step()
        for i in range(3):  # the reference, one node at a time
            m_sum[i] = 0.9 * m_sum[i] + grads[k, i]
            ref[i] -= 0.05 * math.sqrt(5 / 3) * ns_reference(m_sum[i], steps, eps)

    # Assert: the normalisation removes the factor 1 / (1 - mu) between the forms
    torch.testing.assert_close(stacked.detach(), ref, rtol=0, atol=1e-6)


def test_conv_kernels_are_orthogonalised_as_out_by_in_kh_kw():
    # Prepare: a [2, 3, 2, 2] kernel on 2 nodes, jordan scale of the 2 x 12 view = 1
    g = torch.Generator().manual_seed(4)
    grad = torch.randn(2, 2, 3, 2, 2, generator=g, dtype=F64)
    kernel = torch.zeros(2, 2, 3, 2, 2, dtype=F64, requires_grad=True)
    opt = Muon([kernel], muon_lr=1.0, momentum=0.0, nesterov=False, ns_dtype="fp64")

    # Execute
    kernel.grad = grad.clone()
    opt.step()

    # Assert: each node's update is -NS(G viewed as 2 x 12)
    steps, eps = NS_COEFFICIENTS["jordan"]
    for i in range(2):
        ref = -ns_reference(grad[i].reshape(2, 12), steps, eps).reshape(2, 3, 2, 2)
        torch.testing.assert_close(kernel.detach()[i], ref, rtol=0, atol=1e-12)


# -- the AdamW part and per-node step counts ------------------------------------------------------
def test_adamw_part_equals_torch_adamw_per_node():
    # Prepare: a bias vector on 3 nodes; Muon's AdamW part against torch.optim.AdamW per node
    g = torch.Generator().manual_seed(5)
    init = torch.randn(3, 4, generator=g, dtype=F64)
    stacked = init.clone().requires_grad_(True)
    opt = Muon([stacked], lr=0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1)
    rows = [init[i].clone().requires_grad_(True) for i in range(3)]
    refs = [torch.optim.AdamW([r], lr=0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1)
            for r in rows]

    for _ in range(5):
        grad = torch.randn(3, 4, generator=g, dtype=F64)
        # Execute
        stacked.grad = grad.clone()
        opt.step()
        for i in range(3):
            rows[i].grad = grad[i].clone()
            refs[i].step()

    # Assert
    for i in range(3):
        torch.testing.assert_close(stacked.detach()[i], rows[i].detach(), rtol=0, atol=1e-12)
    assert opt.param_groups[0]["params"] == [stacked] and opt.matrices == []


def test_masked_step_leaves_inactive_rows_bit_unchanged_and_matches_the_unmasked_step():
    # Prepare: the same optimizer twice (a matrix for Muon, a vector for AdamW), 3 nodes, after
    # one common step; then one masked step (nodes 0 and 2) and one unmasked step
    g = torch.Generator().manual_seed(6)
    inits = [torch.randn(3, 4, 3, generator=g), torch.randn(3, 4, generator=g)]
    first = [torch.randn_like(p) for p in inits]
    second = [torch.randn_like(p) for p in inits]
    runs = []
    for _ in range(2):
        params = [p.clone().requires_grad_(True) for p in inits]
        opt = Muon(params, lr=0.01, muon_lr=0.02, weight_decay=0.1)
        for p, grad in zip(params, first, strict=True):
            p.grad = grad.clone()
        opt.step()
        runs.append((params, opt))
    (masked, opt_m), (full, opt_f) = runs
    before = [p.detach().clone() for p in masked]
    state_before = {i: {k: v.clone() for k, v in opt_m.state[p].items()}
                    for i, p in enumerate(masked)}
    active = torch.tensor([True, False, True])

    # Execute
    for p, q, grad in zip(masked, full, second, strict=True):
        p.grad, q.grad = grad.clone(), grad.clone()
    opt_m.step(active=active)
    opt_f.step()

    # Assert: node 1 (inactive) is bit-for-bit as before, parameters and every state tensor;
    # nodes 0 and 2 equal the unmasked step exactly; the step counts are per node
    for i, (p, q) in enumerate(zip(masked, full, strict=True)):
        assert torch.equal(p.detach()[1], before[i][1])
        assert torch.equal(p.detach()[[0, 2]], q.detach()[[0, 2]])
        assert not torch.equal(p.detach()[0], before[i][0])
        for k, v in opt_m.state[p].items():
            assert torch.equal(v[1], state_before[i][k][1]), k
            assert torch.equal(v[[0, 2]], opt_f.state[q][k][[0, 2]]), k
        assert opt_m.state[p]["step"].tolist() == [2, 1, 2]


def test_a_node_that_skipped_a_step_gets_its_own_bias_correction():
    # Prepare: a vector on 2 nodes; node 1 skips the first step
    g = torch.Generator().manual_seed(7)
    init = torch.randn(2, 3, generator=g, dtype=F64)
    grads = torch.randn(2, 2, 3, generator=g, dtype=F64)
    stacked = init.clone().requires_grad_(True)
    opt = Muon([stacked], lr=0.1, betas=(0.9, 0.99))

    # Execute: step 1 with node 0 only, step 2 with both
    stacked.grad = grads[0].clone()
    opt.step(active=torch.tensor([True, False]))
    stacked.grad = grads[1].clone()
    opt.step()

    # Assert: node 0 = two AdamW steps (bias corrections at t = 1, 2); node 1 = ONE AdamW step
    # on the second gradient (bias correction at t = 1, not t = 2)
    for i, seq in ((0, [grads[0, 0], grads[1, 0]]), (1, [grads[1, 1]])):
        row = init[i].clone().requires_grad_(True)
        ref = torch.optim.AdamW([row], lr=0.1, betas=(0.9, 0.99), weight_decay=0.0)
        for grad in seq:
            row.grad = grad.clone()
            ref.step()
        torch.testing.assert_close(stacked.detach()[i], row.detach(), rtol=0, atol=1e-12)
    assert opt.state[stacked]["step"].tolist() == [2, 1]


def test_mask_must_be_a_bool_vector_over_the_nodes():
    p = torch.zeros(3, 2, requires_grad=True)
    opt = Muon([p])
    p.grad = torch.ones(3, 2)
    with pytest.raises(ValueError, match=r"active must be a bool tensor of shape \[N=3\]"):
        opt.step(active=torch.tensor([1, 0, 1]))
    with pytest.raises(ValueError, match=r"shape \[N=3\]"):
        opt.step(active=torch.tensor([True, False]))


# -- which parameters get Muon --------------------------------------------------------------------
def test_matrices_get_muon_and_embeddings_head_and_vectors_get_adamw():
    # Prepare: GPT-like names; node-stacked shapes [N, *shape] with N = 2
    shapes = {"wte.weight": (2, 65, 8), "wpe.weight": (2, 16, 8),
              "h.0.attn.qkv.weight": (2, 24, 8), "h.0.ln_1.weight": (2, 8),
              "lm_head.weight": (2, 65, 8), "conv.weight": (2, 4, 3, 2, 2)}
    params = {k: torch.zeros(s, requires_grad=True) for k, s in shapes.items()}

    # Execute
    named = Muon(list(params.values()), names=list(params))
    unnamed = Muon(list(params.values()))

    # Assert: with names, the patterns send wte, wpe and lm_head to AdamW; without, only vectors
    muon_names = {k for k, p in params.items() if any(p is q for q in named.matrices)}
    assert muon_names == {"h.0.attn.qkv.weight", "conv.weight"}
    assert len(unnamed.matrices) == 5
    with pytest.raises(ValueError, match="names must name every parameter"):
        Muon(list(params.values()), names=["a"])


# -- OptimSpec ------------------------------------------------------------------------------------
def test_optim_spec_builds_muon_with_its_fields():
    spec = OptimSpec(name="muon", lr=3e-4, muon_lr=0.05, muon_momentum=0.9, muon_nesterov=False,
                     muon_ns="muloco", muon_scale="spectral", weight_decay=0.01)
    opt = spec.build([torch.zeros(2, 3, 4, requires_grad=True), torch.zeros(2, 3,
                                                                            requires_grad=True)])
    assert isinstance(opt, Muon)
    adamw, muon = opt.param_groups
    assert (adamw["lr"], muon["lr"], muon["momentum"], muon["nesterov"]) == (3e-4, 0.05, 0.9, False)
    assert (muon["ns"], muon["scale"], muon["weight_decay"]) == ("muloco", "spectral", 0.01)
    assert spec.states_per_parameter == 2
    assert OptimSpec(name="muon", muon_exclude="*emb*").muon_exclude == ("*emb*",)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"muon_lr": 0.0}, "muon_lr must be a finite number > 0"),
    ({"muon_momentum": 1.0}, "muon_momentum must be in"),
    ({"muon_nesterov": "yes"}, "muon_nesterov must be True or False"),
    ({"muon_ns": "polar"}, r"muon_ns must be one of \['jordan', 'muloco'\]"),
    ({"muon_ns_dtype": "fp8"}, "muon_ns_dtype must be one of"),
    ({"muon_scale": "rms"}, r"muon_scale must be one of \['jordan', 'moonlight', 'spectral'\]"),
    ({"muon_exclude": ("",)}, "muon_exclude must be non-empty"),
    ({"name": "lamb"}, r"\['adam', 'adamw', 'sgd'\].*\['muon'\].*'lamb'"),
])
def test_optim_spec_rejects_bad_muon_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OptimSpec(**{"name": "muon", **kwargs})


def test_every_strategy_takes_muon_as_its_inner_optimizer():
    # Prepare: DiLoCo with optim.name=muon through the registry's string settings
    s = make("diloco", H=2, **{"optim.name": "muon", "optim.muon_lr": "0.1"})
    nodes, _ = stack(s, nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)).to(F64), n=2)
    w = nodes.params["0.weight"]
    before = w.detach().clone()

    # Execute: one inner step on gradient ones
    for grad in nodes.grads.values():
        grad.fill_(1.0)
    s.step(0)

    # Assert: a Muon optimizer; the all-ones 3 x 4 gradient has rank 1, NS maps its singular
    # value 1 (relative) to f(1) and the update is -0.1 f(1) * ones / sqrt(12) (jordan scale 1)
    assert isinstance(s.optimizer, Muon)
    f1 = quintic(1.0 / (1.0 + 1e-7 / math.sqrt(12)), ((3.4445, -4.7750, 2.0315),) * 5)
    # fp32 iteration (the default) on a float64 parameter: float32 round-off
    torch.testing.assert_close(w.detach(), before - 0.1 * f1 / math.sqrt(12), rtol=0, atol=1e-6)


# -- MuLoCo ---------------------------------------------------------------------------------------
def test_muloco_defaults_are_the_authors_configuration():
    s = make("muloco")
    assert isinstance(s, DiLoCo)
    assert (s.H, s.outer_optimizer, s.outer_lr, s.outer_momentum) == (30, "nesterov", 0.9, 0.8)
    o = s.optim
    assert (o.name, o.muon_lr, o.muon_momentum, o.muon_nesterov) == ("muon", 0.044, 0.9, False)
    assert (o.muon_ns, o.muon_scale, o.betas, o.weight_decay) == ("muloco", "spectral",
                                                                  (0.9, 0.99), 0.00125)
    # a setting keeps the other defaults (the section starts from MuLoCo's own optim)
    s = make("muloco", **{"optim.lr": "2e-3"})
    assert (s.optim.name, s.optim.lr, s.optim.muon_lr) == ("muon", 2e-3, 0.044)
    with pytest.raises(ConfigError, match="MuLoCo's inner optimizer is Muon"):
        make("muloco", **{"optim.name": "adamw"})


class TinyGPTNames(nn.Module):
    """Parameters named like the Shakespeare GPT's: an embedding, a block matrix, a norm, and
    an output layer named as no pattern knows."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(11, 4)
        self.block = nn.Linear(4, 4, bias=False)
        self.ln = nn.LayerNorm(4)
        self.out = nn.Linear(4, 11)

    def forward(self, batch: Tensor) -> Tensor:
        return self.out(self.ln(self.block(self.wte(batch)))).pow(2).mean()


def test_muloco_builds_muon_with_names_so_embeddings_get_adamw():
    # Prepare / Execute
    s = MuLoCo(H=2)
    nodes = NodeStack(TinyGPTNames(), 2, engine="loop")
    s.setup(nodes, InProcessCommunicator(2), 4)

    # Assert: only the block matrix is orthogonalised (the output layer by its role)
    assert s.optimizer.matrices == [nodes.params["block.weight"]]
    assert s.lr == s.optim.lr  # group 0 is the AdamW part: the lr exogym reports


def muon_of(model: nn.Module, **muloco: bool) -> list[str]:
    """The names of ``model``'s parameters MuLoCo's inner Muon orthogonalises."""
    s = MuLoCo(H=2, **muloco)
    nodes = NodeStack(model, 2, engine="loop")
    s.setup(nodes, InProcessCommunicator(2), 4)
    ids = {id(p) for p in s.optimizer.matrices}
    return [name for name, p in nodes.params.items() if id(p) in ids]


def test_muloco_keeps_the_input_and_output_layers_on_adamw_whatever_their_names():
    # the MNIST CNN: the input convolution and the classifier are not hidden layers (they were
    # Muon's: DEFAULT_EXCLUDE knows transformers' names only)
    assert muon_of(MnistCNN()) == ["features.3.weight", "head.1.weight"]
    assert muon_of(MnistCNN(), outer_adamw=False) == [
        "features.0.weight", "features.3.weight", "head.1.weight", "head.3.weight"]
    # the char-GPT: its embeddings and its head (tied to the token embedding) on AdamW; every
    # block's matrices on Muon, the last block's MLP included
    gpt = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8))
    muon = muon_of(gpt)
    hidden = [n for n, p in gpt.named_parameters() if p.dim() >= 2 and n.startswith("blocks.")]
    assert muon == hidden and len(hidden) == 8
    assert outer_layers(gpt) == ("wte.weight", "wpe.weight")


def test_muloco_outer_step_by_hand():
    # Prepare: 2 nodes, a 2 x 2 diagonal matrix W = I, H = 1, inner Muon without momentum
    # (mu = 0), jordan coefficients and scale, eta = 0.1; outer Nesterov lr 0.5, momentum 0.5
    optim = OptimSpec(name="muon", muon_lr=0.1, muon_momentum=0.0, muon_nesterov=False,
                      muon_ns="jordan", muon_scale="jordan", muon_ns_dtype="fp64")
    s = MuLoCo(H=1, outer_lr=0.5, outer_momentum=0.5, optim=optim, outer_adamw=False)
    module = nn.Module()
    module.register_parameter("w", nn.Parameter(torch.eye(2, dtype=F64)))
    nodes, comm = stack(s, module, 2)

    # Execute: node 0 G = diag(3, 4), node 1 G = diag(4, 3)
    nodes.grads["w"].copy_(torch.stack([torch.diag(t([3.0, 4.0])), torch.diag(t([4.0, 3.0]))]))
    s.step(0)

    # Assert: node updates 0.1 diag(f(.6), f(.8)) and 0.1 diag(f(.8), f(.6)); Delta = their mean
    # 0.05 (f(.6) + f(.8)) I; Nesterov's first step: theta = I - 0.5 (1 + 0.5) Delta
    steps, eps = NS_COEFFICIENTS["jordan"]
    fa, fb = quintic(0.6 * 5 / (5 + eps), steps), quintic(0.8 * 5 / (5 + eps), steps)
    delta = 0.05 * (fa + fb)
    expected = torch.eye(2, dtype=F64) * (1 - 0.75 * delta)
    torch.testing.assert_close(s.global_state()["w"], expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(nodes.params["w"], expected.expand(2, 2, 2), rtol=0, atol=1e-12)
    assert [(r.op, r.payload_bytes, r.tag) for r in comm.log] == [
        ("all_reduce", 32, "pseudo_grads")]  # DiLoCo's bytes: 4 float64 entries


def test_muloco_checkpoint_resume_is_exact(tmp_path: Path):
    # H = 3, stop at 5: mid-round, Muon momenta, AdamW moments, per-node steps, outer momentum
    check_checkpoint_resume(lambda: MuLoCo(H=3), tmp_path)
