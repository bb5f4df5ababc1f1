"""Running per-node strategies (:mod:`exogym.strategy.strategy`) on the node-stacked engine.

:class:`PerNode` is a node-stacked strategy that holds one copy of the user's per-node strategy
per node of this process. The run's engine computes every node's forward and backward as usual
(stacked tensors ``[n_local, ...]``); then each node's ``step()`` runs as that node's own code
on a replica module whose parameters, gradients and buffers are views of the node's row, so its
optimizer steps the stacked tensors in place.

Design choice: each node's ``step()`` runs in its own greenlet (a coroutine with its own
stack, on the calling thread), and a collective of :mod:`exogym.strategy.communicate` is a
rendezvous: a node deposits its tensor and yields to the runner, which resumes the nodes in row
order; when every node has arrived, the runner checks that all called the same collective on
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

Limits (errors, not silent): absent nodes (a world with failures, a deadline) and asynchronous
execution are not supported for per-node strategies.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from greenlet import getcurrent, greenlet
from torch import Tensor, nn

from exogym.sim.comm import Communicator
from exogym.sim.engine import NodeStack
from exogym.strategy.base import Strategy as StackedStrategy

__all__ = ["CollectiveMismatch", "PerNode", "current"]

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


class _Rendezvous:
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

    def run(self, steps: list[Any]) -> None:
        """Each node's ``step`` in its greenlet, round by round: resume every node in row order
        until it deposits its next call; complete the round; until every step has ended."""
        nodes = []
        for row, step in enumerate(steps):
            g = greenlet(step)
            g.node = _Node(row, self)
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


class _Node:
    """One node's view while its ``step()`` runs: what :mod:`exogym.strategy.communicate`
    calls."""

    def __init__(self, row: int, rendezvous: _Rendezvous) -> None:
        self.row, self.rendezvous, self.count = row, rendezvous, 0

    def collective(self, kind: str, tensor: Tensor, **options: Any) -> None:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{kind} needs a tensor, got {type(tensor).__name__}")
        self.rendezvous.meet(self.row, _Call(kind, tensor, options, self.count))
        self.count += 1


@dataclass(kw_only=True)
class PerNode(StackedStrategy):
    """A per-node strategy (``node``, a :class:`exogym.strategy.strategy.Strategy`) run on the
    node-stacked engine: one deep copy of ``node`` per node, each bound to its replica.

    Attributes:
        node: the per-node strategy, as constructed by the user (a template: never bound).
    """

    node: Any = None

    def __post_init__(self) -> None:
        super().__post_init__()
        from exogym.strategy.strategy import Strategy as NodeStrategy

        if not isinstance(self.node, NodeStrategy):
            raise TypeError(f"node must be a per-node Strategy (exogym.strategy.strategy), got "
                            f"{type(self.node).__name__}")
        if type(self.node).zero_grad is not NodeStrategy.zero_grad:
            # EXO Gym's TrainNode called strategy.zero_grad() before each step; exogym zeroes
            # every node's row of the stacked gradient itself, so an override would never run
            raise TypeError(
                f"{type(self.node).__name__} overrides zero_grad(), which exogym does not call: "
                "the run zeroes every node's gradients before each step. For gradient "
                "accumulation use fit(micro_batch_size=...); remove the override")

    @property
    def id(self) -> str:  # type: ignore[override]
        return type(self.node).__name__

    def setup(self, nodes: NodeStack, comm: Communicator, total_steps: int) -> None:
        if total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {total_steps}")
        if nodes.engine != "loop":
            raise ValueError(f"per-node strategies run on the loop engine, got engine="
                             f"{nodes.engine!r}; allowed: loop (or auto on a CPU)")
        self.nodes, self.comm, self.total_steps = nodes, comm, total_steps
        self.node_steps = None
        self.pending_recovery = []
        self.transport_codec = None
        self.replicas: list[nn.Module] = []
        self.copies: list[Any] = []
        for row, node_id in enumerate(comm.node_ids):
            replica = _replica(nodes, row)
            strategy = copy.deepcopy(self.node)
            strategy.max_steps = total_steps
            strategy._init_node(replica, node_id, comm.num_nodes)
            self.replicas.append(replica)
            self.copies.append(strategy)

    def step(self, step: int) -> None:
        if self.comm.active is not None:
            raise NotImplementedError(
                f"{self.id} is a per-node strategy: absent nodes (a world with failures, a "
                "deadline) are not supported for per-node strategies; run it in a perfect world")
        for row, replica in enumerate(self.replicas):
            _bind_grads(self.nodes, row, replica)
        meeting = _Rendezvous(list(self.comm.node_ids), self.comm, step)

        def node_step(strategy: Any) -> Any:
            def run() -> None:
                node = getcurrent().node
                strategy.step()
                meeting.meet(node.row, _Call("end", None, {}, node.count))
            return run

        meeting.run([node_step(c) for c in self.copies])
        for row, replica in enumerate(self.replicas):
            _write_back(self.nodes, row, replica)

    def global_state(self) -> dict[str, Tensor]:
        """The nodes' mean (EXO Gym averages the nodes' models at the end)."""
        return self.node_mean_state()

    @property
    def lr(self) -> float:
        optim = getattr(self.copies[0], "optim", None)
        return float(optim.param_groups[0]["lr"]) if optim is not None else 0.0

    def hyperparameters(self) -> dict[str, Any]:
        return self.node.hyperparameters()

    def state_dict(self) -> dict[str, Any]:
        return {"nodes": [c.state_dict() for c in self.copies]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["nodes"]
        if len(saved) != len(self.copies):
            raise ValueError(f"the checkpoint holds {len(saved)} nodes' per-node state, this "
                             f"process runs {len(self.copies)}")
        for c, s in zip(self.copies, saved, strict=True):
            c.load_state_dict(s)


def _replica(nodes: NodeStack, row: int) -> nn.Module:
    """A copy of the model whose parameters and buffers are views of row ``row``."""
    replica = copy.deepcopy(nodes.module)
    for name, stacked in nodes.params.items():
        _set(replica, name, nn.Parameter(stacked.detach()[row], requires_grad=True))
    for name, stacked in nodes.buffers.items():
        _set(replica, name, stacked[row])
    return replica


def _set(module: nn.Module, name: str, value: Tensor) -> None:
    *path, leaf = name.split(".")
    owner = module.get_submodule(".".join(path)) if path else module
    if isinstance(value, nn.Parameter):
        owner._parameters[leaf] = value
    else:
        owner._buffers[leaf] = value


def _bind_grads(nodes: NodeStack, row: int, replica: nn.Module) -> None:
    """Each replica parameter's ``.grad`` is the node's row of the stacked gradient."""
    for name, p in replica.named_parameters():
        p.grad = nodes.grads[name][row]


@torch.no_grad()
def _write_back(nodes: NodeStack, row: int, replica: nn.Module) -> None:
    """Where the node's code rebound ``param.data`` (instead of writing in place), copy the new
    values into the stacked row and view it again."""
    for name, p in replica.named_parameters():
        view = nodes.params[name].detach()[row]
        if p.data_ptr() != view.data_ptr():
            view.copy_(p.data)
            p.data = view
    for name, b in replica.named_buffers():
        view = nodes.buffers[name][row]
        if b.data_ptr() != view.data_ptr():
            view.copy_(b)
            _set(replica, name, view)
