"""EXO Gym's path of its ``FedAvgStrategy`` (:mod:`exogym.compat.exo_gym.builtins`), which runs as
exogym's :class:`exogym.strategy.fedavg.FedAvg`.

Federated averaging: McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from
Decentralized Data".
"""

from exogym.compat.exo_gym.builtins import FedAvgStrategy

__all__ = ["FedAvgStrategy"]
