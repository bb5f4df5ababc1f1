"""exogym: simulate N distributed-training nodes on one machine.

The layers, bottom up: :mod:`exogym.sim` (N nodes on one machine: engine, communicator, codecs,
network, clock, data shards), :mod:`exogym.strategy` (one method per file, inner optimizers),
:mod:`exogym.tasks` (models and datasets), :mod:`exogym.run` (one training run: the trainer,
its loop, where its nodes live, what it writes, real processes), :mod:`exogym.compat` (the
interfaces exogym grew out of, EXO Gym's and diloco-sim's names and forms only),
:mod:`exogym.lab` (many runs: compare, estimate, sample) and :mod:`exogym.cli`. Nothing imports
upwards but EXO Gym's names under exogym's paths (``exogym.strategy.diloco.DiLoCoStrategy``,
...: :mod:`exogym.strategy._exo_gym`) and EXO Gym's form of the ``fit`` call, each loaded on
first use (pyproject.toml lists them). ``exogym.Trainer`` is :class:`exogym.run.trainer.Trainer`,
which takes EXO Gym's strategies and call form too.

>>> from exogym import Trainer
>>> from exogym.strategy import DiLoCo
>>> result = Trainer(model, train_ds, val_ds).fit(strategy=DiLoCo(H=100), num_nodes=4,
...                                               max_steps=500)

``import exogym`` imports neither torch nor any layer: each public name is imported on first use
(PEP 562), so that the command line can handle SIGINT / SIGTERM before the seconds torch takes to
import (:func:`exogym.cli.main`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import exogym._aliases  # noqa: F401  (EXO Gym's module paths: exogym.trainer, exogym.aux)
from exogym.utils.lazy import lazy_exports

if TYPE_CHECKING:
    from exogym.compat import DilocoSimulator
    from exogym.run.output.result import FitResult
    from exogym.run.trainer import Trainer
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
    "Trainer": "exogym.run.trainer",  # the trainer (EXO Gym's forms too)
    "register": "exogym.strategy",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
