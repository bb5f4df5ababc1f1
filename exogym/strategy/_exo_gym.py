"""EXO Gym's names under ``exogym.strategy``'s import paths: the one place the strategy layer
hands a name on to :mod:`exogym.compat.exo_gym`.

EXO Gym's scripts import its built-in strategies from the modules of their methods
(``from exogym.strategy.diloco import DiLoCoStrategy``), from ``exogym.strategy``, and its
``SimpleReduceStrategy`` from ``exogym.strategy.strategy``. exogym's modules at those paths hold
exogym's own methods; each asks :func:`exo_gym_name` for EXO Gym's names from its module
``__getattr__`` (PEP 562), so that importing exogym's code never loads EXO Gym's compatibility,
and a name is looked up in :mod:`exogym.compat.exo_gym` only when a script asks for it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["exo_gym_name"]


def exo_gym_name(module: str, name: str, names: tuple[str, ...]) -> Any:
    """``module``'s attribute ``name`` when it is one of EXO Gym's ``names`` there (the class
    from :mod:`exogym.compat.exo_gym`); else the ``AttributeError`` of a missing attribute."""
    if name not in names:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    import exogym.compat.exo_gym as exo_gym  # on first use (the docstring)

    return getattr(exo_gym, name)
