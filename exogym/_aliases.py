"""The module paths of exogym before its package layout (``exogym.engine``, ``exogym.data.mnist``,
...) and EXO Gym's that name whole modules (``exogym.trainer``, ``exogym.aux``) stay importable:
each is the very module object of its new home (``exogym.engine is exogym.sim.engine``;
``exogym.trainer`` is :mod:`exogym.compat.exo_gym.trainer`, whose ``Trainer`` takes EXO Gym's
form too; ``exogym.aux`` is :mod:`exogym.compat.exo_gym.auxiliary`, a folder named ``aux`` being
impossible on Windows), so scripts written against them keep working without a second copy of
any module.

An entry of :data:`ALIASES` maps an old module path to its new one; a prefix entry (ending in a
dot) maps a whole old package. The finder sits first on ``sys.meta_path`` so that an old name never
reaches the regular path finder (which would load a second copy under the old name).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

__all__ = ["ALIASES"]

ALIASES: dict[str, str] = {
    "exogym.engine": "exogym.sim.engine",
    "exogym.comm": "exogym.sim.comm",
    "exogym.codecs": "exogym.sim.codecs",
    "exogym.network": "exogym.sim.network",
    "exogym.clock": "exogym.sim.clock",
    "exogym.data.sharding": "exogym.sim.sharding",
    "exogym.data.partition": "exogym.sim.partition",
    "exogym.data": "exogym.tasks.data",
    "exogym.data.": "exogym.tasks.data.",
    "exogym.trainer": "exogym.compat.exo_gym.trainer",  # EXO Gym's path of exogym.Trainer
    "exogym.result": "exogym.run.result",
    "exogym.sinks": "exogym.run.sinks",
    "exogym.launch": "exogym.run.launch",
    "exogym.dist": "exogym.run.dist",
    "exogym.optim": "exogym.strategy.optim",
    "exogym.models": "exogym.tasks.models",
    "exogym.gpt": "exogym.tasks.gpt",
    "exogym.compare": "exogym.lab.compare",
    "exogym.report": "exogym.lab.report",
    "exogym.plots": "exogym.lab.plots",
    "exogym.estimate": "exogym.lab.estimate",
    "exogym.sample": "exogym.lab.sample",
    "exogym.config": "exogym.utils.config",
    "exogym.validation": "exogym.utils.validation",
    "exogym.aux": "exogym.compat.exo_gym.auxiliary",  # EXO Gym's helpers (get_device)
    "exogym.aux.": "exogym.compat.exo_gym.auxiliary.",
}


def target(name: str) -> str | None:
    """The module an old path stands for, or None if ``name`` is not an old path."""
    if name in ALIASES:
        return ALIASES[name]
    for old, new in ALIASES.items():
        if old.endswith(".") and name.startswith(old):
            return new + name[len(old):]
    return None


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object = None,
                  target_: object = None) -> importlib.machinery.ModuleSpec | None:
        new = target(fullname)
        if new is None:
            return None
        real = importlib.import_module(new)
        return importlib.util.spec_from_loader(fullname, self,
                                               is_package=hasattr(real, "__path__"))

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = target(spec.name)
        assert new is not None
        return importlib.import_module(new)  # the module itself: its own name and spec stay

    def exec_module(self, module: ModuleType) -> None:
        """Nothing: the module was executed under its own name."""


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())
