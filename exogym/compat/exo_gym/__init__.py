"""EXO Gym's API over exogym's machinery: all of exogym's compatibility with EXO Gym, in one place.

EXO Gym (github.com/exo-explore/gym, read at commit 9fa323c) is where exogym began; its scripts
run on exogym unchanged (docs/from-exo-gym.md). The parts:

- :mod:`~exogym.compat.exo_gym.trainer`: ``exogym.Trainer`` (EXO Gym's ``exogym.trainer.Trainer``),
  the core trainer taking EXO Gym's strategies and call form as well;
- :mod:`~exogym.compat.exo_gym.fit_form`: EXO Gym's ``fit`` arguments mapped onto exogym's, the
  model returned; :mod:`~exogym.compat.exo_gym.logs`: its ``logs/RUN_NAME`` CSVs, W&B against
  the examples trained;
- :mod:`~exogym.compat.exo_gym.simple_reduce`: ``SimpleReduceStrategy``, with the per-node base
  ``Strategy`` (code for one node: exogym's :class:`exogym.strategy.PerNodeStrategy`, in the core)
  under EXO Gym's path ``exogym.strategy.strategy``; :mod:`~exogym.compat.exo_gym.communicate`:
  its collectives (``exogym.strategy.communicate``);
- :mod:`~exogym.compat.exo_gym.per_node` and :mod:`~exogym.compat.exo_gym.rendezvous`: running
  per-node code on the node-stacked engine (each node a coroutine, the collectives a rendezvous
  through the run's communicator);
- :mod:`~exogym.compat.exo_gym.builtins` and :mod:`~exogym.compat.exo_gym.conversions`: EXO
  Gym's built-in strategies (``exogym.strategy.diloco.DiLoCoStrategy``, ...), run as exogym's;
- :mod:`~exogym.compat.exo_gym.auxiliary`: ``exogym.aux.utils.get_device``.

EXO Gym's import paths are thin modules (``exogym.strategy.strategy``,
``exogym.strategy.communicate``, ``exogym.strategy.federated_averaging``), module
``__getattr__``s of exogym's method modules (``exogym.strategy.diloco.DiLoCoStrategy``, ...,
imported on first use, so that importing exogym's own code never loads this package) and
aliases (``exogym.trainer``, ``exogym.aux``: :mod:`exogym._aliases`). This package imports the
core; of the core, only those paths import from it. Its names are imported on first use
(``Strategy``, EXO Gym's name of the per-node base, from ``exogym.strategy.strategy``).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["CollectiveMismatch", "DeMoStrategy", "DiLoCoStrategy", "ExoGymWarning",
           "FedAvgStrategy", "PerNode", "ReduceOp", "SPARTADiLoCoStrategy", "SPARTAStrategy",
           "SimpleReduceStrategy", "Strategy", "Trainer", "all_gather", "all_reduce",
           "as_exogym", "broadcast", "get_device"]

_EXPORTS = {
    "CollectiveMismatch": "rendezvous", "DeMoStrategy": "builtins", "DiLoCoStrategy": "builtins",
    "ExoGymWarning": "conversions", "FedAvgStrategy": "builtins", "PerNode": "per_node",
    "ReduceOp": "communicate", "SPARTADiLoCoStrategy": "builtins", "SPARTAStrategy": "builtins",
    "SimpleReduceStrategy": "simple_reduce", "Strategy": "exogym.strategy.strategy",
    "Trainer": "trainer", "all_gather": "communicate", "all_reduce": "communicate",
    "as_exogym": "per_node", "broadcast": "communicate", "get_device": "auxiliary.utils",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = _EXPORTS[name]  # a module of this package, or one named in full
        return getattr(importlib.import_module(
            module if module.startswith("exogym.") else f"{__name__}.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
