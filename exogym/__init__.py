"""exogym: simulate N distributed-training nodes on one machine.

The layers, bottom up: :mod:`exogym.sim` (N nodes on one machine: engine, communicator, codecs,
network, clock, data shards), :mod:`exogym.strategy` (one method per file, inner optimizers),
:mod:`exogym.tasks` (models and datasets), :mod:`exogym.run` (one training run: trainer, result,
sinks, real processes), :mod:`exogym.compat` (the interfaces exogym grew out of: EXO Gym's, the
whole of it in :mod:`exogym.compat.exo_gym`), :mod:`exogym.lab` (many runs: compare, estimate,
sample) and :mod:`exogym.cli`. Nothing imports upwards but EXO Gym's import paths
(``exogym.strategy.diloco.DiLoCoStrategy``, ...), which hand its names on from
:mod:`exogym.compat.exo_gym`. ``exogym.Trainer`` is that package's trainer: exogym's, taking EXO
Gym's strategies and call form too.

>>> from exogym import Trainer
>>> from exogym.strategy import DiLoCo
>>> result = Trainer(model, train_ds, val_ds).fit(strategy=DiLoCo(H=100), num_nodes=4,
...                                               max_steps=500)

``import exogym`` imports neither torch nor any layer: each public name is imported on first use
(PEP 562), so that the command line can handle SIGINT / SIGTERM before the seconds torch takes to
import (:func:`exogym.cli.main`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import exogym._aliases  # noqa: F401  (EXO Gym's module paths: exogym.trainer, exogym.aux)

if TYPE_CHECKING:
    from exogym.compat import DilocoSimulator
    from exogym.compat.exo_gym.trainer import Trainer
    from exogym.run.output.result import FitResult
    from exogym.strategy import register
    from exogym.strategy.optim import LRSchedule, OptimSpec
    from exogym.tasks.models import Classifier, MnistCNN

__version__ = "0.1.0"
__all__ = [
    "Classifier",
    "DilocoSimulator",
    "FitResult",
    "LRSchedule",
    "MnistCNN",
    "OptimSpec",
    "Trainer",
    "__version__",
    "register",
]

# public name -> the module it is imported from on first use
_EXPORTS: dict[str, str] = {
    "Classifier": "exogym.tasks.models",
    "DilocoSimulator": "exogym.compat",
    "FitResult": "exogym.run.output.result",
    "LRSchedule": "exogym.strategy.optim",
    "MnistCNN": "exogym.tasks.models",
    "OptimSpec": "exogym.strategy.optim",
    "Trainer": "exogym.compat.exo_gym.trainer",  # the core trainer, EXO Gym's form too
    "register": "exogym.strategy",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # imported once: later look-ups do not come here
        return value
    raise AttributeError(f"module 'exogym' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
