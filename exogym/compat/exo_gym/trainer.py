"""``exogym.Trainer``: exogym's trainer that also takes EXO Gym's strategies and its ``fit`` call.

EXO Gym's path of it is ``exogym.trainer.Trainer``. :class:`Trainer` is
:class:`exogym.run.trainer.Trainer` (which knows exogym's strategies and call only) with:

- EXO Gym's constructor, ``Trainer(model, train_dataset, val_dataset, start_port=None,
  device=None, devices=None)`` (github.com/exo-explore/gym at commit 9fa323c,
  ``exogym/trainer.py``);
- EXO Gym's strategies in ``fit``: a per-node strategy (:class:`exogym.strategy.PerNodeStrategy`)
  runs in :class:`~exogym.compat.exo_gym.per_node.PerNode`, a built-in
  (:mod:`exogym.compat.exo_gym.builtins`) as exogym's strategy of its method
  (:func:`~exogym.compat.exo_gym.per_node.as_exogym`);
- EXO Gym's form of the ``fit`` call (its arguments by position or by EXO Gym's names, EXO Gym's
  defaults, the trained model returned): :mod:`exogym.compat.exo_gym.fit_form`.

A call in exogym's own form with exogym's strategies is exactly the core trainer's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn
from torch.utils.data import Dataset

from exogym.compat.exo_gym import fit_form
from exogym.compat.exo_gym.per_node import as_exogym
from exogym.run.output.result import FitResult
from exogym.run.trainer import Trainer as CoreTrainer
from exogym.sim.sharding import DatasetFactory
from exogym.strategy.base import Strategy as StackedStrategy
from exogym.strategy.per_node_base import PerNodeStrategy

__all__ = ["Trainer"]


class Trainer(CoreTrainer):
    """Holds a model and its data; :meth:`fit` trains it on N simulated nodes with an exogym
    strategy, or one of EXO Gym's (see the module docstring).

    Args:
        model: as :class:`exogym.run.trainer.Trainer`'s.
        train_dataset: as :class:`exogym.run.trainer.Trainer`'s.
        val_dataset: as :class:`exogym.run.trainer.Trainer`'s.
        start_port: EXO Gym's first rendezvous port of the processes it spawned per ``fit``.
            Accepted and unused: the simulated nodes of a run live in one process and open no
            port. Kept as ``self.start_port`` (an int in [1, 65535] or None); exogym's own real
            processes take their port from ``exogym.run.launch.fit_processes(..., port=)``.
        device: the device of this trainer's runs (EXO Gym's ``Trainer(device=)``); a
            ``fit(device=)`` given as well must agree with it. None or ``""``: ``fit``'s, else
            ``"auto"``.
        devices: EXO Gym's CUDA device indices, node ``i`` on ``devices[i % len(devices)]``.
            exogym's simulated nodes share one device: one index (the runs' device is then
            ``cuda:INDEX``) or None.
    """

    def __init__(
        self,
        model: nn.Module,
        train_dataset: Dataset | DatasetFactory,
        val_dataset: Dataset | DatasetFactory | None = None,
        start_port: int | None = None,
        device: str | None = None,
        devices: Sequence[int] | None = None,
    ) -> None:
        super().__init__(model, train_dataset, val_dataset)
        if start_port is not None and (isinstance(start_port, bool)
                                       or not isinstance(start_port, int)
                                       or not 1 <= start_port <= 65535):
            raise ValueError(f"start_port must be an integer in [1, 65535] or None, got "
                             f"{start_port!r}")
        self.start_port = start_port
        if device is not None and not isinstance(device, str):
            raise TypeError(f"device must be a device name or None, got {device!r}")
        self.device = _device(device or None, devices)

    def _call_form(self, args: tuple[Any, ...], kwargs: dict[str, Any]
                   ) -> Callable[[Callable[..., FitResult]], Any] | None:
        """EXO Gym's form of the call (:func:`~exogym.compat.exo_gym.fit_form.fit`); or exogym's
        form with one of EXO Gym's strategies, or with this trainer's device; else None (the
        core trainer's own call)."""
        if fit_form.is_exo_gym_call(args, kwargs):
            return functools.partial(fit_form.fit, self, args=args, kwargs=kwargs,
                                     device=self.device)
        strategy = kwargs.get("strategy", "ddp")
        if not isinstance(strategy, (str, StackedStrategy, PerNodeStrategy)):
            raise TypeError(
                "strategy must be an exogym strategy (node-stacked, exogym.strategy), a registry "
                "id, one of EXO Gym's built-ins (exogym.strategy.diloco.DiLoCoStrategy, ...) or "
                "a per-node strategy (exogym.strategy.PerNodeStrategy, EXO Gym's "
                "exogym.strategy.strategy.Strategy), got "
                f"{type(strategy).__name__}")
        given = dict(kwargs)
        if isinstance(strategy, PerNodeStrategy):
            given["strategy"] = as_exogym(strategy, kwargs.get("num_nodes", 1))
        if self.device is not None:
            if given.get("device") is not None and not fit_form.same_device(given["device"],
                                                                    self.device):
                raise ValueError(f"fit(device={given['device']!r}) and Trainer(device="
                                 f"{self.device!r}) differ: give one of them")
            given["device"] = self.device
        if given.keys() == kwargs.keys() and all(given[k] is kwargs[k] for k in kwargs):
            return None  # exogym's own call, run inline (its warnings point at the caller)
        return lambda run: run(**given)


def _device(device: str | None, devices: Sequence[int] | None) -> str | None:
    """EXO Gym's ``device`` and ``devices`` as one device for the simulated nodes."""
    if devices is None:
        return device
    indices = list(devices)
    if len(indices) != 1 or isinstance(indices[0], bool) or not isinstance(indices[0], int):
        raise ValueError(f"devices={devices!r}: exogym simulates every node of a run on one "
                         "device; give one CUDA index (devices=[0]) or None (EXO Gym placed "
                         "node i on devices[i % len(devices)])")
    if device not in (None, "cuda"):
        raise ValueError(f"devices={devices!r} names CUDA devices, but device={device!r}; "
                         "give device='cuda' or None")
    return f"cuda:{indices[0]}"

