"""Where the simulated nodes of a per-node strategy meet at each collective.

Each node's ``step()`` runs in its own greenlet (a coroutine with its own stack, on the calling
thread), and a collective of :mod:`exogym.strategy.per_node.collectives` is a rendezvous: a node
deposits its tensor and yields to the runner (:class:`Rendezvous`), which resumes the nodes in
row order; when every node has arrived, the runner checks that all called the same collective on
tensors of the same shape, stacks them and calls the run's communicator (so bytes are counted,
the simulated network times the collective, and in a multi-process run it crosses processes),
and every node resumes with its result. Coroutines because per-node code is ordinary blocking
Python with collectives anywhere in it (inside loops, behind ``if``s), which must stop in the
middle and resume; not a rewrite of the user's code into phases. Greenlets rather than OS
threads: a first version used one thread per node and measured, at N = 16 on a 2-core CPU
(a 64-128-10 MLP, 100 steps), 4.0 s in the nodes' steps, 0.9 s of it starting threads, and,
with persistent threads, the stacked forward and backward 4x slower (1.86 s against DDP's
0.44 s): every thread that runs torch ops gets its own OpenMP pool, whose workers spin after
each parallel region and take the cores from the main thread's. Greenlets run on one thread
(one pool), switch in about a microsecond, and run the nodes in a fixed order, so the nodes
draw from torch's global generator in the same order every run. Reductions are done once, on
the stacked rows in node order.

Mismatches are errors, not hangs: every node's step ends at a rendezvous too, so a node that skips
a collective (or calls another one) meets the others at a point where they are not, and the run
raises :class:`CollectiveMismatch` naming the nodes and what each called. An exception in one
node's step ends the step (the other nodes' greenlets are discarded) and is re-raised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from greenlet import getcurrent, greenlet
from torch import Tensor

from exogym.sim.comm import Communicator

__all__ = ["CollectiveMismatch", "Rendezvous", "current"]


class CollectiveMismatch(RuntimeError):
    """The nodes of a per-node strategy did not call the same collectives."""


def current() -> _Node | None:
    """The simulated node whose ``step()`` is running (None: not in a per-node step)."""
    return getattr(getcurrent(), "node", None)


@dataclass
class _Call:
    kind: str  # all_reduce, broadcast, all_gather, or "the end of its step"
    tensor: Tensor | None = None
    options: dict[str, Any] = field(default_factory=dict)
    count: int = 0  # collectives this node called before, in this step

    def describe(self) -> str:
        if self.tensor is None:
            return f"reached the end of its step after {self.count} collectives"
        opts = "".join(f", {k}={v!r}" for k, v in self.options.items() if k != "out")
        return (f"called {self.kind} (collective #{self.count + 1} of its step) on a "
                f"{self.tensor.dtype} tensor of shape {list(self.tensor.shape)}{opts}")


class Rendezvous:
    """Where the nodes of this process meet at each collective (see the module docstring)."""

    def __init__(self, node_ids: list[int], comm: Communicator, step: int) -> None:
        self.node_ids, self.comm, self.step = node_ids, comm, step
        self.calls: list[_Call | None] = [None] * len(node_ids)

    def meet(self, row: int, call: _Call) -> None:
        """Deposit ``call`` and yield to the runner until every node has arrived and the
        collective is done."""
        if torch.is_inference_mode_enabled():
            raise RuntimeError(f"node {self.node_ids[row]} calls {call.kind} inside "
                               "torch.inference_mode(), which a node cannot keep across a "
                               "collective; use torch.no_grad()")
        self.calls[row] = call
        grad = torch.is_grad_enabled()  # torch's grad mode is per thread, not per greenlet
        getcurrent().parent.switch()
        torch.set_grad_enabled(grad)

    def run(self, steps: list[Callable[[], Any]]) -> None:
        """Each node's ``step`` (row ``r``'s is ``steps[r]``) in its greenlet, round by round:
        resume every node in row order until it deposits its next call (the end of its step
        is one too); complete the round; until every step has ended."""
        nodes = []
        for row, step in enumerate(steps):
            node = _Node(row, self)
            g = greenlet(_ending(step, node))
            g.node = node
            nodes.append(g)
        grad = torch.is_grad_enabled()

        def resume(g: greenlet) -> None:  # raises what the node's step raised
            try:
                g.switch()
            finally:
                torch.set_grad_enabled(grad)

        while True:
            for g in nodes:
                resume(g)
            calls = [c for c in self.calls if c is not None]
            self.calls = [None] * len(nodes)
            self._complete(calls)
            if calls[0].tensor is None:  # every node ended its step
                for g in nodes:
                    resume(g)  # returns from its last meet and finishes
                return

    @torch.no_grad()  # like torch.distributed's, the collectives write past autograd
    def _complete(self, calls: list[_Call]) -> None:
        first = calls[0]
        same = all(c.kind == first.kind and c.count == first.count and (
            c.tensor is None or (first.tensor is not None and c.tensor.shape == first.tensor.shape
                                 and c.tensor.dtype == first.tensor.dtype
                                 and {k: v for k, v in c.options.items() if k != "out"}
                                 == {k: v for k, v in first.options.items() if k != "out"}))
            for c in calls)
        if not same:
            lines = "; ".join(f"node {i} {c.describe()}"
                              for i, c in zip(self.node_ids, calls, strict=True))
            raise CollectiveMismatch(f"the nodes' collectives do not match at step {self.step}: "
                                     f"{lines}")
        if first.tensor is None:
            return
        tensors = [c.tensor for c in calls if c.tensor is not None]
        stacked = torch.stack([t.detach() for t in tensors])
        tag = f"per_node.{first.kind}"
        if first.kind == "all_reduce":
            out = self.comm.all_reduce(stacked, op=first.options["op"], tag=tag)
            for t in tensors:
                t.copy_(out)
        elif first.kind == "broadcast":
            src = first.options["src"]
            if not 0 <= src < self.comm.num_nodes:
                raise ValueError(f"broadcast src={src} is not a node: allowed 0 to "
                                 f"{self.comm.num_nodes - 1}")
            out = self.comm.broadcast(stacked, src=src, tag=tag)
            for t in tensors:
                t.copy_(out)
        else:  # all_gather
            gathered = self.comm.all_gather(stacked, tag=tag)
            for c in calls:
                out_list = c.options["out"]
                if len(out_list) != self.comm.num_nodes:
                    raise ValueError(f"all_gather's tensor_list has {len(out_list)} tensors; "
                                     f"it needs one per node, {self.comm.num_nodes}")
                for j, t in enumerate(out_list):
                    t.copy_(gathered[j])


def _ending(step: Callable[[], Any], node: _Node) -> Callable[[], None]:
    """``step``, then a last rendezvous: the end of the node's step, where a node that skipped a
    collective meets the others' call."""
    def run() -> None:
        step()
        node.rendezvous.meet(node.row, _Call("end", None, {}, node.count))
    return run


class _Node:
    """One node's view while its ``step()`` runs: what :mod:`exogym.strategy.communicate`
    calls."""

    def __init__(self, row: int, rendezvous: Rendezvous) -> None:
        self.row, self.rendezvous, self.count = row, rendezvous, 0

    def collective(self, kind: str, tensor: Tensor, **options: Any) -> None:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{kind} needs a tensor, got {type(tensor).__name__}")
        self.rendezvous.meet(self.row, _Call(kind, tensor, options, self.count))
        self.count += 1
