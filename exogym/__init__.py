"""exogym: simulate N distributed-training nodes on one machine.

The layers, bottom up: :mod:`exogym.sim` (N nodes on one machine: engine, communicator, codecs,
network, clock, data shards), :mod:`exogym.strategy` (one method per file, inner optimizers),
:mod:`exogym.tasks` (models and datasets), :mod:`exogym.run` (one training run: trainer, result,
sinks, real processes), :mod:`exogym.lab` (many runs: compare, estimate, sample) and
:mod:`exogym.cli`. Nothing imports upwards.

>>> from exogym import Trainer
>>> from exogym.strategy import DiLoCo
>>> result = Trainer(model, train_ds, val_ds).fit(strategy=DiLoCo(H=100), num_nodes=4,
...                                               max_steps=500)
"""

import exogym._aliases  # noqa: F401  (old module paths: exogym.trainer, exogym.data.mnist, ...)
from exogym.compat import DilocoSimulator
from exogym.run.result import FitResult
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
