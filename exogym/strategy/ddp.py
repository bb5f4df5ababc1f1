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

Absent nodes (a world): the gradients are averaged over the nodes whose gradients arrived (the
quorum's mean, as torchft's ``Manager`` computes it: a ring all-reduce among those ``M`` nodes,
``2 (M-1)/M * P`` bytes each), and those nodes take the optimizer step with it. A node that is
down computes and sends nothing. A node that computed but whose gradient was lost, or cut by a
``deadline``, did not take part: it skips the step, is out of sync, and heals from a live peer
before the next one (:meth:`StackedStrategy.recover`: parameters, buffers and optimizer state), as a
torchft replica that did not commit heals. The buffers are broadcast from the lowest-numbered
node that took part.

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

from exogym.strategy.base import StackedStrategy, restart_rows

__all__ = ["DDP"]


@dataclass(kw_only=True)
class DDP(StackedStrategy):
    """Synchronous data parallelism (gradient all-reduce every step).

    Attributes:
        broadcast_buffers: broadcast node 0's buffers every step, as torch DDP does by default.
    """

    id = "ddp"
    broadcast_buffers: bool = True

    @torch.no_grad()
    def step(self, step: int) -> None:
        members = self.arrivals()
        if members is not None and not any(members):
            return  # no gradient arrived: nobody steps, so nobody is out of sync
        self.comm.all_reduce_(list(self.nodes.grads.values()), "mean", tag="grads",
                              codec=self.transport_codec, members=members)
        rows = None if members is None else self.comm.local_rows(members, self.nodes.device)
        self.inner_step(rows)
        if members is not None:  # computed, but not heard: out of sync
            active = self.comm.active or [True] * self.comm.num_nodes
            self.request_recovery([a and not m for a, m in zip(active, members, strict=True)])
        buffers = list(self.nodes.buffers.values())
        if self.broadcast_buffers and buffers:
            src = 0 if members is None else members.index(True)
            for b, value in zip(buffers, self.comm.broadcast(buffers, src, tag="buffers",
                                                             members=members), strict=True):
                if members is None:
                    b.copy_(value.expand_as(b))
                else:
                    restart_rows(b, value, rows)
