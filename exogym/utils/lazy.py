"""A package's public names imported on first use (PEP 562), so that importing the package
imports none of the modules behind them (``import exogym`` imports no torch)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str], public: Iterable[str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of module ``package``: a name of ``exports`` is
    imported from its module (``"exogym.x.y"``, or a module of the package named relative to it,
    ``"y"``) on first use and kept in the package, so later look-ups do not come back; any other
    name is the ``AttributeError`` of a missing attribute. ``public``: the package's
    ``__all__``, listed by ``dir()``."""
    names = sorted(set(public))

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = exports[name]
        value = getattr(importlib.import_module(
            module if module.startswith("exogym.") else f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
