"""EXO Gym's ``SimpleReduceStrategy`` (its path: ``exogym.strategy.strategy``): data parallelism
written for one node.

Used as it is it runs as exogym's :class:`exogym.strategy.ddp.DDP` (the same update, on the
node-stacked engine); a subclass that changes its ``step`` runs per-node, like any
:class:`exogym.strategy.PerNodeStrategy`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from exogym.compat.exo_gym.conversions import check_max_norm, inner_optim, schedule, warn_unused
from exogym.strategy.ddp import DDP
from exogym.strategy.optim import OptimSpec
from exogym.strategy.per_node.base import PerNodeStrategy
from exogym.strategy.per_node.collectives import all_reduce

__all__ = ["SimpleReduceStrategy"]


class SimpleReduceStrategy(PerNodeStrategy):
    """Data-parallel SGD written for one node (EXO Gym's ``SimpleReduceStrategy``): sum every
    gradient over the nodes, divide by N, clip (``max_norm``), step.

    Used as it is (neither ``step`` nor ``_init_node`` overridden), it runs as exogym's
    :class:`exogym.strategy.ddp.DDP` with ``broadcast_buffers=False`` (EXO Gym's: each node keeps
    its own BatchNorm statistics), the same update on the node-stacked engine
    (:meth:`to_stacked`); a subclass that changes ``step`` runs per-node.

    Args:
        optim_spec: the optimizer (default EXO Gym's ``OptimSpec(torch.optim.AdamW)``: lr 1e-3,
            weight decay 0.01).
        max_norm: clip the averaged gradient to this L2 norm (None: off).
        lr_scheduler: see :class:`~exogym.strategy.per_node.base.PerNodeStrategy`.
        lr_scheduler_kwargs: see :class:`~exogym.strategy.per_node.base.PerNodeStrategy`.
        **unused: arguments EXO Gym's class did not declare (its ``example/mnist.py`` passes
            ``H`` and ``p``): an :class:`~exogym.compat.exo_gym.conversions.ExoGymWarning`
            each, ignored.
    """

    def __init__(self, optim_spec: OptimSpec | str | None = None, max_norm: float | None = None,
                 lr_scheduler: str | type | None = None,
                 lr_scheduler_kwargs: dict[str, Any] | None = None, **unused: Any) -> None:
        super().__init__(lr_scheduler=lr_scheduler, lr_scheduler_kwargs=lr_scheduler_kwargs)
        warn_unused(type(self).__name__, unused)
        self.optim_spec = inner_optim(optim_spec)
        self.max_norm = check_max_norm(max_norm, type(self).__name__)

    def step(self) -> None:
        for param in self.model.parameters():
            if param.grad is not None:
                all_reduce(param.grad)
                param.grad.div_(self.num_nodes)
        if self.max_norm:
            nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=self.max_norm)
        self.optim.step()
        super().step()

    def to_stacked(self, num_nodes: int | None = None) -> Any:
        """:class:`exogym.strategy.ddp.DDP` when this class's update is unchanged (and its
        schedule is None or ``"lambda_cosine"``), else None (per-node)."""
        cls = type(self)
        if cls.step is not SimpleReduceStrategy.step \
                or cls._init_node is not PerNodeStrategy._init_node \
                or isinstance(self.lr_scheduler, type) or "max_steps" in self.lr_scheduler_kwargs:
            return None
        return DDP(optim=self.optim_spec,
                   schedule=schedule(self.lr_scheduler, self.lr_scheduler_kwargs, cls.__name__),
                   max_grad_norm=self.max_norm, broadcast_buffers=False)
