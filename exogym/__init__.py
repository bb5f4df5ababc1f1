"""exogym: simulate N distributed-training nodes on one machine.

>>> from exogym import Trainer
>>> from exogym.strategy import DiLoCo
>>> result = Trainer(model, train_ds, val_ds).fit(strategy=DiLoCo(H=100), num_nodes=4,
...                                               max_steps=500)
"""

from exogym.compat import DilocoSimulator
from exogym.models import Classifier, MnistCNN
from exogym.optim import LRSchedule, OptimSpec
from exogym.result import FitResult
from exogym.trainer import Trainer

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
]
