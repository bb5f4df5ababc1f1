"""What one node's training step does, counted once on the user's own model: its FLOPs, the
bytes its kernels move and the kernels it launches (docs/devices.md).

:func:`count_step` runs one training step (forward and backward on one node's batch, each
micro-batch as the run takes them, under bf16 autocast where the run is; then the inner
optimizer's step) on a deep copy of the model, under a :class:`torch.utils._python_dispatch.
TorchDispatchMode` that sees every ATen kernel, and records for each:

- **matmul FLOPs** of the matrix products, convolutions and attention, by PyTorch's own
  formulas: the registry of :class:`torch.utils.flop_counter.FlopCounterMode` (a multiply-add
  is 2 FLOPs; a convolution's backward counts the gradients it computes; CPU's fused attention
  kernel, which that registry does not list, by the same formula as the CUDA ones). Their sum
  equals ``FlopCounterMode``'s count of the same step (a test);
- **elementwise FLOPs** of every other kernel, a stated count: one FLOP per element of its
  largest operand (an add, an activation, a reduction's input, an optimizer's update term;
  a ``_foreach`` kernel's operand is its list of tensors, all their elements);
  copies and fills count none. Every such kernel is bound by memory on every device here, so
  this count is reported, not what prices it;
- **bytes**: what the kernel reads (each distinct input tensor once) and writes (its
  outputs), at most each tensor's storage: an eager kernel's traffic, with no fusion;
- **one kernel launch** per kernel; views (outputs that alias an input without writing it:
  ``view``, ``t``, ``expand``, ...) launch none and move nothing.

The optimizer is counted as it runs on an accelerator: fused where exogym builds it fused
(AdamW: one kernel), else in its ``foreach`` form where it has one (one kernel per operation
over all the parameters; on a CPU PyTorch defaults to a kernel per parameter); its second step
(the first creates its state). A fused kernel counts one elementwise FLOP per element, like
any other: its bytes, which price it, are exact. The global RNG is saved and restored; the caller's
model is untouched.

The result (:class:`StepCount`) keeps every distinct kernel with its multiplicity, so that a
device profile (:mod:`exogym.sim.devices`) prices each on its roofline.
"""

from __future__ import annotations

import contextlib
import copy
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import FlopCounterMode

from exogym.sim.compute import OptimizerBuilder
from exogym.sim.engine import Precision, loss_of, run_model

__all__ = ["Kernel", "StepCount", "count_step", "flop_counter"]

aten = torch.ops.aten

#: Kernel kinds: ``"mm"`` (a matrix product or attention), ``"conv"`` (a convolution, priced at
#: TF32 in fp32 where a device has it: cuDNN's default) and ``"ew"`` (anything else).
KINDS = ("mm", "conv", "ew")

# Kernels that move data and compute nothing.
_MOVES = frozenset({
    aten.copy_, aten._to_copy, aten.clone, aten.fill_, aten.zero_, aten.zeros, aten.zeros_like,
    aten.ones, aten.ones_like, aten.empty, aten.empty_like, aten.empty_strided, aten.full,
    aten.full_like, aten.new_zeros, aten.new_empty, aten.new_empty_strided, aten.new_full,
    aten.cat, aten.stack, aten.index_select, aten.gather, aten.scatter, aten.embedding,
    aten.embedding_dense_backward, aten.lift_fresh, aten.scalar_tensor, aten.arange,
    aten.constant_pad_nd, aten._foreach_copy_, aten._foreach_zero_, aten.detach,
    aten.select_backward, aten.slice_backward, aten.masked_fill,
})
# Kernels that are not run on the device at all (metadata, RNG state).
_FREE = frozenset({aten._local_scalar_dense, aten.set_, aten.resize_, aten._unsafe_view})
_CONV = frozenset({aten.convolution, aten._convolution, aten.convolution_backward,
                   aten.cudnn_convolution, aten._slow_conv2d_forward,
                   aten.convolution_overrideable})


def flop_counter() -> FlopCounterMode:
    """PyTorch's :class:`FlopCounterMode` (no display) with CPU's fused attention kernels, which
    its registry does not list, counted by the formulas of the CUDA ones."""
    counter = FlopCounterMode(display=False)
    registry = counter.flop_registry  # its formulas, already taking tensors
    registry[aten._scaled_dot_product_flash_attention_for_cpu] = registry[
        aten._scaled_dot_product_flash_attention]
    registry[aten._scaled_dot_product_flash_attention_for_cpu_backward] = registry[
        aten._scaled_dot_product_flash_attention_backward]
    return counter


@dataclass(frozen=True)
class Kernel:
    """One kernel as a device profile prices it.

    Attributes:
        kind: ``"mm"``, ``"conv"`` or ``"ew"`` (:data:`KINDS`).
        dtype: the dtype it computes in (``"fp32"``, ``"bf16"``, ``"fp16"``, ...).
        flops: its FLOPs (matmul FLOPs for ``mm`` and ``conv``, elementwise for ``ew``).
        bytes: the bytes it reads and writes.
    """

    kind: str
    dtype: str
    flops: int
    bytes: int


@dataclass(frozen=True)
class StepCount:
    """One node's training step on one batch, counted (module docstring).

    Attributes:
        forward_flops: matmul FLOPs of the forward passes.
        backward_flops: matmul FLOPs of the backward passes.
        optimizer_flops: elementwise FLOPs of the inner optimizer's step.
        elementwise_flops: elementwise FLOPs of the forward and backward passes.
        bytes: bytes moved by every kernel of the step.
        kernels: kernel launches of the step.
        optimizer_bytes: of ``bytes``, the optimizer step's.
        optimizer_kernels: of ``kernels``, the optimizer step's.
        parameters: the model's trainable parameter elements.
        samples: samples in the batch counted (one node's batch).
        profile: every distinct kernel and how many times the step runs it.
        optimizer_profile: of ``profile``, the optimizer step's kernels.
    """

    forward_flops: int
    backward_flops: int
    optimizer_flops: int
    elementwise_flops: int
    bytes: int
    kernels: int
    optimizer_bytes: int
    optimizer_kernels: int
    parameters: int
    samples: int
    profile: tuple[tuple[Kernel, int], ...] = field(repr=False, compare=False)
    optimizer_profile: tuple[tuple[Kernel, int], ...] = field(default=(), repr=False,
                                                              compare=False)

    @property
    def matmul_flops(self) -> int:
        """Forward and backward matmul FLOPs: the "training FLOPs" of the scaling-law papers."""
        return self.forward_flops + self.backward_flops

    @property
    def flops(self) -> int:
        """Every FLOP of the step: matmul, elementwise and the optimizer's."""
        return self.matmul_flops + self.elementwise_flops + self.optimizer_flops

    def to_dict(self) -> dict[str, int]:
        """For ``summary.json``: the counts, without the kernel profile."""
        return {"forward_flops": self.forward_flops, "backward_flops": self.backward_flops,
                "matmul_flops": self.matmul_flops, "elementwise_flops": self.elementwise_flops,
                "optimizer_flops": self.optimizer_flops, "flops": self.flops,
                "bytes": self.bytes, "kernels": self.kernels,
                "optimizer_bytes": self.optimizer_bytes,
                "optimizer_kernels": self.optimizer_kernels, "parameters": self.parameters,
                "samples": self.samples}


_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
           torch.float64: "fp64"}


def _tensors(tree: Any) -> Iterator[Tensor]:
    for leaf in tree_flatten(tree)[0]:
        if isinstance(leaf, Tensor):
            yield leaf


def _nbytes(t: Tensor) -> int:
    """Bytes of ``t`` a kernel touches: its elements, at most its storage (an expanded view)."""
    own = t.numel() * t.element_size()
    try:
        return min(own, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # no storage (a sparse or wrapper tensor)
        return own


def _elements(operand: Any) -> int:
    """Elements of one operand: a tensor's, or a list's (a ``_foreach`` kernel's) in all."""
    return sum(t.numel() for t in _tensors(operand))


def _is_view(func: Any) -> bool:
    """Whether ``func``'s outputs alias an input without writing it: a view, no kernel."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                 for r in returns)


class _Counting(TorchDispatchMode):
    """Records every kernel of what runs under it (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.registry = flop_counter().flop_registry
        self.kernels: Counter[Kernel] = Counter()
        self.matmul = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if func.namespace != "aten" or packet in _FREE or _is_view(func):  # profiler marks
            return out
        inputs = {id(t): t for t in _tensors((args, kwargs))}
        written = {id(t): t for t in _tensors(out)}  # what it returns, and what it mutates
        for arg, value in zip(func._schema.arguments, args, strict=False):
            if arg.alias_info is not None and arg.alias_info.is_write:
                written.update((id(t), t) for t in _tensors(value))
        outputs = list(written.values())
        moved = sum(_nbytes(t) for t in inputs.values()) + sum(_nbytes(t) for t in outputs)
        first = next(iter(inputs.values()), outputs[0] if outputs else None)
        dtype = _DTYPES.get(first.dtype, str(first.dtype)) if first is not None else "fp32"
        if packet in self.registry:
            flops = int(self.registry[packet](*args, **kwargs, out_val=out))
            self.matmul += flops
            kind = "conv" if packet in _CONV else "mm"
        else:
            kind = "ew"
            flops = 0 if packet in _MOVES else max(
                (_elements(a) for a in (*args, *kwargs.values(), out)), default=0)
        self.kernels[Kernel(kind, dtype, flops, moved)] += 1
        return out


def _totals(kernels: Counter[Kernel]) -> tuple[int, int, int]:
    """(elementwise FLOPs, bytes, launches) of ``kernels``."""
    ew = sum(k.flops * n for k, n in kernels.items() if k.kind == "ew")
    return ew, sum(k.bytes * n for k, n in kernels.items()), sum(kernels.values())


def _micro_batches(batch: Any, micro: int | None) -> list[tuple[float | None, Any]]:
    """``batch`` in parts of at most ``micro`` samples with their weights (the engine's)."""
    size = next(_tensors(batch)).shape[0]
    if micro is None or micro >= size:
        return [(None, batch)]
    return [(min(micro, size - lo) / size,
             tree_map(lambda t, lo=lo: t[lo:lo + micro] if isinstance(t, Tensor) else t, batch))
            for lo in range(0, size, micro)]


def count_step(model: nn.Module, batch: Any, optim: OptimizerBuilder, *,
               micro_batch_size: int | None = None, precision: Precision = "fp32",
               device: torch.device | str = "cpu") -> StepCount:
    """Count one node's training step of ``model`` on ``batch`` (one node's batch, a pytree of
    tensors whose first dimension is the sample) with the inner optimizer ``optim`` (module
    docstring)."""
    device = torch.device(device)
    net = copy.deepcopy(model).to(device).train()
    params = [p for p in net.parameters() if p.requires_grad]
    batch = tree_map(lambda t: t.to(device) if isinstance(t, Tensor) else t, batch)
    parts = _micro_batches(batch, micro_batch_size)
    opt = optim.build(params)
    for group in opt.param_groups:  # as on an accelerator: one kernel per operation
        if "foreach" in group and not group.get("fused"):
            group["foreach"] = True
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        forward, backward, step = _Counting(), _Counting(), _Counting()
        for weight, part in parts:
            with forward:
                with _autocast(device, precision):
                    loss = loss_of(run_model(net, part)).float()
                if weight is not None:
                    loss = loss * weight
            with backward:
                loss.backward()
        opt.step()  # the first step creates the optimizer's state: not a step's work
        with step:
            opt.step()
    finally:
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    pass_kernels = forward.kernels + backward.kernels
    ew, moved, launches = _totals(pass_kernels)
    opt_flops, opt_bytes, opt_launches = _totals(step.kernels)
    every = pass_kernels + step.kernels
    return StepCount(
        forward_flops=forward.matmul, backward_flops=backward.matmul,
        optimizer_flops=opt_flops + step.matmul, elementwise_flops=ew,
        bytes=moved + opt_bytes, kernels=launches + opt_launches, optimizer_bytes=opt_bytes,
        optimizer_kernels=opt_launches, parameters=sum(p.numel() for p in params),
        samples=int(next(_tensors(batch)).shape[0]),
        profile=_sorted(every), optimizer_profile=_sorted(step.kernels))


def _sorted(kernels: Counter[Kernel]) -> tuple[tuple[Kernel, int], ...]:
    return tuple(sorted(kernels.items(), key=lambda kv: (kv[0].kind, kv[0].dtype, kv[0].flops,
                                                         kv[0].bytes)))


def _autocast(device: torch.device, precision: Precision) -> Any:
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()

