"""Per-node strategies: code for ONE node (EXO Gym's form), run on the node-stacked engine.

- :mod:`~exogym.strategy.per_node.base`: the base, :class:`PerNodeStrategy` (exported as
  ``exogym.strategy.Strategy``, EXO Gym's name, and ``exogym.strategy.PerNodeStrategy``);
- :mod:`~exogym.strategy.per_node.collectives`: ``all_reduce``, ``broadcast``, ``all_gather``
  with torch.distributed's signatures (EXO Gym's ``exogym.strategy.communicate``);
- :mod:`~exogym.strategy.per_node.rendezvous`: where the simulated nodes' coroutines meet at
  each collective and go through the run's communicator;
- :mod:`~exogym.strategy.per_node.runner`: :class:`PerNode`, the node-stacked strategy that
  runs one copy of a per-node strategy per node, and :func:`as_stacked`.

Imports: the simulator and the rest of :mod:`exogym.strategy`; nothing of the run or of
:mod:`exogym.compat` (EXO Gym's built-ins say which exogym strategy they run as through
:meth:`PerNodeStrategy.to_stacked`).
"""

from exogym.strategy.per_node.base import PerNodeStrategy
from exogym.strategy.per_node.runner import PerNode, as_stacked

__all__ = ["PerNode", "PerNodeStrategy", "as_stacked"]
