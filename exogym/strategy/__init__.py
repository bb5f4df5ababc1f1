"""Strategies and their registry.

Each strategy is one module (one paper) and is registered under a short id with a lazy entry
point, so adding one is one file plus one :func:`register` line::

    from exogym.strategy import make, registry
    make("diloco", H=50)                    # == DiLoCo(H=50)
    make("diloco", **{"optim.lr": "3e-4"})  # strings are parsed as on the CLI

A strategy outside exogym is named where an id is accepted by ``path/to/file.py:Class`` or
``package.module:Class`` (:mod:`exogym.utils.plugins`), registered under an id from Python with
:func:`register`, or declared by an installed package in the entry point group
``exogym.strategies`` (``topk_diloco = "my_pkg.methods:TopKDiLoCo"`` in its ``pyproject.toml``
under ``[project.entry-points."exogym.strategies"]``), found on first use.

The two bases, each chosen by name (docs/writing-a-strategy.md, docs/per-node.md):

- :class:`StackedStrategy` (:mod:`exogym.strategy.base`): node-stacked, ``step(self, step)``
  updates all the nodes of a process at once (tensors ``[N, ...]``); every registered strategy,
  and the one a new method for the simulator's fast path subclasses;
- :class:`Strategy`, also named :class:`PerNodeStrategy` (:mod:`exogym.strategy.per_node`): code
  for ONE node, ``step(self)`` with collectives, as EXO Gym writes it (``from exogym.strategy
  import Strategy``, its README's custom algorithm, runs unchanged); ``exogym.Trainer.fit`` runs
  it on N simulated nodes, and it runs unchanged under torchrun.

A class that writes the other base's ``step`` is refused when it is defined, naming the base it
meant (no base is ever swapped behind the user's back).
"""

from __future__ import annotations

import difflib
import importlib.metadata
import inspect
import warnings
from typing import TYPE_CHECKING, Any

from exogym.strategy.base import StackedStrategy
from exogym.strategy.per_node.base import PerNodeStrategy
from exogym.utils.config import ConfigError, apply_overrides, config_fields
from exogym.utils.plugins import is_spec, load_object, source_of

if TYPE_CHECKING:
    from exogym.strategy.ddp import DDP
    from exogym.strategy.diloco import DiLoCo
    from exogym.strategy.fedavg import FedAvg

__all__ = ["DDP", "DiLoCo", "FedAvg", "PerNodeStrategy", "StackedStrategy", "Strategy", "get",
           "make", "register", "registry"]

Strategy = PerNodeStrategy
"""EXO Gym's name of the per-node base (``from exogym.strategy import Strategy``)."""

_ENTRY_POINTS: dict[str, str] = {}
_EXPORTS = {"DDP": "ddp", "DiLoCo": "diloco", "FedAvg": "fedavg"}
ENTRY_POINT_GROUP = "exogym.strategies"
_plugins_read = False


def register(strategy_id: str, entry_point: str) -> None:
    """Register ``"package.module:Class"`` (or ``"path/to/file.py:Class"``) under
    ``strategy_id``; it is imported on first use.

    Raises:
        ValueError: a malformed id or entry point, or an id already registered to another class.
    """
    if not isinstance(strategy_id, str) or not strategy_id.isidentifier():
        raise ValueError(f"strategy_id must be an identifier (letters, digits, '_'), got "
                         f"{strategy_id!r}")
    if not is_spec(entry_point):
        raise ValueError(f"entry_point must look like 'package.module:Class' or "
                         f"'path/to/file.py:Class', got {entry_point!r}")
    if strategy_id in _ENTRY_POINTS and _ENTRY_POINTS[strategy_id] != entry_point:
        raise ValueError(f"strategy id {strategy_id!r} is already registered to "
                         f"{_ENTRY_POINTS[strategy_id]}")
    _ENTRY_POINTS[strategy_id] = entry_point


def _read_plugins() -> None:
    """Register the entry points of installed packages (group ``exogym.strategies``), once; one
    whose id is taken is skipped with a warning naming its package."""
    global _plugins_read
    if _plugins_read:
        return
    _plugins_read = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            register(ep.name, ep.value)
        except ValueError as err:
            package = ep.dist.name if ep.dist is not None else "an installed package"
            warnings.warn(f"{package}'s entry point {ENTRY_POINT_GROUP} {ep.name} = {ep.value} "
                          f"is not used: {err}", RuntimeWarning, stacklevel=3)


def registry() -> list[str]:
    """Every registered id, sorted: exogym's, :func:`register`'s, installed plugins' and those
    of the ``SOURCE:Class`` specs loaded so far."""
    _read_plugins()
    return sorted(_ENTRY_POINTS)


def _strategy_class(obj: Any, spec: str) -> type[StackedStrategy]:
    if not (isinstance(obj, type) and issubclass(obj, StackedStrategy)):
        kind = f"class {obj.__name__}" if isinstance(obj, type) else type(obj).__name__
        raise ConfigError(f"strategy {spec!r} is a {kind}, not a subclass of "
                          "exogym.strategy.StackedStrategy")
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(obj.__abstractmethods__))
        raise ConfigError(f"strategy {spec!r} is abstract: it does not define {missing}")
    return obj


def get(strategy_id: str) -> type[StackedStrategy]:
    """The class registered under ``strategy_id``, or named by a ``SOURCE:Class`` spec.

    A class loaded from a spec is registered under its :attr:`StackedStrategy.id` (its class name
    unless it sets ``id``), so that ``--set ID.KEY=VALUE`` and later look-ups find it.
    """
    if is_spec(strategy_id):
        cls = _strategy_class(load_object(strategy_id, "strategy"), strategy_id)
        entry = source_of(cls)
        known = _ENTRY_POINTS.get(cls.id)
        if known is not None and known != entry and known != strategy_id:
            raise ConfigError(f"strategy {strategy_id!r} has id {cls.id!r}, which is already "
                              f"{known}'s; give the class another id (class attribute id = ...)")
        _ENTRY_POINTS.setdefault(cls.id, entry)
        return cls
    strategy_id = _registered_id(strategy_id)
    return _strategy_class(load_object(_ENTRY_POINTS[strategy_id], "strategy"), strategy_id)


def _registered_id(name: str) -> str:
    """The registered id ``name`` means: itself, or the id it spells in other case or without
    the underscores (the class names: ``DiLoCo`` -> ``diloco``, ``StreamingDiLoCo`` ->
    ``streaming_diloco``).

    Raises:
        ConfigError: no id is spelled so; the message suggests the closest one."""
    ids = registry()
    if name in ids:
        return name
    folded = {i.replace("_", ""): i for i in ids}
    key = name.lower().replace("_", "").replace("-", "")
    if key in folded:
        return folded[key]
    close = difflib.get_close_matches(name.lower(), ids, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"unknown strategy {name!r}{hint}; available: {', '.join(ids)} (or "
                      "path/to/file.py:Class, package.module:Class)")


def make(strategy_id: str, **overrides: Any) -> StackedStrategy:
    """Build a registered (or ``SOURCE:Class``) strategy; ``overrides`` use the keys of
    ``exogym strategies``."""
    return apply_overrides(get(strategy_id), overrides)


def describe(strategy_id: str) -> dict[str, tuple[Any, Any, str]]:
    """``{key: (type, default, doc)}`` of every hyperparameter of a strategy."""
    return config_fields(get(strategy_id))


# EXO Gym's exports of ``exogym.strategy`` (``from exogym.strategy import DiLoCoStrategy``): the
# classes of EXO Gym's compatibility (exogym.compat.exo_gym), imported on first use.
_EXO_GYM_EXPORTS = {
    "DiLoCoStrategy": "exogym.compat.exo_gym.builtins",
    "SPARTAStrategy": "exogym.compat.exo_gym.builtins",
    "FedAvgStrategy": "exogym.compat.exo_gym.builtins",
    "DeMoStrategy": "exogym.compat.exo_gym.builtins",
    "SPARTADiLoCoStrategy": "exogym.compat.exo_gym.builtins",
    "SimpleReduceStrategy": "exogym.compat.exo_gym.simple_reduce",
    "OptimSpec": "exogym.strategy.optim",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return get(_EXPORTS[name])
    if name in _EXO_GYM_EXPORTS:
        return getattr(importlib.import_module(_EXO_GYM_EXPORTS[name]), name)
    raise AttributeError(f"module 'exogym.strategy' has no attribute {name!r}")


register("ddp", "exogym.strategy.ddp:DDP")
register("fedavg", "exogym.strategy.fedavg:FedAvg")
register("diloco", "exogym.strategy.diloco:DiLoCo")
register("diloco_eager", "exogym.strategy.diloco_eager:DiLoCoEager")
register("demo", "exogym.strategy.demo:DeMo")
register("fedadam", "exogym.strategy.fedadam:FedAdam")
register("fedyogi", "exogym.strategy.fedyogi:FedYogi")
register("fedadagrad", "exogym.strategy.fedadagrad:FedAdagrad")
register("fedavgm", "exogym.strategy.fedavgm:FedAvgM")
register("fedprox", "exogym.strategy.fedprox:FedProx")
register("sparta", "exogym.strategy.sparta:SPARTA")
register("sparta_diloco", "exogym.strategy.sparta_diloco:SPARTADiLoCo")
register("streaming_diloco", "exogym.strategy.streaming_diloco:StreamingDiLoCo")
register("sparseloco", "exogym.strategy.sparseloco:SparseLoCo")
register("muloco", "exogym.strategy.muloco:MuLoCo")
register("desloc", "exogym.strategy.desloc:DESLOC")
register("noloco", "exogym.strategy.noloco:NoLoCo")
register("async_local_sgd", "exogym.strategy.async_local_sgd:AsyncLocalSGD")
register("fedbuff", "exogym.strategy.fedbuff:FedBuff")
