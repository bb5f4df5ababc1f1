"""EXO Gym's built-in strategies, each run as exogym's strategy of the same method.

``DiLoCoStrategy``, ``DeMoStrategy``, ``SPARTAStrategy``, ``SPARTADiLoCoStrategy`` and
``FedAvgStrategy`` take EXO Gym's constructor arguments (github.com/exo-explore/gym, read at
commit 9fa323c: ``exogym/strategy/*.py``), convert them when constructed
(:mod:`exogym.compat.exo_gym.conversions`) and run as exogym's ``diloco``, ``demo``, ``sparta``,
``sparta_diloco`` and ``fedavg``: the updates exogym tests against the papers, on the
node-stacked engine. Their import paths are EXO Gym's (``exogym.strategy.diloco.DiLoCoStrategy``,
``exogym.strategy.federated_averaging.FedAvgStrategy``, ...; ``exogym.strategy`` exports them
too), which hand them on from here. exogym's classes come through the strategy registry
(:func:`exogym.strategy.get`), so that this module imports none of the modules that hand its
names on (no import cycle).
"""

from __future__ import annotations

import warnings
from typing import Any

from exogym.compat.exo_gym import conversions as _exo
from exogym.strategy import StackedStrategy, get
from exogym.strategy.optim import OptimSpec
from exogym.utils.validation import positive_int

__all__ = ["DeMoStrategy", "DiLoCoStrategy", "FedAvgStrategy", "SPARTADiLoCoStrategy",
           "SPARTAStrategy"]


def _make(strategy_id: str, **fields: Any) -> StackedStrategy:
    """exogym's strategy ``strategy_id`` (a registry id) with these fields."""
    return get(strategy_id)(**fields)


class DiLoCoStrategy(_exo.BuiltinStrategy):
    """EXO Gym's ``DiLoCoStrategy``, run as :class:`exogym.strategy.diloco.DiLoCo`.

    Args:
        optim_spec: the inner optimizer (default EXO Gym's: AdamW, lr 1e-3, weight decay 0.01).
        outer_optim_spec: the outer optimizer: SGD (Nesterov or not) or Adam; default EXO Gym's
            and the paper's, SGD with Nesterov momentum 0.9 at lr 0.7.
        H: inner steps per outer step. EXO Gym synchronised after steps H + 1, 2H + 1, ...
            (its check ran before its step counter moved); here after steps H, 2H, ... (the
            paper's).
        max_norm: clip each node's gradient to this L2 norm before the inner step.
        inner_optim: the inner optimizer under the name of EXO Gym's README ("Custom
            Training"); EXO Gym ignored it (AdamW ran instead), here it is the inner optimizer.
        lr_scheduler: None, or ``"lambda_cosine"``
            (:func:`~exogym.compat.exo_gym.conversions.schedule`).
        lr_scheduler_kwargs: ``warmup_steps`` and ``cosine_anneal`` of ``"lambda_cosine"``.
        **unused: arguments EXO Gym's class did not declare: an
            :class:`~exogym.compat.exo_gym.conversions.ExoGymWarning` each, ignored (as EXO
            Gym did).
    """

    def __init__(self, optim_spec: OptimSpec | str | None = None,
                 outer_optim_spec: OptimSpec | str | None = None, H: int = 100,
                 max_norm: float | None = None, lr_scheduler: str | None = None,
                 lr_scheduler_kwargs: dict[str, Any] | None = None,
                 inner_optim: OptimSpec | str | None = None, **unused: Any) -> None:
        name = type(self).__name__
        if optim_spec is not None and inner_optim is not None:
            raise ValueError(f"{name}: give the inner optimizer once, as optim_spec or as "
                             f"inner_optim, got both")
        super().__init__(_make("diloco",
            H=H, **_exo.shared(name, unused, inner_optim if optim_spec is None else optim_spec,
                               lr_scheduler, lr_scheduler_kwargs, max_norm),
            **_exo.outer_fields(outer_optim_spec, name)))


class SPARTAStrategy(_exo.BuiltinStrategy):
    """EXO Gym's ``SPARTAStrategy``, run as :class:`exogym.strategy.sparta.SPARTA` with
    ``policy="random"``.

    EXO Gym drew a Bernoulli(p) mask per tensor on every node and broadcast node 0's, so each step
    also sent a boolean mask as large as the model; here the indices come from a seed every node
    shares (the paper's shared random generator) and only the chosen values are sent. EXO Gym's
    masks held a binomial number of entries per tensor, exogym's subset exactly ``round(p * m)``
    of the model's ``m`` entries.

    Args:
        optim_spec: the inner optimizer (default EXO Gym's: AdamW, lr 1e-3, weight decay 0.01).
        p_sparta: fraction of the parameter entries averaged after every step (the paper's p).
        max_norm: clip each node's gradient to this L2 norm before the inner step.
        lr_scheduler: None, or ``"lambda_cosine"``
            (:func:`~exogym.compat.exo_gym.conversions.schedule`).
        lr_scheduler_kwargs: ``warmup_steps`` and ``cosine_anneal`` of ``"lambda_cosine"``.
        **unused: arguments EXO Gym's class did not declare: an
            :class:`~exogym.compat.exo_gym.conversions.ExoGymWarning` each, ignored (as EXO
            Gym did).
    """

    def __init__(self, optim_spec: OptimSpec | str | None = None, p_sparta: float = 0.005,
                 max_norm: float | None = None, lr_scheduler: str | None = None,
                 lr_scheduler_kwargs: dict[str, Any] | None = None, **unused: Any) -> None:
        name = type(self).__name__
        hints = {"p": f"; SPARTA's fraction is p_sparta (here {p_sparta!r}, as in EXO Gym)"}
        super().__init__(_make("sparta", p=p_sparta, policy="random", **_exo.shared(
            name, unused, optim_spec, lr_scheduler, lr_scheduler_kwargs, max_norm, hints)))


class FedAvgStrategy(_exo.BuiltinStrategy):
    """EXO Gym's ``FedAvgStrategy``, run as :class:`exogym.strategy.fedavg.FedAvg`.

    EXO Gym averaged after steps H + 1, 2H + 1, ... (its check ran before its step counter
    moved); here after steps H, 2H, ... (the paper's rounds of H local steps).

    Args:
        inner_optim: the local optimizer. EXO Gym ignored it (AdamW, lr 1e-3 ran instead unless
            ``optim_spec`` was given); here it is the local optimizer.
        island_size: EXO Gym's random groups averaged apart. None, or a size of at least the
            run's N (EXO Gym then averaged all the nodes, as exogym's FedAvg does); a smaller one
            is an error when the run starts (islands are not implemented).
        H: local steps per round (EXO Gym's default 1).
        max_norm: clip each node's gradient to this L2 norm before the local step.
        optim_spec: the local optimizer under the name EXO Gym's ``example/mnist.py`` passes
            (which EXO Gym used); give it or ``inner_optim``, not both.
        lr_scheduler: None, or ``"lambda_cosine"``
            (:func:`~exogym.compat.exo_gym.conversions.schedule`).
        lr_scheduler_kwargs: ``warmup_steps`` and ``cosine_anneal`` of ``"lambda_cosine"``.
        **unused: arguments EXO Gym's class did not declare: an
            :class:`~exogym.compat.exo_gym.conversions.ExoGymWarning` each, ignored (as EXO
            Gym did).
    """

    def __init__(self, inner_optim: OptimSpec | str | None = None,
                 island_size: int | None = None, H: int = 1, max_norm: float | None = None,
                 optim_spec: OptimSpec | str | None = None, lr_scheduler: str | None = None,
                 lr_scheduler_kwargs: dict[str, Any] | None = None, **unused: Any) -> None:
        name = type(self).__name__
        if island_size is not None:
            positive_int(f"{name}: island_size (or None)", island_size)
        if optim_spec is not None and inner_optim is not None:
            raise ValueError(f"{name}: give the local optimizer once, as inner_optim or as "
                             "optim_spec, got both")
        hints = {"inner_optim_spec": "; the local optimizer is inner_optim (or optim_spec)"}
        super().__init__(_make("fedavg", H=H, **_exo.shared(
            name, unused, inner_optim if optim_spec is None else optim_spec, lr_scheduler,
            lr_scheduler_kwargs, max_norm, hints)))
        self.island_size = island_size

    def check_num_nodes(self, num_nodes: int) -> None:
        """An ``island_size`` below N is an error (EXO Gym averaged random islands of that size
        apart; exogym's FedAvg averages all the nodes)."""
        if self.island_size is not None and self.island_size < num_nodes:
            raise ValueError(
                f"{type(self).__name__}: island_size={self.island_size} with {num_nodes} nodes: "
                "exogym's FedAvg averages all the nodes every round; islands are not "
                f"implemented; allowed: None or an island_size >= {num_nodes} (all the nodes)")


class DeMoStrategy(_exo.BuiltinStrategy):
    """EXO Gym's ``DeMoStrategy``, run as :class:`exogym.strategy.demo.DeMo`.

    EXO Gym built its DeMo optimizer with torch SGD's default lr (1e-3) whatever the strategy
    was given; here ``optim_spec``'s ``lr`` is DeMo's step size eta (the paper's), scheduled by
    ``lr_scheduler``. DeMo is its own optimizer: ``optim_spec``'s other settings are not used.

    Args:
        compression_decay: momentum decay (the paper's beta).
        compression_topk: DCT components each node sends per chunk (the paper's k).
        compression_chunk: chunk size (the paper's s).
        weight_decay: decoupled weight decay (the paper's lambda).
        optim_spec: its ``lr`` is eta (default 1e-3, EXO Gym's fixed value).
        lr_scheduler: None, or ``"lambda_cosine"``
            (:func:`~exogym.compat.exo_gym.conversions.schedule`).
        lr_scheduler_kwargs: ``warmup_steps`` and ``cosine_anneal`` of ``"lambda_cosine"``.
        **unused: arguments EXO Gym's class did not declare: an
            :class:`~exogym.compat.exo_gym.conversions.ExoGymWarning` each, ignored (as EXO
            Gym did).
    """

    def __init__(self, compression_decay: float = 0.999, compression_topk: int = 32,
                 compression_chunk: int = 64, weight_decay: float = 0.0,
                 optim_spec: OptimSpec | str | None = None, lr_scheduler: str | None = None,
                 lr_scheduler_kwargs: dict[str, Any] | None = None, **unused: Any) -> None:
        name = type(self).__name__
        fields = _exo.shared(name, unused, optim_spec, lr_scheduler, lr_scheduler_kwargs)
        lr = 1e-3 if optim_spec is None else fields["optim"].lr  # EXO Gym's fixed value
        if optim_spec is not None:
            _warn_unused_optim(name, fields["optim"])
        super().__init__(_make("demo", beta=compression_decay, k=compression_topk,
                               s=compression_chunk,
                              optim=OptimSpec(lr=lr, weight_decay=weight_decay),
                              schedule=fields["schedule"]))


def _warn_unused_optim(owner: str, spec: OptimSpec) -> None:
    """An :class:`~exogym.compat.exo_gym.conversions.ExoGymWarning` naming the settings of
    ``spec`` beyond ``lr`` that DeMo does not use (those that differ from a plain
    ``OptimSpec(name, lr=lr)``)."""
    plain = OptimSpec(spec.name, lr=spec.lr)
    unused = {f: getattr(spec, f) for f in ("weight_decay", "betas", "eps", "momentum",
                                             "nesterov")
              if getattr(spec, f) != getattr(plain, f)}
    if unused:
        settings = ", ".join(f"{k}={v!r}" for k, v in unused.items())
        warnings.warn(
            f"{owner}: optim_spec's {settings} not used: DeMo is its own optimizer (the sign of "
            f"the decoded DCT momentum), which takes only optim_spec's lr (its step size); "
            f"DeMo's weight decay is {owner}(weight_decay=)", _exo.ExoGymWarning, stacklevel=4)


class SPARTADiLoCoStrategy(_exo.BuiltinStrategy):
    """EXO Gym's ``SPARTADiLoCoStrategy``, run as
    :class:`exogym.strategy.sparta_diloco.SPARTADiLoCo` with ``policy="random"`` (SPARTA's and
    DiLoCo's differences from EXO Gym apply: indices from a shared seed, no mask sent; outer
    steps after H, 2H, ... steps).

    Args:
        inner_optim_spec: the inner optimizer (default EXO Gym's: AdamW, lr 1e-3, weight decay
            0.01).
        outer_optim_spec: SGD (Nesterov or not) or Adam; default SGD, Nesterov momentum 0.9,
            lr 0.7.
        p_sparta: fraction of the parameter entries averaged after every step.
        sparta_interval: EXO Gym stored it and averaged after every step regardless; so does
            exogym: any value but 1 is an :class:`~exogym.compat.exo_gym.conversions.ExoGymWarning`.
        H: inner steps per outer step.
        max_norm: clip each node's gradient to this L2 norm before the inner step.
        lr_scheduler: None, or ``"lambda_cosine"``
            (:func:`~exogym.compat.exo_gym.conversions.schedule`).
        lr_scheduler_kwargs: ``warmup_steps`` and ``cosine_anneal`` of ``"lambda_cosine"``.
        **unused: arguments EXO Gym's class did not declare: an
            :class:`~exogym.compat.exo_gym.conversions.ExoGymWarning` each, ignored (as EXO
            Gym did).
    """

    def __init__(self, inner_optim_spec: OptimSpec | str | None = None,
                 outer_optim_spec: OptimSpec | str | None = None, p_sparta: float = 0.005,
                 sparta_interval: int = 1, H: int = 100, max_norm: float | None = None,
                 lr_scheduler: str | None = None,
                 lr_scheduler_kwargs: dict[str, Any] | None = None, **unused: Any) -> None:
        name = type(self).__name__
        fields = _exo.shared(name, unused, inner_optim_spec, lr_scheduler, lr_scheduler_kwargs,
                             max_norm)
        if sparta_interval != 1:
            _exo.warn_ignored(name, "sparta_interval", sparta_interval,
                              "SPARTA averages after every step, as in EXO Gym")
        super().__init__(_make("sparta_diloco", H=H, p=p_sparta, policy="random", **fields,
                                      **_exo.outer_fields(outer_optim_spec, name)))
