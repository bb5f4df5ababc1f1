"""EXO Gym's path of its ``FedAvgStrategy`` (:mod:`exogym.compat.exo_gym.builtins`), which runs as
exogym's :class:`exogym.strategy.fedavg.FedAvg`, imported on first use
(:mod:`exogym.strategy._exo_gym`).

Federated averaging: McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from
Decentralized Data".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from exogym.strategy._exo_gym import exo_gym_name

if TYPE_CHECKING:
    from exogym.compat.exo_gym.builtins import FedAvgStrategy

__all__ = ["FedAvgStrategy"]


def __getattr__(name: str) -> Any:
    return exo_gym_name(__name__, name, ("FedAvgStrategy",))
