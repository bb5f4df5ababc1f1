"""Collectives for per-node strategies (EXO Gym's path: ``exogym.strategy.communicate``).

A per-node strategy (:class:`exogym.strategy.PerNodeStrategy`) is code for ONE node,
written the way torch.distributed code is written. Its collectives are these three functions, with
torch.distributed's signatures and semantics (in place, ``op`` included):

- ``all_reduce(tensor, op=ReduceOp.SUM)``: every node's ``tensor`` becomes the reduction
  (``SUM`` or ``AVG``) over the nodes;
- ``broadcast(tensor, src=0)``: every node's ``tensor`` becomes node ``src``'s;
- ``all_gather(tensor_list, tensor)``: every node's ``tensor_list[j]`` becomes node ``j``'s
  ``tensor``.

Where they run:

- in a simulated run (``exogym.Trainer``: the nodes of this process run their ``step`` as
  coroutines, :mod:`exogym.strategy.per_node.rendezvous`), the call meets the same call of the
  other nodes and goes through the run's communicator, so its bytes are counted, it is timed on
  the simulated network, and in a multi-process run it crosses processes;
- in a plain torch.distributed program (one node per process, no exogym run), it is the
  torch.distributed collective itself.

Reductions are computed in the tensor's dtype, in node order, the same on every node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.distributed as dist
from torch import Tensor

from exogym.strategy.per_node.rendezvous import current

__all__ = ["ReduceOp", "all_gather", "all_reduce", "broadcast"]

ReduceOp = dist.ReduceOp

_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "mean"}


def _op_name(op: Any) -> str:
    for known, name in _OPS.items():
        if op == known:
            return name
    raise ValueError(f"op must be ReduceOp.SUM or ReduceOp.AVG, got {op!r}")


def all_reduce(tensor: Tensor, op: Any = dist.ReduceOp.SUM) -> None:
    """Reduce ``tensor`` over all nodes, in place (``op``: ``ReduceOp.SUM`` or ``ReduceOp.AVG``)."""
    name = _op_name(op)
    node = current()
    if node is None:
        _plain().all_reduce(tensor, op=op)
        return
    node.collective("all_reduce", tensor, op=name)


def broadcast(tensor: Tensor, src: int = 0) -> None:
    """Node ``src``'s ``tensor`` on every node, in place."""
    node = current()
    if node is None:
        _plain().broadcast(tensor, src=src)
        return
    node.collective("broadcast", tensor, src=src)


def all_gather(tensor_list: Sequence[Tensor], tensor: Tensor, group: Any = None,
               async_op: bool = False) -> None:
    """``tensor_list[j]`` becomes node ``j``'s ``tensor`` (one entry per node)."""
    if async_op:
        raise ValueError("async_op=True is not supported; allowed: False (the call returns when "
                         "every node has the result)")
    node = current()
    if node is None:
        _plain().all_gather(list(tensor_list), tensor, group=group)
        return
    if group is not None:
        raise ValueError(f"group={group!r}: a simulated run has one group, allowed: None")
    node.collective("all_gather", tensor, out=list(tensor_list))


def _plain() -> Any:
    """torch.distributed itself, outside a simulated run."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("a collective outside a run: call it from a per-node strategy's "
                           "step() under exogym.Trainer (simulated nodes) or after "
                           "torch.distributed.init_process_group (one node per process)")
    return dist
