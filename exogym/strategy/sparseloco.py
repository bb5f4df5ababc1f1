"""SparseLoCo: DiLoCo with a per-node error-feedback accumulator for outer momentum, sent top-k.

Reference: A. Sarfi, B. Therien, J. Lidin, E. Belilovsky, "Communication Efficient LLM Pre-training
with SparseLoCo", arXiv:2508.15706 (the update rule below), and the authors' production code,
github.com/tplr-ai/templar at commit c2397ac524c9d9de550a2a126ed37505d090d69f:
``src/tplr/compress.py`` (chunking, top-k, the quantiser, 12-bit index packing),
``src/tplr/neurons.py`` (``prepare_gradient_dict``: the error feedback; ``outer_step``: the
aggregation), ``hparams/hparams.json`` (the defaults).

With ``R`` nodes and the global parameters ``theta^(t-1)``, each outer step ``t``:

1. every node ``r`` starts from ``theta^(t-1)`` and takes ``H`` inner steps with the inner
   optimizer (AdamW), reaching ``theta_r^(t)``; ``Delta_r = theta^(t-1) - theta_r^(t)``;
2. error feedback: ``e_r <- beta e_r + Delta_r`` (``e_r`` starts at zero and is never reset);
3. ``Delta_hat_r = Q(TopK(e_r))``: the tensor is cut into chunks (as DeMo's: a matrix view
   ``[rows, cols]``, chunks of ``h x w`` with ``h``, ``w`` the largest divisors of ``rows`` and
   ``cols`` that are at most ``s``; 1-D tensors into 1-D chunks of at most ``s``; a conv kernel as
   ``[out, in * kh * kw]``, which the authors' code, written for transformers, does not handle);
   each chunk keeps its ``k_c = min(k, h w)`` entries of largest magnitude; their values are
   quantised with ``bits`` bits by the authors' statistical quantiser (``_quantize_values``), per
   tensor and node: ``shift`` = the mean of the kept values, ``scale = sigmas * std / 2^bits``
   (``std`` with ``n - 1``; 1 if that is 0 or not finite), code
   ``q = clamp(round((v - shift) / scale + 2^(bits-1)), 0, 2^bits - 1)``, decoded as
   ``shift + lookup[q]`` with ``lookup[b]`` the mean of ``v - shift`` over the values coded ``b``
   (0 for an empty bin);
4. ``e_r <- e_r - Delta_hat_r`` (what was sent leaves the accumulator, so ``Delta_hat_r + e_r``
   is exactly what step 2 accumulated, to round-off);
5. one all-gather of every node's (indices, codes, shift, lookup); every node rebuilds the same
   ``Delta = (1/R) sum_r Delta_hat_r`` (``aggregation="mean"``, the paper's mean over the ``R``
   nodes) or, per entry, the mean over the nodes that sent it (``"senders"``, the authors' code:
   ``scatter_reduce(mean, include_self=False)``), optionally after scaling each node's values of a
   tensor down to the median of the nodes' norms (``median_clip``, the authors' ``clip_norm=True``);
6. ``theta^(t) = theta^(t-1) - alpha Delta`` (plain SGD: the accumulator of step 2 replaces
   DiLoCo's outer Nesterov momentum), and every node restarts from ``theta^(t)``; each node keeps
   its inner optimizer state.

Absent nodes (a world), as in DiLoCo: ``R`` becomes the ``M`` nodes whose messages arrive (the
all-gather runs among them, ``(M-1) * S`` bytes each, nothing for the others), and only they
restart from ``theta^(t)``; an outer step where no message arrives changes nothing. A node whose
message does not arrive (down, lost, or cut by a ``deadline``) keeps its accumulator as it was
before the round (steps 2 and 4 skip it): it keeps its parameters too, so its next
pseudo-gradient measures the whole progress since ``theta`` again; accumulating it now as well
would count it twice. A node back up gets ``theta^(t)`` from a live peer and an empty
accumulator (:meth:`SparseLoCo.recover`).

Defaults: the production ``hparams.json``: ``H`` = 30 (``inner_steps``), ``beta`` = 0.95
(``momentum_decay``), ``k`` = 64 per chunk and ``s`` = 64 (``topk_compression``, ``target_chunk``:
64 x 64 = 4,096-entry chunks), ``alpha`` = 1 (``outer_learning_rate``), 2-bit values
(``quantization_bins`` 4) over 6 standard deviations (``quantization_range``), no DCT
(``use_dct: false``). Where ``alpha`` enters: the paper puts it in the outer step only (here); the
authors' code also accumulates ``alpha Delta_r`` in step 2 (``error_feedback.add_(grad,
alpha=lr)``), i.e. ``alpha^2`` overall; at the default ``alpha = 1`` the two agree. The authors'
code also rounds ``k_c`` down to an even number (its 12-bit packer pairs indices); here the index
bytes are counted as ``ceil(12 c / 8)``, which needs no pairing, so a chunk of odd size below ``k``
sends all its entries. Floating-point buffers (BatchNorm; the paper's transformers have none) are
averaged exactly in a separate all-reduce and become the global model's buffers, as in DiLoCo.

Sent per outer step (every ``H`` steps) by each node: one ring all-gather, ``(N-1) * S`` bytes,
with ``S = sum_t [ceil(b_i c_t / 8) + ceil(bits c_t / 8) + (1 + 2^bits) e]`` over the parameter
tensors ``t``: ``c_t = chunks_t * k_c`` kept entries, each a packed ``b_i``-bit index into its chunk
(``b_i`` = 12, the authors' packing, for chunks of at most 4,096 entries; ``ceil(log2(h w))`` bits
beyond) and a packed ``bits``-bit code, plus the tensor's shift and its ``2^bits``-entry lookup
table in the parameters' dtype (``e`` = 4 bytes in fp32: 20 bytes per tensor at 2 bits; the
authors' code also ships the scale, the offset and the dtype, which decoding does not need); plus
``2 (N-1)/N * B`` for the float buffers (``B`` bytes), if any. The MNIST CNN (8 tensors; 4,604
kept entries: conv1 64 + 16, conv2 8 x 64 + 32, fc1 56 x 64 + 128, fc2 2 x 64 + 10) sends ``S`` =
7,990 bytes (against ``P`` = 861,480 for the dense fp32 pseudo-gradient): at ``N = 4``, 23,970
bytes per node per outer step, 799 bytes per step at ``H = 30`` (DiLoCo: 12,922 at ``H = 100``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import Tensor

from exogym.strategy._dct import ChunkLayout
from exogym.strategy.base import StackedStrategy, in_range, positive_int, restart_rows

__all__ = ["AGGREGATIONS", "SparseLoCo", "index_bits", "pack_bits", "quantize", "unpack_bits"]

Aggregation = Literal["mean", "senders"]
AGGREGATIONS = ("mean", "senders")
_AUTHORS_INDEX_BITS = 12  # compress.py packs every index in 12 bits: chunks of <= 4,096 entries


def index_bits(area: int) -> int:
    """Bits of one index into a chunk of ``area`` entries: 12 up to 4,096 (the authors' packing),
    ``ceil(log2(area))`` beyond."""
    return max(_AUTHORS_INDEX_BITS, math.ceil(math.log2(area)))


def pack_bits(values: Tensor, bits: int) -> Tensor:
    """``[n, m]`` integers in ``[0, 2^bits)`` -> ``[n, ceil(m bits / 8)]`` uint8, little-endian:
    value ``j``'s bit ``b`` is bit ``j * bits + b`` of the stream (byte ``i`` holds bits
    ``8 i .. 8 i + 7``, low bit first); the last byte is zero-padded."""
    n, m = values.shape
    shifts = torch.arange(bits, device=values.device)
    stream = ((values.long().unsqueeze(-1) >> shifts) & 1).reshape(n, m * bits)  # [n, m bits]
    pad = (-stream.shape[1]) % 8
    stream = torch.nn.functional.pad(stream, (0, pad))
    weights = 1 << torch.arange(8, device=values.device)
    return (stream.reshape(n, -1, 8) * weights).sum(-1).to(torch.uint8)


def unpack_bits(packed: Tensor, bits: int, m: int) -> Tensor:
    """Inverse of :func:`pack_bits`: ``[n, bytes]`` uint8 -> ``[n, m]`` int64."""
    n = packed.shape[0]
    stream = (packed.long().unsqueeze(-1) >> torch.arange(8, device=packed.device)) & 1
    stream = stream.reshape(n, -1)[:, : m * bits].reshape(n, m, bits)
    return (stream << torch.arange(bits, device=packed.device)).sum(-1)


def quantize(values: Tensor, bits: int, sigmas: float) -> tuple[Tensor, Tensor, Tensor]:
    """The authors' statistical quantiser, per row of ``values`` (``[n, m]``, one row per node).

    Returns ``(codes, shift, lookup)``: codes ``[n, m]`` int64 in ``[0, 2^bits)``, ``shift``
    ``[n, 1]`` and ``lookup`` ``[n, 2^bits]`` in ``values``' dtype; the decoded values are
    ``shift + lookup.gather(1, codes)`` (see the module docstring).
    """
    bins = 1 << bits
    n, m = values.shape
    shift = values.mean(dim=1, keepdim=True)
    centered = values - shift
    std = centered.norm(dim=1, keepdim=True) / math.sqrt(m - 1) if m > 1 \
        else torch.full_like(shift, math.nan)
    scale = sigmas * std / bins
    scale = torch.where((scale == 0) | ~torch.isfinite(scale), torch.ones_like(scale), scale)
    codes = (centered / scale + bins // 2).round().clamp(0, bins - 1).long()
    sums = centered.new_zeros(n, bins).scatter_add_(1, codes, centered)
    counts = centered.new_zeros(n, bins).scatter_add_(1, codes, torch.ones_like(centered))
    lookup = torch.where(counts > 0, sums / counts.clamp_min(1), torch.zeros_like(sums))
    return codes, shift, lookup


def _dequantize(codes: Tensor, shift: Tensor, lookup: Tensor) -> Tensor:
    return shift + lookup.gather(1, codes)


def _chunks(x: Tensor, lay: ChunkLayout) -> Tensor:
    """``[n, *shape] -> [n, chunks, h * w]`` (no transform): chunk ``(y, x)`` of the matrix view,
    row-major over chunks and within a chunk, as the authors' ``rearrange('(y h) (x w) -> y x h
    w')``."""
    n = x.shape[0]
    blocks = x.reshape(n, lay.rows // lay.h, lay.h, lay.cols // lay.w, lay.w)
    return blocks.permute(0, 1, 3, 2, 4).reshape(n, lay.num_chunks, lay.area)


def _unchunk(c: Tensor, lay: ChunkLayout) -> Tensor:
    """Inverse of :func:`_chunks`: ``[n, chunks, h * w] -> [n, *shape]``."""
    n = c.shape[0]
    blocks = c.reshape(n, lay.rows // lay.h, lay.cols // lay.w, lay.h, lay.w)
    return blocks.permute(0, 1, 3, 2, 4).reshape(n, *lay.shape)


@dataclass(kw_only=True)
class SparseLoCo(StackedStrategy):
    """DiLoCo with per-node error feedback in place of outer momentum, chunked top-k, 2-bit values.

    Attributes:
        H: inner steps per outer step (the paper's H; 30 in the authors' production settings).
        beta: decay of the error-feedback accumulator, e <- beta e + Delta (0.95).
        k: entries each node sends per chunk (64).
        s: target chunk side: dimensions are cut into chunks of their largest divisor <= s
            (64: 64 x 64 = 4,096-entry chunks).
        bits: bits per sent value (2): 2^bits quantisation bins.
        sigmas: the quantiser's range in standard deviations of the kept values (6).
        alpha: outer learning rate, theta <- theta - alpha Delta (1).
        aggregation: mean (over all nodes, the paper) or senders (per entry, over the nodes that
            sent it, the authors' code).
        median_clip: scale each node's values of a tensor down to the median norm over the nodes
            before aggregating (the authors' code).
    """

    id = "sparseloco"
    supports_codec: ClassVar[bool] = False  # its own compression is the method
    derived_state = ("layouts",)  # from the parameter shapes, s and k
    H: int = 30
    beta: float = 0.95
    k: int = 64
    s: int = 64
    bits: int = 2
    sigmas: float = 6.0
    alpha: float = 1.0
    aggregation: Aggregation = "mean"
    median_clip: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int("H", self.H)
        in_range("beta", self.beta, 0.0, 1.0)
        positive_int("k", self.k)
        positive_int("s", self.s)
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) \
                or not 1 <= self.bits <= 8:
            raise ValueError(f"bits must be an integer in [1, 8], got {self.bits!r}")
        in_range("sigmas", self.sigmas, 0.0, float("inf"), lo_open=True)
        in_range("alpha", self.alpha, 0.0, float("inf"), lo_open=True)
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {list(AGGREGATIONS)}, got "
                             f"{self.aggregation!r}")
        if not isinstance(self.median_clip, bool):
            raise ValueError(f"median_clip must be True or False, got {self.median_clip!r}")

    def init_state(self) -> None:
        self.global_params, self.global_buffers = self.snapshot()
        # e_r, one accumulator per node: [N, *shape], never communicated.
        self.error = {name: torch.zeros_like(p, requires_grad=False)
                      for name, p in self.nodes.params.items()}
        self.layouts = {name: ChunkLayout.of(p.shape[1:], self.s, self.k)
                        for name, p in self.nodes.params.items()}

    def payload_bytes(self) -> int:
        """``S``: the bytes one node contributes to the all-gather of an outer step."""
        total = 0
        for name, p in self.nodes.params.items():
            lay = self.layouts[name]
            kept = lay.num_chunks * lay.k
            total += math.ceil(index_bits(lay.area) * kept / 8) + math.ceil(self.bits * kept / 8)
            total += (1 + (1 << self.bits)) * p.element_size()
        return total

    @torch.no_grad()
    def step(self, step: int) -> None:
        self.inner_step()
        if (step + 1) % self.H == 0:
            self.outer_step()

    @torch.no_grad()
    def outer_step(self) -> None:
        """Accumulate, compress and send every node's pseudo-gradient; step and restart (absent
        nodes: the module docstring)."""
        members = self.arrivals()  # a world's: the active nodes whose messages arrive
        heard = None if members is None else self.comm.local_rows(members, self.nodes.device)
        names = list(self.nodes.params)
        payload: list[Tensor] = []
        for name in names:
            p, e, lay = self.nodes.params[name], self.error[name], self.layouts[name]
            before = e.clone() if heard is not None else None
            e.mul_(self.beta).add_(self.global_params[name].unsqueeze(0) - p)         # 2
            idx, val = lay.top_k(_chunks(e, lay))                                      # 3
            n = val.shape[0]
            codes, shift, lookup = quantize(val.reshape(n, -1), self.bits, self.sigmas)
            sent = _dequantize(codes, shift, lookup).view_as(val)
            e.sub_(_unchunk(lay.scatter(idx, sent), lay))                              # 4
            if before is not None:  # a node not heard keeps its accumulator (docstring)
                e.copy_(torch.where(heard.view(-1, *([1] * (e.dim() - 1))), e, before))
            payload += [pack_bits(idx.reshape(n, -1), index_bits(lay.area)),
                        pack_bits(codes, self.bits), torch.cat([shift, lookup], dim=1)]
        if members is not None and not any(members):
            return  # nobody's message arrives: no outer step, every node keeps its parameters
        gathered = self.comm.all_gather(payload, tag="sparseloco", members=members)   # 5
        senders = None if members is None else torch.tensor(members, device=self.nodes.device)
        for j, name in enumerate(names):
            lay = self.layouts[name]
            parts = gathered[3 * j: 3 * j + 3]
            if senders is not None:
                parts = [t[senders] for t in parts]
            delta = self._aggregate(lay, *parts)
            theta = self.global_params[name]
            theta.sub_(delta, alpha=self.alpha)                                        # 6
            keep = None if members is None else self.comm.local_rows(members, theta.device)
            restart_rows(self.nodes.params[name], theta, keep)
        buffers = list(self.nodes.float_buffers.values())
        means = (list(self.comm.all_reduce(buffers, "mean", tag="buffers", members=members))
                 if buffers else [])
        self.adopt_buffers(means, self.global_buffers,
                           None if members is None
                           else self.comm.local_rows(members, self.nodes.device))

    def recover(self, node: int, donor: int) -> None:
        """A node back up gets the global model from a live peer (DiLoCo's recovery) and an empty
        error-feedback accumulator: what it had accumulated and not sent is lost with it."""
        self.recover_from_global(node, donor, self.global_params, self.global_buffers)
        row = self._row(node)
        if row is not None:
            for e in self.error.values():
                e[row].zero_()

    def _aggregate(self, lay: ChunkLayout, packed_idx: Tensor, packed_codes: Tensor,
                   meta: Tensor) -> Tensor:
        """``Delta`` (one node's shape) from the gathered payloads of all ``N`` nodes."""
        num = packed_idx.shape[0]
        kept = lay.num_chunks * lay.k
        idx = unpack_bits(packed_idx, index_bits(lay.area), kept).view(num, lay.num_chunks, lay.k)
        codes = unpack_bits(packed_codes, self.bits, kept)
        vals = _dequantize(codes, meta[:, :1], meta[:, 1:]).view(num, lay.num_chunks, lay.k)
        if self.median_clip:
            norms = vals.reshape(num, -1).norm(dim=1)                       # [N]
            factor = (norms.median() / (norms + 1e-8)).clamp(max=1.0)
            vals = vals * factor.view(num, 1, 1)
        if self.aggregation == "mean":
            dense = lay.scatter(idx, vals).sum(0, keepdim=True) / num
        else:
            dense = lay.combine(idx, vals)
        return _unchunk(dense, lay)[0]

    def global_state(self) -> dict[str, Tensor]:
        out = {k: v.clone() for k, v in self.global_params.items()}
        out.update({k: v.clone() for k, v in self.global_buffers.items()})
        return out
