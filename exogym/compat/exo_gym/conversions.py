"""EXO Gym's built-in strategies' arguments, converted to exogym's: the base of the built-ins.

EXO Gym (github.com/exo-explore/gym, read at commit 9fa323c) names its methods
``DiLoCoStrategy``, ``SPARTAStrategy``, ``FedAvgStrategy``, ``DeMoStrategy``,
``SPARTADiLoCoStrategy`` and ``SimpleReduceStrategy``, with per-node constructor arguments
(``optim_spec``, ``outer_optim_spec``, ``H``, ``p_sparta``, ``lr_scheduler="lambda_cosine"``,
``lr_scheduler_kwargs``, ``max_norm``). Each such class (:mod:`exogym.compat.exo_gym.builtins`,
under EXO Gym's import paths: ``exogym.strategy.diloco.DiLoCoStrategy``, ...) is a
:class:`BuiltinStrategy`: it takes those arguments, converts them when it is constructed (so a
bad value is an error at once) and becomes exogym's strategy of the same method when a run
starts (:meth:`BuiltinStrategy.to_stacked`): the update is exogym's paper-faithful one, every
byte goes through the communicator, and the run uses the fast engine.

Conversions shared by the classes:

- ``optim_spec`` (an :class:`OptimSpec`, a name, or None for EXO Gym's default
  ``OptimSpec(torch.optim.AdamW)``: lr 1e-3, weight decay 0.01) is the inner optimizer;
- ``lr_scheduler="lambda_cosine"`` with ``warmup_steps`` (EXO Gym's default 1) and
  ``cosine_anneal`` is :class:`LRSchedule` ``(warmup_steps, cosine, min_lr_ratio=0.1)``: EXO
  Gym's floor of 0.1 of the peak; exogym's warm-up reaches ``lr * (t + 1) / W`` at step ``t``
  where EXO Gym's takes a first step at lr 0 (``t / W``);
- ``max_norm`` is ``max_grad_norm``.

An argument EXO Gym's class did not declare (``SPARTAStrategy(p=0.05)``, ``SimpleReduceStrategy(
H=20)``, both in EXO Gym's ``example/mnist.py``) was stored by EXO Gym as an attribute and never
read; here each is an :class:`ExoGymWarning` naming it, and ignored likewise. The full list of
names and differences is docs/from-exo-gym.md.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from exogym.strategy.optim import LRSchedule, OptimSpec
from exogym.strategy.per_node.base import PerNodeStrategy
from exogym.utils.validation import check_number

if TYPE_CHECKING:
    from exogym.strategy.base import StackedStrategy

__all__ = ["BuiltinStrategy", "ExoGymWarning", "check_max_norm", "inner_optim", "outer_fields",
           "schedule", "shared", "warn_ignored", "warn_unused"]


class ExoGymWarning(UserWarning):
    """An EXO Gym argument that has no effect here (EXO Gym had silently ignored it too)."""


def warn_unused(owner: str, unused: Mapping[str, Any], hints: Mapping[str, str] | None = None,
                stacklevel: int = 3) -> None:
    """One :class:`ExoGymWarning` per argument EXO Gym's ``owner`` did not declare."""
    for key, value in unused.items():
        hint = (hints or {}).get(key, "")
        warnings.warn(
            f"{owner}: {key}={value!r} is not an argument of EXO Gym's {owner} (EXO Gym stored "
            f"it as an attribute and never read it); ignored{hint}", ExoGymWarning,
            stacklevel=stacklevel)


def warn_ignored(owner: str, key: str, value: Any, why: str, stacklevel: int = 3) -> None:
    """An :class:`ExoGymWarning`: EXO Gym's ``owner`` declared ``key`` but never used it."""
    warnings.warn(f"{owner}: {key}={value!r} is ignored: {why} (EXO Gym declared it and never "
                  "read it)", ExoGymWarning, stacklevel=stacklevel)


def inner_optim(value: Any, what: str = "optim_spec") -> OptimSpec:
    """EXO Gym's inner-optimizer argument: an :class:`OptimSpec`, an optimizer name
    (``"adamw"``, any case) or None (EXO Gym's default: ``OptimSpec(torch.optim.AdamW)``)."""
    if value is None:
        return OptimSpec(torch.optim.AdamW)  # type: ignore[arg-type]
    if isinstance(value, str):
        return OptimSpec.from_string(value)
    if isinstance(value, OptimSpec):
        return value
    raise TypeError(f"{what} must be an OptimSpec, an optimizer name or None, got "
                    f"{type(value).__name__}")


def schedule(lr_scheduler: Any, lr_scheduler_kwargs: Mapping[str, Any] | None,
             owner: str) -> LRSchedule:
    """EXO Gym's ``lr_scheduler`` / ``lr_scheduler_kwargs`` as exogym's :class:`LRSchedule`."""
    kwargs = dict(lr_scheduler_kwargs or {})
    if lr_scheduler is None:
        if kwargs:
            raise ValueError(f"{owner}: lr_scheduler_kwargs {kwargs} given without "
                             "lr_scheduler='lambda_cosine'")
        return LRSchedule()
    if lr_scheduler != "lambda_cosine":
        raise ValueError(
            f"{owner}: lr_scheduler must be None or 'lambda_cosine' for EXO Gym's built-in "
            f"strategies, got {lr_scheduler!r}; a torch.optim.lr_scheduler class runs in a "
            "per-node strategy (a subclass of exogym.strategy.PerNodeStrategy, EXO Gym's "
            "exogym.strategy.strategy.Strategy)")
    unknown = set(kwargs) - {"warmup_steps", "cosine_anneal", "max_steps"}
    if unknown:
        raise ValueError(f"{owner}: lr_scheduler_kwargs for 'lambda_cosine': unknown "
                         f"{sorted(unknown)}; allowed: ['cosine_anneal', 'warmup_steps']")
    if "max_steps" in kwargs:
        raise ValueError(
            f"{owner}: lr_scheduler_kwargs max_steps={kwargs['max_steps']!r} (a cosine shorter "
            "than the run) has no equivalent in exogym's schedule, which decays over the run's "
            "steps; leave it out, or run the strategy per-node (exogym.strategy.strategy)")
    cosine = kwargs.get("cosine_anneal", False)
    if not isinstance(cosine, bool):
        raise ValueError(f"{owner}: cosine_anneal must be True or False, got {cosine!r}")
    return LRSchedule(warmup_steps=kwargs.get("warmup_steps", 1), cosine=cosine,
                      min_lr_ratio=0.1 if cosine else 0.0)


def outer_fields(spec: Any, owner: str) -> dict[str, Any]:
    """EXO Gym's ``outer_optim_spec`` as :class:`exogym.strategy.diloco.DiLoCo`'s outer fields;
    None is EXO Gym's default, SGD with Nesterov momentum 0.9 at lr 0.7 (DiLoCo's)."""
    if spec is None:
        return {"outer_optimizer": "nesterov", "outer_lr": 0.7, "outer_momentum": 0.9}
    spec = inner_optim(spec, "outer_optim_spec")
    if spec.weight_decay:
        raise ValueError(f"{owner}: outer_optim_spec weight_decay={spec.weight_decay} has no "
                         "equivalent in exogym's outer optimizers (nesterov, sgd, adam); give "
                         "weight_decay=0.0")
    if spec.name == "sgd":
        return {"outer_optimizer": "nesterov" if spec.nesterov else "sgd", "outer_lr": spec.lr,
                "outer_momentum": spec.momentum}
    if spec.name in ("adam", "adamw"):
        return {"outer_optimizer": "adam", "outer_lr": spec.lr, "outer_betas": spec.betas,
                "outer_eps": spec.eps}
    raise ValueError(f"{owner}: outer_optim_spec {spec.name!r} has no equivalent in exogym's "
                     "outer optimizers; allowed: SGD (with or without Nesterov momentum), Adam")


def check_max_norm(max_norm: Any, owner: str) -> float | None:
    """EXO Gym's ``max_norm`` (None or 0: no clipping) as ``max_grad_norm``."""
    if max_norm is None or max_norm == 0:
        return None
    return check_number(f"{owner}: max_norm (or None)", max_norm, lo=0.0, lo_open=True)


def shared(owner: str, unused: Mapping[str, Any], optim_spec: Any, lr_scheduler: Any,
           lr_scheduler_kwargs: Mapping[str, Any] | None, max_norm: Any = None,
           hints: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The fields every built-in converts alike: warnings for ``unused`` arguments, then
    ``optim``, ``schedule`` and ``max_grad_norm`` of the exogym strategy."""
    warn_unused(owner, unused, hints, stacklevel=4)
    return {"optim": inner_optim(optim_spec),
            "schedule": schedule(lr_scheduler, lr_scheduler_kwargs, owner),
            "max_grad_norm": check_max_norm(max_norm, owner)}


class BuiltinStrategy(PerNodeStrategy):
    """An EXO Gym built-in strategy: constructed with EXO Gym's arguments, run as exogym's
    strategy of the same method (:meth:`to_stacked`). It has no per-node ``step``, and a subclass
    may not add one: a per-node method subclasses :class:`exogym.strategy.PerNodeStrategy`,
    a variant of a built-in subclasses its exogym class (``exogym.strategy.diloco.DiLoCo``)."""

    def __init__(self, exogym: StackedStrategy) -> None:
        super().__init__()  # the schedule was converted (and checked) into ``exogym``'s
        self._exogym = exogym

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        concrete = [b.__name__ for b in cls.__mro__[1:]
                    if issubclass(b, BuiltinStrategy) and b is not BuiltinStrategy]
        changed = [m for m in ("step", "_init_node") if m in cls.__dict__]
        if concrete and changed:
            raise TypeError(
                f"{cls.__qualname__} defines {', '.join(changed)}, but {concrete[0]} runs as "
                "an exogym node-stacked strategy and has no per-node step to change: write a "
                "per-node method as a subclass of exogym.strategy.Strategy (the per-node base), "
                "or a variant of the method as a subclass of its exogym class "
                "(exogym.strategy.diloco.DiLoCo, ...)")

    def to_stacked(self, num_nodes: int | None = None) -> StackedStrategy:
        """A fresh copy of the exogym strategy this one runs as, checked against a run of
        ``num_nodes`` nodes when given (:meth:`check_num_nodes`)."""
        if num_nodes is not None:
            self.check_num_nodes(num_nodes)
        elif getattr(self, "island_size", None) is not None:
            raise ValueError(f"{type(self).__name__}(island_size={self.island_size}) depends on "
                             "the run's N: give as_stacked(strategy, num_nodes=N)")
        return copy.deepcopy(self._exogym)

    def check_num_nodes(self, num_nodes: int) -> None:  # a hook, empty on purpose
        """Refuse a run of ``num_nodes`` nodes that EXO Gym's arguments give no equivalent for
        (``FedAvgStrategy(island_size=)`` smaller than N); nothing by default."""

    def step(self) -> None:
        raise TypeError(f"{type(self).__name__} runs as exogym's {type(self._exogym).__name__} "
                        "(node-stacked); it has no per-node step")

    def hyperparameters(self) -> dict[str, Any]:
        return {"strategy": type(self).__name__, "runs_as": self._exogym.id}
