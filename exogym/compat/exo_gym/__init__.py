"""EXO Gym's names and forms over exogym's machinery: all of exogym's compatibility with EXO Gym,
in one place, and nothing else.

EXO Gym (github.com/exo-explore/gym, read at commit 9fa323c) is where exogym began; its scripts
run on exogym unchanged (docs/from-exo-gym.md). What is EXO Gym's alone lives here:

- :mod:`~exogym.compat.exo_gym.builtins` and :mod:`~exogym.compat.exo_gym.conversions`: EXO
  Gym's built-in strategies (``DiLoCoStrategy``, ``SPARTAStrategy``, ``FedAvgStrategy``,
  ``DeMoStrategy``, ``SPARTADiLoCoStrategy``) with EXO Gym's arguments, each run as exogym's
  strategy of its method;
- :mod:`~exogym.compat.exo_gym.simple_reduce`: ``SimpleReduceStrategy``, EXO Gym's per-node DDP;
- :mod:`~exogym.compat.exo_gym.fit_form`: EXO Gym's form of the ``fit`` call (its arguments by
  position and name, its defaults, the model returned), which ``exogym.Trainer`` hands such a
  call to; :mod:`~exogym.compat.exo_gym.logs`: its ``logs/RUN_NAME`` CSVs, W&B against the
  examples trained;
- :mod:`~exogym.compat.exo_gym.auxiliary`: ``exogym.aux.utils.get_device``.

What EXO Gym's scripts use that is exogym's own lives in exogym's packages: ``exogym.Trainer``
(:mod:`exogym.run.trainer`, also at EXO Gym's path ``exogym.trainer``), the per-node base
``Strategy`` and its runtime (:mod:`exogym.strategy.per_node`: running per-node code on the
node-stacked engine, its collectives at EXO Gym's path ``exogym.strategy.communicate``).
This package's ``__getattr__`` names them too, so that every EXO Gym name is found here.

EXO Gym's paths of the names that live here are module ``__getattr__``s of exogym's modules
(``exogym.strategy.diloco.DiLoCoStrategy``, ``exogym.strategy.strategy.SimpleReduceStrategy``,
...), which ask :mod:`exogym.strategy._exo_gym` on first use, so that importing exogym's own
code never loads this package; ``exogym.Trainer.fit`` imports :mod:`fit_form` only for a call
that may be in EXO Gym's form. This package imports the core; nothing else of the core imports
it (pyproject.toml, the layers contract's two exceptions).
"""

from __future__ import annotations

from exogym.utils.lazy import lazy_exports

__all__ = ["CollectiveMismatch", "DeMoStrategy", "DiLoCoStrategy", "ExoGymWarning",
           "FedAvgStrategy", "PerNode", "ReduceOp", "SPARTADiLoCoStrategy", "SPARTAStrategy",
           "SimpleReduceStrategy", "Strategy", "Trainer", "all_gather", "all_reduce",
           "as_stacked", "broadcast", "get_device"]

_EXPORTS = {
    "DeMoStrategy": "builtins", "DiLoCoStrategy": "builtins", "ExoGymWarning": "conversions",
    "FedAvgStrategy": "builtins", "SPARTADiLoCoStrategy": "builtins",
    "SPARTAStrategy": "builtins", "SimpleReduceStrategy": "simple_reduce",
    "get_device": "auxiliary.utils",
    # exogym's own, under the names EXO Gym's scripts use
    "CollectiveMismatch": "exogym.strategy.per_node.rendezvous",
    "PerNode": "exogym.strategy.per_node.runner", "ReduceOp": "exogym.strategy.communicate",
    "Strategy": "exogym.strategy.strategy", "Trainer": "exogym.run.trainer",
    "all_gather": "exogym.strategy.communicate", "all_reduce": "exogym.strategy.communicate",
    "as_stacked": "exogym.strategy.per_node.runner", "broadcast": "exogym.strategy.communicate",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
