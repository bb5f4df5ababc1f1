"""EXO Gym's path of its per-node base: ``from exogym.strategy.strategy import Strategy``.

Its names: ``Strategy``, the per-node base (:class:`exogym.strategy.Strategy`, also named
:class:`~exogym.strategy.PerNodeStrategy`: code for ONE node, :mod:`exogym.strategy.per_node`),
and EXO Gym's ``SimpleReduceStrategy`` (:mod:`exogym.compat.exo_gym.simple_reduce`, imported on
first use through :mod:`exogym.strategy._exo_gym`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from exogym.strategy._exo_gym import exo_gym_name
from exogym.strategy.per_node.base import PerNodeStrategy as Strategy

if TYPE_CHECKING:
    from exogym.compat.exo_gym.simple_reduce import SimpleReduceStrategy

__all__ = ["SimpleReduceStrategy", "Strategy"]


def __getattr__(name: str) -> Any:
    return exo_gym_name(__name__, name, ("SimpleReduceStrategy",))
