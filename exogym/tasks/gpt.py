"""A small nanoGPT-style decoder-only transformer for character-level language modelling.

Architecture (GPT-2 style, as in Karpathy's nanoGPT): token + learned position embeddings,
dropout, ``n_layer`` pre-LayerNorm blocks ``h = h + attn(ln_1(h)); h = h + mlp(ln_2(h))`` with
causal multi-head self-attention (:func:`torch.nn.functional.scaled_dot_product_attention` with
``is_causal=True``) and a 4x GELU MLP, a final LayerNorm and an output head whose weight is tied to
the token embedding. Weights are initialised N(0, 0.02), biases 0, and the residual output
projections N(0, 0.02 / sqrt(2 * n_layer)) as in GPT-2.

The model follows exogym's contract: ``model((x, y))`` with int64 ``x, y`` of shape ``[B, T]``
returns ``{"loss": mean next-token cross-entropy}``, plus ``"perplexity": exp(loss)`` in eval mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["GPT", "GPTConfig"]


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a :class:`GPT`.

    Attributes:
        vocab_size: number of token ids (65 for Tiny Shakespeare characters).
        block_size: maximum context length ``T`` (64-256 for the Shakespeare task).
        n_layer: number of transformer blocks (2-6 for the Shakespeare task).
        n_head: attention heads; must divide ``n_embd``.
        n_embd: embedding width (128-384 for the Shakespeare task).
        dropout: dropout probability on embeddings, attention weights, residual outputs.
        bias: whether Linear and LayerNorm layers have biases.
    """

    vocab_size: int = 65
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GPTConfig.{name}={value!r} is invalid; expected an int >= 1")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"GPTConfig.n_head={self.n_head} does not divide n_embd={self.n_embd}; "
                "choose n_head among the divisors of n_embd"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout={self.dropout!r} is invalid; expected 0 <= p < 1")

    def num_params(self) -> int:
        """Parameters of a :class:`GPT` of these sizes (the tied head counted once).

        ``(V + T) * C`` embeddings; per block ``12*C^2`` weights plus ``13*C`` biases and
        LayerNorm parameters (``2*C`` LayerNorm weights without biases); ``2*C`` (or ``C``) for
        the final LayerNorm.
        """
        C = self.n_embd
        # biases: LayerNorms 2*2C, qkv 3C, proj C, fc 4C, fc2 C; without: LayerNorm weights 2C
        per_block = 12 * C * C + (13 * C if self.bias else 2 * C)
        final_ln = 2 * C if self.bias else C
        return (self.vocab_size + self.block_size) * C + self.n_layer * per_block + final_ln


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position ``t`` only sees positions ``<= t``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, h: Tensor) -> Tensor:
        B, T, C = h.shape
        q, k, v = self.qkv(h).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(B, T, C)))


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias),
            nn.GELU(),
            nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, h: Tensor) -> Tensor:
        h = h + self.attn(self.ln_1(h))
        return h + self.mlp(self.ln_2(h))


class GPT(nn.Module):
    """Decoder-only transformer; see the module docstring.

    Args:
        config: sizes; a default :class:`GPTConfig` if omitted.
    """

    def __init__(self, config: GPTConfig | None = None) -> None:
        super().__init__()
        cfg = config or GPTConfig()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Embedding):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for block in self.blocks:
            for proj in (block.attn.proj, block.mlp[2]):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    def logits(self, idx: Tensor) -> Tensor:
        """Next-token logits ``[B, T, vocab_size]`` for int64 ids ``[B, T]`` (T <= block_size)."""
        T = idx.shape[-1]
        if self.config.block_size < T:
            raise ValueError(
                f"sequence length {T} exceeds block_size={self.config.block_size}"
            )
        h = self.drop(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)))
        for block in self.blocks:
            h = block(h)
        return self.lm_head(self.ln_f(h))

    def forward(self, batch: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        x, y = batch
        logits = self.logits(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        out = {"loss": loss}
        if not self.training:
            out["perplexity"] = loss.exp()
        return out

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Append ``max_new_tokens`` sampled ids to ``idx [B, T0]``; returns ``[B, T0 + new]``.

        Each step feeds the last ``block_size`` ids, divides the last logits by ``temperature``,
        keeps the ``top_k`` largest (if given) and samples with ``generator``.
        """
        if temperature <= 0:
            raise ValueError(f"temperature={temperature!r} is invalid; expected > 0")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k={top_k!r} is invalid; expected an int >= 1 or None")
        for _ in range(max_new_tokens):
            logits = self.logits(idx[:, -self.config.block_size :])[:, -1, :] / temperature
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = F.softmax(logits, dim=-1)
            idx = torch.cat([idx, torch.multinomial(probs, 1, generator=generator)], dim=1)
        return idx
