"""EXO Gym's ``FedAvgStrategy`` (its module path), run as :class:`exogym.strategy.fedavg.FedAvg`.

Federated averaging (McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from
Decentralized Data"): every node takes ``H`` local steps, then the nodes' parameters are
averaged. The conversions and warnings are :mod:`exogym.strategy.exo_gym`'s.
"""

from __future__ import annotations

from typing import Any

from exogym.strategy import exo_gym as _exo
from exogym.strategy.fedavg import FedAvg
from exogym.strategy.optim import OptimSpec

__all__ = ["FedAvgStrategy"]


class FedAvgStrategy(_exo.BuiltinStrategy):
    """EXO Gym's ``FedAvgStrategy``, run as :class:`exogym.strategy.fedavg.FedAvg`.

    EXO Gym averaged after steps H + 1, 2H + 1, ... (its check ran before its step counter
    moved); here after steps H, 2H, ... (the paper's rounds of H local steps).

    Args:
        inner_optim: the local optimizer. EXO Gym ignored it (AdamW, lr 1e-3 ran instead unless
            ``optim_spec`` was given); here it is the local optimizer.
        island_size: EXO Gym's random groups averaged apart; exogym's FedAvg averages all the
            nodes, so only None is allowed.
        H: local steps per round (EXO Gym's default 1).
        max_norm: clip each node's gradient to this L2 norm before the local step.
        optim_spec: the local optimizer under the name EXO Gym's ``example/mnist.py`` passes
            (which EXO Gym used); give it or ``inner_optim``, not both.
        lr_scheduler, lr_scheduler_kwargs: None, or ``"lambda_cosine"`` with ``warmup_steps``
            and ``cosine_anneal`` (:func:`exogym.strategy.exo_gym.schedule`).
        **unused: arguments EXO Gym's class did not declare: an
            :class:`exogym.strategy.exo_gym.ExoGymWarning` each, ignored (as EXO Gym did).
    """

    def __init__(self, inner_optim: OptimSpec | str | None = None,
                 island_size: int | None = None, H: int = 1, max_norm: float | None = None,
                 optim_spec: OptimSpec | str | None = None, lr_scheduler: str | None = None,
                 lr_scheduler_kwargs: dict[str, Any] | None = None, **unused: Any) -> None:
        name = type(self).__name__
        if island_size is not None:
            raise ValueError(f"{name}: island_size={island_size!r}: exogym's FedAvg averages all "
                             "the nodes every round (EXO Gym's island_size=None); islands are "
                             "not implemented")
        if optim_spec is not None and inner_optim is not None:
            raise ValueError(f"{name}: give the local optimizer once, as inner_optim or as "
                             "optim_spec, got both")
        super().__init__(FedAvg(H=H, **_exo.shared(
            name, unused, inner_optim if optim_spec is None else optim_spec, lr_scheduler,
            lr_scheduler_kwargs, max_norm)))
