"""Codecs: what each node does to a tensor before sending it (lossy transport).

A :class:`Codec` turns one node's row of a node-stacked tensor into what the receivers
reconstruct, and says how many bytes that row costs on the wire. The communicator applies it to
every row (``comm.all_reduce(x, codec=c)``), reduces the *reconstructions* and charges the
compressed payload in its byte formulas. Build one from a spec string with :func:`make_codec`.

Specs and bytes per row of ``n`` elements (``e`` = element size of the tensor's dtype, 4 for fp32):

=================  ======================================================  ======================
spec               transport                                               bytes per row
=================  ======================================================  ======================
``fp16``/``bf16``  cast to the 16-bit float and back                       ``2 n``
``int8``           symmetric absmax, one fp32 scale per row                ``n + 4``
``int8:C``         symmetric absmax, one fp32 scale per chunk of ``C``     ``n + 4 ceil(n / C)``
``int4[:C]``       symmetric absmax to [-7, 7] (two codes per byte)        ``ceil(n/2) + 4 s``
``fp4[:C]``        FP4 E3M0 (sign + 3 exponent bits) times an absmax scale ``ceil(n/2) + 4 s``
``topk:F``         the ``k = ceil(F n)`` largest magnitudes, sparse        ``k e + 4 k``
``randk:F``        ``k = ceil(F n)`` entries at shared random indices      ``k e``
=================  ======================================================  ======================

(``s`` = number of scales: 1, or ``ceil(n / C)`` with ``:C``.) Quantized codecs (int8, int4,
fp4) compute in fp32 and return the input dtype; their scales travel as fp32.

Error feedback (``make_codec(spec, error_feedback=True)``; F. Seide, H. Fu, J. Droppo, G. Li,
D. Yu, "1-Bit Stochastic Gradient Descent and its Application to Data-Parallel Distributed
Training of Speech DNNs", Interspeech 2014; S. P. Karimireddy, Q. Rebjock, S. U. Stich, M. Jaggi,
"Error Feedback Fixes SignSGD and other Gradient Compression Schemes", ICML 2019,
arXiv:1901.09847, Algorithm 2 "EF-SGD"): every node keeps, per call site ``key``, a residual
``e`` (zero at first); it sends ``c = C(x + e)`` and keeps ``e <- (x + e) - c``. The bytes are
those of the inner codec.

The reduction (an all-reduce's sum or mean) of the reconstructions happens in fp32 (fp64 for fp64
tensors). A real ring all-reduce of quantized data re-quantizes the partial sums at every hop of
its reduce-scatter; this simulation quantizes once per node, which is the lower bound of the
transport error.
"""

from __future__ import annotations

import abc
import hashlib
import math
from collections.abc import Hashable
from fractions import Fraction
from typing import Any, ClassVar

import torch
from torch import Tensor

__all__ = [
    "VALID_SPECS",
    "CastCodec",
    "Codec",
    "ErrorFeedback",
    "FP4Codec",
    "IntCodec",
    "RandKCodec",
    "TopKCodec",
    "make_codec",
]

VALID_SPECS = (
    "none", "fp16", "bf16", "int8", "int8:CHUNK", "int4", "int4:CHUNK", "fp4", "fp4:CHUNK",
    "topk:FRACTION", "randk:FRACTION",
)
_SCALE_BYTES = 4  # every scale travels as one fp32


class Codec(abc.ABC):
    """What each node does to a tensor before sending it (lossy transport).

    Attributes:
        name: the spec that builds this codec (``"int8:256"``, ``"topk:0.1+ef"``).
        sparse: True when each node sends its own index set (top-k): an all-reduce then travels
            as an all-gather of every node's payload, ``(N-1) x payload`` per node.
        sparsifying: True when the reconstruction drops entries (top-k, random-k): zeros where
            nothing was sent. Sensible for updates, not for parameters.
    """

    name: str = ""
    sparse: bool = False
    sparsifying: bool = False

    def roundtrip(self, x: Tensor, key: Hashable, rows: Tensor | None = None) -> Tensor:
        """What the receivers reconstruct from each row of the node-stacked ``x``.

        ``x`` is ``[n_local, ...]``; the result has its shape and dtype. ``key`` identifies the
        call site (error feedback keeps a residual per key and node). ``x`` is not modified.
        ``rows`` (int64 row indices): only those rows send (the others are absent from this
        call: their reconstruction is zeros and their error-feedback residual is untouched).
        """
        if not isinstance(x, Tensor) or x.dim() == 0 or not x.is_floating_point():
            what = f"a {x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, Tensor) \
                else type(x).__name__
            raise ValueError(
                f"codec {self.name!r} takes a node-stacked floating-point tensor [n_local, ...], "
                f"got {what}"
            )
        if x[0].numel() == 0:
            return x.clone()
        if rows is None:
            return self._roundtrip(x, key)
        out = torch.zeros_like(x)
        if rows.numel():
            out[rows] = self._roundtrip_rows(x, key, rows)
        return out

    def _roundtrip_rows(self, x: Tensor, key: Hashable, rows: Tensor) -> Tensor:
        """The reconstruction of the rows ``rows`` of ``x`` only (codecs work row by row)."""
        return self._roundtrip(x.index_select(0, rows), key)

    @abc.abstractmethod
    def _roundtrip(self, x: Tensor, key: Hashable) -> Tensor: ...

    @abc.abstractmethod
    def payload_bytes(self, numel: int, dtype: torch.dtype) -> int:
        """Bytes ONE node sends for one row of ``numel`` elements of ``dtype`` (all included)."""

    def reset(self) -> None:  # noqa: B027 - stateless codecs have nothing to reset
        """Forget any state (error-feedback residuals, call counters)."""

    def state_dict(self) -> dict[str, Any]:
        """What the codec carries between calls (a checkpoint's part): nothing for a stateless
        codec; tensors are returned by reference."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s content (its tensors on the device they are given on)."""
        if state:
            raise ValueError(f"codec {self.name!r} has no state, got keys {sorted(state)}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class CastCodec(Codec):
    """``fp16`` / ``bf16``: cast each element to a 16-bit float and back; ``2 n`` bytes per row.

    The cast rounds to nearest (ties to even); fp16 overflows to +-inf above 65504, bf16 keeps
    fp32's range with 8 significant bits.
    """

    _DTYPES: ClassVar[dict[str, torch.dtype]] = {"fp16": torch.float16, "bf16": torch.bfloat16}

    def __init__(self, name: str) -> None:
        if name not in self._DTYPES:
            raise ValueError(f"CastCodec name must be one of {list(self._DTYPES)}, got {name!r}")
        self.name = name
        self.wire_dtype = self._DTYPES[name]

    def _roundtrip(self, x: Tensor, key: Hashable) -> Tensor:
        return x.to(self.wire_dtype).to(x.dtype)

    def payload_bytes(self, numel: int, dtype: torch.dtype) -> int:
        return 2 * numel


class _ScaledCodec(Codec):
    """Absmax-scaled codes; one fp32 scale per row, or per chunk of ``chunk`` elements.

    A row of ``n`` elements is cut into ``ceil(n / chunk)`` consecutive chunks (the last one may be
    shorter); each chunk's ``absmax`` sets its scale.
    """

    bits: int = 8
    base: str = ""

    def __init__(self, chunk: int | None = None) -> None:
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int)
                                  or chunk < 1):
            raise ValueError(f"{self.base} chunk size must be an integer >= 1, got {chunk!r}")
        self.chunk = chunk
        self.name = self.base if chunk is None else f"{self.base}:{chunk}"

    def num_scales(self, numel: int) -> int:
        """``1`` per row, or ``ceil(numel / chunk)``."""
        return 1 if self.chunk is None else -(-numel // self.chunk)

    def payload_bytes(self, numel: int, dtype: torch.dtype) -> int:
        return -(-numel * self.bits // 8) + _SCALE_BYTES * self.num_scales(numel)

    def _roundtrip(self, x: Tensor, key: Hashable) -> Tensor:
        n = x.shape[0]
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        rows = x.reshape(n, -1).to(work)
        numel = rows.shape[1]
        chunk = numel if self.chunk is None else self.chunk
        chunks = -(-numel // chunk)
        pad = chunks * chunk - numel
        if pad:
            rows = torch.nn.functional.pad(rows, (0, pad))
        blocks = rows.view(n, chunks, chunk)
        absmax = blocks.abs().amax(dim=2, keepdim=True)
        deq = self._quantize(blocks, absmax.to(torch.float32).to(work))
        return deq.reshape(n, -1)[:, :numel].reshape(x.shape).to(x.dtype)

    @abc.abstractmethod
    def _quantize(self, blocks: Tensor, absmax: Tensor) -> Tensor:
        """Quantize-dequantize ``blocks`` ``[n, chunks, chunk]`` given each chunk's absmax."""


class IntCodec(_ScaledCodec):
    """``int8[:C]`` / ``int4[:C]``: symmetric absmax integer quantization.

    With ``q_max = 2^(b-1) - 1`` (127 for int8, 7 for int4) and ``scale = absmax / q_max`` (fp32,
    per row or per chunk): ``q = clamp(round(x / scale), -q_max, q_max)`` (round half to even),
    reconstructed as ``q * scale``; hence ``|x - q(x)| <= scale / 2``. An all-zero chunk has
    scale 0 and reconstructs as zeros. Bytes per row: ``ceil(n b / 8) + 4 s`` (``s`` scales):
    ``n + 4 s`` for int8, ``ceil(n / 2) + 4 s`` for int4 (two codes per byte).
    """

    def __init__(self, bits: int, chunk: int | None = None) -> None:
        if bits not in (4, 8):
            raise ValueError(f"IntCodec bits must be 4 or 8, got {bits!r}")
        self.bits = bits
        self.base = f"int{bits}"
        self.q_max = 2 ** (bits - 1) - 1
        super().__init__(chunk)

    def _quantize(self, blocks: Tensor, absmax: Tensor) -> Tensor:
        scale = absmax / self.q_max
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(blocks / safe).clamp_(-self.q_max, self.q_max)
        return q * scale


class FP4Codec(_ScaledCodec):
    """``fp4[:C]``: FP4 E3M0, the 4-bit float of Streaming DiLoCo (Douillard et al. 2025).

    A. Douillard, Y. Donchev, K. Rush, S. Kale, et al., "Streaming DiLoCo with overlapping
    communication: Towards a Distributed Free Lunch", arXiv:2501.18512: outer gradients are
    exchanged as 4-bit floats E3M0, 1 sign bit, 3 exponent bits, no mantissa.

    Our precise definition (the paper does not spell out the bias and rounding): with ``scale =
    absmax`` (fp32, per row or per chunk), ``y = x / scale`` lies in ``[-1, 1]``. The 3-bit exponent
    field ``E`` encodes magnitude ``0`` for ``E = 0`` and ``2^(E - 7)`` for ``E = 1..7`` (bias 7,
    no infinities, no NaN), i.e. ``|y|`` is one of ``{0, 2^-6, 2^-5, 2^-4, 2^-3, 2^-2, 2^-1, 1}``.
    Rounding is to the nearest representable magnitude in linear value: between ``2^(m-1)`` and
    ``2^m`` the midpoint is ``0.75 * 2^m`` (a tie goes to the larger magnitude); below ``2^-6``
    the midpoint to zero is ``2^-7`` (a tie goes to ``2^-6``). The sign is kept; the reconstruction
    is ``sign(y) * level * scale``. The largest entry of each chunk is thus exact and the relative
    error of any entry with ``|y| >= 2^-6`` is at most 1/3. Bytes per row: ``ceil(n / 2) + 4 s``.
    """

    bits = 4
    base = "fp4"
    min_exponent = -6  # smallest nonzero magnitude 2^-6 (exponent field 1, bias 7)

    def _quantize(self, blocks: Tensor, absmax: Tensor) -> Tensor:
        safe = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
        y = blocks / safe
        mag = y.abs()
        # The power of two at or below |y|, clamped into the representable exponents [-6, 0].
        lower = torch.exp2(torch.floor(torch.log2(mag.clamp(min=2.0 ** self.min_exponent)))
                           .clamp_(self.min_exponent, 0))
        level = torch.where(mag >= 1.5 * lower, 2 * lower, lower).clamp_(max=1.0)
        level = torch.where(mag >= 2.0 ** (self.min_exponent - 1), level,
                            torch.zeros_like(level))
        return torch.sign(y) * level * absmax


def _fraction(value: str | float, spec: str) -> Fraction:
    try:
        frac = Fraction(str(value))
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"codec {spec!r}: the fraction must be a number in (0, 1], "
                         f"got {value!r}") from None
    if not 0 < frac <= 1:
        raise ValueError(f"codec {spec!r}: the fraction must be in (0, 1], got {value!r}")
    return frac


class _SparseCodec(Codec):
    """Shared helpers of top-k and random-k: ``k = ceil(F * n)`` of ``n`` entries per row."""

    base: str = ""
    sparsifying = True

    def __init__(self, fraction: str | float) -> None:
        self.fraction = _fraction(fraction, f"{self.base}:{fraction}")
        self.name = f"{self.base}:{fraction}"

    def k(self, numel: int) -> int:
        """Entries kept per row: ``ceil(F * numel)`` (exact rational arithmetic), at least 1."""
        return max(1, min(numel, math.ceil(self.fraction * numel)))


class TopKCodec(_SparseCodec):
    """``topk:F``: each node keeps its ``k = ceil(F n)`` largest-magnitude entries, zeros the rest.

    Every node picks its own indices, so it sends ``k`` values (the tensor's dtype, ``e`` bytes
    each) and ``k`` int32 indices: ``k e + 4 k`` bytes per row. Different nodes' index sets cannot
    be summed along a ring, so an all-reduce travels as an all-gather of the sparse payloads
    (``sparse = True``). Ties in magnitude are broken by ``torch.topk``.
    """

    base = "topk"
    sparse = True

    def _roundtrip(self, x: Tensor, key: Hashable) -> Tensor:
        rows = x.reshape(x.shape[0], -1)
        idx = rows.abs().topk(self.k(rows.shape[1]), dim=1, sorted=False).indices
        out = torch.zeros_like(rows).scatter_(1, idx, rows.gather(1, idx))
        return out.view(x.shape)

    def payload_bytes(self, numel: int, dtype: torch.dtype) -> int:
        k = self.k(numel)
        return k * _element_size(dtype) + 4 * k


class RandKCodec(_SparseCodec):
    """``randk:F``: ``k = ceil(F n)`` entries at random indices, the same on every node.

    The indices of the ``c``-th call (counted over this codec's lifetime, all call sites) are
    ``randperm(n)[:k]`` drawn from a CPU ``torch.Generator`` seeded from ``(seed, c)`` by
    :meth:`generator_seed` (a hash, so that no two ``(seed, c)`` share a stream); every node
    runs the same calls in the same order, so all draw the same indices and none has to be sent:
    the payload is the ``k`` values only, ``k e`` bytes per row. Because the index set is shared,
    the nodes can sum the ``k``-vectors along an ordinary ring, so an all-reduce is accounted as a
    dense all-reduce of ``k e`` bytes (``sparse = False``).

    The reconstruction is the *unscaled* sparse vector (the kept entries as they are, zeros
    elsewhere), not the unbiased ``(n / k)``-scaled one: the unscaled operator is a contraction,
    ``E||C(x) - x||^2 = (1 - k/n) ||x||^2``, which is what error feedback needs to converge
    (Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory", NeurIPS 2018, arXiv:1809.07599); the
    scaled one has error ``(n/k - 1) ||x||^2``, larger than ``||x||^2`` for ``k < n/2``, and would
    make the error-feedback residual grow. Without error feedback, unscaled rand-k shrinks the
    update by ``k/n`` in expectation.
    """

    base = "randk"

    def __init__(self, fraction: str | float, seed: int = 0) -> None:
        super().__init__(fraction)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
            raise ValueError(f"randk seed must be an integer in [0, 2^31), got {seed!r}")
        self.seed = seed
        self.calls = 0

    def reset(self) -> None:
        self.calls = 0

    def state_dict(self) -> dict[str, Any]:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calls = int(state["calls"])

    def generator_seed(self, call: int) -> int:
        """Seed of call number ``call``: the first 8 bytes (little-endian) of
        ``BLAKE2b("{seed}:{call}")``, masked to 32 bits (torch's CPU generator keeps 32)."""
        digest = hashlib.blake2b(f"{self.seed}:{call}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") & 0xFFFFFFFF

    def _roundtrip(self, x: Tensor, key: Hashable) -> Tensor:
        rows = x.reshape(x.shape[0], -1)
        numel = rows.shape[1]
        gen = torch.Generator(device="cpu").manual_seed(self.generator_seed(self.calls))
        self.calls += 1
        idx = torch.randperm(numel, generator=gen)[: self.k(numel)].to(x.device)
        out = torch.zeros_like(rows)
        out[:, idx] = rows[:, idx]
        return out.view(x.shape)

    def payload_bytes(self, numel: int, dtype: torch.dtype) -> int:
        return self.k(numel) * _element_size(dtype)


class ErrorFeedback(Codec):
    """Error feedback around ``inner`` (Seide et al. 2014; Karimireddy et al. 2019, EF-SGD).

    Per call site ``key`` every node keeps a residual ``e`` (zeros at the first call, fp32, or
    fp64 for fp64 tensors); a call with ``x`` sends ``c = C(x + e)`` and keeps
    ``e <- (x + e) - c``. Bytes and sparsity are the inner codec's. A key's residual is tied to the
    shape of its first tensor; a different shape under the same key is an error.
    """

    def __init__(self, inner: Codec) -> None:
        if isinstance(inner, ErrorFeedback):
            raise ValueError("error feedback cannot wrap another ErrorFeedback codec")
        self.inner = inner
        self.name = f"{inner.name}+ef"
        self.sparse = inner.sparse
        self.sparsifying = inner.sparsifying
        self.residuals: dict[Hashable, Tensor] = {}

    def reset(self) -> None:
        self.residuals.clear()
        self.inner.reset()

    def state_dict(self) -> dict[str, Any]:
        """Every node's residual per call site (by reference) and the inner codec's state."""
        return {"residuals": dict(self.residuals), "inner": self.inner.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.residuals = {key: value.clone() for key, value in state["residuals"].items()}
        self.inner.load_state_dict(state["inner"])

    def _roundtrip_rows(self, x: Tensor, key: Hashable, rows: Tensor) -> Tensor:
        """Error feedback for the sending rows only: the absent rows keep their residuals."""
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        e = self.residuals.get(key)
        if e is None:
            e = self.residuals[key] = torch.zeros_like(x, dtype=work)
        elif e.shape != x.shape:
            raise ValueError(f"error feedback: call site {key!r} had shape {tuple(e.shape)}, "
                             f"now {tuple(x.shape)}")
        corrected = x.index_select(0, rows).to(work) + e.index_select(0, rows)
        c = self.inner.roundtrip(corrected.to(x.dtype) if x.dtype != work else corrected, key)
        e[rows] = corrected - c.to(work)
        return c

    def _roundtrip(self, x: Tensor, key: Hashable) -> Tensor:
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        e = self.residuals.get(key)
        if e is None:
            corrected = x.to(work)
        elif e.shape != x.shape:
            raise ValueError(f"error feedback: call site {key!r} had shape {tuple(e.shape)}, "
                             f"now {tuple(x.shape)}")
        else:
            corrected = x.to(work) + e
        c = self.inner.roundtrip(corrected.to(x.dtype) if x.dtype != work else corrected, key)
        self.residuals[key] = corrected - c.to(work)
        return c

    def payload_bytes(self, numel: int, dtype: torch.dtype) -> int:
        return self.inner.payload_bytes(numel, dtype)


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _chunk_arg(base: str, arg: str, spec: str) -> int:
    try:
        chunk = int(arg)
    except ValueError:
        chunk = 0
    if chunk < 1:
        raise ValueError(f"codec {spec!r}: CHUNK must be an integer >= 1, got {arg!r}")
    return chunk


def make_codec(spec: str | None, *, error_feedback: bool = False, seed: int = 0) -> Codec | None:
    """Build a codec from its spec (see the module docstring for the table).

    ``None``/``"none"`` -> ``None`` (no codec; ``error_feedback`` must then be False);
    ``"fp16"``, ``"bf16"``, ``"int8"`` (per-row scale), ``"int8:CHUNK"`` (per-chunk scales),
    ``"int4[:CHUNK]"``, ``"fp4[:CHUNK]"`` (FP4 E3M0, as Streaming DiLoCo), ``"topk:FRACTION"``,
    ``"randk:FRACTION"`` (FRACTION in (0, 1]). ``error_feedback`` wraps the codec in
    :class:`ErrorFeedback`; ``seed`` seeds randk's shared index generator. Anything else is a
    ``ValueError`` that lists the valid specs.
    """
    if not isinstance(error_feedback, bool):
        raise ValueError(f"error_feedback must be True or False, got {error_feedback!r}")
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "none"):
        if error_feedback:
            raise ValueError("error_feedback=True needs a codec; got codec None")
        return None
    valid = ", ".join(VALID_SPECS)
    if not isinstance(spec, str):
        raise ValueError(f"codec must be a string spec or None, got {spec!r}; valid: {valid}")
    text = spec.strip().lower()
    base, _, arg = text.partition(":")
    codec: Codec
    if base in ("fp16", "bf16") and not arg:
        codec = CastCodec(base)
    elif base in ("int8", "int4", "fp4"):
        chunk = _chunk_arg(base, arg, spec) if arg else None
        codec = IntCodec(int(base[3:]), chunk) if base.startswith("int") else FP4Codec(chunk)
    elif base == "topk" and arg:
        codec = TopKCodec(arg)
    elif base == "randk" and arg:
        codec = RandKCodec(arg, seed)
    else:
        raise ValueError(f"unknown codec {spec!r}; valid specs: {valid} "
                         "(CHUNK an integer >= 1, FRACTION in (0, 1])")
    return ErrorFeedback(codec) if error_feedback else codec
