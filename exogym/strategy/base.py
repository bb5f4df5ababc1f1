"""The ``Strategy`` interface: what a distributed-training method must define.

A strategy is a small keyword-only dataclass (its fields are its hyperparameters, validated in
``__post_init__``) that also owns the inner optimizer and decides what to communicate when. The
trainer owns the loop and calls, in order:

1. :meth:`Strategy.setup` once (the base builds the inner optimizer over the node-stacked
   parameters, then calls the subclass's :meth:`Strategy.init_state`);
2. per step, after every node's backward has filled ``nodes.grads``: :meth:`Strategy.step`, which
   must update the parameters (usually by calling :meth:`Strategy.inner_step`) and communicate
   through ``self.comm`` only; the trainer zeroes the gradients afterwards;
3. :meth:`Strategy.global_state` whenever the global model is evaluated.

Compressed communication: the fields ``codec`` (a spec of :func:`exogym.sim.codecs.make_codec`,
``"int8"``, ``"topk:0.1"``, ...), ``error_feedback`` and ``codec_seed`` select a transport codec;
:meth:`Strategy.setup` builds it afresh for every run as ``self.transport_codec`` (``None``
without a codec), and the strategy passes it to its main collective
(``self.comm.all_reduce_(..., codec=self.transport_codec)``). A strategy whose communication
cannot go through a codec sets the class attribute ``supports_codec = False``; it then rejects a
codec at construction.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import torch
from torch import Tensor

from exogym.sim.codecs import Codec, make_codec
from exogym.sim.comm import Communicator, ReduceOp
from exogym.sim.engine import NodeStack
from exogym.strategy.optim import LRSchedule, OptimSpec
from exogym.utils.validation import check_number, in_range, positive_int

__all__ = ["Strategy", "in_range", "positive_int", "restart_rows"]


@dataclass(kw_only=True)
class Strategy(abc.ABC):
    """Base class of every strategy.

    Attributes:
        optim: the inner (per-node) optimizer; every node keeps its own state.
        schedule: warm-up and cosine decay of the inner learning rate.
        max_grad_norm: clip each node's gradient to this L2 norm before the inner step (None: off).
        codec: transport codec of the strategy's main collective (None: exact fp32): fp16, bf16,
            int8, int8:CHUNK, int4[:CHUNK], fp4[:CHUNK], topk:FRACTION, randk:FRACTION.
        error_feedback: keep each node's compression error and add it to its next message
            (needs a codec).
        codec_seed: seed of randk's index generator, shared by all nodes.
    """

    id: ClassVar[str] = ""
    supports_codec: ClassVar[bool] = True
    optim: OptimSpec = field(default_factory=OptimSpec)
    schedule: LRSchedule = field(default_factory=LRSchedule)
    max_grad_norm: float | None = None
    codec: str | None = None
    error_feedback: bool = False
    codec_seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.optim, OptimSpec):
            raise TypeError(f"optim must be an OptimSpec, got {type(self.optim).__name__}")
        if not isinstance(self.schedule, LRSchedule):
            raise TypeError(f"schedule must be an LRSchedule, got {type(self.schedule).__name__}")
        if self.max_grad_norm is not None:
            check_number("max_grad_norm (or None)", self.max_grad_norm, lo=0.0, lo_open=True)
        if self.codec is not None and not type(self).supports_codec:
            raise ValueError(f"strategy {type(self).__name__} does not support a transport codec; "
                             f"got codec={self.codec!r}, allowed: None")
        if isinstance(self.codec_seed, bool) or not isinstance(self.codec_seed, int) \
                or not 0 <= self.codec_seed < 2**31:
            raise ValueError(f"codec_seed must be an integer in [0, 2^31), got {self.codec_seed!r}")
        try:
            self._make_codec()
        except ValueError as err:
            raise ValueError(f"codec={self.codec!r}, error_feedback={self.error_feedback!r}: "
                             f"{err}") from None

    # -- called by the trainer -----------------------------------------------------------------
    def setup(self, nodes: NodeStack, comm: Communicator, total_steps: int) -> None:
        """Bind to the nodes and communicator of a run and build the inner optimizer."""
        if total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {total_steps}")
        self.nodes = nodes
        self.comm = comm
        self.total_steps = total_steps
        self.transport_codec: Codec | None = self._make_codec()
        self.optimizer = self.optim.build(list(nodes.params.values()))
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        if self.schedule.active:
            schedule, total = self.schedule, total_steps
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda t: schedule.factor(t, total)
            )
        self.init_state()

    def init_state(self) -> None:  # noqa: B027 - optional hook, empty on purpose
        """Allocate the strategy's own state (global copies, outer optimizers). Optional."""

    @abc.abstractmethod
    def step(self, step: int) -> None:
        """Update every node after the backward of ``step`` (0-based); communicate via ``comm``."""

    @torch.no_grad()
    def global_state(self) -> dict[str, Tensor]:
        """Parameters and buffers of the model the method would deploy, keyed like a state_dict.

        Default: node 0, right for methods that keep all nodes identical (DDP).
        """
        return {k: v.clone() for k, v in self.nodes.node_state(0).items()}

    # -- helpers for subclasses ----------------------------------------------------------------
    def _make_codec(self) -> Codec | None:
        """A fresh transport codec (fresh error-feedback residuals and randk counter)."""
        return make_codec(self.codec, error_feedback=self.error_feedback, seed=self.codec_seed)

    @torch.no_grad()
    def inner_step(self) -> None:
        """Per-node gradient clipping, one inner optimizer step, one schedule step."""
        if self.max_grad_norm is not None:
            self.nodes.clip_grad_norm_(self.max_grad_norm)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()

    def snapshot(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Copies of node 0's parameters and buffers: a global/server model's starting point."""
        state = self.nodes.node_state(0)
        return ({k: state[k].clone() for k in self.nodes.params},
                {k: state[k].clone() for k in self.nodes.buffers})

    def all_reduce_with_buffers(
        self, payload: list[Tensor], buffers: list[Tensor], op: ReduceOp, *, tag: str
    ) -> tuple[list[Tensor], list[Tensor]]:
        """Reduce ``payload`` through the transport codec and the float ``buffers`` exactly.

        Without a codec one collective carries both (one record, tag ``tag``); with a codec the
        buffers travel uncompressed in a second one tagged ``"buffers"``.
        """
        codec = self.transport_codec
        if codec is None:
            reduced = list(self.comm.all_reduce(payload + buffers, op, tag=tag))
            return reduced[: len(payload)], reduced[len(payload):]
        out = list(self.comm.all_reduce(payload, op, tag=tag, codec=codec))
        return out, list(self.comm.all_reduce(buffers, op, tag="buffers")) if buffers else []

    @torch.no_grad()
    def adopt_buffers(
        self, means: list[Tensor], into: dict[str, Tensor], keep: Tensor | None = None
    ) -> None:
        """Float buffers: every node's (``keep``'s rows only, if given) and ``into`` <- ``means``;
        then the integer counters of ``into`` (``num_batches_tracked``) <- node 0's."""
        for (k, b), mean in zip(self.nodes.float_buffers.items(), means, strict=True):
            restart_rows(b, mean, keep)
            into[k].copy_(mean)
        self.copy_counters(into)

    def copy_counters(self, into: dict[str, Tensor]) -> None:
        """``into``'s integer buffers (``num_batches_tracked``) <- node 0's."""
        for k, b in self.nodes.buffers.items():
            if not b.is_floating_point():
                into[k].copy_(b[0])

    @property
    def overlap_steps(self) -> int | None:
        """Steps after its start by which an ``overlap=True`` collective's result is needed.

        The network clock lets such a collective run under that many steps of compute. None (the
        default): until the next collective with the same tag. Streaming DiLoCo returns its tau.
        """
        return None

    @property
    def sync_period(self) -> int | None:
        """Steps between the synchronisations that update the whole global model (the paper's
        ``H``), or None for a method that synchronises every step. The trainer refuses a run
        shorter than this (the global model would stay the initial one) unless told otherwise.
        Default: the field ``H`` if the strategy has one."""
        period = getattr(self, "H", None)
        return period if isinstance(period, int) else None

    @property
    def lr(self) -> float:
        """The current inner learning rate."""
        return float(self.optimizer.param_groups[0]["lr"])

    def hyperparameters(self) -> dict[str, Any]:
        """Every field, nested configs flattened as ``optim.lr``; for logs and summaries."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if hasattr(value, "__dataclass_fields__"):
                for sub in fields(value):
                    out[f"{f.name}.{sub.name}"] = getattr(value, sub.name)
            else:
                out[f.name] = value
        return out


def restart_rows(stacked: Tensor, value: Tensor, keep: Tensor | None = None) -> None:
    """Every row of node-stacked ``stacked`` (``keep``'s rows only, if given) becomes ``value``."""
    if keep is None:
        stacked.copy_(value.expand_as(stacked))
    else:
        mask = keep.view(-1, *([1] * (stacked.dim() - 1)))
        stacked.copy_(torch.where(mask, value.unsqueeze(0), stacked))

