"""The per-node base, :class:`PerNodeStrategy` (``exogym.strategy.Strategy``): a strategy
written for ONE node.

Two kinds of strategy run in exogym, each with its own base, chosen by name:

- :class:`exogym.strategy.StackedStrategy` (:mod:`exogym.strategy.base`): node-stacked.
  ``step(self, step)`` updates all the nodes of a process at once, tensors ``[N, ...]``; the
  fast path, every built-in strategy;
- :class:`PerNodeStrategy`, exported as ``exogym.strategy.Strategy`` (EXO Gym's name, also at
  its path ``exogym.strategy.strategy.Strategy``) and ``exogym.strategy.PerNodeStrategy``:
  per-node. ``step(self)`` is one node's code, as torch.distributed code is written: it uses
  ``self.model`` (this node's replica, gradients filled), ``self.optim`` (built from
  ``self.optim_spec``), ``self.rank``, ``self.num_nodes``, ``self.local_step``,
  ``self.scheduler``, and the collectives of :mod:`exogym.strategy.per_node.collectives` (EXO
  Gym's ``exogym.strategy.communicate``), and ends with ``super().step()``.

A class that writes the other base's ``step`` is refused when it is defined, with a
``TypeError`` naming the base it meant: a per-node ``step(self)`` on the node-stacked base
(:meth:`exogym.strategy.base.StackedStrategy.__init_subclass__`), a node-stacked ``step(self,
step)`` here (:meth:`PerNodeStrategy.__init_subclass__`). ``exogym.Trainer.fit`` accepts either;
a per-node strategy runs on N simulated nodes in one process
(:class:`exogym.strategy.per_node.runner.PerNode`: each node's ``step`` as its own coroutine,
collectives meeting through the run's communicator) and, unchanged, as one rank per node under
torchrun, or on local processes with ``fit_processes(..., strategy=as_stacked(strategy))``
(:func:`exogym.strategy.per_node.runner.as_stacked`). This module imports only the core
(checkpointing, optimizers).

Where this base differs from EXO Gym's: unknown keyword arguments are an error, not attributes
set silently; ``lr_scheduler`` is ``None``, ``"lambda_cosine"`` (EXO Gym's warm-up and optional
cosine, ``lr_scheduler_kwargs``: ``warmup_steps``, ``cosine_anneal``, ``max_steps``) or a
``torch.optim.lr_scheduler`` class (built with ``lr_scheduler_kwargs``).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from exogym.strategy.checkpointing import restore_value, save_value
from exogym.strategy.optim import OPTIMIZERS, OptimSpec

__all__ = ["PerNodeStrategy", "build_optimizer"]

_COSINE_KEYS = {"warmup_steps", "cosine_anneal", "max_steps"}


class PerNodeStrategy:
    """Base of a per-node strategy (see the module docstring).

    Args:
        lr_scheduler: None, ``"lambda_cosine"`` or a ``torch.optim.lr_scheduler`` class.
        lr_scheduler_kwargs: the scheduler's arguments (``lambda_cosine``: ``warmup_steps``,
            ``cosine_anneal``, ``max_steps``).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        step = cls.__dict__.get("step")
        if callable(step) and len(inspect.signature(step).parameters) > 1:
            raise TypeError(
                f"{cls.__name__} defines step({', '.join(inspect.signature(step).parameters)}), "
                "a node-stacked step "
                "that updates all the nodes at once, but it subclasses exogym.strategy.Strategy, "
                "the per-node base (EXO Gym's: step(self) is one node's code); for a "
                "node-stacked method subclass exogym.strategy.StackedStrategy instead")

    def __init__(self, lr_scheduler: str | type | None = None,
                 lr_scheduler_kwargs: dict[str, Any] | None = None) -> None:
        if not (lr_scheduler is None or lr_scheduler == "lambda_cosine"
                or isinstance(lr_scheduler, type)):
            raise ValueError(f"lr_scheduler must be None, 'lambda_cosine' or a "
                             f"torch.optim.lr_scheduler class, got {lr_scheduler!r}")
        kwargs = dict(lr_scheduler_kwargs or {})
        if lr_scheduler == "lambda_cosine" and set(kwargs) - _COSINE_KEYS:
            raise ValueError(f"lr_scheduler_kwargs for 'lambda_cosine': unknown "
                             f"{sorted(set(kwargs) - _COSINE_KEYS)}; allowed: "
                             f"{sorted(_COSINE_KEYS)}")
        self.lr_scheduler = lr_scheduler
        self.lr_scheduler_kwargs = kwargs
        self.max_steps = 1

    # -- bound by the runner, once per node ------------------------------------------------------
    def _init_node(self, model: nn.Module, rank: int, num_nodes: int) -> None:
        """Bind this copy to node ``rank`` of ``num_nodes`` and its replica ``model``; builds
        ``self.optim`` from ``self.optim_spec`` when the strategy has one. What the constructor
        set is the strategy's settings; what is set from here on is its state (see
        :meth:`state_dict`)."""
        self._settings = frozenset(vars(self))
        self.scheduler: Any = None
        self.model = model
        self.rank = rank
        self.num_nodes = num_nodes
        self.local_step = 0
        spec = getattr(self, "optim_spec", None)
        if spec is not None:
            self.optim = build_optimizer(spec, model)
            self._setup_scheduler()

    def step(self) -> None:
        """One node's update; a subclass communicates, steps ``self.optim`` and then calls
        ``super().step()``, which advances the scheduler and ``local_step``."""
        if self.scheduler is not None:
            self.scheduler.step()
        self.local_step += 1

    def zero_grad(self) -> None:
        self.optim.zero_grad()

    def to_stacked(self, num_nodes: int | None = None) -> Any:
        """The node-stacked strategy that computes exactly this one's update, when there is one
        (EXO Gym's built-ins, an unchanged ``SimpleReduceStrategy``): the run then uses it, on
        the fast engine. None (the default): the run calls this class's ``step`` on every node.
        ``num_nodes``: the run's N, where the answer depends on it (None: not known yet; a
        class whose answer needs it raises ``ValueError`` saying so)."""
        return None

    def _setup_scheduler(self) -> None:
        if self.lr_scheduler is None:
            self.scheduler = None
        elif self.lr_scheduler == "lambda_cosine":
            self.scheduler = LambdaLR(self.optim, self._lambda_cosine)
        else:
            assert isinstance(self.lr_scheduler, type)
            self.scheduler = self.lr_scheduler(self.optim, **self.lr_scheduler_kwargs)

    def _lambda_cosine(self, step: int) -> float:
        """EXO Gym's schedule: linear warm-up over ``warmup_steps``, then 1, or with
        ``cosine_anneal`` a cosine from 1 to 0.1 at ``min(max_steps, run's steps)``.

        The warm-up is ``(t + 1) / W`` for step ``t`` (0-based), as the built-ins'
        (:class:`exogym.strategy.optim.LRSchedule`), not EXO Gym's ``t / W``, whose first
        step ran at lr 0: a per-node strategy and the built-in it rewrites take the same
        learning rates."""
        kw = self.lr_scheduler_kwargs
        warmup = int(kw.get("warmup_steps", 1))
        total = min(int(kw["max_steps"]), self.max_steps) if "max_steps" in kw else self.max_steps
        if step < warmup:
            return (step + 1) / warmup
        if not kw.get("cosine_anneal", False):
            return 1.0
        progress = (step - warmup) / max(1, total - warmup)
        return 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)) + 0.1

    def _state_names(self) -> list[str]:
        return [k for k in vars(self)
                if k not in self._settings and k not in ("_settings", "model", "rank",
                                                         "num_nodes")]

    def state_dict(self) -> dict[str, Any]:
        """This node's state for a checkpoint: every attribute set from :meth:`_init_node` on
        (the optimizer, scheduler, step count, and a subclass's own: a master copy, an outer
        optimizer), saved as the node-stacked strategies' state is
        (:mod:`exogym.strategy.checkpointing`); a kind that cannot be saved is an error naming
        it."""
        where = type(self).__name__
        return {k: save_value(getattr(self, k), f"{where}.{k}") for k in self._state_names()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        where = type(self).__name__
        if set(state) != set(self._state_names()):
            raise ValueError(f"{where}: the checkpoint's per-node state has "
                             f"{sorted(state)}, this strategy {sorted(self._state_names())}")
        for k, saved in state.items():
            setattr(self, k, restore_value(getattr(self, k), saved, f"{where}.{k}"))

    def hyperparameters(self) -> dict[str, Any]:
        """The constructor's settings, for logs and summaries."""
        out: dict[str, Any] = {"strategy": type(self).__name__,
                               "lr_scheduler": getattr(self.lr_scheduler, "__name__",
                                                       self.lr_scheduler)}
        settings = getattr(self, "_settings", vars(self))  # a bound copy: not its state
        for key, value in vars(self).items():
            if key not in settings or key in ("lr_scheduler", "max_steps") or key[0] == "_":
                continue
            if isinstance(value, (int, float, str, bool)) or value is None:
                out[key] = value
            elif isinstance(value, OptimSpec):
                out.update({f"{key}.{k}": v for k, v in vars(value).items()
                            if isinstance(v, (int, float, str, bool))})
        return out


def build_optimizer(spec: Any, model: nn.Module) -> torch.optim.Optimizer:
    """``spec`` (an :class:`OptimSpec`) over ``model``'s parameters."""
    if not isinstance(spec, OptimSpec):
        raise TypeError(f"optim_spec must be an OptimSpec, got {type(spec).__name__}")
    if spec.name not in OPTIMIZERS:  # Muon's implementation reads dim 0 as the node dimension
        raise ValueError(f"optim_spec name={spec.name!r} is a node-stacked optimizer; a per-node "
                         f"strategy's optimizer is one of {sorted(OPTIMIZERS)}")
    return spec.build(model)
