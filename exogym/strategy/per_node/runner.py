"""Running per-node strategies (:class:`exogym.strategy.PerNodeStrategy`) on the node-stacked
engine.

:class:`PerNode` is a node-stacked strategy that holds one copy of the user's per-node strategy
per node of this process. The run's engine computes every node's forward and backward as usual
(stacked tensors ``[n_local, ...]``, on the loop engine); then each node's ``step()`` runs as
that node's own code on a replica module whose parameters, gradients and buffers are views of the
node's row, so its optimizer steps the stacked tensors in place. The nodes' steps run as
coroutines that meet at each collective (:mod:`exogym.strategy.per_node.rendezvous`, where the
design and its measurements are).

Limits (errors, not silent): absent nodes (a world with failures, a deadline) and asynchronous
execution are not supported for per-node strategies.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from exogym.sim.comm import Communicator
from exogym.sim.engine import NodeStack
from exogym.strategy.base import StackedStrategy
from exogym.strategy.per_node.base import PerNodeStrategy
from exogym.strategy.per_node.rendezvous import Rendezvous

__all__ = ["PerNode", "as_stacked"]


@dataclass(kw_only=True)
class PerNode(StackedStrategy):
    """A per-node strategy (``node``, a :class:`exogym.strategy.PerNodeStrategy`) run on
    the node-stacked engine: one deep copy of ``node`` per node, each bound to its replica. It
    runs on the loop engine (``engine="auto"`` becomes ``"loop"`` at :meth:`setup`).

    Attributes:
        node: the per-node strategy, as constructed by the user (a template: never bound).
    """

    node: Any = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.node, PerNodeStrategy):
            raise TypeError(f"node must be a per-node strategy (exogym.strategy.PerNodeStrategy, "
                            f"EXO Gym's exogym.strategy.strategy.Strategy), got "
                            f"{type(self.node).__name__}")
        if type(self.node).zero_grad is not PerNodeStrategy.zero_grad:
            # EXO Gym's TrainNode called strategy.zero_grad() before each step; exogym zeroes
            # every node's row of the stacked gradient itself, so an override would never run
            raise TypeError(
                f"{type(self.node).__name__} overrides zero_grad(), which exogym does not call: "
                "the run zeroes every node's gradients before each step. For gradient "
                "accumulation use fit(micro_batch_size=...); remove the override")

    @property
    def id(self) -> str:  # type: ignore[override]
        return type(self.node).__name__

    def setup(self, nodes: NodeStack, comm: Communicator, total_steps: int, *,
              seed: int = 0) -> None:
        self.run_seed = seed
        if total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {total_steps}")
        if nodes.engine != "loop":
            if not nodes.auto:
                raise ValueError(f"per-node strategies run on the loop engine, got engine="
                                 f"{nodes.engine!r}; allowed: loop or auto")
            # engine="auto" chose for node-stacked strategies; each node's step runs on its own
            # replica, which the loop engine's per-node views give (no step has run yet)
            nodes.engine = "loop"
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
        Rendezvous(list(self.comm.node_ids), self.comm, step).run(
            [c.step for c in self.copies])
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


def as_stacked(strategy: Any, num_nodes: int | None = None) -> Any:
    """The node-stacked strategy that runs ``strategy``: the one a per-node strategy says computes
    its update (:meth:`PerNodeStrategy.to_stacked`: EXO Gym's built-ins run as exogym's strategy
    of their method; ``num_nodes``, the run's N, when known), else the per-node strategy in
    :class:`PerNode`; anything else (a node-stacked strategy, an id) as it is.

    ``exogym.Trainer.fit`` calls it; call it yourself where exogym's own functions take a
    strategy, e.g. ``exogym.run.launch.fit_processes(..., strategy=as_stacked(MyPerNode()))``.
    """
    if not isinstance(strategy, PerNodeStrategy):
        return strategy
    stacked = strategy.to_stacked(num_nodes)
    return PerNode(node=strategy) if stacked is None else stacked


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
