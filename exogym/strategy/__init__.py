"""Strategies and their registry.

Each strategy is one module (one paper) and is registered under a short id with a lazy entry
point, so adding one is one file plus one :func:`register` line::

    from exogym.strategy import make, registry
    make("diloco", H=50)                    # == DiLoCo(H=50)
    make("diloco", **{"optim.lr": "3e-4"})  # strings are parsed as on the CLI
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from exogym.strategy.base import Strategy
from exogym.utils.config import ConfigError, apply_overrides, config_fields

if TYPE_CHECKING:
    from exogym.strategy.ddp import DDP
    from exogym.strategy.diloco import DiLoCo
    from exogym.strategy.fedavg import FedAvg

__all__ = ["DDP", "DiLoCo", "FedAvg", "Strategy", "get", "make", "register", "registry"]

_ENTRY_POINTS: dict[str, str] = {}
_EXPORTS = {"DDP": "ddp", "DiLoCo": "diloco", "FedAvg": "fedavg"}


def register(strategy_id: str, entry_point: str) -> None:
    """Register ``"package.module:ClassName"`` under ``strategy_id`` (imported on first use)."""
    if ":" not in entry_point:
        raise ValueError(f"entry_point must look like 'package.module:Class', got {entry_point!r}")
    if strategy_id in _ENTRY_POINTS and _ENTRY_POINTS[strategy_id] != entry_point:
        raise ValueError(f"strategy id {strategy_id!r} is already registered")
    _ENTRY_POINTS[strategy_id] = entry_point


def registry() -> list[str]:
    """Every registered id, sorted."""
    return sorted(_ENTRY_POINTS)


def get(strategy_id: str) -> type[Strategy]:
    """The class registered under ``strategy_id``."""
    if strategy_id not in _ENTRY_POINTS:
        raise ConfigError(f"unknown strategy {strategy_id!r}; available: {', '.join(registry())}")
    module, cls = _ENTRY_POINTS[strategy_id].split(":")
    return getattr(importlib.import_module(module), cls)


def make(strategy_id: str, **overrides: Any) -> Strategy:
    """Build a registered strategy; ``overrides`` use the keys of ``exogym strategies``."""
    return apply_overrides(get(strategy_id), overrides)


def describe(strategy_id: str) -> dict[str, tuple[Any, Any, str]]:
    """``{key: (type, default, doc)}`` of every hyperparameter of a strategy."""
    return config_fields(get(strategy_id))


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return get(_EXPORTS[name])
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
register("async_local_sgd", "exogym.strategy.async_local_sgd:AsyncLocalSGD")
register("fedbuff", "exogym.strategy.fedbuff:FedBuff")
