"""DDP: all-reduce the gradients every step, then take the inner optimizer step.

Reference: S. Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training", VLDB 2020, arXiv:2006.15704 (``torch.nn.parallel.DistributedDataParallel``).

Per step, every node computes the gradient ``g_i`` of its own batch; the nodes all-reduce
``g = (1/N) sum_i g_i`` and each applies the same inner optimizer step with ``g``, so all replicas
stay identical. As in ``DistributedDataParallel(broadcast_buffers=True)``, the buffers (BatchNorm
running statistics) of node 0 are broadcast to every node each step.

Sent per step by each node: ``2 (N-1)/N * P`` bytes for the gradients (ring all-reduce, ``P`` =
parameter bytes, 4 x number of parameters in fp32), plus, if the model has buffers, node 0 sends
``(N-1) * B`` buffer bytes.

With a transport codec (``codec="int8"``, see :mod:`exogym.sim.codecs`) every node sends its
gradients through it (optionally with error feedback) and all nodes step with the mean of the
reconstructions, so the replicas stay identical. ``P`` becomes the compressed payload
``P_c = sum over parameter tensors of codec.payload_bytes(numel)`` (int8: ``numel + 4`` per
tensor); a sparse codec (top-k) travels as an all-gather, ``(N-1) * P_c`` per node. The buffers
are broadcast exactly (no codec).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from exogym.strategy.base import Strategy

__all__ = ["DDP"]


@dataclass(kw_only=True)
class DDP(Strategy):
    """Synchronous data parallelism (gradient all-reduce every step).

    Attributes:
        broadcast_buffers: broadcast node 0's buffers every step, as torch DDP does by default.
    """

    id = "ddp"
    broadcast_buffers: bool = True

    @torch.no_grad()
    def step(self, step: int) -> None:
        self.comm.all_reduce_(list(self.nodes.grads.values()), "mean", tag="grads",
                              codec=self.transport_codec)
        self.inner_step()
        buffers = list(self.nodes.buffers.values())
        if self.broadcast_buffers and buffers:
            for b, src in zip(buffers, self.comm.broadcast(buffers, 0, tag="buffers"), strict=True):
                b.copy_(src.expand_as(b))
