"""Module paths that users import and whose modules moved, each the very module object of its
home, so that their code keeps working without a second copy of any module:

- EXO Gym's: ``exogym.trainer`` is :mod:`exogym.run.trainer` (whose ``Trainer`` takes EXO Gym's
  forms too) and ``exogym.aux`` (with ``exogym.aux.utils``, ...) is
  :mod:`exogym.compat.exo_gym.auxiliary` (a folder named ``aux`` being impossible on Windows);
- the run layer's modules that exogym's documentation showed before the run layer became
  packages (``exogym.run.result``, ``exogym.run.sinks``, ``exogym.run.ft_launch``,
  ``exogym.run.ft_replay``); their public names are also ``exogym.run``'s and
  ``exogym.run.ft``'s, the paths the documentation shows now.

These are the only aliases: exogym's own earlier flat paths (``exogym.engine``,
``exogym.data.mnist``, ...) are gone and fail to import as any missing module does.

An entry of :data:`ALIASES` maps an EXO Gym module path to its module; a prefix entry (ending in
a dot) maps a whole package. The finder sits first on ``sys.meta_path`` so that an aliased name
never reaches the regular path finder (which would load a second copy under that name).
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
    "exogym.trainer": "exogym.run.trainer",  # EXO Gym's path of exogym.Trainer
    "exogym.aux": "exogym.compat.exo_gym.auxiliary",  # EXO Gym's helpers (get_device)
    "exogym.aux.": "exogym.compat.exo_gym.auxiliary.",
    # the run layer's documented modules before its packages (exogym 0.1, docs at 8601882)
    "exogym.run.result": "exogym.run.output.result",
    "exogym.run.sinks": "exogym.run.output.sinks",
    "exogym.run.ft_launch": "exogym.run.ft.launch",
    "exogym.run.ft_replay": "exogym.run.ft.replay",
}


def target(name: str) -> str | None:
    """The module an aliased path stands for, or None if ``name`` is not one."""
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
