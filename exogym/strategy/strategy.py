"""EXO Gym's path of its per-node base: ``from exogym.strategy.strategy import Strategy``.

Its names: ``Strategy``, exogym's per-node base :class:`exogym.strategy.PerNodeStrategy` (code
for ONE node, :mod:`exogym.strategy.per_node_base`), and :class:`SimpleReduceStrategy`
(:mod:`exogym.compat.exo_gym.simple_reduce`). exogym's own base, :class:`exogym.strategy.Strategy`,
is node-stacked.
"""

from exogym.compat.exo_gym.simple_reduce import SimpleReduceStrategy
from exogym.strategy.per_node_base import PerNodeStrategy as Strategy

__all__ = ["SimpleReduceStrategy", "Strategy"]
