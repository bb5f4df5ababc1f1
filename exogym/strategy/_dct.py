"""Chunked 2-D DCT and top-k sparsification for DeMo (:mod:`exogym.strategy.demo`).

Every tensor is seen as a matrix ``[R, C]``: a 2-D tensor as it is, a 1-D tensor of length ``L``
as ``[1, L]`` (so its chunks are 1-D, as in the reference implementation), a tensor with more
dimensions (a conv kernel ``[out, in, kh, kw]``) as ``[shape[0], prod(shape[1:])]``, a scalar as
``[1, 1]``. The matrix is cut into ``h x w`` chunks, ``h`` = the largest divisor of ``R`` that is
at most ``s`` and ``w`` the same for ``C`` (:func:`chunk_size`), and each chunk is transformed by
the orthonormal 2-D DCT-II ``c = D_h x D_w^T`` (:func:`dct_matrix`). Its inverse is
``x = D_h^T c D_w``. All of it runs on node-stacked tensors ``[n, *shape]`` with two matrix
products, batched over nodes and chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["ChunkLayout", "chunk_size", "dct_matrix", "index_dtype"]


def chunk_size(n: int, s: int) -> int:
    """The largest divisor of ``n`` that is at most ``s`` (``n`` itself when ``n <= s``)."""
    if n < 1 or s < 1:
        raise ValueError(f"chunk_size needs n >= 1 and s >= 1, got n={n}, s={s}")
    return max(d for d in range(1, min(n, s) + 1) if n % d == 0)


def dct_matrix(n: int, *, dtype: torch.dtype = torch.float64,
               device: torch.device | str | None = None) -> Tensor:
    """The orthonormal DCT-II matrix ``D`` (``[n, n]``): ``c = D @ x`` is the DCT of ``x``.

    ``D[f, i] = a_f cos(pi (2 i + 1) f / (2 n))`` with ``a_0 = sqrt(1 / n)``, ``a_f = sqrt(2 / n)``
    for ``f >= 1`` (scipy's ``dct(norm="ortho")``); ``D D^T = I``, so the inverse is ``D^T``.
    Computed in float64, then cast to ``dtype``.
    """
    f = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    i = torch.arange(n, dtype=torch.float64).unsqueeze(0)
    d = torch.cos(math.pi * (2.0 * i + 1.0) * f / (2.0 * n)) * math.sqrt(2.0 / n)
    d[0] = math.sqrt(1.0 / n)
    return d.to(dtype=dtype, device=device)


def index_dtype(area: int) -> torch.dtype:
    """The smallest integer dtype that holds the indices ``0 .. area - 1`` of a chunk.

    ``uint8`` up to 256 entries (a 1-D chunk of <= 64, a 16 x 16 chunk), ``int16`` up to 32,768
    (a 64 x 64 chunk: 4,096), ``int32`` beyond.
    """
    if area <= 1 << 8:
        return torch.uint8
    if area <= 1 << 15:
        return torch.int16
    return torch.int32


@dataclass(frozen=True)
class ChunkLayout:
    """How one tensor (one node's shape) is chunked, transformed and sparsified.

    Attributes:
        shape: one node's tensor shape.
        rows / cols: the matrix view ``[rows, cols]`` of the tensor.
        h / w: chunk height and width (largest divisors of rows / cols that are <= s).
        k: components kept per chunk, ``min(k, h * w)``.
    """

    shape: tuple[int, ...]
    rows: int
    cols: int
    h: int
    w: int
    k: int

    @classmethod
    def of(cls, shape: tuple[int, ...] | torch.Size, s: int, k: int) -> ChunkLayout:
        shape = tuple(shape)
        if len(shape) == 0:
            rows, cols = 1, 1
        elif len(shape) == 1:
            rows, cols = 1, shape[0]
        else:
            rows, cols = shape[0], math.prod(shape[1:])
        h, w = chunk_size(rows, s), chunk_size(cols, s)
        return cls(shape, rows, cols, h, w, min(k, h * w))

    @property
    def num_chunks(self) -> int:
        return (self.rows // self.h) * (self.cols // self.w)

    @property
    def area(self) -> int:
        """Components per chunk, ``h * w``."""
        return self.h * self.w

    @property
    def index_dtype(self) -> torch.dtype:
        return index_dtype(self.area)

    def payload_bytes(self, value_bytes: int) -> int:
        """Bytes one node sends for this tensor: ``chunks * k * (index bytes + value bytes)``."""
        index_bytes = torch.empty((), dtype=self.index_dtype).element_size()
        return self.num_chunks * self.k * (index_bytes + value_bytes)

    def encode(self, x: Tensor, dct: dict[int, Tensor]) -> Tensor:
        """``[n, *shape] -> [n, chunks, h * w]``: the 2-D DCT of every chunk, row-major in the
        chunk (index ``a * w + b`` is vertical frequency ``a``, horizontal frequency ``b``)."""
        n = x.shape[0]
        blocks = x.reshape(n, self.rows // self.h, self.h, self.cols // self.w, self.w)
        c = torch.einsum("fi,nyixj,gj->nyxfg", dct[self.h], blocks, dct[self.w])
        return c.reshape(n, self.num_chunks, self.area)

    def decode(self, c: Tensor, dct: dict[int, Tensor]) -> Tensor:
        """Inverse of :meth:`encode`: ``[n, chunks, h * w] -> [n, *shape]``."""
        n = c.shape[0]
        blocks = c.reshape(n, self.rows // self.h, self.cols // self.w, self.h, self.w)
        x = torch.einsum("fi,nyxfg,gj->nyixj", dct[self.h], blocks, dct[self.w])
        return x.reshape(n, *self.shape)

    def top_k(self, c: Tensor) -> tuple[Tensor, Tensor]:
        """The ``k`` largest-magnitude components of each chunk: ``(indices int64, values)``,
        both ``[n, chunks, k]``."""
        idx = torch.topk(c.abs(), self.k, dim=-1, largest=True, sorted=False).indices
        return idx, torch.gather(c, -1, idx)

    def scatter(self, idx: Tensor, val: Tensor) -> Tensor:
        """Dense ``[n, chunks, h * w]`` coefficients: ``val`` at ``idx``, zero elsewhere."""
        dense = val.new_zeros(*val.shape[:-1], self.area)
        return dense.scatter_(-1, idx, val)

    def combine(self, idx: Tensor, val: Tensor) -> Tensor:
        """What every node rebuilds from the gathered ``[N, chunks, k]`` components of all nodes:
        ``[1, chunks, h * w]``, each component the mean over the nodes that sent it (zero where
        none did), as the reference's ``scatter_reduce(mean, include_self=False)``.

        Summed over the node dimension (no atomic adds), so deterministic on every device.
        """
        total = self.scatter(idx, val).sum(0, keepdim=True)
        senders = self.scatter(idx, torch.ones_like(val)).sum(0, keepdim=True)
        return total / senders.clamp_min(1.0)
