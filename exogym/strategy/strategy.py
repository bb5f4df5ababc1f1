"""EXO Gym's path of its per-node base: ``from exogym.strategy.strategy import Strategy``.

The names are :mod:`exogym.compat.exo_gym`'s: :class:`Strategy` (code for ONE node,
:mod:`exogym.compat.exo_gym.strategy`) and :class:`SimpleReduceStrategy`
(:mod:`exogym.compat.exo_gym.simple_reduce`). exogym's own base is :class:`exogym.strategy.Strategy`
(node-stacked).
"""

from exogym.compat.exo_gym.simple_reduce import SimpleReduceStrategy
from exogym.compat.exo_gym.strategy import Strategy

__all__ = ["SimpleReduceStrategy", "Strategy"]
